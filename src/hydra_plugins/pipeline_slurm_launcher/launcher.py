"""`hydra/launcher=slurm`: submitit's SLURM launcher, with a sweep's manners.

hydra-submitit-launcher submits a job array and then waits for the jobs in order, raising at the first
that did not return (one `scancel`, a node failure, a job killed at its time limit): the sweep then ends
in a traceback with no report. This launcher submits the same array and then

- says which SLURM job holds each run (`[job 1] slurm 12_1: seed=1 ok ...`), one line per job as it
  finishes, in the order they finish: what a local sweep prints, plus the job ids;
- turns a job that SLURM ended without a result (CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, ...) into
  a failed run record that says so, so the other seeds go on, the report covers what finished and the
  sweep ends with its resume command.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as SubmititSlurmLauncher
from omegaconf import OmegaConf, open_dict

log = logging.getLogger(__name__)

# How often the launcher asks SLURM about its jobs (submitit's own default is 1 s per job check).
POLL_S = 2.0


class SlurmLauncher(SubmititSlurmLauncher):
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit

        from pipeline.config.checks import ConfigError
        from pipeline.runtime.cluster import check_slurm_submission

        assert self.config is not None and job_overrides
        try:
            check_slurm_submission(self.params, OmegaConf.select(self.config, "device.accelerator"))
        except ConfigError as exc:  # before anything is submitted or written
            print(f"error: {exc}", file=sys.stderr, flush=True)
            sys.exit(2)
        # The executor is set up as hydra-submitit-launcher's launch() does (its launch() cannot be reused:
        # it waits for the jobs in order and raises at the first one SLURM ended).
        init_keys = {"max_num_timeout", "submitit_folder"}
        executor = submitit.AutoExecutor(
            cluster=self._EXECUTOR, folder=self.params["submitit_folder"],
            **{f"{self._EXECUTOR}_max_num_timeout": self.params["max_num_timeout"]} if "max_num_timeout" in self.params else {},
        )
        base = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{k if k in base else f"{self._EXECUTOR}_{k}": v
                                      for k, v in self.params.items() if k not in init_keys})
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        log.info(f"Submitit '{self._EXECUTOR}' sweep output dir : {sweep_dir}")
        params = []
        for i, overrides in enumerate(job_overrides):
            log.info(f"\t#{initial_job_idx + i} : {' '.join(filter_overrides(overrides))}")
            params.append((list(overrides), "hydra.sweep.dir", initial_job_idx + i, f"job_id_for_{initial_job_idx + i}",
                           Singleton.get_state()))
        jobs = executor.map_array(self, *zip(*params))
        ids = [j.job_id for j in jobs]
        print(f"submitted {len(jobs)} SLURM job(s): {ids[0]}" + (f" .. {ids[-1]}" if len(ids) > 1 else ""), flush=True)

        returns: dict[int, JobReturn] = {}
        pending = dict(enumerate(jobs))
        while pending:
            for i, job in list(pending.items()):
                if not job.done():
                    continue
                del pending[i]
                returns[i] = self._finished(job, list(job_overrides[i]), initial_job_idx + i)
            if pending:
                time.sleep(POLL_S)
        return [returns[i] for i in range(len(jobs))]

    def _finished(self, job, overrides: list[str], num: int) -> JobReturn:
        """The job's return, with one line printed; a job SLURM ended without a result becomes failed records."""
        try:
            ret = job.results()[0]
        except Exception as exc:  # the job did not return: cancelled, timed out, node failure, killed
            ret = self._lost(job, overrides, num, exc)
        from pipeline.store.record import summary_line

        records = ret.return_value if ret.status == JobStatus.COMPLETED else None
        for record in records if isinstance(records, list) else []:
            print(f"[job {num}] slurm {job.job_id}: {summary_line(record)}", flush=True)
        if not isinstance(records, list):
            print(f"[job {num}] slurm {job.job_id}: failed: {str(ret._return_value).splitlines()[0]}", flush=True)
        return ret

    def _lost(self, job, overrides: list[str], num: int, exc: Exception) -> JobReturn:
        from pipeline.runtime.job import record_lost_job
        from pipeline.sweep import sweep_command

        state = _slurm_state(job)
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(cfg.hydra.job):
            cfg.hydra.job.num = num
        run_dir = Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
        how = f"ended by SLURM as {state} (job {job.job_id})" if state else f"lost by SLURM (job {job.job_id}): {exc}"
        job_cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
        records = record_lost_job(job_cfg, run_dir, how, sweep_command(self.config))
        return JobReturn(overrides=overrides, cfg=cfg, hydra_cfg=None, working_dir=os.fspath(run_dir),
                         task_name=str(cfg.hydra.job.name), status=JobStatus.COMPLETED, _return_value=records)


def _slurm_state(job) -> str | None:
    try:
        return str(job.state).split()[0]
    except Exception:  # sacct unreachable: the caller says "lost" with submitit's reason
        return None

"""Hydra callback for multi-seed sweeps: one line per finished job, the report at the end, and honest endings.

- A sweep resumed (`hydra.sweep.dir=<dir> resume=true`) with other overrides than the ones its dir
  was made with is refused in one line naming the differing keys: mixing configurations in one
  sweep dir would silently add a second group and overwrite multirun.yaml.
- While it runs, its progress ("[7/20 done, 3 running, 1 failed, ETA 4 min]", pipeline.sweep_progress): the
  jobs, wherever the launcher runs them, write when they start and end into the sweep dir; this process shows it.
- At the end the seed-distribution report is written over whatever finished, and when a job did not
  finish ok the command exits non-zero with, as its last line, the one command that finishes the sweep.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from pipeline.config.grouping import start_sweep_id
from pipeline.runtime.context import exit_status
from pipeline.runtime.job import RELAY_ENV
from pipeline.store.record import read_records, summary_line
from pipeline.sweep_progress import SweepProgress, job_ended, job_started, planned_jobs, start_sweep

log = logging.getLogger("pipeline.sweep")

# Overrides that may differ between a sweep and its resume without changing what it computes.
_RESUME_FREE = ("resume", "hydra.sweep.dir", "hydra/launcher", "hydra.launcher", "device.num_threads", "logger")


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _comparable(overrides: list[str]) -> dict[str, str]:
    out = {}
    for o in overrides:
        key = _key(o)
        if not key.startswith(_RESUME_FREE):
            out[key] = o.split("=", 1)[1] if "=" in o else ""
    return out


def sweep_command(config: DictConfig) -> str:
    # The launcher and other hydra/ choices too: the resumed sweep runs the way the first one did.
    given = [*config.hydra.overrides.hydra, *config.hydra.overrides.task]
    overrides = [o for o in given if not _key(o).startswith(("resume", "hydra.sweep.dir", "hydra.run.dir", "hydra.mode"))]
    args = " ".join(shlex.quote(o) for o in overrides)
    return f"python -m pipeline -m {args} hydra.sweep.dir={shlex.quote(str(config.hydra.sweep.dir))} resume=true"


def _multirun(config: DictConfig) -> bool:
    return config.hydra.mode is not None and str(config.hydra.mode) == "RunMode.MULTIRUN"


class SweepReportCallback(Callback):
    _progress: SweepProgress | None = None

    def __getstate__(self) -> dict:  # launchers pickle the callbacks for their workers: the display stays here
        return {k: v for k, v in self.__dict__.items() if k != "_progress"}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # Before any job starts (and before hydra.sweep.dir resolves): with a sweep dir of the user's choosing no
        # resolver asks for the id, and the runs' W&B `sweep=<id>` tag and `sweep_id` config would be missing.
        start_sweep_id()
        self._refuse_changed_resume(config)
        sweep_dir = Path(config.hydra.sweep.dir)
        start_sweep(sweep_dir, planned_jobs(config))
        launcher = str(OmegaConf.select(config, "hydra.launcher._target_", default="") or "")
        # A live line needs the terminal to itself: joblib's workers print their jobs' lines straight to it, so
        # they get plain lines; the basic launcher's job processes send their output through this process.
        live = sys.stdout.isatty() and "joblib" not in launcher.lower()
        if live and launcher.endswith("BasicLauncher"):
            os.environ[RELAY_ENV] = "1"
        self._progress = SweepProgress(sweep_dir, live=live).start()

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if _multirun(config):
            job_started(config.hydra.sweep.dir, config.hydra.job.num)

    def _refuse_changed_resume(self, config: DictConfig) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        saved = sweep_dir / "multirun.yaml"
        if not (config.get("resume") and saved.is_file()):
            return
        before = _comparable(list(OmegaConf.load(saved).hydra.overrides.task))
        now = _comparable(list(config.hydra.overrides.task))
        differing = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
        if differing:
            shown = ", ".join(f"{k} ({before.get(k, '-')} -> {now.get(k, '-')})" for k in differing[:5])
            print(
                f"error: resume of {sweep_dir} with other overrides than it was made with: {shown}; "
                f"resume with the same overrides, or start a new sweep dir",
                file=sys.stderr, flush=True,
            )
            sys.exit(2)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        status = "failed"
        try:
            records = job_return.return_value
        except Exception as exc:  # the job raised past run(): still say so, and let the other seeds go on
            print(f"[job {job_return.hydra_cfg.hydra.job.num}] failed: {str(exc).splitlines()[0] if str(exc) else exc}", flush=True)
            records = None
        if isinstance(records, dict):
            records = [records]
        if isinstance(records, list) and _multirun(config):
            for record in records:
                print(f"[job {config.hydra.job.num}] {summary_line(record)}", flush=True)
            statuses = [str(r.get("status") if isinstance(r, dict) else getattr(r, "status", "failed")) for r in records]
            status = next((s for s in statuses if s != "ok"), "ok") if statuses else "failed"
        if _multirun(config):
            job_ended(config.hydra.sweep.dir, config.hydra.job.num, status)
            if self._progress is not None:  # the job ran in this process: its progress line follows its own line
                self._progress.update()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        os.environ.pop(RELAY_ENV, None)
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        report = None
        try:
            from pipeline.report import build_report

            # A tuning sweep reports its confirmation runs (tune/ compares the trials itself).
            inputs = [sweep_dir / "confirm"] if (sweep_dir / "confirm").is_dir() else [sweep_dir]
            report = build_report(inputs, sweep_dir / "report")
            print(f"report: {sweep_dir / 'report' / 'report.md'}", flush=True)
        except Exception as exc:  # a broken report must not hide the finished runs
            log.error(f"report failed: {str(exc).splitlines()[0] if str(exc) else exc}; rebuild it with: python -m pipeline.report {sweep_dir}")
        wandb_cfg = (config.get("logger") or {}).get("wandb")
        if wandb_cfg is not None and report is not None:
            from pipeline.report.wandb_summary import log_report_to_wandb

            groups = {r.group for r in read_records(sweep_dir)}
            group = groups.pop() if len(groups) == 1 else str(config.name)  # the runs' own W&B group when they share one
            log_report_to_wandb(report, sweep_dir / "report", project=wandb_cfg.get("project", "pipeline"),
                                group=group, entity=wandb_cfg.get("entity"), mode=wandb_cfg.get("mode"))
        unfinished = unfinished_runs(sweep_dir)
        if unfinished:
            exit_status.at_least(1)
            print(f"{len(unfinished)} run(s) did not finish ok: " + "; ".join(unfinished[:5]), flush=True)
            print(f"finish the sweep with: {sweep_command(config)}", flush=True)


def unfinished_runs(sweep_dir: Path) -> list[str]:
    """'seed=3 failed: killed by SIGKILL ...' for each run record under the sweep dir that is not ok."""
    # A tuning trial's failed seed (a NaN at a bad learning rate) is a result of the search, not an unfinished run.
    trials = (sweep_dir / "trials").resolve()
    return [f"seed={r.seed} {r.status}: {r.error}" for r in read_records(sweep_dir)
            if r.status != "ok" and trials not in Path(r.run_dir or sweep_dir).resolve().parents]

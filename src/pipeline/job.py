"""One Hydra job: its context, and (in sweeps) its own process, so a killed job never takes down the sweep.

Light on purpose (no torch, no Lightning): in a sweep the launcher's process only spawns
`python -m pipeline.job <dir>` for each job and waits. The child trains; if it is killed (kill -9,
the OOM killer, a crash in native code) the parent records how it ended in the job's result.json
(signal or exit code, the step its checkpoint holds, the command that finishes the sweep) and returns,
so the launcher's other jobs go on and the sweep-end report is written over what finished.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

log = logging.getLogger("pipeline")

JOB_DIR = ".pipeline"
@dataclass
class JobContext:
    """What a run needs from Hydra, as plain values (a child process has no Hydra)."""

    run_dir: str
    multirun: bool = False
    overrides: list[str] = field(default_factory=list)
    choices: dict[str, str] = field(default_factory=dict)
    num_threads: int | None = None
    sweep_dir: str | None = None
    job_num: int | None = None
    # True in a sweep job's own process: SIGUSR2 (SLURM's warning before preemption or the time
    # limit, as submitit asks for it) then also means "checkpoint and stop".
    isolated: bool = False
    # The sweep's own overrides (`seed=0,1,2`, not this job's `seed=1`): what its resume command repeats.
    sweep_overrides: list[str] = field(default_factory=list)

    @classmethod
    def from_hydra(cls, cfg: DictConfig) -> JobContext:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        multirun = hc.mode == RunMode.MULTIRUN
        return cls(
            run_dir=str(hc.runtime.output_dir),
            multirun=multirun,
            overrides=list(hc.overrides.task),
            choices={str(k): str(v) for k, v in hc.runtime.choices.items() if v is not None},
            num_threads=threads_for_this_job(cfg.device.num_threads, hc, multirun),
            sweep_dir=str(hc.sweep.dir) if multirun else None,
            job_num=int(hc.job.num) if multirun and hc.job.get("num") is not None else None,
            sweep_overrides=_sweep_overrides(str(hc.sweep.dir)) if multirun else [],
        )

    def resume_command(self) -> str:
        """The one command that continues this run (or, in a sweep, finishes the sweep)."""
        given = self.sweep_overrides if (self.multirun and self.sweep_overrides) else self.overrides
        skip = ("ckpt_path=", "resume=", "hydra.run.dir=", "hydra.sweep.dir=", "hydra.mode=")
        args = " ".join(shlex.quote(o) for o in given if not o.startswith(skip))
        if self.multirun and self.sweep_dir:
            return f"python -m pipeline -m {args} hydra.sweep.dir={shlex.quote(self.sweep_dir)} resume=true".replace("  ", " ")
        return f"python -m pipeline {args} hydra.run.dir={shlex.quote(self.run_dir)} ckpt_path=last".replace("  ", " ")


def _sweep_overrides(sweep_dir: str) -> list[str]:
    saved = Path(sweep_dir) / "multirun.yaml"
    try:
        hydra = OmegaConf.load(saved).hydra
        return [str(o) for o in (*hydra.overrides.hydra, *hydra.overrides.task)]
    except (OSError, ValueError, AttributeError):
        return []


def threads_for_this_job(requested, hydra_cfg, multirun: bool) -> int | None:
    """Under a parallel launcher, jobs x threads must not exceed the cores (oversubscription is 3-10x slower)."""
    n_jobs = OmegaConf.select(hydra_cfg, "launcher.n_jobs", default=None)
    if not multirun or not isinstance(n_jobs, int) or requested is None:
        return requested
    cores = os.cpu_count() or 1
    # joblib: -1 means all cores, -2 all but one, ...
    parallel = cores + 1 + n_jobs if n_jobs < 0 else n_jobs
    cap = max(1, cores // max(1, parallel))
    if int(requested) > cap:
        log.info(f"device.num_threads={requested} lowered to {cap}: {parallel} parallel jobs on {cores} cores")
    return min(int(requested), cap)


def hydra_job(cfg: DictConfig) -> list[dict]:
    """Hydra's task function body: a sweep's job runs in a child process, a single run in this one."""
    ctx = JobContext.from_hydra(cfg)
    if ctx.multirun and cfg.get("resume"):
        done = read_job_records(Path(ctx.run_dir), int(cfg.get("seeds_per_process") or 1), int(cfg.seed))
        if done and all(r.get("status") == "ok" for r in done):
            log.info(f"resume: {ctx.run_dir} already finished ok, skipping")
            return done
    if ctx.multirun and bool(cfg.get("isolate_jobs", True)):
        return run_in_child(cfg, ctx)
    from pipeline.run import run_job

    return run_job(cfg, ctx)


# ---- the sweep side: spawn, wait, record how the child ended ----------------------------------
def run_in_child(cfg: DictConfig, ctx: JobContext) -> list[dict]:
    job_dir = Path(ctx.run_dir) / JOB_DIR
    job_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, job_dir / "config.yaml", resolve=True)
    (job_dir / "context.json").write_text(json.dumps({**asdict(ctx), "isolated": True}, indent=2))
    # Its own process group: a terminal's Ctrl-C reaches this process only, which forwards it once.
    child = subprocess.Popen([sys.executable, "-m", "pipeline.job", str(job_dir)], start_new_session=True)
    received: list[int] = []

    def forward(signum, frame):  # Ctrl-C / SIGTERM reach the child, which saves and stops cleanly
        received.append(signum)
        if child.poll() is None:
            child.send_signal(signum)

    previous = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2):
            previous[sig] = signal.signal(sig, _chain(forward, signal.getsignal(sig)) if sig == signal.SIGUSR2 else forward)
    except ValueError:  # not the main thread: the launcher handles signals
        previous = {}
    try:
        rc = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    records = read_job_records(Path(ctx.run_dir), int(cfg.get("seeds_per_process") or 1), int(cfg.seed))
    if rc not in (0, 1, 130, 143, 2):
        how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited with code {rc}"
        records = [_record_death(r, how, ctx) for r in records]
        print(f"[job {ctx.job_num}] seed={cfg.seed}: the training process was {how}; finish with: {ctx.resume_command()}", flush=True)
    if received and signal.SIGUSR2 not in received:
        # Stop the sweep; its jobs' records say where each one stopped.
        print(f"sweep stopped by {signal.Signals(received[0]).name}; finish it with: {ctx.resume_command()}", flush=True)
        raise SystemExit(130 if received[0] == signal.SIGINT else 143)
    return records


def _chain(first, second):
    """Call our handler, then the one that was there (submitit's requeue on SIGUSR2)."""

    def handler(signum, frame):
        first(signum, frame)
        if callable(second):
            second(signum, frame)

    return handler


def read_job_records(run_dir: Path, k: int, seed: int) -> list[dict]:
    from pipeline.record import read_result

    dirs = [run_dir] if k <= 1 else [run_dir / f"seed{seed + i}" for i in range(k)]
    return [r for r in (read_result(d) for d in dirs) if r is not None]


def _record_death(record: dict, how: str, ctx: JobContext) -> dict:
    from pipeline.record import RESULT, write_json

    if record.get("status") == "ok":  # never overwrite a finished record
        return record
    checkpoint = record.get("checkpoint") or {}
    step = checkpoint.get("step")
    where = f"; its checkpoint holds step {step}" if step is not None else "; no checkpoint was written yet"
    record.update(status="failed", error=f"the training process was {how}{where}", ended_by=how,
                  resume_command=ctx.resume_command())
    write_json(Path(record["run_dir"]) / RESULT, record)
    return record


# ---- the child side ------------------------------------------------------------------------------
def child_main(job_dir: str) -> int:
    job_dir_path = Path(job_dir)
    ctx = JobContext(**json.loads((job_dir_path / "context.json").read_text()))
    cfg = OmegaConf.load(job_dir_path / "config.yaml")
    _log_to(Path(ctx.run_dir) / "run.log")
    from pipeline.quiet import install

    install()  # a sweep's job process never goes through cli.main
    from pipeline.run import exit_code_of, run_job

    records = run_job(cfg, ctx)
    return exit_code_of(records)


def _log_to(path: Path) -> None:
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(logging.Formatter("%(message)s"))
    file = logging.FileHandler(path)
    file.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    root.handlers = [console, file]
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda"):
        logging.getLogger(name).setLevel(logging.WARNING)


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1]))

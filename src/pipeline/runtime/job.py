"""One Hydra job: its context, and (in sweeps) its own process, so a killed job never takes down the sweep.

Light on purpose (no torch, no Lightning): in a sweep the launcher's process only spawns
`python -m pipeline.runtime.job <dir>` for each job and waits. The child trains; if it is killed (kill -9,
the OOM killer, a crash in native code) the parent records how it ended in the job's result.json
(signal or exit code, the step its checkpoint holds, the command that finishes the sweep) and returns,
so the launcher's other jobs go on and the sweep-end report is written over what finished.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from pipeline.config.checks import one_line
from pipeline.config.grouping import group_name, semantic_config
from pipeline.config.startup import CheckedRun, check_run
from pipeline.runtime.cluster import slurm_rank
from pipeline.runtime.context import JobContext
from pipeline.runtime.rundir import EXIT_CODES, STOP_SIGNALS, honour_stop_signals_from_now, say
from pipeline.store.layout import RESULT, agent_dirs
from pipeline.store.record import RunRecord, read_record

log = logging.getLogger("pipeline")

JOB_DIR = ".pipeline"
# A job process that found its run dir owned by another live process (exit code of the child).
BUSY_EXIT = 75
# Set by a sweep showing a live progress line on its terminal: the job process's output then comes through this
# process (whose stdout the live display owns), so it prints above the line instead of through it.
RELAY_ENV = "PIPELINE_RELAY_JOB_OUTPUT"
# Written into the sweep dir by the sweep's process on a stop request: a job that has not started yet does not.
STOP_FILE = ".stop"
# A child's exit code after it saved on a stop request, and the signal that asked it.
STOPPED_BY = {EXIT_CODES[s]: s.name for s in STOP_SIGNALS}


def hydra_job(cfg: DictConfig, start=None) -> list[dict]:
    """Hydra's task function body: a sweep's job runs in a child process, a single run in this one.

    `start`: a single run the CLI checked and whose run dir it claimed before Hydra composed
    (`pipeline.runtime.start.Start`); otherwise the job's config is checked here, once (`check_run`). When the
    check changed the config (a preset's model keys dropped for the user's model option), the run dir's copy of the
    config Hydra saved is replaced by the config that runs."""
    ctx = JobContext.from_hydra(cfg)
    if ctx.multirun and ctx.sweep_dir and (Path(ctx.sweep_dir) / STOP_FILE).is_file():
        log.info(f"[job {ctx.job_num}] seed={cfg.seed}: not started, the sweep was asked to stop")
        return read_job_records_as_dicts(Path(ctx.run_dir), _agents(cfg), int(cfg.seed))
    if ctx.multirun and cfg.get("resume"):
        done = read_job_records(Path(ctx.run_dir), _agents(cfg), int(cfg.seed))
        # Finished only when every agent has an ok record (one without a record has not run to its end).
        if len(done) == _agents(cfg) and all(r.status == "ok" for r in done):
            log.info(f"resume: {ctx.run_dir} already finished ok, skipping")
            return [r.to_dict() for r in done]
    checked = start.checked if start is not None else check_run(cfg)
    if start is None and not ctx.multirun:  # a single run the CLI could not check before Hydra (--config-path)
        from pipeline.runtime.start import check_device

        check_device(checked.device.accelerator)
    rank = slurm_rank() if checked.processes > 1 else None
    if rank:  # a task SLURM started for one rank of a run on several processes: it trains in step and writes nothing
        from pipeline.runtime.run import run_rank

        ctx.rank = rank
        run_rank(checked, ctx)
        return []
    _save_checked_config(checked, cfg)
    if ctx.multirun and bool(cfg.get("isolate_jobs", True)):
        return run_in_child(checked.cfg, ctx)
    from pipeline.runtime.run import run_job

    records = run_job(checked, ctx, **tuner_hooks(cfg), plan=None if start is None else start.plan)
    if ctx.multirun:
        # A job trained in the sweep's own process (isolate_jobs=false) took the sweep's SIGINT/SIGTERM: it saved
        # and recorded `interrupted`; the sweep stops too, as it does for a job in a child process (it went on
        # to the next job, and a tuner worker cancelled by SLURM kept asking for trials).
        signals = [(r.get("interrupted") or {}).get("signal") for r in records if r.get("status") == "interrupted"]
        stop = next((s for s in signals if s in ("SIGINT", "SIGTERM", "SIGHUP")), None)
        if stop:
            say(f"sweep stopped by {stop}; finish it with: {ctx.resume_command()}")
            raise SystemExit(EXIT_CODES[signal.Signals[stop]])
    return records


def _save_checked_config(checked: CheckedRun, cfg: DictConfig) -> None:
    """The config Hydra saved in the run dir, replaced by the checked one where the check changed it (what `python -m
    pipeline.eval` and `pipeline.load` rebuild the run from)."""
    if OmegaConf.to_container(checked.cfg) == OmegaConf.to_container(cfg):
        return
    from hydra.core.hydra_config import HydraConfig

    hydra = HydraConfig.get()
    if hydra.output_subdir is not None:
        OmegaConf.save(checked.cfg, Path(hydra.runtime.output_dir) / str(hydra.output_subdir) / "config.yaml")


# ---- the sweep side: spawn, wait, record how the child ended ----------------------------------
def run_in_child(cfg: DictConfig, ctx: JobContext) -> list[dict]:
    job_dir = Path(ctx.run_dir) / JOB_DIR
    job_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, job_dir / "config.yaml", resolve=True)
    (job_dir / "context.json").write_text(json.dumps({**asdict(ctx), "isolated": True}, indent=2))
    relay = os.environ.get(RELAY_ENV) == "1"
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT} if relay else {}
    # Its own process group: a terminal's Ctrl-C reaches this process only, which forwards it once.
    child = subprocess.Popen([sys.executable, "-m", "pipeline.runtime.job", str(job_dir)], start_new_session=True,
                             preexec_fn=_stop_with_parent, **pipes)
    relayer = threading.Thread(target=_relay, args=(child.stdout,), daemon=True) if relay else None
    if relayer is not None:
        relayer.start()
    received: list[int] = []

    def forward(signum, frame):  # Ctrl-C / SIGTERM / SIGHUP reach the child, which saves and stops cleanly
        received.append(signum)
        if child.poll() is None:
            child.send_signal(signum)

    previous = {}
    try:
        for sig in (*STOP_SIGNALS, signal.SIGUSR2):
            if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
                continue  # nohup
            previous[sig] = signal.signal(sig, forward)
    except ValueError:  # not the main thread: the launcher handles signals
        previous = {}
    try:
        rc = child.wait()
        if relayer is not None:
            relayer.join(timeout=10)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    requeue = previous.get(signal.SIGUSR2)
    if signal.SIGUSR2 in received and callable(requeue):
        # SLURM's warning before preemption or the time limit (submitit asks for SIGUSR2). This process owns
        # it: the child has saved its checkpoint and stopped, and only now does submitit's handler requeue
        # the job (scontrol requeue); the requeued job continues from the checkpoint (SLURM_RESTART_COUNT).
        # Lightning's own SLURM auto-requeue is off in the child (runtime.run.make_trainer), so one requeue.
        log.info(f"[job {ctx.job_num}] seed={cfg.seed}: checkpoint saved after SIGUSR2 (exit {rc}); requeueing")
        requeue(signal.SIGUSR2, None)
    records = read_job_records(Path(ctx.run_dir), _agents(cfg), int(cfg.seed))
    if rc == BUSY_EXIT:  # another live process still trains this job (a sweep resumed too soon): leave it be
        print(f"[job {ctx.job_num}] seed={cfg.seed}: still running in another process ({ctx.run_dir} is locked); "
              "not started again: resume the sweep when it has ended", flush=True)
        return [r.to_dict() for r in records]
    if rc not in (0, 1, 2, *STOPPED_BY) or len(records) < _agents(cfg):
        how = (f"killed by {signal.Signals(-rc).name}" if rc < 0 else
               f"stopped by {STOPPED_BY[rc]} before it started" if rc in STOPPED_BY else
               f"ended with exit code {rc} before it wrote a record" if rc in (0, 1, 2) else f"exited with code {rc}")
        # A child killed in its first seconds (during imports, out of memory) wrote no record: one is made
        # here from what the sweep knows, so every launched job is counted.
        records = [_record_death(r, how, ctx) for r in _with_skeletons(records, cfg, ctx)]
        print(f"[job {ctx.job_num}] seed={cfg.seed}: the training process was {how}; finish with: {ctx.resume_command()}", flush=True)
    if received and signal.SIGUSR2 not in received:
        # Stop the sweep; its jobs' records say where each one stopped.
        say(f"sweep stopped by {signal.Signals(received[0]).name}; finish it with: {ctx.resume_command()}")
        raise SystemExit(EXIT_CODES.get(received[0], 1))
    return [r.to_dict() for r in records]


def _stop_with_parent() -> None:
    """In the child, before it runs: when the process that started it dies (a killed sweep, a killed joblib
    worker or submitit controller), the kernel sends it SIGTERM, so it checkpoints, records `interrupted` and
    stops instead of training on as an orphan. Linux only (prctl PR_SET_PDEATHSIG); elsewhere nothing changes."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _relay(stream) -> None:
    for raw in iter(stream.readline, b""):
        # A progress bar's redraws arrive as one line of carriage returns: its last state is what to show.
        text = raw.decode(errors="replace").rstrip("\n").rsplit("\r", 1)[-1]
        if text.strip():
            print(text, flush=True)


def _agents(cfg: DictConfig) -> int:
    k = cfg.get("seeds_per_process") or 1
    return int(k) if isinstance(k, int) and k > 0 else 1


def read_job_records_as_dicts(run_dir: Path, k: int, seed: int) -> list[dict]:
    return [r.to_dict() for r in read_job_records(run_dir, k, seed)]


def read_job_records(run_dir: Path, k: int, seed: int) -> list[RunRecord]:
    dirs = agent_dirs(run_dir, [seed + i for i in range(k)])
    return [r for r in (read_record(d) for d in dirs) if r is not None]


def _with_skeletons(records: list[RunRecord], cfg: DictConfig, ctx: JobContext) -> list[RunRecord]:
    """The job's records, plus a skeleton for each agent whose process died before it could write one."""
    have = {r.seed for r in records}
    seeds = [int(cfg.seed) + i for i in range(_agents(cfg))]
    out = list(records)
    for seed, d in zip(seeds, agent_dirs(Path(ctx.run_dir), seeds)):
        if seed not in have:
            d.mkdir(parents=True, exist_ok=True)
            task = str(OmegaConf.select(cfg, "task._target_", default="") or "").rsplit(".", 1)[-1]
            resolved = OmegaConf.to_container(cfg, resolve=True)
            out.append(RunRecord(experiment=str(cfg.get("name") or ""), group=group_name(resolved, str(cfg.get("name") or "")),
                                 task=task, seed=seed, run_dir=str(d), versions=None, git_commit=None,
                                 config=semantic_config(resolved), seeds_per_process=len(seeds), agent=seed - seeds[0]))
    return out


def _record_death(record: RunRecord, how: str, ctx: JobContext) -> RunRecord:
    return mark_dead(record, how, ctx.resume_command())


def mark_dead(record: RunRecord, how: str, resume_command: str) -> RunRecord:
    if record.status == "ok":  # never overwrite a finished record
        return record
    step = (record.checkpoint or {}).get("step")
    where = f"; its checkpoint holds step {step}" if step is not None else "; no checkpoint was written yet"
    record.update(status="failed", error=f"the training process was {how}{where}", ended_by=how,
                  resume_command=resume_command)
    record.write()
    return record


def record_lost_job(cfg: DictConfig, run_dir: Path, how: str, resume_command: str) -> list[dict]:
    """A job the launcher lost (cancelled or killed by the scheduler): its records say so, and a job that never
    started gets one (with its config, so the report groups it with its seeds), so the sweep counts it and
    ends with the command that finishes it. `cfg` is the job's config without its `hydra` node."""
    from pipeline.config.grouping import group_name, semantic_config

    k, seed = _agents(cfg), int(cfg.seed)
    records = read_job_records(run_dir, k, seed)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    if records:
        for r in records:
            if r.config is None and r.status != "ok":  # an early skeleton: group it with its seeds
                r.update(config=semantic_config(resolved), group=group_name(resolved, str(cfg.name)))
        return [mark_dead(r, how, resume_command).to_dict() for r in records]
    out = []
    for i, d in enumerate(agent_dirs(run_dir, [seed + i for i in range(k)])):
        record = RunRecord(
            experiment=str(cfg.name), group=group_name(resolved, str(cfg.name)), seed=seed + i, run_dir=str(d),
            task=str(cfg.task._target_).rsplit(".", 1)[-1], config=semantic_config(resolved), seeds_per_process=k,
            agent=i, error=f"the job was {how} before the run started", versions=None, git_commit=None,
        ).update(ended_by=how, resume_command=resume_command)
        d.mkdir(parents=True, exist_ok=True)
        record.write()
        out.append(record.to_dict())
    return out


# ---- the child side ------------------------------------------------------------------------------
def child_main(job_dir: str) -> int:
    honour_stop_signals_from_now()
    job_dir_path = Path(job_dir)
    ctx = JobContext(**json.loads((job_dir_path / "context.json").read_text()))
    cfg = OmegaConf.load(job_dir_path / "config.yaml")
    _log_to(Path(ctx.run_dir) / "run.log")
    from pipeline.runtime.quiet import install

    install()  # a sweep's job process never goes through cli.main
    from pipeline.config.errors import ConfigError
    from pipeline.runtime.preflight import RunRefused
    from pipeline.runtime.run import exit_code_of, run_job
    from pipeline.runtime.rundir import RunDirBusy

    try:
        records = run_job(check_run(cfg, ctx.choices), ctx, **tuner_hooks(cfg))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    except RunRefused as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return BUSY_EXIT if isinstance(exc.__context__, RunDirBusy) or "is in use by" in str(exc) else 2
    return exit_code_of(records)


def _log_to(path: Path) -> None:
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(logging.Formatter("%(message)s"))
    file = logging.FileHandler(path)
    file.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    root.handlers = [console, file]
    from pipeline.runtime.quiet import quiet_failing_log_handlers

    quiet_failing_log_handlers()
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda"):
        logging.getLogger(name).setLevel(logging.WARNING)


def tuner_hooks(cfg: DictConfig) -> dict:
    """For a job the tuner started (`cfg.trial` set): what makes its trial's reporter, handed to the lifecycle
    (`run_job(..., trial_reporter=)`), which knows no tuner. Other jobs: nothing."""
    if cfg.get("trial") is None:
        return {}
    from pipeline.tune.pruning import TrialReporter

    return {"trial_reporter": TrialReporter.from_config}


def _parent_gone(parent: int, wait_s: float = 3.0) -> bool:
    """Whether rank 0 (`parent`) has died: this rank is reparented. A killed process's sockets close before its children
    are reparented, so a collective can fail first; the wait covers that window (seen under load), on the error path
    only."""
    deadline = time.monotonic() + wait_s
    while os.getppid() == parent:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def rank_main(job_dir: str) -> int:
    """Rank r > 0 of a run on several processes on this machine (started by rank 0, devices.RankProcesses): it trains
    in step with rank 0 and writes nothing into the run dir; its error line goes to `<job_dir>/rank<r>.error`, where
    rank 0 reads it into the run's record."""
    honour_stop_signals_from_now()
    path = Path(job_dir)
    ctx = JobContext(**json.loads((path / "context.json").read_text()))
    ctx.rank = int(os.environ.get("LOCAL_RANK", "0"))
    cfg = OmegaConf.load(path / "config.yaml")
    logging.basicConfig(level=logging.WARNING, format=f"[rank {ctx.rank}] %(message)s")
    from pipeline.runtime.quiet import install

    install()
    from pipeline.runtime.run import run_rank

    parent = os.getppid()  # rank 0, which started this rank
    try:
        return run_rank(check_run(cfg, ctx.choices), ctx)
    except BaseException as exc:
        (path / f"rank{ctx.rank}.error").write_text(one_line(exc))
        if not isinstance(exc, Exception) or not _parent_gone(parent):
            raise
        # Rank 0 is gone (killed): this rank's collective failed because of it, and its traceback (~100 lines of
        # gloo's "Connection reset by peer") says nothing more. Rank 0's record says where the run stands.
        say(f"[rank {ctx.rank}] stopped: rank 0 (pid {parent}) is gone, so the run cannot go on; its {RESULT} says "
            "where the run stands", sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(rank_main(sys.argv[2]) if sys.argv[1] == "--rank" else child_main(sys.argv[1]))

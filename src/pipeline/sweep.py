"""Hydra callback for multi-seed sweeps: one line per finished job, the report at the end, and honest endings.

- A sweep resumed (`hydra.sweep.dir=<dir> resume=true`) with other overrides than the ones its dir
  was made with is refused in one line naming the differing keys: mixing configurations in one
  sweep dir would silently add a second group and overwrite multirun.yaml.
- While it runs, its progress ("[7/20 done, 3 running, 1 failed, ETA 4 min]", pipeline.sweep_progress): the
  jobs, wherever the launcher runs them, write when they start and end into the sweep dir; this process shows it.
- At the end the seed-distribution report is written over whatever finished, and when a job did not
  finish ok the command exits non-zero with, as its last line, the one command that finishes the sweep.
- A stop request (SIGINT, SIGTERM, SIGHUP) to the sweep's process, whatever the launcher: the running jobs'
  training processes save and stop, no new job starts (`<sweep dir>/.stop`), and the sweep ends as any other:
  a status line per job, the report over what finished, the command that finishes it. So does a launcher that
  fails (a killed joblib worker, a killed submitit controller: `end_after_launcher_failure`). No process of the
  sweep outlives the command.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from pipeline.config.grouping import start_sweep_id
from pipeline.runtime.context import exit_status, launcher_failure_handler
from pipeline.runtime.job import RELAY_ENV, STOP_FILE, mark_dead
from pipeline.runtime.rundir import EXIT_CODES, STOP_SIGNALS, say
from pipeline.store.layout import kept_sweep_id
from pipeline.store.record import read_records, summary_line
from pipeline.sweep_progress import (
    NOT_STARTED,
    SweepProgress,
    job_ended,
    job_started,
    job_started_at,
    planned_jobs,
    progress_dir,
    start_sweep,
)

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


# The sweep this process runs, for a launcher failure caught outside Hydra's callbacks: (callback, config).
_ACTIVE: list = []


class SweepReportCallback(Callback):
    _progress: SweepProgress | None = None
    _stopped_by: int | None = None

    def __getstate__(self) -> dict:  # launchers pickle the callbacks for their workers: the display stays here
        return {k: v for k, v in self.__dict__.items() if k not in ("_progress", "_previous")}

    def _install_stop(self, sweep_dir: Path) -> None:
        """SIGINT/SIGTERM/SIGHUP to the sweep's process: its jobs' training processes save and stop, and no new job
        starts. Without this a joblib sweep exited at once while its workers trained on and started new jobs."""
        (sweep_dir / STOP_FILE).unlink(missing_ok=True)

        def stop(signum, frame):
            first = self._stopped_by is None
            self._stopped_by = self._stopped_by or signum
            try:
                (sweep_dir / STOP_FILE).write_text(signal.Signals(signum).name)
            except OSError:
                pass
            for pid in sweep_processes(sweep_dir, jobs_only=True):
                _signal(pid, signum)
            if first:
                say(f"{signal.Signals(signum).name} received: the running jobs save and stop; no new job starts")

        self._previous = {}
        try:
            for sig in STOP_SIGNALS:
                if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
                    continue  # nohup
                self._previous[sig] = signal.signal(sig, stop)
        except ValueError:  # not the main thread
            self._previous = {}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # Before any job starts (and before hydra.sweep.dir resolves): with a sweep dir of the user's choosing no
        # resolver asks for the id, and the runs' W&B `sweep=<id>` tag and `sweep_id` config would be missing.
        # A resumed sweep keeps the id its runs kept (their W&B group and tags), also for the jobs it starts anew.
        start_sweep_id(kept_sweep_id(Path(config.hydra.sweep.dir)) if config.get("resume") else None)
        self._refuse_changed_resume(config)
        sweep_dir = Path(config.hydra.sweep.dir)
        # A sweep refused before it launches anything leaves no dir it made: the first of them, or None.
        self._made_dir = next((d for d in reversed([sweep_dir, *sweep_dir.absolute().parents]) if not d.exists()), None)
        self._had_progress = progress_dir(sweep_dir).is_dir()  # an earlier attempt's: what a resume needs from it
        start_sweep(sweep_dir, planned_jobs(config))
        self._install_stop(sweep_dir)
        _ACTIVE[:] = [(self, config)]
        launcher_failure_handler[:] = [end_after_launcher_failure]
        launcher = str(OmegaConf.select(config, "hydra.launcher._target_", default="") or "")
        # A live line needs the terminal to itself: joblib's workers print their jobs' lines straight to it, so
        # they get plain lines; the basic launcher's job processes send their output through this process.
        live = sys.stdout.isatty() and "joblib" not in launcher.lower()
        if live and launcher.endswith("BasicLauncher"):
            os.environ[RELAY_ENV] = "1"
        if "joblib" in launcher.lower():
            stop_jobs_before_loky_kills()
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
            if _not_started(Path(config.hydra.sweep.dir), config.hydra.job.num, records):
                status = NOT_STARTED
            job_ended(config.hydra.sweep.dir, config.hydra.job.num, status)
            if self._progress is not None:  # the job ran in this process: its progress line follows its own line
                self._progress.update()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        refused = bool(kwargs.get("refused"))
        if self._progress is not None:
            self._progress.stop(final_line=not refused)
            self._progress = None
        os.environ.pop(RELAY_ENV, None)
        for sig, handler in (getattr(self, "_previous", None) or {}).items():
            signal.signal(sig, handler)
        self._previous = {}
        _ACTIVE.clear()
        launcher_failure_handler.clear()
        if refused:  # before any job (the tuner's checks of its settings and space): nothing to report
            _remove_unlaunched(sweep_dir, getattr(self, "_made_dir", None), getattr(self, "_had_progress", True))
            return
        if not sweep_dir.is_dir():
            return
        stopped = self._stopped_by or _stop_requested(sweep_dir)
        if stopped or kwargs.get("failed"):
            reap(sweep_dir)  # the sweep ends here: none of its processes trains on unseen
            for record in read_records(sweep_dir):  # where each job stands, in one place
                if record.status == "failed" and (record.error or "").startswith("run did not finish"):
                    # Its training process is gone without a word (the launcher killed it with its worker).
                    how = "killed when its launcher failed" if kwargs.get("failed") and not stopped else "killed"
                    record = mark_dead(record, how, sweep_command(config))
                print(f"[{Path(record.run_dir).name}] {summary_line(record.to_dict())}", flush=True)
        if stopped:
            exit_status.at_least(EXIT_CODES.get(stopped, 1))
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
        if unfinished or stopped or kwargs.get("failed"):
            exit_status.at_least(1)
            if unfinished:
                print(f"{len(unfinished)} run(s) did not finish ok: " + "; ".join(unfinished[:5]), flush=True)
            print(f"finish the sweep with: {sweep_command(config)}", flush=True)


def _launched(sweep_dir: Path) -> bool:
    """Whether the sweep launched a job (a job writes its start into the progress folder first)."""
    return any(progress_dir(sweep_dir).glob("job*.json"))


def _remove_unlaunched(sweep_dir: Path, made_dir: Path | None, had_progress: bool) -> None:
    """A sweep that launched nothing: its progress folder (unless an earlier attempt left one) and stop request go,
    and the dirs this sweep made (the sweep dir, and `made_dir`, the first missing one above it, with what is
    between), Hydra's multirun.yaml with them; a dir that was there before keeps its multirun.yaml."""
    import shutil

    if not had_progress:
        shutil.rmtree(progress_dir(sweep_dir), ignore_errors=True)
    (sweep_dir / STOP_FILE).unlink(missing_ok=True)
    if made_dir is None:
        return
    (sweep_dir / "multirun.yaml").unlink(missing_ok=True)
    made = Path(made_dir).absolute()
    for folder in [sweep_dir.absolute(), *sweep_dir.absolute().parents]:
        try:
            folder.rmdir()  # only when empty
        except OSError:
            return
        if folder == made:
            return


def _not_started(sweep_dir: Path, num: int, records) -> bool:
    """Whether job `num` did not run: the sweep was asked to stop before it started (the job saw `.stop` and
    returned at once), or while it started, before it wrote a record."""
    try:
        stopped_at = (sweep_dir / STOP_FILE).stat().st_mtime
    except OSError:
        return False
    started = job_started_at(sweep_dir, num)
    return not records or (started is not None and started >= stopped_at)


def _stop_requested(sweep_dir: Path) -> int | None:
    try:
        return int(signal.Signals[(sweep_dir / STOP_FILE).read_text().strip()])
    except (OSError, KeyError, ValueError):
        return None


def end_after_launcher_failure(exc: BaseException, stopped: bool = False) -> bool:
    """A launcher that failed under the sweep (joblib's TerminatedWorkerError when a worker is killed, submitit's
    UncompletedJobError when its controller is): one line for it, then the sweep's ordinary end (every job's
    status, the report over what finished, the resume command), instead of a traceback. False: no sweep of ours
    is running in this process (the caller re-raises)."""
    if not _ACTIVE:
        return False
    callback, config = _ACTIVE[0]
    if stopped:  # a job stopped the sweep on a signal (it said so): the sweep's end, then its exit code
        callback.on_multirun_end(config, failed=True)
        return True
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    say(f"the launcher failed: {type(exc).__name__}{': ' + first[:200] if first else ''}")
    callback.on_multirun_end(config, failed=True)
    return True


def end_refused_sweep() -> None:
    """A sweeper that refuses its settings or space (one line, exit 2) before it launches a job: Hydra calls no
    on_multirun_end then, so the sweep ends here, leaving no sweep dir of its own making. One that launched jobs
    keeps what they wrote."""
    if _ACTIVE and not _launched(Path(_ACTIVE[0][1].hydra.sweep.dir)):
        callback, config = _ACTIVE[0]
        callback.on_multirun_end(config, refused=True)


def sweep_processes(sweep_dir: Path, jobs_only: bool = False) -> list[int]:
    """The live processes that work for this sweep, found by their command line: a job's training process
    (`python -m pipeline.runtime.job <sweep dir>/<job>/...`, under any launcher, orphaned or not) and, unless
    `jobs_only`, submitit's job processes for it. Never this process, never another sweep's or a user's."""
    names = {str(Path(sweep_dir)), str(Path(sweep_dir).resolve()), os.path.abspath(sweep_dir)}
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        ours = "pipeline.runtime.job" in command or (not jobs_only and "submitit" in command)
        if ours and any(name in command for name in names):
            found.append(int(entry.name))
    return sorted(found)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError:
        pass


def stop_jobs(sweep_dir: Path, grace_s: float = 60.0) -> None:
    """The sweep's training processes get SIGTERM (they save and record `interrupted`) and up to `grace_s` to end."""
    jobs = sweep_processes(sweep_dir, jobs_only=True)
    for pid in jobs:
        _signal(pid, signal.SIGTERM)
    end = time.monotonic() + grace_s
    while jobs and time.monotonic() < end:
        jobs = [pid for pid in jobs if _alive(pid)]
        time.sleep(0.2)


def reap(sweep_dir: Path, grace_s: float = 60.0) -> None:
    """Stop what is left of the sweep: training processes get SIGTERM and `grace_s` to end (`stop_jobs`); then
    whatever of it is still alive (a stuck job, submitit's job processes) is killed."""
    stop_jobs(sweep_dir, grace_s)
    for pid in sweep_processes(sweep_dir):
        _signal(pid, signal.SIGKILL)


def stop_jobs_before_loky_kills() -> None:
    """joblib's loky executor, once one worker dies, SIGKILLs every other worker with its descendants: their jobs'
    training processes lost what they had trained since their last checkpoint. Here they get the stop signal first
    (`stop_jobs`), as a stopped sweep's do, then loky kills what is left. Installed once per process; outside a sweep
    of ours it is loky's own."""
    try:
        from joblib.externals.loky import process_executor
    except ImportError:
        return
    if getattr(process_executor.kill_process_tree, "_pipeline_guard", False):
        return
    kill = process_executor.kill_process_tree

    def kill_process_tree(process, *args, **kwargs):
        if _ACTIVE:
            stop_jobs(Path(_ACTIVE[0][1].hydra.sweep.dir))
        return kill(process, *args, **kwargs)

    kill_process_tree._pipeline_guard = True
    process_executor.kill_process_tree = kill_process_tree


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie (ended, not yet reaped by its parent) is not training
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def unfinished_runs(sweep_dir: Path) -> list[str]:
    """'seed=3 failed: killed by SIGKILL ...' for each run record under the sweep dir that is not ok."""
    # A tuning trial's failed seed (a NaN at a bad learning rate) is a result of the search, not an unfinished run.
    trials = (sweep_dir / "trials").resolve()
    return [f"seed={r.seed} {r.status}: {r.error}" for r in read_records(sweep_dir)
            if r.status != "ok" and trials not in Path(r.run_dir or sweep_dir).resolve().parents]

"""Sweep progress: "[7/20 done, 3 running, 1 failed, ETA 4 min]", for any launcher.

The state lives on disk, in `<sweep dir>/.progress/`: the sweep's process writes how many jobs it plans
(`sweep.json`), and each job, wherever it runs (this process, a joblib worker, a submitit or SLURM job on
another node sharing the sweep dir), writes `job<num>.json` when it starts and again when it ends, with its
status. `SweepProgress` in the sweep's process reads that folder once a second and shows it: a live line at the
bottom of a terminal (rich), or, in a log or a pipe, one plain line each time a job finishes. A job the launcher
hands over after the sweep was asked to stop does not run: it counts as "not started", neither done nor failed.

The ETA assumes every job takes as long as the finished ones did on average (d) and that as many run side by
side as run now (c): (the running jobs' remaining d - age, plus d for each job not started) / c. None before the
first job ends, or when the sweeper does not say how many jobs it plans (the tuner).

A resumed sweep (`resume=true`) skips the jobs that finished ok before: `start_sweep` keeps their numbers and how
long they took from the folder the earlier attempt left, so such a job counts as done with the time it really took
(not as a job of a fraction of a second, which made the ETA say "1 s" for minutes); the line says how many.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.runtime.progress_lines import LIVE_STATUS_ENV

PROGRESS_DIR = ".progress"
SWEEP_FILE = "sweep.json"
# The status of a job the launcher handed over after the sweep was asked to stop: it did not run.
NOT_STARTED = "not started"


def progress_dir(sweep_dir: str | Path) -> Path:
    return Path(os.path.abspath(sweep_dir)) / PROGRESS_DIR


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def start_sweep(sweep_dir: str | Path, total: int | None, now: float | None = None) -> None:
    """Called once by the sweep's process before any job starts. A resumed sweep starts counting afresh, and
    remembers which jobs finished ok in an earlier attempt, with how long each took (None: not known)."""
    folder = progress_dir(sweep_dir)
    earlier = _read(folder / SWEEP_FILE) or {}
    finished = {str(k): v for k, v in (earlier.get("finished_before") or {}).items()}
    for old in folder.glob("job*.json"):
        job = _read(old) or {}
        if job.get("status") == "ok":
            num = old.stem.removeprefix("job")
            took = job.get("took_s") if job.get("skipped") else _took(job)
            finished[num] = took if took is not None else finished.get(num)
        old.unlink(missing_ok=True)
    _write(folder / SWEEP_FILE, {"total": total, "started": time.time() if now is None else now, "pid": os.getpid(),
                                 "finished_before": finished})


def plan_jobs(sweep_dir: str | Path, total: int) -> None:
    """How many jobs a sweeper plans that knows it only once it runs (the tuner), for the N/M and the ETA."""
    path = progress_dir(sweep_dir) / SWEEP_FILE
    sweep = _read(path)
    if sweep is not None:
        _write(path, {**sweep, "total": int(total)})


def _took(job: dict) -> float | None:
    started, ended = job.get("started"), job.get("ended")
    return None if started is None or ended is None else max(0.0, float(ended) - float(started))


def job_started(sweep_dir: str | Path, num: int, now: float | None = None) -> None:
    _write(progress_dir(sweep_dir) / f"job{int(num)}.json", {"started": time.time() if now is None else now})


def job_started_at(sweep_dir: str | Path, num: int) -> float | None:
    """When job `num` started (None: not known)."""
    started = (_read(progress_dir(sweep_dir) / f"job{int(num)}.json") or {}).get("started")
    return None if started is None else float(started)


def job_ended(sweep_dir: str | Path, num: int, status: str, now: float | None = None) -> None:
    """The job's end and status. One that finished ok in an earlier attempt of the sweep, ending ok again, was
    skipped (resume=true): it is written as skipped, with the time it took then."""
    folder = progress_dir(sweep_dir)
    path = folder / f"job{int(num)}.json"
    started = (_read(path) or {}).get("started")
    job = {"started": started, "ended": time.time() if now is None else now, "status": str(status)}
    before = (_read(folder / SWEEP_FILE) or {}).get("finished_before") or {}
    if str(status) == "ok" and str(int(num)) in before:
        job.update(skipped=True, took_s=before[str(int(num))])
    _write(path, job)


def close_unfinished(sweep_dir: str | Path, now: float | None = None) -> None:
    """At the sweep's end every launched job has returned: one still marked running died without a word (a
    killed worker, a job SLURM cancelled) and is counted as `lost`."""
    for path in progress_dir(sweep_dir).glob("job*.json"):
        job = _read(path)
        if job is not None and "ended" not in job:
            job_ended(sweep_dir, int(path.stem.removeprefix("job")), "lost", now)


def duration(seconds: float) -> str:
    """45 s, 4 min, 1 h 05 min: what a person reads at a glance."""
    seconds = max(0.0, float(seconds))
    if math.ceil(seconds) < 60:
        return f"{math.ceil(seconds)} s"
    minutes = math.ceil(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


@dataclass
class Snapshot:
    total: int | None
    done: int = 0
    running: int = 0
    not_ok: dict[str, int] = field(default_factory=dict)  # status -> count, for jobs that ended other than ok
    elapsed_s: float = 0.0
    durations_s: list[float] = field(default_factory=list)  # of the finished jobs
    running_ages_s: list[float] = field(default_factory=list)
    skipped: int = 0  # of the done jobs: finished ok in an earlier attempt of a resumed sweep
    not_started: int = 0  # handed over after the sweep was asked to stop: not done, not failed


    @property
    def eta_s(self) -> float | None:
        if not self.total or not self.durations_s or self.done >= self.total or self.not_started:
            return None
        d = sum(self.durations_s) / len(self.durations_s)
        pending = max(0, self.total - self.done - self.running)
        left = sum(max(0.0, d - age) for age in self.running_ages_s) + pending * d
        return left / max(1, self.running)

    def shown(self) -> tuple:
        """What a plain line says that is news when it changes (not the ETA)."""
        return self.done, tuple(sorted(self.not_ok.items())), self.not_started

    def line(self) -> str:
        done = f"{self.done}/{self.total} done" if self.total else f"{self.done} done"
        parts = [done + (f" ({self.skipped} before the resume)" if self.skipped else ""), f"{self.running} running",
                 f"{self.not_ok.get('failed', 0)} failed"]
        parts += [f"{n} {status}" for status, n in sorted(self.not_ok.items()) if status != "failed"]
        parts += [f"{self.not_started} {NOT_STARTED}"] if self.not_started else []
        if self.total and self.done >= self.total:
            parts.append(f"took {duration(self.elapsed_s)}")
        elif self.eta_s is not None:
            parts.append(f"ETA {duration(self.eta_s)}")
        return f"[{', '.join(parts)}]"


def read_snapshot(sweep_dir: str | Path, now: float | None = None) -> Snapshot | None:
    """The sweep's progress as its folder says now (None when the sweep did not start one)."""
    folder = progress_dir(sweep_dir)
    sweep = _read(folder / SWEEP_FILE)
    if sweep is None:
        return None
    now = time.time() if now is None else now
    snap = Snapshot(total=sweep.get("total"), elapsed_s=max(0.0, now - float(sweep.get("started") or now)))
    for path in folder.glob("job*.json"):
        job = _read(path)
        if job is None:
            continue
        started = job.get("started")
        if "ended" not in job:
            snap.running += 1
            if started is not None:
                snap.running_ages_s.append(max(0.0, now - float(started)))
            continue
        if job.get("status") == NOT_STARTED:
            snap.not_started += 1
            continue
        snap.done += 1
        if job.get("skipped"):  # its time is the earlier attempt's (when known), not the skip's fraction of a second
            snap.skipped += 1
            if job.get("took_s") is not None:
                snap.durations_s.append(float(job["took_s"]))
        elif started is not None:
            snap.durations_s.append(max(0.0, float(job["ended"]) - float(started)))
        if job.get("status") != "ok":
            snap.not_ok[str(job.get("status"))] = snap.not_ok.get(str(job.get("status")), 0) + 1
    return snap


def planned_jobs(config) -> int | None:
    """How many jobs Hydra's basic sweeper will launch: the product of the sweep overrides' lengths
    (`seed=range(0,10) optimizer.lr=0.1,0.01` -> 20). None for another sweeper (the tuner decides as it goes)."""
    from omegaconf import OmegaConf

    target = str(OmegaConf.select(config, "hydra.sweeper._target_", default="") or "")
    if not target.endswith("BasicSweeper"):
        return None
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        params = OmegaConf.select(config, "hydra.sweeper.params", default=None) or {}
        given = [*config.hydra.overrides.task, *(f"{k}={v}" for k, v in params.items())]
        total = 1
        for override in OverridesParser.create().parse_overrides(given):
            if override.is_sweep_override():
                total *= len(list(override.sweep_iterator()))
        return total
    except Exception:  # noqa: BLE001 - a sweep we cannot count still shows what is done and running
        return None


class SweepProgress:
    """Shows a sweep's progress from its `.progress/` folder: a live line on a terminal, plain lines otherwise.

    `update()` may be called from any thread (the poller, or the job-end hook when the job ran in this process,
    so its line follows the job's own line at once). `stop()` ends with the final line, in both modes.
    """

    def __init__(self, sweep_dir: str | Path, live: bool, console=None, interval_s: float = 1.0) -> None:
        self.sweep_dir = Path(sweep_dir)
        self.live = live
        self.interval_s = interval_s
        self._console = console
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_shown: tuple | None = None
        self._live = None
        self._handlers: list[tuple[logging.StreamHandler, object]] = []

    def start(self) -> SweepProgress:
        # The sweep's jobs (in this process, or in processes started from it: joblib's workers, the job processes)
        # write their progress as lines, not bars: several bars, or a bar and our live line, would draw over each other.
        os.environ[LIVE_STATUS_ENV] = "1"
        if self.live:
            from rich.console import Console
            from rich.live import Live

            console = self._console or Console(file=sys.__stdout__)
            # Our own prints and log lines go above the live line (rich redirects sys.stdout/stderr; the logging
            # handlers that already hold the terminal's stream are pointed at the redirected one while we show it).
            self._live = Live("", console=console, auto_refresh=False, transient=True, redirect_stdout=True, redirect_stderr=True)
            self._live.start()
            self._redirect_log_handlers()
            # A sweep stopped by Ctrl-C never reaches on_multirun_end: give the terminal back (cursor, line) anyway.
            atexit.register(self._give_back_terminal)
        self._thread = threading.Thread(target=self._poll, name="sweep-progress", daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stopped.wait(self.interval_s):
            try:
                self.update()
            except Exception:  # noqa: BLE001 - a progress line must never break a sweep
                pass

    def update(self) -> None:
        snap = read_snapshot(self.sweep_dir)
        if snap is None:
            return
        with self._lock:
            if self._live is not None:
                from rich.text import Text

                self._live.update(Text(snap.line(), style="bold"), refresh=True)
                return
            shown = snap.shown()
            if snap.done and shown != self._last_shown:
                self._last_shown = shown
                print(snap.line(), flush=True)

    def stop(self, sweep_ended: bool = True, final_line: bool = True) -> None:
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        os.environ.pop(LIVE_STATUS_ENV, None)
        if sweep_ended:
            close_unfinished(self.sweep_dir)
        snap = read_snapshot(self.sweep_dir)
        self._give_back_terminal()
        with self._lock:
            if final_line and snap is not None and snap.shown() != self._last_shown:
                self._last_shown = snap.shown()
                print(snap.line(), flush=True)

    def _give_back_terminal(self) -> None:
        with self._lock:
            if self._live is not None:
                self._restore_log_handlers()
                self._live.stop()
                self._live = None

    def _redirect_log_handlers(self) -> None:
        loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger))]
        for logger in loggers:
            for handler in logger.handlers:
                if type(handler) is logging.StreamHandler and handler.stream in (sys.__stdout__, sys.__stderr__):
                    self._handlers.append((handler, handler.stream))
                    handler.setStream(sys.stdout if handler.stream is sys.__stdout__ else sys.stderr)

    def _restore_log_handlers(self) -> None:
        for handler, stream in self._handlers:
            handler.setStream(stream)
        self._handlers.clear()

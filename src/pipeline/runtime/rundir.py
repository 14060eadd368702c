"""A run dir has one owner, and an interruption is a request to stop cleanly, not a crash.

`RunDirLock` holds an exclusive `flock` on `<run dir>/.lock` for the life of the run: a second
process on the same dir is refused at once with one line naming the owner. The kernel releases the
lock when its owner dies, however it dies, so a stale lock (owner killed) is simply taken over, with
a note in run.log naming the previous owner. An owner that ends normally removes the file.

`StopRequests` turns SIGINT, SIGTERM and SIGHUP (a closed terminal, a dropped SSH session) into a flag the
training loop polls at a safe point (the end of a round or a batch): the run then saves a checkpoint, records
`status: interrupted` and exits 130 / 143 / 129. A second Ctrl-C falls back to Python's default
(KeyboardInterrupt) for an impatient user. A SIGHUP the process inherited as ignored (`nohup`) stays ignored.

The lock is reentrant within a process: the CLI takes it before Hydra writes the dir's `.hydra/`, and the
lifecycle's own acquire in the same process shares it.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import socket
import time
from pathlib import Path

from pipeline.store.atomic import StoreWriteError, write_error
from pipeline.store.layout import RESULT, lock_path

log = logging.getLogger("pipeline")

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129, signal.SIGUSR2: 140}
# The signals that ask a run to save and stop (SLURM's SIGUSR2 is added in a sweep job's own process).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# A second delivery of a stop signal within this many seconds is the same request (a terminal's Ctrl-C reaches a
# sweep's process and its workers, and both pass it on), not an impatient second Ctrl-C.
SAME_REQUEST_S = 1.0

# The locks this process holds, by absolute path: [fd, how many acquires share it, a take-over note to log].
_HELD: dict[str, list] = {}


class RunDirBusy(RuntimeError):
    """Another live process owns the run dir."""


class RunDirLock:
    def __init__(self, run_dir: Path):
        self.path = lock_path(run_dir)
        self._fd: int | None = None
        self._shared = False

    @property
    def _key(self) -> str:
        return os.path.abspath(self.path)

    def acquire(self) -> None:
        held = _HELD.get(self._key)
        if held is not None and _same_file(held[0], self.path):  # this process owns it already (the CLI took it)
            held[1] += 1
            self._shared = True
            if held[2]:  # said again now that the run's log is set up (the CLI took the lock before it was)
                log.info(held[2])
                held[2] = ""
            return
        try:
            self._acquire()
        except OSError as exc:  # a full disk or a read-only dir: one line naming the path, not a traceback
            if isinstance(exc, StoreWriteError):
                raise
            raise write_error(self.path, exc) from None
        _HELD[self._key] = [self._fd, 1, self._took_over]

    def _acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _read_owner(fd)
                os.close(fd)
                who = f"process {owner.get('pid')} on {owner.get('host')}" if owner else "another process"
                raise RunDirBusy(
                    f"run dir {self.path.parent} is in use by {who}; wait for it, or choose another dir with hydra.run.dir=<dir>"
                ) from None
            if _same_file(fd, self.path):
                break
            # The owner we waited on removed the file as it released it: our lock is on a file nobody else will
            # open again, so take the one the path names now.
            os.close(fd)
        previous = _read_owner(fd)
        self._took_over = ""
        if previous and previous.get("pid") != os.getpid():
            self._took_over = f"took over {self.path.parent} from process {previous.get('pid')} on {previous.get('host')}, which is gone"
            log.info(self._took_over)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}).encode(), 0)
        except OSError:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            raise
        self._fd = fd

    def release(self) -> None:
        """Remove the lock file, then let go: a finished run dir keeps no stale `.lock`. Removed only while this
        process holds the lock, so a lock another live process holds is never removed (`acquire` checks that the
        file it locked is still the one the path names)."""
        if self._shared:
            self._shared = False
            _HELD[self._key][1] -= 1
            return
        if self._fd is not None:
            _HELD.pop(self._key, None)
            if _same_file(self._fd, self.path):
                self.path.unlink(missing_ok=True)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def probe_owner(run_dir: Path) -> None:
    """RunDirBusy if a live process owns `run_dir`; writes nothing (a dir without a lock file has no owner)."""
    path = lock_path(run_dir)
    if os.path.abspath(path) in _HELD:
        return  # this process owns it
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = _read_owner(fd)
        who = f"process {owner.get('pid')} on {owner.get('host')}" if owner else "another process"
        raise RunDirBusy(f"run dir {path.parent} is in use by {who}; wait for it, or choose another dir with hydra.run.dir=<dir>") from None
    finally:
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _read_owner(fd: int) -> dict | None:
    try:
        raw = os.pread(fd, 4096, 0)
        return json.loads(raw.decode()) if raw else None
    except (OSError, ValueError):
        return None


class StopRequests:
    """SIGINT/SIGTERM/SIGHUP set `signal`; the loop checks `requested` at safe points."""

    def __init__(self, signals: tuple[int, ...] = STOP_SIGNALS) -> None:
        self.signal: int | None = None
        self.signals = signals
        self._previous: dict[int, object] = {}
        self._announced: int | None = None
        self._since = 0.0

    @property
    def requested(self) -> bool:
        """Polled at safe points; the first poll after a signal says so in the log. Not the handler: logging
        there re-enters a stream the main thread may be writing (a second delivery of the same signal, as
        SLURM signals every process of a step and the job's parent forwards it too, printed 'Logging error')."""
        if self.signal is not None and self._announced != self.signal:
            self._announced = self.signal
            log.warning(f"{signal.Signals(self.signal).name} received: saving a checkpoint and stopping at the next safe point")
        return self.signal is not None

    def _handle(self, signum, frame) -> None:
        if self.signal is not None and signum == signal.SIGINT and time.monotonic() - self._since > SAME_REQUEST_S:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        if self.signal is None:
            self._since = time.monotonic()
        self.signal = signum

    def install(self) -> StopRequests:
        try:
            for sig in self.signals:
                if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
                    continue  # started with nohup: a closed terminal is not a stop request
                self._previous[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread (e.g. a launcher's worker thread): leave signals alone
            self._previous.clear()
        if self._previous:
            _progress["started"] = True
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.signal, 1)

    @property
    def name(self) -> str:
        return signal.Signals(self.signal).name if self.signal else ""


# What a signal arriving outside a run's own handler may say: whether a run has started in this process, and the
# command that continues it once it was interrupted (a second Ctrl-C after the first one's save said so).
_progress: dict[str, object] = {"started": False, "resume": None}


def note_resume_command(command: str) -> None:
    """The run was interrupted and saved: a later signal repeats this command instead of contradicting it."""
    _progress["resume"] = command


def say(line: str, stream=None) -> None:
    """Print one line; a terminal that is gone (SIGHUP: a closed window, a dropped SSH session) swallows it."""
    import sys

    try:
        print(line, file=stream or sys.stdout, flush=True)
    except (OSError, ValueError):
        pass


def _early_stop_line(name: str) -> str:
    if _progress["resume"]:
        return f"stopped by {name}; the run was already interrupted and saved: continue with: {_progress['resume']}"
    if _progress["started"]:
        return f"stopped by {name}; the run's {RESULT} says where it stands"
    return f"stopped by {name} before the run started: no run record was written, nothing to resume"


def honour_stop_signals_from_now() -> None:
    """SIGINT and SIGTERM stop the process from its first line on, whatever it inherited: a shell starts
    background jobs with SIGINT ignored, and Python keeps an ignored SIGINT ignored, so a `kill -INT` in the
    seconds before the run installs its own handler (StopRequests) was lost and the run trained to the end.

    Until then nothing of the run was written, so the process ends at once (`os._exit`). Raising an
    exception instead would land in whatever import is running: a library that catches it there leaves a
    half-imported module behind (numpy.dtypes, in a CI run) and the process failed with a RecursionError."""

    def stop(signum, frame):
        try:
            os.write(2, (_early_stop_line(signal.Signals(signum).name) + "\n").encode())
        except OSError:
            pass
        os._exit(EXIT_CODES.get(signum, 1))

    try:
        for sig in STOP_SIGNALS:
            if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
                continue  # nohup: the user asked the run to outlive its terminal
            signal.signal(sig, stop)
    except ValueError:  # not the main thread
        pass


class Interrupted(Exception):
    """Raised by a task after it stopped at a safe point because a stop was requested."""

    def __init__(self, step: int | None) -> None:
        super().__init__(f"interrupted at step {step}")
        self.step = step

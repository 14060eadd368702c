"""The run dir's owner lock and the stop requests, by hand and in this process (no subprocess: the lock
conflicts between two open files of the same process too, which is how flock works)."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import socket
import threading
import time

import pytest

from pipeline.runtime import rundir
from pipeline.runtime.rundir import (
    SAME_REQUEST_S,
    Interrupted,
    RunDirBusy,
    RunDirLock,
    StopRequests,
    honour_stop_signals_from_now,
    probe_owner,
)


def _hold(path, content: bytes | None = None) -> int:
    """Another owner of `path`: an open file with an exclusive flock on it (and `content` written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    if content is not None:
        os.ftruncate(fd, 0)
        os.pwrite(fd, content, 0)
    return fd


def _free(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


# ---- RunDirLock ------------------------------------------------------------------------------------
def test_the_lock_file_is_dot_lock_in_the_run_dir_and_holds_this_process_as_owner(tmp_path):
    run_dir = tmp_path / "not" / "made" / "yet"
    lock = RunDirLock(run_dir)
    assert lock.path == run_dir / ".lock"
    before = time.time()
    old = os.umask(0o022)
    try:
        lock.acquire()
    finally:
        os.umask(old)
    after = time.time()
    try:
        assert (run_dir / ".lock").stat().st_mode & 0o777 == 0o644
        owner = json.loads((run_dir / ".lock").read_text())
        assert set(owner) == {"pid", "host", "since"}
        assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
        assert before <= owner["since"] <= after
    finally:
        lock.release()


def test_a_second_acquire_in_the_owning_process_shares_the_lock(tmp_path):
    """The CLI takes the run dir's lock before Hydra writes there; the run's lifecycle, in the same process, shares
    it. Another process is refused (test_a_lock_held_by_a_live_process_is_never_removed)."""
    first = RunDirLock(tmp_path)
    first.acquire()
    try:
        inner = RunDirLock(tmp_path)
        inner.acquire()
        inner.release()
        assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()  # the owner's lock stands
        probe_owner(tmp_path)  # its own: not busy
    finally:
        first.release()
    assert not (tmp_path / ".lock").exists()


@pytest.mark.parametrize("content", [None, b"", b"{half a json"])
def test_an_owner_that_wrote_nothing_readable_is_another_process(tmp_path, content):
    fd = _hold(tmp_path / ".lock", content)
    try:
        with pytest.raises(RunDirBusy, match=r"^run dir .* is in use by another process; wait for it"):
            RunDirLock(tmp_path).acquire()
        with pytest.raises(RunDirBusy, match=r"^run dir .* is in use by another process; wait for it"):
            probe_owner(tmp_path)
    finally:
        _free(fd)


def test_a_refused_acquire_keeps_no_file_open_and_no_lock(tmp_path):
    fd = _hold(tmp_path / ".lock", b'{"pid": 1, "host": "h"}')
    lock = RunDirLock(tmp_path)
    with pytest.raises(RunDirBusy, match="process 1 on h"):
        lock.acquire()
    assert lock._fd is None
    _free(fd)
    lock.acquire()  # the owner has gone: now it is ours
    assert lock._fd is not None
    lock.release()


def test_a_stale_lock_of_another_pid_is_taken_over_with_a_note_and_rewritten_whole(tmp_path, caplog):
    stale = {"pid": 999_999_999, "host": "elsewhere", "since": 1.0, "padding": "x" * 500}
    (tmp_path / ".lock").write_text(json.dumps(stale))
    lock = RunDirLock(tmp_path)
    with caplog.at_level(logging.INFO, logger="pipeline"):
        lock.acquire()
    try:
        said = [r.getMessage() for r in caplog.records]
        assert said == [f"took over {tmp_path} from process 999999999 on elsewhere, which is gone"]
        # The shorter new owner replaced the longer old one entirely (no tail of the old text left behind).
        owner = json.loads((tmp_path / ".lock").read_text())
        assert owner["pid"] == os.getpid() and "padding" not in owner
    finally:
        lock.release()


@pytest.mark.parametrize("content", ["", "{not json", None])
def test_a_lock_file_without_a_foreign_owner_is_taken_without_a_note(tmp_path, caplog, content):
    if content is None:
        content = json.dumps({"pid": os.getpid(), "host": "here"})  # this very process wrote it before
    (tmp_path / ".lock").write_text(content)
    lock = RunDirLock(tmp_path)
    with caplog.at_level(logging.INFO, logger="pipeline"):
        lock.acquire()
    lock.release()
    assert not caplog.records


def test_release_removes_the_file_and_lets_go_and_a_second_release_does_nothing(tmp_path):
    with RunDirLock(tmp_path) as lock:
        assert isinstance(lock, RunDirLock) and lock._fd is not None
        assert (tmp_path / ".lock").is_file()
    assert not (tmp_path / ".lock").exists() and lock._fd is None
    lock.release()  # nothing held: nothing happens
    fd = _hold(tmp_path / ".lock")  # nobody holds a lock on the path any more
    _free(fd)


def test_release_leaves_a_lock_file_that_is_no_longer_ours(tmp_path):
    lock = RunDirLock(tmp_path)
    lock.acquire()
    os.unlink(tmp_path / ".lock")
    (tmp_path / ".lock").write_text("someone else's")
    lock.release()
    assert (tmp_path / ".lock").read_text() == "someone else's"
    assert lock._fd is None


def test_release_unlocks_before_it_closes(tmp_path):
    """The lock is dropped with the file removed: a holder of a second descriptor of the same open file (as a
    forked child has) does not keep the lock."""
    lock = RunDirLock(tmp_path)
    lock.acquire()
    dup = os.dup(lock._fd)  # the same open file description, as a forked child holds it
    try:
        lock.release()
        fd = _hold(tmp_path / ".lock")  # would raise BlockingIOError if the lock were still held through `dup`
        _free(fd)
    finally:
        os.close(dup)


def test_acquire_takes_the_file_the_path_names_when_the_one_it_locked_was_removed(tmp_path, monkeypatch):
    """The owner it waited on removed the file as it released it: the lock on the removed file is worth
    nothing, so acquire closes it and locks the file the path names now."""
    real = rundir._same_file
    replaced = []

    def replace_once(fd, path):
        if not replaced:  # between our open and our check, the file at the path is replaced
            os.unlink(path)
            path.write_text("")
            replaced.append(os.stat(path).st_ino)
        return real(fd, path)

    monkeypatch.setattr(rundir, "_same_file", replace_once)
    open_before = len(os.listdir("/proc/self/fd"))
    lock = RunDirLock(tmp_path)
    lock.acquire()
    try:
        assert len(os.listdir("/proc/self/fd")) == open_before + 1  # the first file was closed
        assert os.fstat(lock._fd).st_ino == replaced[0] == os.stat(tmp_path / ".lock").st_ino
        assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
    finally:
        monkeypatch.setattr(rundir, "_same_file", real)
        lock.release()


def test_same_file_is_false_for_a_missing_path_and_another_file(tmp_path):
    (tmp_path / "a").write_text("a")
    (tmp_path / "b").write_text("b")
    fd = os.open(tmp_path / "a", os.O_RDONLY)
    try:
        assert rundir._same_file(fd, tmp_path / "a") is True
        assert rundir._same_file(fd, tmp_path / "b") is False
        assert rundir._same_file(fd, tmp_path / "missing") is False
    finally:
        os.close(fd)
    assert rundir._same_file(fd, tmp_path / "a") is False  # a closed descriptor


def test_read_owner_reads_the_json_at_the_start_of_the_file(tmp_path):
    path = tmp_path / "owner"
    path.write_text('{"pid": 4, "host": "h"}')
    fd = os.open(path, os.O_RDWR)
    try:
        os.lseek(fd, 0, os.SEEK_END)  # pread reads from offset 0 whatever the position
        assert rundir._read_owner(fd) == {"pid": 4, "host": "h"}
        os.ftruncate(fd, 0)
        assert rundir._read_owner(fd) is None
        os.pwrite(fd, b"\xff\xfe", 0)  # not UTF-8
        assert rundir._read_owner(fd) is None
    finally:
        os.close(fd)
    assert rundir._read_owner(fd) is None  # a closed descriptor: OSError


# ---- probe_owner ------------------------------------------------------------------------------------
def test_probe_owner_of_a_dir_without_a_lock_file_says_nothing_and_writes_nothing(tmp_path):
    assert probe_owner(tmp_path) is None
    assert probe_owner(tmp_path / "missing") is None
    assert list(tmp_path.iterdir()) == []


def test_probe_owner_names_a_live_owner_and_lets_go_of_a_free_lock(tmp_path):
    fd = _hold(tmp_path / ".lock", b'{"pid": 42, "host": "node7"}')
    with pytest.raises(RunDirBusy) as err:
        probe_owner(tmp_path)
    assert str(err.value) == (
        f"run dir {tmp_path} is in use by process 42 on node7; wait for it, or choose another dir with hydra.run.dir=<dir>"
    )
    assert err.value.__suppress_context__
    _free(fd)
    assert probe_owner(tmp_path) is None  # a lock file nobody holds: no owner
    assert (tmp_path / ".lock").read_text() == '{"pid": 42, "host": "node7"}'  # read, not written
    fd = _hold(tmp_path / ".lock")  # the probe let go of the lock it took
    _free(fd)


# ---- StopRequests ---------------------------------------------------------------------------------
def test_exit_codes_are_128_plus_the_signal_for_int_term_and_usr2_else_1():
    stops = StopRequests()
    assert stops.signals == (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    assert stops.signal is None and not stops.requested and stops.name == ""
    assert stops.exit_code == 1
    for sig, code, name in [(signal.SIGINT, 130, "SIGINT"), (signal.SIGTERM, 143, "SIGTERM"), (signal.SIGUSR2, 140, "SIGUSR2"), (signal.SIGHUP, 129, "SIGHUP")]:
        stops = StopRequests()
        stops._handle(sig, None)
        assert stops.signal == sig and stops.exit_code == code and stops.name == name


def _first_asks_only(stops: StopRequests, sig) -> None:
    """A KeyboardInterrupt escaping a test stops pytest itself: turn it into this test's failure."""
    try:
        stops._handle(sig, None)
    except KeyboardInterrupt:
        pytest.fail(f"{signal.Signals(sig).name} raised KeyboardInterrupt where it should only set the flag")
    assert stops.signal == sig


def test_a_second_sigint_raises_keyboard_interrupt_a_second_sigterm_does_not():
    stops = StopRequests()
    _first_asks_only(stops, signal.SIGINT)
    # The same Ctrl-C delivered twice at once (a sweep's process and its worker both pass it on): one request.
    _first_asks_only(stops, signal.SIGINT)
    stops._since -= 2 * SAME_REQUEST_S  # a second Ctrl-C, later: stop now
    with pytest.raises(KeyboardInterrupt):
        stops._handle(signal.SIGINT, None)
    stops = StopRequests()
    _first_asks_only(stops, signal.SIGTERM)
    _first_asks_only(stops, signal.SIGTERM)
    assert stops.signal == signal.SIGTERM
    stops._since -= 2 * SAME_REQUEST_S
    with pytest.raises(KeyboardInterrupt):
        stops._handle(signal.SIGINT, None)  # a Ctrl-C after a SIGTERM: stop now too


def test_each_new_signal_is_announced_once_at_the_next_poll(caplog):
    stops = StopRequests()
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        assert stops.requested is False
        stops._handle(signal.SIGTERM, None)
        assert not caplog.records  # the handler logs nothing
        assert stops.requested is True and stops.requested is True
        stops._handle(signal.SIGUSR2, None)
        assert stops.requested is True
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    tail = "received: saving a checkpoint and stopping at the next safe point"
    assert said == [("WARNING", f"SIGTERM {tail}"), ("WARNING", f"SIGUSR2 {tail}")]


def test_install_routes_the_signals_to_the_flag_and_uninstall_puts_back_what_was_there():
    def before(signum, frame):
        pass

    previous = signal.signal(signal.SIGUSR1, before)
    try:
        stops = StopRequests((signal.SIGUSR1,))
        assert stops.install() is stops
        assert signal.getsignal(signal.SIGUSR1) == stops._handle
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stops.signal == signal.SIGUSR1
        stops.uninstall()
        assert signal.getsignal(signal.SIGUSR1) is before
        assert stops._previous == {}
        stops.uninstall()  # twice: nothing left to put back
        assert signal.getsignal(signal.SIGUSR1) is before
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_install_outside_the_main_thread_leaves_the_signals_alone():
    previous = signal.getsignal(signal.SIGUSR1)
    seen = {}

    def worker():
        try:
            stops = StopRequests((signal.SIGUSR1,))
            seen["returned"] = stops.install() is stops
            seen["previous"] = dict(stops._previous)
        except Exception as exc:  # noqa: BLE001 - reported to the main thread
            seen["error"] = exc

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == {"returned": True, "previous": {}}
    assert signal.getsignal(signal.SIGUSR1) is previous


# ---- honour_stop_signals_from_now ---------------------------------------------------------------------
def _forked_stop(sig) -> tuple[int, str]:
    """Fork a child that installs the early handlers and signals itself: its exit code and what it wrote to fd 2."""
    read, write = os.pipe()
    previous = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    # Installed here and inherited by the child (mutmut learns which tests reach a function from this process).
    honour_stop_signals_from_now()
    pid = os.fork()
    if pid == 0:  # the child: never returns to pytest
        try:
            rundir._progress.update(started=False, resume=None)  # a fresh process: no run has started in it
            os.close(read)
            os.dup2(write, 2)
            os.kill(os.getpid(), sig)
            time.sleep(2)
        finally:
            os._exit(99)
    signal.signal(signal.SIGINT, previous[0])
    signal.signal(signal.SIGTERM, previous[1])
    signal.signal(signal.SIGHUP, previous[2])
    os.close(write)
    with os.fdopen(read) as f:
        said = f.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), said


def test_the_early_handler_is_installed_for_sigint_and_sigterm_in_this_process():
    """Also here, not only in a forked child: mutmut learns which tests reach a function from this process."""
    previous = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        honour_stop_signals_from_now()
        now = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])
    assert callable(now[0]) and now[0] is now[1] and now[0] not in previous
    assert now[0].__name__ == "stop"


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stop_signal_before_the_run_starts_ends_the_process_at_once_saying_so(sig, code):
    got, said = _forked_stop(sig)
    name = signal.Signals(sig).name
    assert (got, said) == (code, f"stopped by {name} before the run started: no run record was written, nothing to resume\n")


def test_honour_stop_signals_outside_the_main_thread_changes_nothing():
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    seen = {}

    def worker():
        try:
            honour_stop_signals_from_now()
            seen["ok"] = True
        except Exception as exc:  # noqa: BLE001 - reported to the main thread
            seen["error"] = exc

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == {"ok": True}
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == previous


def test_interrupted_names_its_step():
    exc = Interrupted(12)
    assert exc.step == 12 and str(exc) == "interrupted at step 12"
    assert str(Interrupted(None)) == "interrupted at step None"

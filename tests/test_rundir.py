"""The run dir's owner lock: a finished run leaves no `.lock` behind, and a lock a live process holds is never removed."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

import pytest

from pipeline.runtime.rundir import RunDirBusy, RunDirLock, StopRequests, probe_owner

# Holds the lock in another process; releases it (as a finished run does) when its stdin closes, or is killed.
OWNER = """
import sys
from pipeline.runtime.rundir import RunDirLock
lock = RunDirLock(sys.argv[1])
lock.acquire()
print("locked", flush=True)
sys.stdin.read()
lock.release()
print("released", flush=True)
"""


def _owner(run_dir) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", OWNER, str(run_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_released_lock_leaves_no_file_and_the_dir_can_be_owned_again(tmp_path):
    lock = RunDirLock(tmp_path)
    lock.acquire()
    assert (tmp_path / ".lock").is_file()
    lock.release()
    assert not (tmp_path / ".lock").exists()
    with RunDirLock(tmp_path):
        probe_owner(tmp_path)  # this process's own lock (the CLI's, which the run's lifecycle shares)
        with RunDirLock(tmp_path):
            pass
        assert (tmp_path / ".lock").is_file()  # the inner, shared acquire's release keeps the outer one's lock
        assert _probe_elsewhere(tmp_path) == "busy"
    assert not (tmp_path / ".lock").exists()
    probe_owner(tmp_path)  # no owner now
    assert _probe_elsewhere(tmp_path) == "free"


def _probe_elsewhere(run_dir) -> str:
    """probe_owner from another process: 'busy' or 'free'."""
    code = ("import sys; from pathlib import Path; from pipeline.runtime.rundir import RunDirBusy, probe_owner\n"
            "try:\n    probe_owner(Path(sys.argv[1])); print('free')\nexcept RunDirBusy:\n    print('busy')")
    return subprocess.run([sys.executable, "-c", code, str(run_dir)], capture_output=True, text=True, check=True).stdout.strip()


def test_a_lock_held_by_a_live_process_is_never_removed(tmp_path):
    proc = _owner(tmp_path)
    try:
        with pytest.raises(RunDirBusy, match=str(proc.pid)):
            RunDirLock(tmp_path).acquire()
        assert (tmp_path / ".lock").is_file()  # the refused process took nothing away
        with pytest.raises(RunDirBusy):
            probe_owner(tmp_path)
    finally:
        proc.stdin.close()
    assert proc.stdout.readline().strip() == "released" and proc.wait() == 0
    assert not (tmp_path / ".lock").exists()


def test_a_killed_owner_leaves_its_lock_to_be_taken_over_then_removed(tmp_path):
    proc = _owner(tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (tmp_path / ".lock").is_file()  # nothing could remove it: the report reads the owner from it
    lock = RunDirLock(tmp_path)
    lock.acquire()  # the kernel let go of the dead owner's lock
    lock.release()
    assert not (tmp_path / ".lock").exists()


def test_a_finished_run_leaves_no_lock_file(make_cfg, tmp_path):
    from pipeline.runtime.run import run

    (record,) = run(make_cfg("experiment=dqn_cartpole", "trainer=debug", "trainer.enable_progress_bar=false"), tmp_path)
    assert record["status"] == "ok", record["error"]
    assert not (tmp_path / ".lock").exists()


def test_a_signal_delivered_twice_is_one_stop_announced_once_and_never_logged_inside_the_handler(caplog):
    """SLURM signals every process of a step and the job's parent forwards the signal too: the run gets it twice.
    The handler only records it (logging inside a handler re-enters a stream being written: 'Logging error');
    the first poll at a safe point says it once."""
    stops = StopRequests((signal.SIGUSR2,)).install()
    try:
        with caplog.at_level(logging.WARNING, logger="pipeline"):
            os.kill(os.getpid(), signal.SIGUSR2)
            os.kill(os.getpid(), signal.SIGUSR2)
            assert stops.signal == signal.SIGUSR2
            assert not caplog.records  # nothing logged from the handler
            assert stops.requested and stops.requested
        said = [r.getMessage() for r in caplog.records]
        assert said == ["SIGUSR2 received: saving a checkpoint and stopping at the next safe point"], said
        assert stops.exit_code == 140
    finally:
        stops.uninstall()

"""A live run's result.json says `running` and names its process (pid, host), not `failed` ("killed, or still
running"); a reader that finds that process gone reads `failed`, with the checkpoint's step and the command that
continues the run; one on another host (not checkable from here) stays `running`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from pipeline.store.owner import settled, this_process
from pipeline.store.record import read_record, read_result


def _gone_owner() -> dict:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    since = time.time()
    proc.wait()
    return {"pid": proc.pid, "host": socket.gethostname(), "since": since}


def _live_record(run_dir, owner, checkpoint_step=None):
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {"experiment": "e", "group": "g", "task": "DQNTask", "seed": 0, "run_dir": str(run_dir), "status": "running",
              "error": None, "owner": owner, "segments": [{"started": "2026-12-07T19:00:00", "from_step": None}],
              "resume_command": "python -m pipeline experiment=dqn_cartpole hydra.run.dir=x ckpt_path=last",
              "checkpoint": None if checkpoint_step is None else {"step": checkpoint_step}}
    (run_dir / "result.json").write_text(json.dumps(record))
    return run_dir


def test_a_record_whose_process_runs_says_running(tmp_path):
    run_dir = _live_record(tmp_path / "r", this_process())
    assert read_result(run_dir)["status"] == "running" and read_result(run_dir)["error"] is None
    assert read_record(run_dir).status == "running"


def test_a_record_whose_process_is_gone_reads_failed_with_the_resume_command(tmp_path):
    owner = _gone_owner()
    run_dir = _live_record(tmp_path / "r", owner, checkpoint_step=256)
    got = read_result(run_dir)
    assert got["status"] == "failed" and got["error"] == (
        f"run did not finish (killed: its process {owner['pid']} on {owner['host']} is gone); its checkpoint holds "
        "step 256; continue with: python -m pipeline experiment=dqn_cartpole hydra.run.dir=x ckpt_path=last")
    assert json.loads((run_dir / "result.json").read_text())["status"] == "running"  # reading changes no file
    fresh = _live_record(tmp_path / "r2", owner)
    assert "no checkpoint was written yet; continue with: python -m pipeline" in read_result(fresh)["error"]


def test_a_process_on_another_host_cannot_be_checked_and_stays_running(tmp_path):
    run_dir = _live_record(tmp_path / "r", {"pid": 1, "host": "not-" + socket.gethostname(), "since": time.time()})
    assert read_result(run_dir)["status"] == "running"


def test_a_reused_pid_is_not_the_owner():
    """The pid of a process started after the record named it (pid reuse) is not the run's."""
    assert settled({"status": "running", "owner": {**this_process(), "since": time.time() - 3600}}, ".")["status"] == "failed"


def test_other_statuses_are_as_written(tmp_path):
    for status in ("ok", "failed", "interrupted", "pruned"):
        data = {"status": status, "error": None, "owner": _gone_owner()}
        assert settled(data, tmp_path) is data


@pytest.mark.slow
def test_a_live_run_says_running_and_after_kill_9_its_readers_say_failed(tmp_path):
    from pipeline_testing import run_module, start_module

    proc = start_module("pipeline", "experiment=supervised_digits", "trainer.max_epochs=400", "checkpoint.every_s=0",
                        "trainer.enable_progress_bar=false", f"hydra.run.dir={tmp_path}")
    try:
        deadline = time.time() + 300
        raw = {}
        while time.time() < deadline and not (raw.get("checkpoint") or {}).get("step"):
            time.sleep(0.3)
            try:
                raw = json.loads((tmp_path / "result.json").read_text())
            except (OSError, ValueError):
                pass
        assert raw.get("status") == "running" and raw["error"] is None, raw
        assert raw["owner"]["pid"] == proc.pid and raw["owner"]["host"] == socket.gethostname()
        assert read_result(tmp_path)["status"] == "running"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    got = read_result(tmp_path)
    assert got["status"] == "failed" and "run did not finish (killed" in got["error"] and "ckpt_path=last" in got["error"]
    report = run_module("pipeline.report", str(tmp_path), "--out", str(tmp_path.parent / "rep"))
    counts = json.loads((tmp_path.parent / "rep" / "report.json").read_text())["status_counts"]
    assert counts["failed"] == 1 and counts["running"] == 0, report.stdout + report.stderr


def test_a_killed_process_not_yet_reaped_is_gone(tmp_path):
    """A zombie (killed, its parent has not waited for it yet) is not the run's live owner."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    since = time.time()
    owner = {"pid": proc.pid, "host": socket.gethostname(), "since": since}
    try:
        assert read_result(_live_record(tmp_path / "r", owner))["status"] == "running"
        os.kill(proc.pid, signal.SIGKILL)
        deadline = time.time() + 30
        import psutil

        while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE and time.time() < deadline:
            time.sleep(0.05)
        assert read_result(tmp_path / "r")["status"] == "failed"
    finally:
        proc.wait()

"""Every status a run record can hold is counted and shown: ok, failed, interrupted, pruned, running (and any
other a record names), in report.json, report.md, the CLI's summary and the W&B summary."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest
from report_runs import write_run

from pipeline.report import build_report
from pipeline.report.cli import summary_lines
from pipeline.report.wandb_summary import per_seed_rows, summary_values

GROUP = "dqn_cartpole"
# Holds a run dir's lock the way a training process does (pipeline's own RunDirLock), then waits.
OWNER = """
import sys, time
from pipeline.runtime.rundir import RunDirLock
RunDirLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""


def _unfinished(run_dir, seed):
    """The record run.py writes at the start: status failed, a segment that has not closed."""
    return write_run(run_dir, seed=seed, group=GROUP, value=None, status="failed",
                     error="run did not finish (killed, or still running)",
                     extra={"segments": [{"started": "2026-01-01T00:00:00", "from_step": None, "pid": 1}]})


def _own(run_dir, seconds):
    proc = subprocess.Popen([sys.executable, "-c", OWNER, str(run_dir), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    sweep = tmp_path_factory.mktemp("statuses")
    for seed, value in enumerate([400.0, 450.0, 500.0]):
        write_run(sweep / str(seed), seed=seed, group=GROUP, value=value)
    write_run(sweep / "3", seed=3, group=GROUP, value=None, status="failed", error="ValueError: NaN loss")
    write_run(sweep / "4", seed=4, group=GROUP, value=None, status="interrupted", error=None,
              extra={"interrupted": {"signal": "SIGTERM", "step": 2048, "resume": "python -m pipeline ckpt_path=last"}})
    # The tuner stopped it: a shortened run's value must not enter the statistics.
    write_run(sweep / "5", seed=5, group=GROUP, value=9.0,
              rl={"env_steps": 2048, "early_stop": {"env_step": 2048, "reason": "pruned by the tuner"}})
    write_run(sweep / "6", seed=6, group=GROUP, value=None, status="exploded", error="a status from the future")
    _unfinished(sweep / "7", 7)
    _unfinished(sweep / "8", 8)
    killed = _own(sweep / "8", 0)  # its owner exits: the lock names a process that is gone
    killed.wait(timeout=60)
    running = _own(sweep / "7", 120)
    try:
        report = build_report([sweep], sweep / "report", reps=100)
    finally:
        running.kill()
        running.wait()
    return sweep, report


def test_every_status_is_counted_in_report_json(mixed):
    sweep, report = mixed
    counts = {"ok": 3, "failed": 2, "interrupted": 1, "pruned": 1, "running": 1, "exploded": 1}
    assert report["status_counts"] == counts
    assert json.loads((sweep / "report" / "report.json").read_text())["status_counts"] == counts
    assert report["partial"] is True
    g = report["groups"][GROUP]
    assert (g["n_ok"], g["n_failed"], g["n_interrupted"], g["n_pruned"], g["n_running"]) == (3, 2, 1, 1, 1)
    assert g["status_counts"] == counts
    # Only the three ok runs are in the statistics: the pruned run's 9.0 is not.
    assert g["values"] == [400.0, 450.0, 500.0] and g["min"] == 400.0
    assert [e["seed"] for e in g["failed"]] == [3, 8] and [e["seed"] for e in g["running"]] == [7]
    assert g["interrupted"][0]["error"] == "interrupted by SIGTERM at step 2048; resume: python -m pipeline ckpt_path=last"
    assert "still running" in g["running"][0]["error"] and "pruned by the tuner at step 2048" in g["pruned"][0]["error"]
    assert g["other_status"] == {"exploded": [{"seed": 6, "error": "a status from the future", "dir": str((sweep / "6").resolve()),
                                               "relative_dir": "6"}]}
    warnings = " ".join(report["warnings"])
    for text in ("2 failed runs", "1 interrupted run", "pruned by the tuner", "still running: this report is partial",
                 "status 'exploded'"):
        assert text in warnings, text


def test_every_status_is_shown_in_report_md_and_the_cli(mixed):
    sweep, report = mixed
    text = (sweep / "report" / "report.md").read_text()
    assert "Runs by status: ok 3, failed 2, interrupted 1, pruned 1, running 1, exploded 1." in text
    assert "> **Partial report:** 1 run(s) still running" in text
    assert "| group | primary metric | ok | failed | interrupted | pruned | running |" in text
    assert f"| {GROUP} | eval/return_mean | 3 | 2 | 1 | 1 | 1 |" in text
    for title in ("Failed runs:", "Interrupted runs", "Pruned runs", "Runs still running", "Runs with status `exploded`:"):
        assert title in text, title
    lines = summary_lines(report)
    assert lines[0].split()[:7] == ["group", "metric", "ok", "failed", "interrupted", "pruned", "running"]
    assert lines[1].split()[:7] == [GROUP, "eval/return_mean", "3", "2", "1", "1", "1"]


def test_every_status_reaches_the_wandb_summary(mixed):
    _, report = mixed
    values = summary_values(report)
    assert {k: values[f"runs/{k}"] for k in ("ok", "failed", "interrupted", "pruned", "running")} == {
        "ok": 3, "failed": 2, "interrupted": 1, "pruned": 1, "running": 1}
    assert values["partial"] is True
    assert (values[f"{GROUP}/n_interrupted"], values[f"{GROUP}/n_pruned"], values[f"{GROUP}/n_running"]) == (1, 1, 1)
    statuses = sorted(row[2] for row in per_seed_rows(report))
    assert statuses == sorted(["ok"] * 3 + ["failed"] * 2 + ["interrupted", "pruned", "running", "exploded"])


def test_a_finished_report_is_not_partial(tmp_path):
    for seed in range(2):
        write_run(tmp_path / str(seed), seed=seed, group=GROUP, value=1.0)
    report = build_report([tmp_path], tmp_path / "out", reps=50)
    assert report["partial"] is False and report["status_counts"]["running"] == 0
    assert "Partial report" not in (tmp_path / "out" / "report.md").read_text()


def test_a_record_that_says_running_is_running(tmp_path):
    """A record written with status running (no lock to check) counts as running, and the report is partial."""
    write_run(tmp_path / "0", seed=0, group=GROUP, value=1.0)
    write_run(tmp_path / "1", seed=1, group=GROUP, value=None, status="running", error=None)
    report = build_report([tmp_path], tmp_path / "out", reps=50)
    g = report["groups"][GROUP]
    assert report["partial"] is True and g["n_running"] == 1 and g["n_ok"] == 1
    assert g["running"][0]["error"] == "still running: the report is partial"


def test_an_unfinished_run_owned_on_another_host_counts_as_running_not_failed(tmp_path):
    """The lock names a process on another host (a cluster node): this host cannot check it, so the run may still be
    training; the report counts it running, says why, and is partial. A lock naming a gone local process: failed."""
    from pipeline.store.layout import lock_path

    write_run(tmp_path / "0", seed=0, group=GROUP, value=1.0)
    _unfinished(tmp_path / "1", 1)
    lock_path(tmp_path / "1").write_text(json.dumps({"pid": os.getpid(), "host": "node7.invalid", "since": time.time()}))
    _unfinished(tmp_path / "2", 2)
    lock_path(tmp_path / "2").write_text(json.dumps({"pid": 2**22 + 12345, "host": socket.gethostname(), "since": time.time()}))
    report = build_report([tmp_path], tmp_path / "out", reps=50)
    g = report["groups"][GROUP]
    assert (g["n_ok"], g["n_running"], g["n_failed"], report["partial"]) == (1, 1, 1, True)
    assert [e["seed"] for e in g["running"]] == [1] and [e["seed"] for e in g["failed"]] == [2]
    assert "node7.invalid, which this host cannot check" in g["running"][0]["error"]

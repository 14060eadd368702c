"""SIGHUP (a closed terminal, a dropped SSH session) is a stop request like SIGINT and SIGTERM, and a second signal
after the first one's save never contradicts it."""

import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from pipeline.runtime.rundir import StopRequests
from pipeline_testing import read_result, run_cli, start_module


def test_a_sighup_the_process_inherited_as_ignored_stays_ignored():
    """`nohup python -m pipeline ...`: the user asked the run to outlive its terminal."""
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        stop = StopRequests().install()
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN and signal.getsignal(signal.SIGINT) == stop._handle
        stop.uninstall()
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        stop = StopRequests().install()
        assert signal.getsignal(signal.SIGHUP) == stop._handle
        stop._handle(signal.SIGHUP, None)
        assert stop.requested and stop.exit_code == 129 and stop.name == "SIGHUP"
        stop.uninstall()
    finally:
        signal.signal(signal.SIGHUP, before)


SECOND_SIGNAL = """
import os, signal, sys, time
from pipeline.runtime.rundir import honour_stop_signals_from_now, note_resume_command, StopRequests
honour_stop_signals_from_now()
if sys.argv[1] != "before":
    stop = StopRequests().install()  # the run started ...
    stop.uninstall()
if sys.argv[1] == "saved":
    note_resume_command("python -m pipeline hydra.run.dir=/runs/a ckpt_path=last")  # ... and its first signal saved it
os.kill(os.getpid(), signal.SIGINT)
time.sleep(30)
"""


@pytest.mark.parametrize("when", ["before", "running", "saved"])
def test_a_signal_outside_the_runs_own_handler_says_what_is_true(when):
    """A double Ctrl-C printed "interrupted ... continue with: ..." and then "stopped by SIGINT before the run
    started: ... nothing to resume"."""
    done = subprocess.run([sys.executable, "-c", SECOND_SIGNAL, when], capture_output=True, text=True, timeout=60)
    assert done.returncode == 130
    line = done.stderr.strip().splitlines()[-1]
    assert ("nothing to resume" in line) == (when == "before"), line
    if when == "saved":
        assert line.endswith("continue with: python -m pipeline hydra.run.dir=/runs/a ckpt_path=last"), line


@pytest.mark.slow
def test_sighup_saves_records_interrupted_and_the_printed_command_continues(tmp_path):
    args = ("experiment=supervised_digits", "scheduler=none", "checkpoint.every_s=3600", "trainer.enable_progress_bar=false",
            f"hydra.run.dir={tmp_path}")
    proc = start_module("pipeline", *args, "trainer.max_epochs=5000")

    def epochs_done() -> int:
        try:
            return int(pd.read_csv(tmp_path / "metrics.csv").dropna(subset=["val/acc"])["step"].max()) + 1
        except (OSError, ValueError, KeyError, pd.errors.EmptyDataError):
            return 0

    end = time.monotonic() + 240
    while epochs_done() < 3 and proc.poll() is None and time.monotonic() < end:
        time.sleep(0.2)
    proc.send_signal(signal.SIGHUP)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 129, out[-2000:]  # was: killed at once, nothing saved, no message
    record = read_result(tmp_path)
    assert record["status"] == "interrupted" and record["interrupted"]["signal"] == "SIGHUP", record
    step = record["interrupted"]["step"]
    assert isinstance(step, int) and step >= 2 and record["checkpoint"]["step"] == step
    assert f"interrupted by SIGHUP at step {step}; continue with: " in out
    resumed = run_cli(*args, f"trainer.max_epochs={step + 3}", "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert read_result(tmp_path)["status"] == "ok"
    assert pd.read_csv(tmp_path / "metrics.csv").dropna(subset=["val/acc"])["step"].tolist() == list(range(step + 3))

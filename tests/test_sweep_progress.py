"""A sweep's progress line, read from what its jobs write into the sweep dir (any launcher's jobs can)."""

from __future__ import annotations

import io
import os

import pytest
from omegaconf import OmegaConf

from pipeline.runtime.progress_lines import LIVE_STATUS_ENV, bar_on_terminal
from pipeline.sweep_progress import (
    SweepProgress,
    job_ended,
    job_started,
    planned_jobs,
    read_snapshot,
    start_sweep,
)

T0 = 1_000_000.0


def test_the_line_counts_done_running_failed_and_the_eta_from_the_jobs_durations(tmp_path):
    start_sweep(tmp_path, 20, now=T0)
    for num in range(7):  # 7 jobs of 2 minutes each, one of them failed
        job_started(tmp_path, num, now=T0 + 120 * num)
        job_ended(tmp_path, num, "failed" if num == 3 else "ok", now=T0 + 120 * (num + 1))
    now = T0 + 900
    for num in range(7, 10):  # 3 running side by side for a minute
        job_started(tmp_path, num, now=now - 60)
    # Left: 3 x (120 - 60) s for the running ones + 10 jobs x 120 s not started = 1380 s of work, 3 at a time: 460 s.
    snap = read_snapshot(tmp_path, now=now)
    assert snap.eta_s == pytest.approx(460.0)
    assert snap.line() == "[7/20 done, 3 running, 1 failed, ETA 8 min]"


def test_other_endings_are_named_and_a_finished_sweep_says_how_long_it_took(tmp_path):
    start_sweep(tmp_path, 3, now=T0)
    for num, status in enumerate(["ok", "interrupted", "ok"]):
        job_started(tmp_path, num, now=T0)
        job_ended(tmp_path, num, status, now=T0 + 30)
    assert read_snapshot(tmp_path, now=T0 + 95).line() == "[3/3 done, 0 running, 0 failed, 1 interrupted, took 2 min]"


def test_no_eta_before_a_job_ends_nor_without_a_planned_total(tmp_path):
    start_sweep(tmp_path, 4, now=T0)
    job_started(tmp_path, 0, now=T0)
    assert read_snapshot(tmp_path, now=T0 + 5).line() == "[0/4 done, 1 running, 0 failed]"
    start_sweep(tmp_path, None, now=T0)  # the tuner: no total known; a new start forgets the old jobs
    job_started(tmp_path, 5, now=T0)
    job_ended(tmp_path, 5, "ok", now=T0 + 10)
    assert read_snapshot(tmp_path, now=T0 + 20).line() == "[1 done, 0 running, 0 failed]"


def test_planned_jobs_is_the_product_of_the_basic_sweepers_overrides():
    def config(target, *overrides):
        return OmegaConf.create({"hydra": {"sweeper": {"_target_": target, "params": None},
                                           "overrides": {"task": list(overrides)}}})

    basic = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
    assert planned_jobs(config(basic, "experiment=dqn_cartpole", "seed=range(0,10)", "optimizer.lr=0.1,0.01")) == 20
    assert planned_jobs(config(basic, "experiment=dqn_cartpole")) == 1
    assert planned_jobs(config("hydra_plugins.pipeline_optuna_sweeper.sweeper.PipelineOptunaSweeper", "seed=range(0,3)")) is None


def test_plain_lines_follow_each_finished_job_once(tmp_path, capsys):
    start_sweep(tmp_path, 2)
    progress = SweepProgress(tmp_path, live=False, interval_s=3600).start()
    # Jobs started from this process (joblib's workers share one terminal) write progress lines, not bars.
    assert os.environ.get(LIVE_STATUS_ENV) == "1" and not bar_on_terminal(_Terminal())
    job_started(tmp_path, 0)
    job_started(tmp_path, 1)
    progress.update()
    assert capsys.readouterr().out == ""  # nothing finished yet: nothing to say in a log
    job_ended(tmp_path, 0, "ok")
    progress.update()
    progress.update()
    assert capsys.readouterr().out.startswith("[1/2 done, 1 running, 0 failed, ETA ")
    job_ended(tmp_path, 1, "failed")
    progress.stop()
    assert capsys.readouterr().out.startswith("[2/2 done, 0 running, 1 failed, took ")
    assert LIVE_STATUS_ENV not in os.environ


def test_on_a_terminal_the_line_is_live_and_prints_go_above_it(tmp_path, capsys):
    from rich.console import Console

    screen = io.StringIO()
    start_sweep(tmp_path, 2)
    progress = SweepProgress(tmp_path, live=True, console=Console(file=screen, force_terminal=True, width=120),
                             interval_s=3600).start()
    job_started(tmp_path, 0)
    progress.update()
    print("[job 0] seed=0 ok")  # a job's own line, printed while the live line shows
    job_ended(tmp_path, 0, "ok")
    progress.update()
    drawn = screen.getvalue()
    # While the status line is live, a job's progress in this process writes lines above it, not a second bar.
    assert os.environ.get(LIVE_STATUS_ENV) == "1" and not bar_on_terminal(_Terminal())
    assert "[0/2 done, 1 running, 0 failed]" in drawn and "[1/2 done, 0 running, 0 failed, ETA" in drawn
    assert "\x1b[" in drawn  # redrawn in place (cursor control), not appended line by line
    assert drawn.index("[job 0] seed=0 ok") < drawn.index("[1/2 done")  # the print went above the line
    progress.stop()
    assert capsys.readouterr().out.startswith("[1/2 done, 0 running, 0 failed, ETA ")  # the last state stays, plain
    assert LIVE_STATUS_ENV not in os.environ and bar_on_terminal(_Terminal())  # the terminal is the job's again


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_durations_read_at_a_glance():
    from pipeline.sweep_progress import duration

    assert [duration(s) for s in (0.2, 45, 59.5, 61, 3600, 3900)] == ["1 s", "45 s", "1 min", "2 min", "1 h 00 min", "1 h 05 min"]


def test_a_job_that_never_said_it_ended_is_counted_lost_when_the_sweep_ends(tmp_path, capsys):
    start_sweep(tmp_path, 2)
    progress = SweepProgress(tmp_path, live=False, interval_s=3600).start()
    job_started(tmp_path, 0)
    job_ended(tmp_path, 0, "ok")
    job_started(tmp_path, 1)  # its worker was killed: no end is ever written
    progress.stop()
    assert capsys.readouterr().out.startswith("[2/2 done, 0 running, 0 failed, 1 lost, took ")

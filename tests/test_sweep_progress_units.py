"""sweep_progress.py piece by piece: the files a sweep and its jobs write, the snapshot read from them, the line
and the ETA worked out by hand, and the shower's plain and live modes."""

from __future__ import annotations

import io
import json
import logging
import os
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipeline import sweep_progress
from pipeline.sweep_progress import (
    Snapshot,
    SweepProgress,
    close_unfinished,
    duration,
    job_ended,
    job_started,
    planned_jobs,
    progress_dir,
    read_snapshot,
    start_sweep,
)

T0 = 1_000_000.0


def files(sweep_dir: Path) -> dict[str, dict]:
    folder = sweep_dir / ".progress"
    return {p.name: json.loads(p.read_text()) for p in sorted(folder.iterdir())}


def test_the_progress_folder_is_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert progress_dir("sweeps/a") == tmp_path / "sweeps" / "a" / ".progress"
    assert progress_dir(tmp_path / "b") == tmp_path / "b" / ".progress"


def test_what_the_sweep_and_its_jobs_write(tmp_path):
    start_sweep(tmp_path, 3, now=T0)
    job_started(tmp_path, 7, now=T0 + 1)
    job_started(tmp_path, "8", now=T0 + 2)
    job_ended(tmp_path, 8, "failed", now=T0 + 12)
    job_ended(tmp_path, 9, 0, now=T0 + 13)  # never said it started; a status of any kind is written as text
    assert files(tmp_path) == {
        "job7.json": {"started": T0 + 1},
        "job8.json": {"started": T0 + 2, "ended": T0 + 12, "status": "failed"},
        "job9.json": {"started": None, "ended": T0 + 13, "status": "0"},
        "sweep.json": {"total": 3, "started": T0, "pid": os.getpid(), "finished_before": {}},
    }


def test_the_clock_is_read_when_no_time_is_given(tmp_path, monkeypatch):
    monkeypatch.setattr(time, "time", lambda: 4242.0)
    start_sweep(tmp_path, None)
    job_started(tmp_path, 0)
    job_started(tmp_path, 1)
    job_ended(tmp_path, 1, "ok")
    assert files(tmp_path) == {
        "job0.json": {"started": 4242.0},
        "job1.json": {"started": 4242.0, "ended": 4242.0, "status": "ok"},
        "sweep.json": {"total": None, "started": 4242.0, "pid": os.getpid(), "finished_before": {}},
    }
    monkeypatch.setattr(time, "time", lambda: 4250.0)
    snap = read_snapshot(tmp_path)
    assert snap.elapsed_s == 8.0 and snap.running_ages_s == [8.0]
    close_unfinished(tmp_path)
    assert files(tmp_path)["job0.json"] == {"started": 4242.0, "ended": 4250.0, "status": "lost"}


def test_a_new_start_forgets_the_old_jobs_only(tmp_path):
    start_sweep(tmp_path, 2, now=T0)
    job_started(tmp_path, 0, now=T0)
    (tmp_path / ".progress" / "notes.json").write_text("{}")
    start_sweep(tmp_path, 5, now=T0 + 100)
    assert sorted(files(tmp_path)) == ["notes.json", "sweep.json"]
    assert files(tmp_path)["sweep.json"]["total"] == 5


def test_a_resumed_sweep_counts_its_skipped_jobs_with_the_time_they_took_before(tmp_path):
    """The issue's case: 4 jobs of 60 s; the first attempt finished jobs 0 and 1 and was killed during job 2. The
    resume skips 0 and 1 (0.3 s each): the ETA is still that of 60 s jobs, not of 0.3 s ones."""
    start_sweep(tmp_path, 4, now=T0)
    for num in (0, 1):
        job_started(tmp_path, num, now=T0 + 60 * num)
        job_ended(tmp_path, num, "ok", now=T0 + 60 * num + 60)
    job_started(tmp_path, 2, now=T0 + 120)  # killed: never ends
    start_sweep(tmp_path, 4, now=T0 + 500)
    for num in (0, 1):
        job_started(tmp_path, num, now=T0 + 500 + 0.3 * num)
        job_ended(tmp_path, num, "ok", now=T0 + 500 + 0.3 * num + 0.3)
    job_started(tmp_path, 2, now=T0 + 501)
    snap = read_snapshot(tmp_path, now=T0 + 511)
    assert (snap.done, snap.skipped, snap.running) == (2, 2, 1)
    assert snap.durations_s == [60.0, 60.0]
    # By hand: d = 60; job 2 has 50 s left, job 3 waits 60: 110 s with one running.
    assert snap.eta_s == pytest.approx(110.0)
    assert snap.line() == "[2/4 done (2 before the resume), 1 running, 0 failed, ETA 2 min]"
    # A job that failed before and ends ok now really ran: its own time counts, and it is not "before the resume".
    job_ended(tmp_path, 2, "ok", now=T0 + 561)
    start_sweep(tmp_path, 4, now=T0 + 600)  # a second resume still knows all three, with their first times
    assert files(tmp_path)["sweep.json"]["finished_before"] == {"0": 60.0, "1": 60.0, "2": 60.0}


def test_close_unfinished_marks_only_the_running_jobs_lost(tmp_path):
    start_sweep(tmp_path, 3, now=T0)
    job_started(tmp_path, 0, now=T0)
    job_started(tmp_path, 11, now=T0)
    job_ended(tmp_path, 11, "ok", now=T0 + 5)
    (tmp_path / ".progress" / "job2.json").write_text("{not json")
    close_unfinished(tmp_path, now=T0 + 50)
    read = {name: json.loads((tmp_path / ".progress" / name).read_text()) for name in ("job0.json", "job11.json")}
    assert read == {"job0.json": {"started": T0, "ended": T0 + 50, "status": "lost"},
                    "job11.json": {"started": T0, "ended": T0 + 5, "status": "ok"}}
    assert (tmp_path / ".progress" / "job2.json").read_text() == "{not json"


def test_close_unfinished_without_a_folder_does_nothing(tmp_path):
    close_unfinished(tmp_path / "none", now=T0)
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize(
    "seconds, text",
    [(-5, "0 s"), (0, "0 s"), (0.2, "1 s"), (59, "59 s"), (59.2, "1 min"), (60, "1 min"), (60.5, "2 min"),
     (120.5, "3 min"), (3540, "59 min"), (3541, "1 h 00 min"), (3600, "1 h 00 min"), (7260, "2 h 01 min"),
     (36000 + 600, "10 h 10 min")],
)
def test_durations(seconds, text):
    assert duration(seconds) == text


@pytest.mark.parametrize(
    "snap, eta",
    [
        (Snapshot(total=10, done=2, durations_s=[10.0, 30.0]), 160.0),  # d = 20, 8 not started, none running
        (Snapshot(total=5, done=1, running=2, durations_s=[60.0], running_ages_s=[90.0, 20.0]), 80.0),  # (0+40+2*60)/2
        (Snapshot(total=3, done=1, running=4, durations_s=[10.0], running_ages_s=[0.0] * 4), 10.0),  # none pending
        (Snapshot(total=4, done=3, durations_s=[1.0, 2.0, 3.0]), 2.0),
        (Snapshot(total=None, done=3, durations_s=[1.0]), None),
        (Snapshot(total=0, done=0, durations_s=[1.0]), None),
        (Snapshot(total=5, done=0, running=1, running_ages_s=[3.0]), None),
        (Snapshot(total=2, done=2, durations_s=[1.0, 1.0]), None),
        (Snapshot(total=2, done=3, durations_s=[1.0, 1.0, 1.0]), None),
    ],
)
def test_the_eta_by_hand(snap, eta):
    assert snap.eta_s == (pytest.approx(eta) if eta is not None else None)


def test_a_snapshot_starts_empty():
    snap = Snapshot(total=4)
    assert (snap.done, snap.running, snap.not_ok, snap.elapsed_s, snap.durations_s, snap.running_ages_s) == (
        0, 0, {}, 0.0, [], []
    )
    assert snap.line() == "[0/4 done, 0 running, 0 failed]"


@pytest.mark.parametrize(
    "snap, line",
    [
        (Snapshot(total=None, done=6, running=1, not_ok={"lost": 1, "failed": 2, "interrupted": 3}),
         "[6 done, 1 running, 2 failed, 3 interrupted, 1 lost]"),
        (Snapshot(total=0, done=1), "[1 done, 0 running, 0 failed]"),
        (Snapshot(total=2, done=2, elapsed_s=61, not_ok={"failed": 1}), "[2/2 done, 0 running, 1 failed, took 2 min]"),
        (Snapshot(total=2, done=3, elapsed_s=5), "[3/2 done, 0 running, 0 failed, took 5 s]"),
        (Snapshot(total=3, done=1, elapsed_s=5, durations_s=[30.0]), "[1/3 done, 0 running, 0 failed, ETA 1 min]"),
        # A stopped sweep: the jobs it did not start are neither done nor failed, and no ETA is promised.
        (Snapshot(total=4, done=1, elapsed_s=5, durations_s=[30.0], not_ok={"interrupted": 1}, not_started=2),
         "[1/4 done, 0 running, 0 failed, 1 interrupted, 2 not started]"),
    ],
)
def test_lines(snap, line):
    assert snap.line() == line


def test_read_snapshot_of_a_dir_without_a_sweep(tmp_path):
    assert read_snapshot(tmp_path, now=T0) is None
    (tmp_path / ".progress").mkdir()
    (tmp_path / ".progress" / "sweep.json").write_text("[1, 2]")
    assert read_snapshot(tmp_path, now=T0) is None
    (tmp_path / ".progress" / "sweep.json").write_text("{broken")
    assert read_snapshot(tmp_path, now=T0) is None


def test_read_snapshot_by_hand(tmp_path):
    folder = tmp_path / ".progress"
    folder.mkdir()
    write = {
        "sweep.json": {"total": 6, "started": T0},
        "job0.json": {"started": T0, "ended": T0 + 30, "status": "ok"},
        "job1.json": {"started": T0 + 10, "ended": T0 + 5, "status": "failed"},  # a clock behind: 0 s
        "job2.json": {"started": None, "ended": T0 + 40, "status": "interrupted"},  # no duration known
        "job3.json": {"started": T0, "ended": T0 + 20},  # no status
        "job4.json": {"started": T0 + 90},
        "job5.json": {"started": T0 + 200},  # a clock ahead: age 0
        "job6.json": {},
        "other.json": {"started": T0, "ended": T0 + 1, "status": "ok"},
    }
    for name, data in write.items():
        (folder / name).write_text(json.dumps(data))
    (folder / "job7.json").write_text("[]")
    (folder / "job8.json").write_text("{")
    snap = read_snapshot(tmp_path, now=T0 + 100)
    assert snap.total == 6 and snap.done == 4 and snap.running == 3 and snap.elapsed_s == 100.0
    assert sorted(snap.durations_s) == [0.0, 20.0, 30.0]
    assert sorted(snap.running_ages_s) == [0.0, 10.0]
    assert snap.not_ok == {"failed": 1, "interrupted": 1, "None": 1}


def test_elapsed_without_a_start_time_or_before_it(tmp_path):
    folder = tmp_path / ".progress"
    folder.mkdir()
    (folder / "sweep.json").write_text(json.dumps({"total": 1}))
    assert read_snapshot(tmp_path, now=T0).elapsed_s == 0.0
    (folder / "sweep.json").write_text(json.dumps({"total": 1, "started": T0 + 10}))
    assert read_snapshot(tmp_path, now=T0).elapsed_s == 0.0


def test_a_job_not_started_is_read_as_such(tmp_path):
    start_sweep(tmp_path, 3, now=T0)
    job_started(tmp_path, 0, now=T0 + 1)
    job_ended(tmp_path, 0, "ok", now=T0 + 11)
    job_ended(tmp_path, 1, "not started", now=T0 + 12)
    snap = read_snapshot(tmp_path, now=T0 + 12)
    assert (snap.done, snap.not_started, snap.not_ok, snap.durations_s) == (1, 1, {}, [10.0])
    assert snap.line() == "[1/3 done, 0 running, 0 failed, 1 not started]"


def test_two_ends_of_one_status_are_counted_twice(tmp_path):
    start_sweep(tmp_path, 2, now=T0)
    for num in (0, 1):
        job_ended(tmp_path, num, "failed", now=T0)
    assert read_snapshot(tmp_path, now=T0).not_ok == {"failed": 2}


def basic(*overrides, params=None, target="hydra._internal.core_plugins.basic_sweeper.BasicSweeper"):
    return OmegaConf.create({"hydra": {"sweeper": {"_target_": target, "params": params},
                                       "overrides": {"task": list(overrides)}}})


def test_planned_jobs_counts_the_sweepers_params_too():
    assert planned_jobs(basic("seed=0,1", params={"optimizer.lr": "0.1,0.01,0.001"})) == 6
    assert planned_jobs(basic(params={"seed": "range(0,4)"})) == 4


def test_planned_jobs_without_a_basic_sweeper_or_a_countable_sweep():
    assert planned_jobs(OmegaConf.create({"seed": 0})) is None
    assert planned_jobs(basic("seed=0,1", target="")) is None
    assert planned_jobs(basic("seed=0,1", target="my.BasicSweeperX")) is None
    assert planned_jobs(basic("seed=range(0,")) is None


def test_stop_without_the_sweeps_end_leaves_running_jobs_running(tmp_path, capsys):
    start_sweep(tmp_path, 2, now=T0)
    progress = SweepProgress(tmp_path, live=False, interval_s=3600).start()
    job_started(tmp_path, 0, now=T0)
    job_started(tmp_path, 1, now=T0)
    job_ended(tmp_path, 1, "ok", now=T0 + 1)
    progress.stop(sweep_ended=False)
    assert capsys.readouterr().out.startswith("[1/2 done, 1 running, 0 failed, ETA ")
    assert "ended" not in files(tmp_path)["job0.json"]


def test_stop_says_nothing_new_twice(tmp_path, capsys):
    start_sweep(tmp_path, 2, now=T0)
    progress = SweepProgress(tmp_path, live=False, interval_s=3600).start()
    job_started(tmp_path, 0, now=T0)
    job_ended(tmp_path, 0, "ok", now=T0 + 1)
    job_started(tmp_path, 1, now=T0)
    progress.update()
    assert capsys.readouterr().out.startswith("[1/2 done, 1 running, 0 failed, ETA ")
    progress.stop(sweep_ended=False)
    assert capsys.readouterr().out == ""
    progress.stop(sweep_ended=False)
    assert capsys.readouterr().out == ""


def test_a_new_failure_without_a_new_end_is_still_news(tmp_path, capsys):
    """The shown state is (done, endings): a job re-ending as failed changes it although done stays 1."""
    start_sweep(tmp_path, 2, now=T0)
    progress = SweepProgress(tmp_path, live=False, interval_s=3600)
    job_ended(tmp_path, 0, "ok", now=T0)
    progress.update()
    job_ended(tmp_path, 0, "failed", now=T0)
    progress.update()
    # no job said when it started: no duration, no ETA
    assert capsys.readouterr().out.splitlines() == ["[1/2 done, 0 running, 0 failed]", "[1/2 done, 0 running, 1 failed]"]
    progress.stop(sweep_ended=False)
    assert capsys.readouterr().out == ""


def test_without_a_sweep_there_is_nothing_to_show(tmp_path, capsys):
    progress = SweepProgress(tmp_path, live=False, interval_s=3600).start()
    progress.update()
    progress.stop()
    assert capsys.readouterr().out == ""


def test_the_poller_shows_a_finished_job_on_its_own(tmp_path, capsys):
    start_sweep(tmp_path, 2, now=T0)
    progress = SweepProgress(tmp_path, live=False, interval_s=0.01).start()
    assert progress._thread.name == "sweep-progress" and progress._thread.daemon is True
    job_ended(tmp_path, 0, "ok", now=T0)
    shown = ""
    for _ in range(1000):  # up to ~10 s on a loaded machine; the first poll after 0.01 s prints it
        shown += capsys.readouterr().out
        if shown:
            break
        time.sleep(0.01)
    progress.stop(sweep_ended=False)
    assert shown == "[1/2 done, 0 running, 0 failed]\n"


def test_a_failing_poll_does_not_stop_the_poller(tmp_path, monkeypatch):
    calls = []

    def broken():
        calls.append(1)
        raise OSError("disk gone")

    progress = SweepProgress(tmp_path, live=False, interval_s=0.01)
    monkeypatch.setattr(progress, "update", broken)
    progress.start()
    for _ in range(1000):
        if len(calls) >= 3:
            break
        time.sleep(0.01)
    progress.stop(sweep_ended=False)
    assert len(calls) >= 3 and not progress._thread.is_alive()


def test_the_default_poll_interval_is_a_second(tmp_path):
    assert SweepProgress(tmp_path, live=False).interval_s == 1.0


def test_live_mode_points_the_terminals_log_handlers_at_the_redirected_streams_and_back(tmp_path, capsys):
    from rich.console import Console

    logger = logging.getLogger("test_sweep_progress_units.live")
    to_stdout = logging.StreamHandler(sys.__stdout__)
    to_stderr = logging.StreamHandler(sys.__stderr__)
    elsewhere = logging.StreamHandler(io.StringIO())
    to_file = logging.FileHandler(tmp_path / "log.txt", delay=True)
    to_file.setStream(sys.__stderr__)  # a subclass of StreamHandler writing to the terminal: left alone
    root_handler = logging.StreamHandler(sys.__stderr__)
    for h in (to_stdout, to_stderr, elsewhere, to_file):
        logger.addHandler(h)
    logging.getLogger().addHandler(root_handler)
    try:
        start_sweep(tmp_path, 1)
        screen = io.StringIO()
        progress = SweepProgress(tmp_path, live=True, console=Console(file=screen, force_terminal=True, width=120),
                                 interval_s=3600).start()
        redirected_out, redirected_err = sys.stdout, sys.stderr
        assert redirected_out is not sys.__stdout__ and redirected_err is not sys.__stderr__
        assert to_stdout.stream is redirected_out and to_stderr.stream is redirected_err
        assert root_handler.stream is redirected_err
        assert to_file.stream is sys.__stderr__ and elsewhere.stream is not redirected_out
        progress.update()
        job_ended(tmp_path, 0, "ok")
        progress.stop()
        assert to_stdout.stream is sys.__stdout__ and to_stderr.stream is sys.__stderr__
        assert root_handler.stream is sys.__stderr__
        assert progress._handlers == [] and progress._live is None
        assert "[0/1 done, 0 running, 0 failed]" in screen.getvalue()
        progress._give_back_terminal()  # again (at exit): nothing left to give back
    finally:
        for h in (to_stdout, to_stderr, elsewhere, to_file):
            logger.removeHandler(h)
        logging.getLogger().removeHandler(root_handler)
    assert capsys.readouterr().out.startswith("[1/1 done, 0 running, 0 failed, took ")


def test_live_mode_draws_on_the_real_stdout_by_default(tmp_path, monkeypatch):
    screen = io.StringIO()
    screen.isatty = lambda: True
    monkeypatch.setattr(sys, "__stdout__", screen)
    start_sweep(tmp_path, 1, now=T0)
    progress = SweepProgress(tmp_path, live=True, interval_s=3600).start()
    progress.update()
    progress.stop(sweep_ended=False)
    assert "[0/1 done, 0 running, 0 failed]" in screen.getvalue()


def test_the_module_names_its_files():
    assert (sweep_progress.PROGRESS_DIR, sweep_progress.SWEEP_FILE) == (".progress", "sweep.json")


def test_a_sweep_dir_that_does_not_exist_yet_is_made(tmp_path):
    start_sweep(tmp_path / "new" / "sweep", 2, now=T0)
    job_started(tmp_path / "other" / "sweep", 0, now=T0)
    assert files(tmp_path / "new" / "sweep")["sweep.json"]["total"] == 2
    assert files(tmp_path / "other" / "sweep") == {"job0.json": {"started": T0}}


class Flushes(io.StringIO):
    """A pipe stand-in: what was written, and what had been written at each flush."""

    def __init__(self):
        super().__init__()
        self.flushed: list[str] = []

    def flush(self):
        self.flushed.append(self.getvalue())
        super().flush()


def test_plain_lines_are_flushed_at_once(tmp_path, monkeypatch):
    """In a pipe or a log file a line must not wait in a buffer for the next one."""
    out = Flushes()
    monkeypatch.setattr(sys, "stdout", out)
    start_sweep(tmp_path, 2, now=T0)
    progress = SweepProgress(tmp_path, live=False, interval_s=3600)
    job_ended(tmp_path, 0, "ok", now=T0)
    progress.update()
    assert out.flushed[-1:] == ["[1/2 done, 0 running, 0 failed]\n"]
    job_ended(tmp_path, 1, "failed", now=T0)
    progress.stop(sweep_ended=False)
    assert out.flushed[-1].splitlines()[-1].startswith("[2/2 done, 0 running, 1 failed, took ")


def test_a_second_stop_repeats_nothing(tmp_path, capsys):
    start_sweep(tmp_path, 1, now=T0)
    progress = SweepProgress(tmp_path, live=False, interval_s=3600)
    job_ended(tmp_path, 0, "ok", now=T0)
    progress.stop(sweep_ended=False)
    assert capsys.readouterr().out.startswith("[1/1 done, 0 running, 0 failed, took ")
    progress.stop(sweep_ended=False)
    assert capsys.readouterr().out == ""


def test_the_live_line_is_bold_blank_before_the_first_update_and_erased_at_the_end(tmp_path):
    import re

    from rich.console import Console

    screen = io.StringIO()
    start_sweep(tmp_path, 2, now=T0)
    before_out, before_err = sys.stdout, sys.stderr
    progress = SweepProgress(tmp_path, live=True, console=Console(file=screen, force_terminal=True, width=120),
                             interval_s=3600).start()
    try:
        assert sys.stdout is not before_out and sys.stderr is not before_err  # prints and errors go above the line
        assert re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue()).strip() == ""  # blank until the first update
        progress.update()
        assert "\x1b[1m[0/2 done, 0 running, 0 failed]" in screen.getvalue()  # bold
    finally:
        progress.stop(sweep_ended=False)
    assert sys.stdout is before_out and sys.stderr is before_err
    assert screen.getvalue().endswith("\x1b[2K")  # the live line is erased: the plain final line follows it


def test_a_live_line_stopped_before_its_first_update_draws_no_text(tmp_path):
    import re

    from rich.console import Console

    screen = io.StringIO()
    progress = SweepProgress(tmp_path, live=True, console=Console(file=screen, force_terminal=True, width=120),
                             interval_s=3600).start()
    progress.stop(sweep_ended=False)
    assert re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue()).strip() == ""

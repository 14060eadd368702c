"""The report's view of run records: finding and loading them, the numbers read off a record, the curve, the owner
check, each against records and processes set up by hand."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from pipeline.report.collect import (
    ReportedRun,
    ReportInputError,
    RunRecordWarning,
    collect_runs,
    finite_or_none,
    owner_alive,
)


def _write(run_dir: Path, **result) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "result.json").write_text(json.dumps({"seed": 0, "status": "ok", **result}))
    return run_dir


def _run(result: dict, run_dir: Path = Path("/nowhere/run")) -> ReportedRun:
    return ReportedRun(dir=run_dir, input_root=run_dir.parent, result=result)


def test_finite_or_none():
    assert finite_or_none(2) == 2.0 and type(finite_or_none(2)) is float
    assert finite_or_none("2.5") == 2.5 and finite_or_none(np.float32(0.5)) == 0.5
    for value in (None, True, False, "abc", [1.0], {}, float("nan"), float("inf"), "-inf"):
        assert finite_or_none(value) is None, value


def test_get_float_and_metric_bounds():
    run = _run({"wall_time_s": "3.5", "bad": float("inf"), "flag": True,
                "metric_bounds": {"ret": [0, 500], "tup": (-1.0, "x"), "three": [0, 1, 2], "str": "01", "inf": [-1e999, 5]}})
    assert run.get_float("wall_time_s") == 3.5
    assert run.get_float("bad") is None and run.get_float("flag") is None and run.get_float("missing") is None
    assert run.metric_bounds("ret") == (0.0, 500.0)
    assert run.metric_bounds("tup") == (-1.0, None)
    assert run.metric_bounds("inf") == (None, 5.0)
    for metric in ("three", "str", "other", None):
        assert run.metric_bounds(metric) == (None, None), metric
    assert _run({}).metric_bounds("ret") == (None, None)
    assert _run({"metric_bounds": None}).metric_bounds("ret") == (None, None)


def _curve_csv(run_dir: Path, text: str) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.csv").write_text(text)


def test_load_curve_reads_the_finite_points_in_step_order(tmp_path):
    _curve_csv(tmp_path, "step,train/loss,eval/r\n300,0.5,\n300,,3.0\n100,,1.0\n200,,nan\n0,,0.5\n400,0.1,\n")
    x, steps, values = _run({"primary_curve": "eval/r"}, tmp_path).load_curve()
    assert x == "step"
    assert steps.tolist() == [0.0, 100.0, 300.0] and values.tolist() == [0.5, 1.0, 3.0]
    assert steps.dtype == np.float64 and values.dtype == np.float64


def test_load_curve_of_an_rl_run_is_over_env_steps(tmp_path):
    _curve_csv(tmp_path, "env_step,eval/r\n1000,2.0\n2000,4.0\n")
    x, steps, values = _run({"primary_curve": "eval/r", "env_steps": 2000}, tmp_path).load_curve()
    assert (x, steps.tolist(), values.tolist()) == ("env_step", [1000.0, 2000.0], [2.0, 4.0])


def test_no_curve_to_load(tmp_path):
    assert _run({}, tmp_path).load_curve() is None  # no primary curve named
    assert _run({"primary_curve": "eval/r"}, tmp_path / "empty").load_curve() is None  # no metrics.csv
    _curve_csv(tmp_path / "other", "step,train/loss\n1,0.5\n")
    assert _run({"primary_curve": "eval/r"}, tmp_path / "other").load_curve() is None  # not that metric
    _curve_csv(tmp_path / "nan", "step,eval/r\n1,nan\n2,inf\n")
    assert _run({"primary_curve": "eval/r"}, tmp_path / "nan").load_curve() is None  # nothing finite
    (tmp_path / "bytes").mkdir()
    (tmp_path / "bytes" / "metrics.csv").write_bytes(b"step,eval/r\n1,\xff\xfe\n")
    assert _run({"primary_curve": "eval/r"}, tmp_path / "bytes").load_curve() is None  # not text
    _curve_csv(tmp_path / "value", "step,eval/r\nabc,1.0\n")
    assert _run({"primary_curve": "eval/r"}, tmp_path / "value").load_curve() is None  # not a number


def test_owner_alive_by_host_pid_and_start_time():
    me = psutil.Process(os.getpid())
    started, host = me.create_time(), socket.gethostname()
    assert owner_alive({"host": "elsewhere", "pid": os.getpid(), "since": started}) is None
    assert owner_alive({"pid": os.getpid(), "since": started}) is None  # no host: not this one
    assert owner_alive({"host": host, "pid": os.getpid(), "since": started}) is True
    assert owner_alive({"host": host, "pid": os.getpid(), "since": started - 0.9}) is True  # within a second
    assert owner_alive({"host": host, "pid": os.getpid(), "since": started - 1.0}) is True  # a second, exactly
    # The lock was taken before this process started: the pid was reused.
    assert owner_alive({"host": host, "pid": os.getpid(), "since": started - 1.1}) is False
    assert owner_alive({"host": host, "pid": os.getpid(), "since": "when"}) is True  # no usable time: pid only
    assert owner_alive({"host": host, "pid": os.getpid()}) is True
    assert owner_alive({"host": host, "pid": os.getpid(), "since": int(started) + 5}) is True
    for pid in (2**22 + 12345, -1, 2**70):  # not running, not a pid, too large for the OS
        assert owner_alive({"host": host, "pid": pid, "since": time.time()}) is False, pid


def test_collect_runs_reads_each_run_dir_once_in_order(tmp_path, monkeypatch):
    _write(tmp_path / "sweep" / "b", seed=2)
    _write(tmp_path / "sweep" / "a", seed=1)
    _write(tmp_path / "sweep" / "a" / "report" / "x", seed=9)  # a report's folder is not a run
    monkeypatch.setenv("HOME", str(tmp_path))
    runs = collect_runs(["~/sweep", tmp_path / "sweep" / "a"])  # the second input is inside the first
    assert [r.seed for r in runs] == [1, 2]
    assert [r.dir for r in runs] == [(tmp_path / "sweep" / "a").resolve(), (tmp_path / "sweep" / "b").resolve()]
    assert all(r.input_root == (tmp_path / "sweep").resolve() for r in runs)
    assert runs[0].result == {"seed": 1, "status": "ok"}
    # A run dir given as its own input: its root is itself.
    # A run met again is skipped, and the runs after it are still read.
    assert [r.seed for r in collect_runs([tmp_path / "sweep" / "a", tmp_path / "sweep"])] == [1, 2]
    (one,) = collect_runs(iter([tmp_path / "sweep" / "b"]))
    assert one.input_root == one.dir == (tmp_path / "sweep" / "b").resolve()


def test_bad_records_are_skipped_with_a_warning_naming_the_file(tmp_path):
    good = _write(tmp_path / "good")
    (tmp_path / "list").mkdir()
    (tmp_path / "list" / "result.json").write_text("[1, 2]")
    (tmp_path / "nokeys").mkdir()
    (tmp_path / "nokeys" / "result.json").write_text('{"metrics": {}}')
    _write(tmp_path / "nostatus").joinpath("result.json").write_text('{"seed": 3}')
    _write(tmp_path / "future", schema_version=99)
    with pytest.warns(RunRecordWarning) as caught:
        runs = collect_runs([tmp_path])
    assert [r.dir for r in runs] == [good.resolve()]
    messages = [str(w.message) for w in caught if issubclass(w.category, RunRecordWarning)]
    root = tmp_path.resolve()
    assert messages[0].startswith(f"skipping run record {root / 'future' / 'result.json'}: schema_version 99 ")
    assert messages[1:] == [
        f"skipping unreadable run record {root / 'list' / 'result.json'}: not a JSON object",
        f"skipping run record {root / 'nokeys' / 'result.json'}: missing key(s) seed, status",
        f"skipping run record {root / 'nostatus' / 'result.json'}: missing key(s) status",
    ]


def test_bad_inputs_are_one_line_errors_that_say_the_fix(tmp_path):
    with pytest.raises(ReportInputError, match=r"^no input dirs given; pass one or more run or sweep dirs$"):
        collect_runs([])
    with pytest.raises(ReportInputError, match=rf"^input dir {tmp_path / 'nope'} does not exist; pass a run dir or a sweep dir$"):
        collect_runs([tmp_path / "nope"])
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ReportInputError, match=r"is not a directory; pass the run or sweep dir that holds it$"):
        collect_runs([tmp_path / "file.txt"])
    (tmp_path / "empty").mkdir()
    _write(tmp_path / "full")
    with pytest.raises(ReportInputError, match=rf"^no run records \(result.json\) found under {(tmp_path / 'empty').resolve()}; "
                       r"pass a run dir or a sweep dir written by `python -m pipeline`$"):
        collect_runs([tmp_path / "full", tmp_path / "empty"])
    (tmp_path / "broken" / "r").mkdir(parents=True)
    (tmp_path / "broken" / "r" / "result.json").write_text("{")
    (tmp_path / "broken2" / "r").mkdir(parents=True)
    (tmp_path / "broken2" / "r" / "result.json").write_text("[]")
    with pytest.warns(RunRecordWarning), pytest.raises(
            ReportInputError, match=rf"^every result.json under {tmp_path / 'broken'}, {tmp_path / 'broken2'} was unreadable; "
                                    "see the warnings above$"):
        collect_runs([tmp_path / "broken", tmp_path / "broken2"])

"""`python -m pipeline.report`'s main(argv) called in-process: arguments, refusals, and the printed summary.

build_report is stood in for where the summary is the point (the report's numbers are test_report_units'), so the
printed table is checked against a report written by hand; the refusals before any work run the real code. The
subprocess tests in test_report_cli stay the end-to-end check.
"""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import pytest

from pipeline.report import cli
from pipeline.report.collect import ReportInputError, RunRecordWarning

HAND_REPORT_GROUPS = {
    "a": {"primary_metric": "test/acc", "n_ok": 5, "n_failed": 1, "n_interrupted": 0, "n_pruned": 2, "n_running": 0,
          "mean": 0.5, "std": 0.125, "iqm": 0.25, "iqm_ci": [0.125, 0.75]},
    "longer group": {"primary_metric": "x", "n_ok": 0, "n_failed": 0, "n_interrupted": 3, "n_pruned": 0,
                     "n_running": 1, "mean": None, "std": None, "iqm": None, "iqm_ci": None},
    "c": {"primary_metric": "test/acc", "n_ok": 4, "n_failed": 0, "n_interrupted": 0, "n_pruned": 0, "n_running": 0,
          "mean": 12345.0, "std": None, "iqm": 2.0, "iqm_ci": [1.0, 3.0]},
}

# Written out by hand: columns as wide as their widest cell, two spaces between, no trailing spaces.
HAND_SUMMARY = [
    "group" + " " * 9 + "metric" + " " * 4 + "ok  failed  interrupted  pruned  running  mean ± std   IQM [95% CI]",
    "a" + " " * 13 + "test/acc  5   1       0            2       0        0.5 ± 0.125  0.25 [0.125, 0.75]",
    "longer group  x         0   0       3            0       1        -            -",
    "c" + " " * 13 + "test/acc  4   0       0            0       0        12,345 ± -   2 [1, 3]",
]


def test_summary_lines_by_hand():
    assert cli.summary_lines({"groups": HAND_REPORT_GROUPS}) == HAND_SUMMARY


def test_summary_lines_of_no_groups_is_the_header():
    assert cli.summary_lines({"groups": {}}) == [
        "group  metric  ok  failed  interrupted  pruned  running  mean ± std  IQM [95% CI]"]


class _Build:
    """Stands in for build_report: records its arguments, warns as collect does, returns a report."""

    def __init__(self, report=None, error=None, other_warning=False):
        self.calls = []
        self.other_warning = other_warning
        self.report = report
        self.error = error

    def __call__(self, inputs, out, *, reps, seed):
        self.calls.append((list(inputs), out, reps, seed))
        warnings.warn("skipping unreadable run record x", RunRecordWarning, stacklevel=1)
        if self.other_warning:
            warnings.warn("some other warning", UserWarning, stacklevel=1)
        if self.error is not None:
            raise self.error
        return self.report


def _report(out_dir, **over):
    report = {"groups": HAND_REPORT_GROUPS, "warnings": [], "partial": False, "status_counts": {"running": 0},
              "n_runs": 7, "out_dir": str(out_dir)}
    report.update(over)
    return report


@pytest.fixture
def clock(monkeypatch):
    ticks = itertools.cycle([100.0, 101.5])
    monkeypatch.setattr(cli.time, "perf_counter", lambda: next(ticks))


def test_main_prints_the_summary_warnings_and_where_the_report_is(tmp_path, monkeypatch, capsys, clock):
    build = _Build(_report(tmp_path / "rep", warnings=["group a has 1 failed run", "second"], partial=True,
                           status_counts={"running": 2}), other_warning=True)
    monkeypatch.setattr("pipeline.report.build.build_report", build)
    filters = list(warnings.filters)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert cli.main(["d1", "d2", "--reps", "7", "--seed", "3"]) == 0
    # The collector's per-record warnings are not shown twice (they are in report["warnings"]).
    # ... while any other warning still is.
    assert [(w.category, str(w.message)) for w in seen] == [(UserWarning, "some other warning")]
    assert warnings.filters == filters
    assert build.calls == [(["d1", "d2"], None, 7, 3)]
    out, err = capsys.readouterr()
    assert err == ""
    assert out.splitlines() == [
        *HAND_SUMMARY,
        "warning: group a has 1 failed run",
        "warning: second",
        "partial report: 2 run(s) still running; build it again when they finish",
        "7 runs, 3 groups, built in 1.5 s",
        f"report: {tmp_path / 'rep' / 'report.md'}",
    ]


def test_main_without_warnings_or_running_runs(tmp_path, monkeypatch, capsys, clock):
    build = _Build(_report(tmp_path, groups={}, n_runs=1))
    monkeypatch.setattr("pipeline.report.build.build_report", build)
    assert cli.main([str(tmp_path)]) == 0
    assert build.calls == [([str(tmp_path)], None, 2000, 0)]  # the defaults: 2000 resamples, seed 0
    assert capsys.readouterr().out.splitlines()[1:] == [
        "1 runs, 0 groups, built in 1.5 s", f"report: {tmp_path / 'report.md'}"]


def test_main_makes_the_out_dir_and_leaves_no_probe(tmp_path, monkeypatch, capsys, clock):
    out = tmp_path / "a" / "b"
    build = _Build(_report(out))
    monkeypatch.setattr("pipeline.report.build.build_report", build)
    assert cli.main(["d", "--out", str(out)]) == 0
    assert out.is_dir() and list(out.iterdir()) == []
    assert build.calls == [(["d"], str(out), 2000, 0)]
    # An existing out dir is fine too.
    assert cli.main(["d", "--out", str(out)]) == 0
    assert list(out.iterdir()) == []


def test_main_refuses_an_out_it_cannot_write_before_building(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("x")
    build = _Build(_report(tmp_path))
    monkeypatch.setattr("pipeline.report.build.build_report", build)
    out = tmp_path / "file" / "sub"
    assert cli.main(["d", "--out", str(out)]) == 2
    assert build.calls == []
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"error: --out {out}: Not a directory; choose a folder you can write\n"


def test_main_names_an_oserror_without_strerror(tmp_path, monkeypatch, capsys):
    def refuse(self, *args, **kwargs):
        raise OSError("read-only mount")

    monkeypatch.setattr(Path, "mkdir", refuse)
    assert cli.main(["d", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == f"error: --out {tmp_path / 'o'}: read-only mount; choose a folder you can write\n"


def test_main_reports_input_errors_in_one_line(tmp_path, monkeypatch, capsys):
    build = _Build(error=ReportInputError("no run records under x; pass a run dir"))
    monkeypatch.setattr("pipeline.report.build.build_report", build)
    assert cli.main(["x"]) == 2
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", "error: no run records under x; pass a run dir\n")


def test_main_on_a_missing_dir_runs_the_real_check(tmp_path, capsys):
    missing = tmp_path / "nope"
    assert cli.main([str(missing)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and str(missing) in err[0] and "does not exist" in err[0]
    assert not missing.exists()


@pytest.mark.parametrize(("reps", "message"), [
    ("0", "0: the bootstrap needs at least 1 resample (default 2000)"),
    ("-3", "-3: the bootstrap needs at least 1 resample (default 2000)"),
    ("many", "'many' is not a whole number"),
    ("1.5", "'1.5' is not a whole number"),
])
def test_reps_must_be_a_positive_whole_number(reps, message, capsys, monkeypatch):
    build = _Build()
    monkeypatch.setattr("pipeline.report.build.build_report", build)
    with pytest.raises(SystemExit) as info:
        cli.main(["d", "--reps", reps])
    assert info.value.code == 2 and build.calls == []
    assert capsys.readouterr().err.splitlines()[-1] == f"python -m pipeline.report: error: argument --reps: {message}"


def test_one_resample_is_enough():
    assert cli.parse_args(["d", "--reps", "1"]).reps == 1


def test_parse_args_needs_a_dir_and_takes_an_int_seed(capsys):
    args = cli.parse_args(["a", "b"])
    assert (args.inputs, args.out, args.reps, args.seed) == (["a", "b"], None, 2000, 0)
    with pytest.raises(SystemExit):
        cli.parse_args([])
    assert "the following arguments are required: DIR" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.parse_args(["a", "--seed", "x"])
    assert "argument --seed: invalid int value: 'x'" in capsys.readouterr().err


def test_help_describes_each_argument(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    with pytest.raises(SystemExit) as info:
        cli.parse_args(["--help"])
    assert info.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert "Seed-distribution report (IQM, bootstrap CIs, plots) from run or sweep dirs." in lines
    text = " ".join(" ".join(lines).split())
    assert text.startswith("usage: python -m pipeline.report ")
    for part in (
        "Seed-distribution report (IQM, bootstrap CIs, plots) from run or sweep dirs.",
        "DIR run dirs or sweep dirs (searched recursively)",
        "--out OUT report dir (default: DIR/report when one DIR is given)",
        "--reps REPS bootstrap resamples (default 2000)",
        "--seed SEED bootstrap seed (default 0)",
    ):
        assert part in text

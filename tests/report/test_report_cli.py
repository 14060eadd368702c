"""`python -m pipeline.report` driven as a subprocess, the way a user runs it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from report_runs import OTHER_GROUP, RL_GROUP, write_two_group_sweep

from pipeline_testing import run_module


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_module("pipeline.report", *args, cwd=Path.cwd(), timeout=120)


def test_cli_builds_report_and_prints_summary(tmp_path):
    sweep = write_two_group_sweep(tmp_path / "sweep")
    out = tmp_path / "custom_out"
    done = _run(str(sweep), "--out", str(out), "--reps", "500")
    assert done.returncode == 0, done.stderr
    assert RL_GROUP in done.stdout and OTHER_GROUP in done.stdout
    assert "IQM [95% CI]" in done.stdout
    assert f"report: {out.resolve() / 'report.md'}" in done.stdout
    assert f"warning: group {RL_GROUP} has only 3 ok seeds" in done.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["n_runs"] == 10 and report["settings"]["bootstrap_reps"] == 500


def test_cli_missing_dir_is_one_clear_line(tmp_path):
    missing = tmp_path / "outputs" / "multirun" / "nope"
    done = _run(str(missing))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert str(missing) in lines[0] and "does not exist" in lines[0]
    assert not (missing / "report").exists()


@pytest.mark.parametrize("reps", ["0", "-3", "many"])
def test_cli_refuses_a_bootstrap_without_resamples(tmp_path, reps):
    write_two_group_sweep(tmp_path)
    done = _run(str(tmp_path), "--reps", reps)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("python -m pipeline.report: error: argument --reps:")
    assert not (tmp_path / "report" / "report.json").exists()


def test_cli_dir_without_runs(tmp_path):
    done = _run(str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"error: no run records (result.json) found under {tmp_path.resolve()}; pass a run dir or a sweep dir "
        "written by `python -m pipeline`"
    )

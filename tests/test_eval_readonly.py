"""`python -m pipeline.eval` and `python -m pipeline.report` on a run dir that cannot be written: one line naming the
file and the fix (out=<dir>, --out <dir>), before any work; with the fix, the work is done and written there."""

import json
import shutil
import subprocess

import pytest

from pipeline_testing import run_cli, run_module


@pytest.fixture(scope="module")
def read_only_run(tmp_path_factory):
    """A finished run on a read-only file system (tmpfs remounted read-only: root ignores file modes)."""
    base = tmp_path_factory.mktemp("ro")
    done = run_cli("experiment=supervised_digits", "trainer=debug", f"hydra.run.dir={base / 'made'}")
    assert done.returncode == 0, done.stdout[-2000:]
    mount = base / "mnt"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("a read-only file system needs root and mount (tmpfs) here")
    shutil.copytree(base / "made", mount / "run")
    subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
    yield mount / "run"
    subprocess.run(["umount", str(mount)], check=False)


def test_eval_on_a_read_only_run_dir_is_one_line_and_out_writes_elsewhere(read_only_run, tmp_path):
    done = run_module("pipeline.eval", str(read_only_run))
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines  # was: a traceback after the work
    assert lines[0] == f"error: cannot write {read_only_run / 'eval.json'}: the folder is not writable; write it elsewhere with out=<dir>"
    done = run_module("pipeline.eval", str(read_only_run), f"out={tmp_path / 'ev'}")
    assert done.returncode == 0 and str(tmp_path / "ev" / "eval.json") in done.stdout, done.stdout + done.stderr
    scored = json.loads((tmp_path / "ev" / "eval.json").read_text())
    record = json.loads((read_only_run / "result.json").read_text())
    assert scored["metrics"]["test/acc"] == pytest.approx(record["metrics"]["test/acc"], abs=1e-6)


def test_report_on_a_read_only_run_dir_is_one_line_with_the_out_hint(read_only_run, tmp_path):
    done = run_module("pipeline.report", str(read_only_run))
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "--out <dir>" in lines[0], lines
    done = run_module("pipeline.report", str(read_only_run), "--out", str(tmp_path / "rep"))
    assert done.returncode == 0 and (tmp_path / "rep" / "report.md").is_file(), done.stdout + done.stderr

"""The command line: bad input gets one clear line and a non-zero exit; help lists the groups."""

import sys

import pytest

from pipeline_testing import read_result, run_cli


def test_unknown_group_option_names_the_group():
    proc = run_cli("experiment=supervised_digits", "model=nope")
    assert proc.returncode != 0
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "'model'" in err[0] and "nope" in err[0] and "mlp" in err[0]


def test_unknown_option_inside_a_sweep_list():
    proc = run_cli("-m", "experiment=supervised_digits", "optimizer=adam,adamz")
    assert proc.returncode != 0 and "adamz" in proc.stderr and "'optimizer'" in proc.stderr


def test_wrong_type_names_the_key(tmp_path):
    proc = run_cli("experiment=supervised_digits", "optimizer.lr=abc", f"hydra.run.dir={tmp_path}")
    assert proc.returncode != 0
    error_lines = [line for line in proc.stdout.splitlines() + proc.stderr.splitlines() if "failed" in line]
    assert len(error_lines) == 1 and "optimizer.lr" in error_lines[0] and "number" in error_lines[0]
    record = read_result(tmp_path)
    assert record["status"] == "failed" and "optimizer.lr" in record["error"]


def test_missing_required_value_names_the_key(tmp_path):
    proc = run_cli("experiment=supervised_digits", "+data.extra=???", f"hydra.run.dir={tmp_path}")
    assert proc.returncode != 0
    assert "data.extra" in read_result(tmp_path)["error"]


def test_help_lists_groups_and_options():
    proc = run_cli("--help")
    assert proc.returncode == 0
    for group in ("model", "loss", "optimizer", "scheduler", "device", "seeding", "logger", "trainer", "data", "env", "experiment"):
        assert f"{group}:" in proc.stdout, group
    assert "rmsprop" in proc.stdout and "cosine" in proc.stdout


@pytest.mark.parametrize("group", ["loss", "optimizer", "scheduler", "device", "logger", "trainer"])
def test_group_options_compose(make_cfg, group):
    from pipeline.config_checks import group_options

    for option in group_options()[group]:
        if group == "device" and option in ("cuda", "mps"):
            continue  # composes, but would fail at start-up on this machine (tested below)
        cfg = make_cfg("experiment=supervised_digits", f"{group}={option}")
        assert cfg[group] is not None


def test_cuda_request_without_gpu_is_one_clear_line(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    proc = run_cli("experiment=supervised_digits", "device=cuda", f"hydra.run.dir={tmp_path}")
    assert proc.returncode != 0 and "device=cpu" in read_result(tmp_path)["error"]


def test_installed_wheel_runs_from_another_directory(tmp_path):
    """`pip install .` (not editable) ships the configs: run from a folder with no conf/ in sight."""
    import subprocess

    from pipeline_testing import ROOT

    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target", str(target), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )
    assert (target / "pipeline" / "conf" / "experiment" / "supervised_digits.yaml").is_file()
    where = subprocess.run(
        [sys.executable, "-c", "import pipeline; print(pipeline.__file__)"],
        capture_output=True, text=True, cwd=tmp_path, env={"PYTHONPATH": str(target)}, check=True,
    )
    assert where.stdout.startswith(str(target))
    proc = run_cli(
        "experiment=supervised_digits", "trainer=debug", f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path, env={"PYTHONPATH": str(target)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = read_result(tmp_path / "run")
    assert record["status"] == "ok"
    assert record["run_dir"] == str(tmp_path / "run")

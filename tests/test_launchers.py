"""Promises of docs/sweeps.md and docs/running.md about launchers and user configs, each checked on a real run.

- a sweep through the submitit launcher (`hydra/launcher=submitit_local`) ends in K records and a report;
- under a parallel launcher, `device.num_threads` is lowered so jobs x threads fit the cores;
- `--config-dir` adds the user's own experiment presets beside the packaged ones;
- `seeding=deterministic` gives bitwise-identical curves for the same seed.
"""

import json
import os

import pytest

from pipeline_testing import read_result, run_cli, sweep_dir


@pytest.mark.slow
def test_submitit_local_sweep_ends_in_records_and_a_report(tmp_path):
    proc = run_cli(
        "-m", "experiment=supervised_digits", "trainer=debug", "seed=3,4", "hydra/launcher=submitit_local",
        "hydra.launcher.timeout_min=10", cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep = sweep_dir(tmp_path)
    records = sorted((json.loads(p.read_text()) for p in sweep.glob("*/result.json")), key=lambda r: r["seed"])
    assert [(r["seed"], r["status"]) for r in records] == [(3, "ok"), (4, "ok")]
    # submitit ran each job in its own process, with its own submitit log folder.
    assert len({r["pid"] for r in records}) == 2
    assert list(sweep.rglob("*_log.out")), sorted(p.name for p in sweep.rglob("*"))[:20]
    # The jobs ran in submitit's processes; their starts and ends reached this sweep's progress line.
    assert "[2/2 done, 0 running, 0 failed, took " in proc.stdout
    (group,) = json.loads((sweep / "report" / "report.json").read_text())["groups"].values()
    assert group["n_ok"] == 2 and sorted(group["values"]) == sorted(r["metrics"]["test/acc"] for r in records)


@pytest.mark.slow
def test_parallel_launcher_lowers_threads_to_fit_the_cores(tmp_path):
    cores = os.cpu_count() or 1
    proc = run_cli(
        "-m", "experiment=supervised_digits", "trainer=debug", "seed=0,1", "hydra/launcher=joblib",
        f"hydra.launcher.n_jobs={cores}", f"device.num_threads={cores + 1}", cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # n_jobs = cores parallel jobs leave one thread each (cores // n_jobs); each job says so in its log.
    logs = [p.read_text() for p in sweep_dir(tmp_path).glob("*/*.log")]
    assert len(logs) == 2, logs
    for log in logs:
        assert f"device.num_threads={cores + 1} lowered to 1: {cores} parallel jobs on {cores} cores" in log
        assert "device: cpu (1 CPU thread(s))" in log


@pytest.mark.slow
def test_config_dir_adds_a_user_experiment(tmp_path):
    user = tmp_path / "my_configs" / "experiment"
    user.mkdir(parents=True)
    (user / "digits_small.yaml").write_text(
        "# @package _global_\n"
        "defaults:\n  - supervised_digits\n\n"
        "name: digits_small\nmodel:\n  hidden: [32]\noptimizer:\n  lr: 0.01\n"
    )
    proc = run_cli(
        "--config-dir", str(tmp_path / "my_configs"), "experiment=digits_small", "trainer=debug",
        f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = read_result(tmp_path / "run")
    assert record["status"] == "ok" and record["experiment"] == "digits_small"
    config = record["config"]  # flat dotted keys
    assert config["model.hidden"] == [32] and config["optimizer.lr"] == 0.01
    # The rest comes from the packaged preset it extends.
    assert config["model.dropout"] == 0.2 and config["optimizer.weight_decay"] == 0.0001


@pytest.mark.slow
def test_seeding_deterministic_gives_identical_curves(tmp_path):
    curves = []
    for name in ("a", "b"):
        run_dir = tmp_path / name
        proc = run_cli("experiment=supervised_digits", "trainer=debug", "seeding=deterministic", "seed=7",
                       f"hydra.run.dir={run_dir}", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert read_result(run_dir)["config"]["seeding.deterministic"] is True
        curves.append((run_dir / "metrics.csv").read_text())
    assert curves[0] == curves[1] and len(curves[0].splitlines()) > 2

"""Multi-seed sweeps through real Hydra launchers, ending in a report; failures and resume lose nothing."""

import json
import time
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from pipeline_testing import run_cli, sweep_dir


def wandb_log(run_dir: Path, wait_s: float = 30.0) -> bytes:
    """The offline run's run-*.wandb bytes. W&B's service process writes that file and can still be at it for a moment
    after the run's own process has exited (seen once in a CI rehearsal under load: no file yet); wait for it."""
    end = time.monotonic() + wait_s
    while not (found := sorted(run_dir.glob("run-*.wandb"))) and time.monotonic() < end:
        time.sleep(0.2)
    assert found, f"no run-*.wandb in {run_dir} after {wait_s:.0f} s: {sorted(p.name for p in run_dir.iterdir())}"
    return found[0].read_bytes()


@pytest.mark.slow
def test_joblib_sweep_with_wandb_writes_report_and_offline_runs(tmp_path):
    proc = run_cli(
        "-m", "experiment=supervised_digits", "trainer=debug", "seed=range(0,3)", "hydra/launcher=joblib",
        "logger=[csv,wandb]", cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep = sweep_dir(tmp_path)
    jobs = sorted(p for p in sweep.iterdir() if (p / "result.json").is_file())
    assert [p.name for p in jobs] == ["0_seed=0,trainer=debug", "1_seed=1,trainer=debug", "2_seed=2,trainer=debug"]
    assert proc.stdout.count("[job ") == 3 and "report:" in proc.stdout
    assert "[3/3 done, 0 running, 0 failed, took " in proc.stdout  # counted from the joblib workers' jobs
    results = [json.loads((job / "result.json").read_text()) for job in jobs]
    assert [r["seed"] for r in results] == [0, 1, 2] and {r["status"] for r in results} == {"ok"}
    report = json.loads((sweep / "report" / "report.json").read_text())
    (group,) = report["groups"].values()
    assert group["n_ok"] == 3 and group["n_failed"] == 0
    # The report summarises exactly these three runs' final accuracies (3 seeds: the IQM is their mean).
    accuracies = [r["metrics"]["test/acc"] for r in results]
    assert sorted(group["values"]) == sorted(accuracies)
    assert group["iqm"] == pytest.approx(np.mean(accuracies))
    assert any("fewer than 5" in w or "only 3" in w for w in report["warnings"])
    plots = sorted((sweep / "report").glob("*.png"))
    assert plots
    for plot in plots:  # real, non-blank images
        image = imread(plot)
        assert min(image.shape[:2]) >= 100 and image[..., :3].std() > 0.01, plot.name
    # One offline W&B run per seed holding that seed's record, and one summary run for the report.
    for job, result in zip(jobs, results):
        (run_dir,) = (job / "wandb").glob("offline-run-*")
        log = wandb_log(run_dir)
        assert f'"seed":{result["seed"]},'.encode() in log, job
        assert f'"test/acc":{result["metrics"]["test/acc"]!r}'.encode() in log, job
    (summary_run,) = (sweep / "report").rglob("offline-run-*")
    assert b"IQM and mean of test/acc" in wandb_log(summary_run)


@pytest.mark.slow
def test_failed_run_is_reported_and_resume_reruns_only_it(tmp_path):
    # isolate_jobs=false: the jobs train in the sweep's process (a fresh Python per job is not what this tests)
    args = ["-m", "experiment=supervised_digits", "trainer=debug", "seed=0,1", "optimizer=sgd", "optimizer.lr=0.05,1e30",
            "isolate_jobs=false"]
    proc = run_cli(*args, cwd=tmp_path)
    sweep = sweep_dir(tmp_path)
    results = {p.parent.name: json.loads(p.read_text()) for p in sweep.glob("*/result.json")}
    assert len(results) == 4
    failed = [name for name, r in results.items() if r["status"] == "failed"]
    assert len(failed) == 2 and all("lr=1e+30" in name for name in failed)
    assert all("loss became" in results[name]["error"] for name in failed)
    assert "failed" in proc.stdout
    # Progress in a log: each finished job's line is followed by the sweep's count so far; the last one says it all.
    lines = proc.stdout.splitlines()
    job_lines = [i for i, line in enumerate(lines) if line.startswith("[job ")]
    assert [lines[i + 1].split(" done")[0] for i in job_lines] == ["[1/4", "[2/4", "[3/4", "[4/4"], proc.stdout
    assert "[4/4 done, 0 running, 2 failed, took " in proc.stdout
    report = json.loads((sweep / "report" / "report.json").read_text())
    assert sum(g["n_failed"] for g in report["groups"].values()) == 2
    assert "loss became" in (sweep / "report" / "report.md").read_text()

    # A killed run leaves a record that says it did not finish; resume reruns only that one.
    ok_dirs = [sweep / name for name, r in results.items() if r["status"] == "ok"]
    killed = ok_dirs[0]
    record = json.loads((killed / "result.json").read_text())
    record.update(status="failed", error="run did not finish (killed, or still running)")
    (killed / "result.json").write_text(json.dumps(record))
    untouched = {d: (d / "result.json").stat().st_mtime_ns for d in ok_dirs[1:]}
    proc = run_cli(*args, f"hydra.sweep.dir={sweep}", "resume=true", cwd=tmp_path)
    assert json.loads((killed / "result.json").read_text())["status"] == "ok"
    for d, mtime in untouched.items():
        assert (d / "result.json").stat().st_mtime_ns == mtime, f"{d} should have been skipped"
    assert proc.stdout.count("[job ") == 4


def test_a_sweep_in_a_dir_of_the_users_choosing_has_an_id(tmp_path, monkeypatch):
    """The sweep id came from the default sweep dir's name (its resolver): with hydra.sweep.dir set, no resolver
    ran and the runs' W&B `sweep=<id>` tag and `sweep_id` config were missing. The sweep's start makes it now."""
    from omegaconf import OmegaConf

    from pipeline.config.grouping import SWEEP_ENV, sweep_id
    from pipeline.runtime.loggers import wandb_config, wandb_tags
    from pipeline.sweep import SweepReportCallback

    monkeypatch.delenv(SWEEP_ENV, raising=False)
    assert sweep_id() is None
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "my_sweep")}}, "resume": False})
    SweepReportCallback().on_multirun_start(config)
    uid = sweep_id()
    assert uid and len(uid) == 6 and "my_sweep" not in uid
    assert f"sweep={uid}" in wandb_tags(0, []) and wandb_config({})["sweep_id"] == uid
    SweepReportCallback().on_multirun_start(config)  # a second call (a resumed start) keeps the id of this invocation
    assert sweep_id() == uid

"""csv, tensorboard and wandb (offline) loggers from the `logger` group, in one run."""

import wandb

from pipeline.run import run


def test_many_loggers_offline(make_cfg, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = make_cfg("experiment=supervised_digits", "trainer=debug", "logger=many", "seed=5")
    record = run(cfg, tmp_path)
    assert record["status"] == "ok", record["error"]
    assert (tmp_path / "metrics.csv").is_file()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    (offline,) = (tmp_path / "wandb").glob("offline-run-*")
    wandb.teardown()  # wait for the service to flush the run log
    log = next(offline.glob("run-*.wandb")).read_bytes()
    # Group = experiment, tagged with the seed, named after it; the config is resolved, not interpolations.
    assert b"supervised_digits" in log and b"seed=5" in log and b"supervised_digits-seed5" in log
    assert b"${trainer.max_epochs}" not in log and b"T_max" in log
    assert wandb.run is None  # finished, so the next run in this process starts clean

"""The foundation, proven on a real supervised experiment (scikit-learn digits)."""

import math

import pandas as pd
import pytest
import torch
from hydra.utils import instantiate

from pipeline.data.digits import DigitsDataModule
from pipeline.run import run
from pipeline_testing import read_result, run_cli

SHORT = ("experiment=supervised_digits", "trainer.max_epochs=3", "trainer.enable_progress_bar=false")


def test_default_reaches_097_end_to_end(tmp_path):
    proc = run_cli("experiment=supervised_digits", f"hydra.run.dir={tmp_path}", "trainer.enable_progress_bar=false")
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = read_result(tmp_path)
    assert record["status"] == "ok" and record["error"] is None
    assert record["primary_metric"] == "test/acc"
    assert record["metrics"]["test/acc"] >= 0.97
    for key in ("experiment", "task", "seed", "wall_time_s", "time_breakdown_s", "device", "versions"):
        assert record[key] is not None, key
    assert {"train", "val", "test"} <= set(record["time_breakdown_s"])
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    curves = pd.read_csv(tmp_path / "metrics.csv")
    assert "step" in curves and curves["val/acc"].notna().sum() == 60


def test_model_pt_reloads_with_identical_predictions(make_cfg, tmp_path):
    cfg = make_cfg(*SHORT)
    record = run(cfg, tmp_path)
    assert record["status"] == "ok", record["error"]
    net = instantiate(cfg.model)(in_features=64, out_features=10)
    net.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))
    net.eval()
    dm = DigitsDataModule(**{k: v for k, v in cfg.data.items() if k != "_target_"})
    dm.setup()
    x, y = dm.splits["test"].tensors
    with torch.inference_mode():
        acc = (net(x).argmax(-1) == y).float().mean().item()
    assert acc == pytest.approx(record["metrics"]["test/acc"], abs=1e-6)
    # The Lightning checkpoint holds the same weights.
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    from_ckpt = {k.removeprefix("net."): v for k, v in ckpt["state_dict"].items() if k.startswith("net.")}
    for key, value in net.state_dict().items():
        assert torch.equal(value, from_ckpt[key]), key


def test_same_seed_gives_bitwise_identical_metrics(make_cfg, tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for d, seed in ((a, 3), (b, 3), (c, 4)):
        assert run(make_cfg(*SHORT, f"seed={seed}"), d)["status"] == "ok"
    assert (a / "metrics.csv").read_bytes() == (b / "metrics.csv").read_bytes()
    assert (a / "metrics.csv").read_bytes() != (c / "metrics.csv").read_bytes()


def test_resume_continues_from_last_checkpoint(make_cfg, tmp_path):
    first = run(make_cfg(*SHORT, "trainer.max_epochs=2"), tmp_path)
    assert first["status"] == "ok"
    second = run(make_cfg(*SHORT, "trainer.max_epochs=4", "ckpt_path=last"), tmp_path)
    assert second["status"] == "ok"
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["epoch"] == 3
    # Training restarted at epoch 2, not 0: the resumed part logged only epochs 2 and 3.
    curves = pd.read_csv(tmp_path / "metrics.csv")
    epochs = curves.loc[curves["train/loss"].notna(), "epoch"].unique()
    assert sorted(epochs) == [2, 3]


@pytest.mark.parametrize("loss,kind", [("bce", "one_vs_all"), ("mse", "regression"), ("huber", "regression")])
def test_other_losses_train(make_cfg, tmp_path, loss, kind):
    record = run(make_cfg(*SHORT, f"loss={loss}", "trainer.max_epochs=10"), tmp_path)
    assert record["status"] == "ok", record["error"]
    if kind == "regression":
        # Predicting the mean label gives a mean absolute error of 2.49 on digits.
        assert record["metrics"]["test/mae"] < 1.8
    else:
        # Well above the 0.1 of guessing.
        assert record["metrics"]["test/acc"] > 0.8


@pytest.mark.parametrize("opt", ["sgd", "adam", "adamw", "rmsprop"])
@pytest.mark.parametrize("sched", ["none", "step", "exponential", "cosine"])
def test_every_optimizer_and_scheduler_composes_and_steps(make_cfg, tmp_path, opt, sched):
    overrides = (*SHORT, f"optimizer={opt}", f"scheduler={sched}", "trainer.max_epochs=1", "trainer.limit_train_batches=2",
                 "trainer.limit_val_batches=1", "trainer.limit_test_batches=1")
    record = run(make_cfg(*overrides), tmp_path)
    assert record["status"] == "ok", record["error"]
    assert math.isfinite(record["metrics"]["test/loss"])


def test_nan_loss_stops_and_records_failure(make_cfg, tmp_path):
    record = run(make_cfg(*SHORT, "optimizer=sgd", "optimizer.lr=1e30"), tmp_path)
    assert record["status"] == "failed"
    assert "loss became" in record["error"] and "learning rate" in record["error"]
    assert read_result(tmp_path)["status"] == "failed"
    assert (tmp_path / "error.log").is_file()

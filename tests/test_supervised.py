"""The foundation, proven on a real supervised experiment (scikit-learn digits)."""

import math

import pandas as pd
import pytest
import torch
from hydra.utils import instantiate

from pipeline.data.digits import DigitsDataModule
from pipeline.nets.mlp import MLP
from pipeline.runtime.run import run
from pipeline_testing import read_result, run_cli

SHORT = ("experiment=supervised_digits", "trainer.max_epochs=3", "trainer.enable_progress_bar=false")


@pytest.mark.slow
def test_the_preset_learns_on_every_seed(make_cfg, tmp_path):
    """experiment=supervised_digits, seeds 0-2 in one process: each reaches 0.965 test accuracy.

    Measured on this machine: 0.975 on seeds 0-2 as single runs, 0.972-0.978 over 16 seeds in one
    process; 0.965 leaves about a point of margin below the worst seed seen.
    """
    records = run(make_cfg("experiment=supervised_digits", "seeds_per_process=3", "trainer.enable_progress_bar=false"), tmp_path)
    accs = [r["metrics"]["test/acc"] for r in records]
    assert all(r["status"] == "ok" for r in records) and min(accs) >= 0.965, accs


@pytest.mark.slow
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
    (record,) = run(cfg, tmp_path)
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
    # The Lightning checkpoint loads safely and carries what Lightning does not know (data orders, RNG).
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["epoch"] == 2 and ckpt["pipeline"]["agent_seeds"] == [0]
    stacked = {k.removeprefix("net."): v for k, v in ckpt["state_dict"].items() if k.startswith("net.")}
    from pipeline.nets.ensemble import make_ensemble

    ensemble = make_ensemble(instantiate(cfg.model), [0], (64,), 10)
    ensemble.load_state_dict(stacked)
    for key, value in net.state_dict().items():
        assert torch.equal(ensemble.member_state_dict(0)[key], value), key


def test_same_seed_gives_bitwise_identical_metrics(make_cfg, tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for d, seed in ((a, 3), (b, 3), (c, 4)):
        assert run(make_cfg(*SHORT, f"seed={seed}"), d)[0]["status"] == "ok"
    assert (a / "metrics.csv").read_bytes() == (b / "metrics.csv").read_bytes()
    assert (a / "metrics.csv").read_bytes() != (c / "metrics.csv").read_bytes()


def test_the_scheduler_steps_the_learning_rate_in_a_real_fit(make_cfg, tmp_path):
    """scheduler=step with step_size 1 and gamma 0.5: the logged learning rate halves every epoch."""
    (record,) = run(make_cfg(*SHORT, "scheduler=step", "scheduler.step_size=1", "scheduler.gamma=0.5", "optimizer.lr=0.008"), tmp_path)
    assert record["status"] == "ok", record["error"]
    lr = pd.read_csv(tmp_path / "metrics.csv").dropna(subset=["train/lr"]).set_index("step")["train/lr"]
    # The rate each epoch ran with (its start): the configured 0.008, then halved once per epoch.
    assert lr.tolist() == pytest.approx([0.008, 0.004, 0.002])


def test_k_seeds_in_one_process_write_k_ordinary_records(make_cfg, tmp_path):
    records = run(make_cfg(*SHORT, "seeds_per_process=3", "seed=4"), tmp_path)
    assert [r["seed"] for r in records] == [4, 5, 6] and all(r["status"] == "ok" for r in records)
    accs = [r["metrics"]["test/acc"] for r in records]
    assert min(accs) > 0.85 and len(set(accs)) > 1  # learned, and each seed is its own run
    for seed in (4, 5, 6):
        d = tmp_path / f"seed{seed}"
        assert read_result(d)["seeds_per_process"] == 3
        net = MLP(64, 10, hidden=(256, 128), dropout=0.2)
        net.load_state_dict(torch.load(d / "model.pt", weights_only=True))
        assert pd.read_csv(d / "metrics.csv").dropna(subset=["val/acc"])["step"].tolist() == [0, 1, 2]
    assert not (tmp_path / "result.json").exists()
    # Agent 1 of the batch is seed 5: the single run of seed 5 gets the same accuracy in distribution
    # (here, for this deterministic data, within two points).
    (single,) = run(make_cfg(*SHORT, "seed=5"), tmp_path / "single")
    assert abs(single["metrics"]["test/acc"] - records[1]["metrics"]["test/acc"]) < 0.02


@pytest.mark.parametrize("loss,kind", [("bce", "one_vs_all"), ("mse", "regression"), ("huber", "regression")])
def test_other_losses_train(make_cfg, tmp_path, loss, kind):
    (record,) = run(make_cfg(*SHORT, f"loss={loss}", "trainer.max_epochs=10"), tmp_path)
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
    (record,) = run(make_cfg(*overrides), tmp_path)
    assert record["status"] == "ok", record["error"]
    assert math.isfinite(record["metrics"]["test/loss"])


def test_nan_loss_stops_and_records_failure(make_cfg, tmp_path):
    (record,) = run(make_cfg(*SHORT, "optimizer=sgd", "optimizer.lr=1e30"), tmp_path)
    assert record["status"] == "failed"
    assert "loss became" in record["error"] and "learning rate" in record["error"]
    assert read_result(tmp_path)["status"] == "failed"
    assert (tmp_path / "error.log").is_file()


def test_a_run_resumed_with_ckpt_path_last_ends_where_the_straight_run_ends(make_cfg, tmp_path):
    """The preset (dropout 0.2): 2 epochs, then ckpt_path=last to 4, is bitwise the run of 4 epochs in one go
    (weights and test accuracy). Before the fix the resumed one was off (0.914 vs 0.931 test accuracy).
    (scheduler=none: the preset's cosine schedule spans max_epochs, so a run extended from 2 to 4 is another run.)"""
    args = (*SHORT[::2], "scheduler=none")
    (straight,) = run(make_cfg(*args, "trainer.max_epochs=4"), tmp_path / "straight")
    (first,) = run(make_cfg(*args, "trainer.max_epochs=2"), tmp_path / "resumed")
    (resumed,) = run(make_cfg(*args, "trainer.max_epochs=4", "ckpt_path=last"), tmp_path / "resumed")
    assert straight["status"] == first["status"] == resumed["status"] == "ok"
    assert resumed["metrics"]["test/acc"] == straight["metrics"]["test/acc"]
    mine = torch.load(tmp_path / "resumed" / "model.pt", weights_only=True)
    theirs = torch.load(tmp_path / "straight" / "model.pt", weights_only=True)
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)

"""seeds_per_process=K: K seeds trained in one process still leave K ordinary run records."""

import json

import torch

from pipeline.nets.mlp import MLP
from pipeline.report import build_report
from pipeline.run import run


def test_batched_dqn_writes_one_record_per_seed(make_cfg, tmp_path):
    cfg = make_cfg("experiment=dqn_cartpole_batched", "seeds_per_process=3", "seed=7", "task.total_steps=2000",
                   "model.hidden=[32,32]", "trainer.enable_progress_bar=false")
    summary = run(cfg, tmp_path)
    assert summary["status"] == "ok", summary["error"]
    assert sorted(p.name for p in tmp_path.glob("seed*")) == ["seed7", "seed8", "seed9"]
    for seed in (7, 8, 9):
        d = tmp_path / f"seed{seed}"
        record = json.loads((d / "result.json").read_text())
        assert record["status"] == "ok" and record["seed"] == seed and record["seeds_per_process"] == 3
        assert record["env_steps"] == 2000 and "eval/return_mean" in record["metrics"]
        net = MLP(4, 2, hidden=(32, 32))
        net.load_state_dict(torch.load(d / "model.pt", weights_only=True))
        assert "step" in (d / "metrics.csv").read_text().splitlines()[0]
    report = build_report([tmp_path], tmp_path / "report", reps=200)
    (group,) = report["groups"].values()
    assert group["n_ok"] == 3  # the batch's own folder is not counted as a fourth run


def test_single_seed_presets_batch_their_own_recipe(make_cfg, tmp_path):
    """`experiment=dqn_cartpole seeds_per_process=K` trains the single-seed recipe for K seeds at once."""
    cfg = make_cfg("experiment=dqn_cartpole", "seeds_per_process=2", "task.total_steps=1500", "trainer.enable_progress_bar=false")
    assert run(cfg, tmp_path / "dqn")["status"] == "ok"
    records = [json.loads(p.read_text()) for p in sorted((tmp_path / "dqn").glob("seed*/result.json"))]
    assert [r["seed"] for r in records] == [0, 1] and all(r["task"] == "BatchedDQNTask" for r in records)
    cfg = make_cfg("experiment=supervised_digits", "seeds_per_process=2", "trainer=debug")
    assert run(cfg, tmp_path / "sup")["status"] == "ok"
    assert len(list((tmp_path / "sup").glob("seed*/model.pt"))) == 2


def test_task_without_a_batched_variant_refuses(make_cfg, tmp_path):
    record = run(make_cfg("experiment=cem_cartpole", "seeds_per_process=2"), tmp_path)
    assert record["status"] == "failed" and "seed-batched" in record["error"]
    assert all(r.read_text().count('"failed"') for r in tmp_path.glob("seed*/result.json"))

"""`python -m pipeline.eval <run dir>` on runs without an env: a supervised run's test metrics from model.pt, a GAN's
score by its own judge; the numbers are the run's own record on the same split and noise."""

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from pipeline.data.digits import DigitsDataModule
from pipeline.eval import main as eval_main
from pipeline.nets.mlp import MLP
from pipeline.store.checkpoint import save_atomic  # as the pipeline writes it: with its digest
from pipeline_testing import read_result, run_cli, run_module


def run_eval(*args: str, env: dict | None = None):
    return run_module("pipeline.eval", *args, env=env, timeout=300)


def eval_json(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "eval.json").read_text())


@pytest.fixture(scope="module")
def supervised_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("supervised")
    proc = run_cli("experiment=supervised_digits", "trainer=debug", "seed=2", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return run_dir


def by_hand(run_dir: Path, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """model.pt in a plain MLP (sizes read from the weights), scored with torch's own loss: no task code."""
    state = torch.load(run_dir / "model.pt", weights_only=True)
    net = MLP(64, 10, hidden=[256, 128], dropout=0.2)
    net.load_state_dict(state)
    with torch.no_grad():
        out = net.eval()(x)
    return {"acc": float((out.argmax(1) == y).float().mean()), "loss": float(torch.nn.functional.cross_entropy(out, y))}


def split_of(split: str, **data) -> tuple[torch.Tensor, torch.Tensor]:
    dm = DigitsDataModule(**data)
    dm.setup()
    return dm.splits[split].tensors


@pytest.mark.slow
def test_supervised_eval_reports_the_runs_own_test_metrics(supervised_run):
    proc = run_eval(str(supervised_run))
    assert proc.returncode == 0, proc.stderr[-2000:]
    result, record = eval_json(supervised_run), read_result(supervised_run)
    assert result["split"] == "test" and result["run_seed"] == 2
    assert set(result["metrics"]) == {"test/acc", "test/loss"}
    for name, value in record["metrics"].items():
        assert result["metrics"][name] == pytest.approx(value, rel=1e-6, abs=1e-7), name
    # An untrained-looking number would also be "some accuracy": the record's own is the reference, and a hand
    # computation agrees with it.
    expected = by_hand(supervised_run, *split_of("test"))
    assert result["metrics"]["test/acc"] == pytest.approx(expected["acc"], abs=1e-6)
    assert result["metrics"]["test/loss"] == pytest.approx(expected["loss"], rel=1e-5)
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and "test/acc=" in lines[0] and "eval.json" in lines[0]


@pytest.mark.slow
def test_supervised_eval_on_other_splits_and_data(supervised_run):
    # In-process (the CLI's own subprocess is pinned above): split=val is the run's own last validation row.
    assert eval_main([str(supervised_run), "split=val"]) == 0
    metrics = eval_json(supervised_run)["metrics"]
    rows = [r for r in (supervised_run / "metrics.csv").read_text().splitlines()[1:]]
    header = (supervised_run / "metrics.csv").read_text().splitlines()[0].split(",")
    last_val = [dict(zip(header, r.split(","))) for r in rows if r.split(",")[header.index("val/acc")]][-1]
    assert metrics["val/acc"] == pytest.approx(float(last_val["val/acc"]), abs=1e-6)
    assert metrics["val/loss"] == pytest.approx(float(last_val["val/loss"]), rel=1e-6)
    # data.<key>=: another split of the digits (split_seed=1), scored where the run never was.
    assert eval_main([str(supervised_run), "split=train", "data.split_seed=1"]) == 0
    result = eval_json(supervised_run)
    assert result["split"] == "train" and result["data"] == {"split_seed": "1"}
    expected = by_hand(supervised_run, *split_of("train", split_seed=1))
    assert result["metrics"]["train/acc"] == pytest.approx(expected["acc"], abs=1e-6)
    assert result["metrics"]["train/loss"] == pytest.approx(expected["loss"], rel=1e-5)
    assert expected != by_hand(supervised_run, *split_of("train"))  # the override did change the data


@pytest.mark.slow
def test_a_seed_of_a_seed_batched_supervised_run(tmp_path, capsys):
    proc = run_cli("experiment=supervised_digits", "trainer=debug", "seeds_per_process=2", "seed=5", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert run_eval(str(tmp_path / "seed6")).returncode == 0
    assert eval_main([str(tmp_path / "seed5")]) == 0
    for seed in (5, 6):
        result, record = eval_json(tmp_path / f"seed{seed}"), read_result(tmp_path / f"seed{seed}")
        assert result["run_seed"] == seed
        # The run scored both members in one batched forward, eval scores one: equal up to float rounding.
        for name, value in record["metrics"].items():
            assert result["metrics"][name] == pytest.approx(value, rel=1e-5, abs=1e-6), (seed, name)
    capsys.readouterr()
    assert eval_main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "seed5, seed6" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_gan_eval_scores_the_generator_as_the_run_did(tmp_path, capsys, monkeypatch):
    cache = {"PIPELINE_CACHE": str(tmp_path / "cache")}
    run_dir = tmp_path / "run"
    proc = run_cli("experiment=gan_digits", "trainer=debug", "seed=1", f"hydra.run.dir={run_dir}", env=cache)
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = run_eval(str(run_dir), env=cache)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record, result = read_result(run_dir)["metrics"], eval_json(run_dir)
    # The same judge, reference and noise stream (seed + a fixed offset): the run's final score, exactly.
    scored = {k for k in record if k.startswith("eval/") and not k.endswith("_start")}
    assert set(result["metrics"]) == scored and "eval/inception_score" in scored
    # Within 1e-5: float32 feature sums in two processes may part in the last bits, and the Fréchet distance's matrix
    # square root amplifies that (seen once under load: 5.693631 vs 5.693623, 1.3e-6 relative); another noise stream
    # moves it by percents (below).
    for name in scored:
        assert result["metrics"][name] == pytest.approx(record[name], rel=1e-5, abs=1e-9), name
    # Other noise gives another sample, hence another Fréchet distance; the real-data reference stays.
    monkeypatch.setenv("PIPELINE_CACHE", cache["PIPELINE_CACHE"])
    assert eval_main([str(run_dir), "seed=7"]) == 0
    other = eval_json(run_dir)["metrics"]
    assert other["eval/frechet_distance"] != pytest.approx(record["eval/frechet_distance"], rel=1e-6)
    assert other["eval/inception_score_real"] == pytest.approx(record["eval/inception_score_real"], rel=1e-9)
    capsys.readouterr()
    assert eval_main([str(run_dir), "split=val"]) == 2
    err = capsys.readouterr().err
    assert "choose split=test" in err and len(err.strip().splitlines()) == 1


# ---- bad input: one line, exit 2, no eval.json (configs saved as the CLI composes them, no training) ----


def saved_run(make_cfg, run_dir: Path, *overrides: str, state: dict | None = None) -> Path:
    cfg = make_cfg(*overrides)
    (run_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    if state is not None:
        save_atomic(state, run_dir / "model.pt")
    return run_dir


SUPERVISED = ("experiment=supervised_digits",)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["split=foo"], "split=foo: a SupervisedTask run is scored on test, val, train; choose split=test or split=val or split=train"),
        (["data.path=bids.csv"], "data.path: the run's data (pipeline.data.digits.DigitsDataModule) has no such key; it has batch_size"),
        (["data.test_fraction=2"], "data.test_fraction=2 must be in (0, 1)"),
        (["episodes=3"], "episodes= replay RL agents"),
        (["seed=3"], "seed=3: a supervised score draws nothing at random"),
    ],
)
def test_bad_options_for_a_supervised_run_are_one_line(make_cfg, tmp_path, capsys, args, says):
    torch.manual_seed(0)
    run_dir = saved_run(make_cfg, tmp_path / "run", *SUPERVISED, state=MLP(64, 10, hidden=[256, 128], dropout=0.2).state_dict())
    assert eval_main([str(run_dir), *args]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1
    assert not (run_dir / "eval.json").exists()


def test_a_supervised_run_with_hand_made_weights_is_scored(make_cfg, tmp_path, capsys):
    """No training at all: the CLI's numbers are those of the weights it was given (fast, in-process)."""
    torch.manual_seed(0)
    net = MLP(64, 10, hidden=[256, 128], dropout=0.2)
    run_dir = saved_run(make_cfg, tmp_path / "run", *SUPERVISED, state=net.state_dict())
    assert eval_main([str(run_dir), "split=val"]) == 0
    expected = by_hand(run_dir, *split_of("val"))
    metrics = eval_json(run_dir)["metrics"]
    assert metrics["val/acc"] == pytest.approx(expected["acc"], abs=1e-6)
    assert metrics["val/loss"] == pytest.approx(expected["loss"], rel=1e-5)


def test_weights_of_another_model_and_a_missing_model_are_one_line(make_cfg, tmp_path, capsys):
    run_dir = saved_run(make_cfg, tmp_path / "run", *SUPERVISED, state=MLP(64, 10, hidden=[32]).state_dict())
    assert eval_main([str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "model.pt does not fit the run's model config (pipeline.nets.mlp.MLP)" in err and len(err.strip().splitlines()) == 1
    empty = saved_run(make_cfg, tmp_path / "empty", *SUPERVISED)
    assert eval_main([str(empty)]) == 2
    err = capsys.readouterr().err
    assert "no model.pt; did the run finish?" in err and len(err.strip().splitlines()) == 1


def test_a_task_eval_cannot_score_is_one_line(make_cfg, tmp_path, capsys):
    run_dir = saved_run(make_cfg, tmp_path / "run", "experiment=rmac_auction", state={})
    assert eval_main([str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "CounterfactualTask" in err and "scores supervised and GAN runs" in err and len(err.strip().splitlines()) == 1


def test_data_options_on_an_rl_run_are_one_line(make_cfg, tmp_path, capsys):
    run_dir = saved_run(make_cfg, tmp_path / "run", "experiment=dqn_cartpole", "model.hidden=[16]", state=MLP(4, 2, hidden=[16]).state_dict())
    assert eval_main([str(run_dir), "split=val"]) == 2
    err = capsys.readouterr().err
    assert "split= score supervised and GAN runs" in err and len(err.strip().splitlines()) == 1

"""runtime/model_eval.py's pure parts: data.<key>= overrides, the split and options checks, the task class check and
the one-line summary, on configs and results written by hand (scoring a real run is tests/test_eval_tasks.py's)."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipeline.runtime import model_eval
from pipeline.runtime.replay import EvalError, Options
from pipeline.store.checkpoint import save_atomic  # as the pipeline writes it: with its digest


def test_data_overrides_are_read_as_yaml_on_a_copy():
    cfg = OmegaConf.create({"data": {"_target_": "x.Data", "batch_size": 64, "noise": {"std": 0.1}, "name": "a"}})
    out = model_eval.with_data_overrides(cfg, {"batch_size": "128", "noise.std": "0.5", "name": "[b, c]"})
    assert out.data.batch_size == 128 and out.data.noise.std == 0.5 and list(out.data.name) == ["b", "c"]
    assert cfg.data.batch_size == 64 and cfg.data.noise.std == 0.1  # the run's config is untouched


def test_a_value_yaml_cannot_read_is_kept_as_text():
    cfg = OmegaConf.create({"data": {"_target_": "x.Data", "path": "p"}})
    out = model_eval.with_data_overrides(cfg, {"path": "a: b: c"})
    assert out.data.path == "a: b: c"


def test_an_override_replaces_a_node_instead_of_merging_into_it():
    cfg = OmegaConf.create({"data": {"_target_": "x.Data", "noise": {"std": 0.1, "kind": "g"}}})
    out = model_eval.with_data_overrides(cfg, {"noise": "{std: 0.2}"})
    assert OmegaConf.to_container(out.data.noise) == {"std": 0.2}


def test_interpolations_survive_the_copy():
    cfg = OmegaConf.create({"seed": 3, "data": {"_target_": "x.Data", "seed": "${seed}"}})
    out = model_eval.with_data_overrides(cfg, {})
    out.seed = 9
    assert out.data.seed == 9


@pytest.mark.parametrize(("key", "expected"), [
    ("batchsize", "data.batchsize: the run's data (x.Data) has no such key; it has batch_size, noise"),
    ("_target_", "data._target_: the run's data (x.Data) has no such key; it has batch_size, noise"),
    ("size.of", "data.size.of: the run's data (x.Data) has no such key; it has batch_size, noise"),
])
def test_a_key_the_data_lacks_is_one_line_naming_the_keys(key, expected):
    cfg = OmegaConf.create({"data": {"_target_": "x.Data", "batch_size": 1, "noise": 0}})
    with pytest.raises(EvalError) as info:
        model_eval.with_data_overrides(cfg, {key: "1"})
    assert str(info.value) == expected


def test_a_run_without_data_says_none():
    with pytest.raises(EvalError) as info:
        model_eval.with_data_overrides(OmegaConf.create({"seed": 1}), {"batch_size": "2"})
    assert str(info.value) == "data.batch_size: the run's data (none) has no such key"
    with pytest.raises(EvalError) as info:
        model_eval.with_data_overrides(OmegaConf.create({"data": {"_target_": "x.D"}}), {"a": "2"})
    assert str(info.value) == "data.a: the run's data (x.D) has no such key"


class Scored:
    eval_splits = ("test", "val")


def options(**kwargs) -> Options:
    return Options(run_dir=Path("runs/x"), **kwargs)


def test_the_split_defaults_to_the_tasks_first():
    assert model_eval.check_options(options(), Scored) == "test"
    assert model_eval.check_options(options(split="val", given={"split", "seed", "device"}), Scored) == "val"


def test_a_split_the_task_does_not_score_names_the_ones_it_does():
    with pytest.raises(EvalError) as info:
        model_eval.check_options(options(split="train"), Scored)
    assert str(info.value) == "split=train: a Scored run is scored on test, val; choose split=test or split=val"


@pytest.mark.parametrize(("given", "named"), [
    ({"episodes", "split"}, "episodes="), ({"video"}, "video="), ({"video", "episodes"}, "episodes= and video="),
])
def test_rl_options_are_refused(given, named):
    with pytest.raises(EvalError) as info:
        model_eval.check_options(options(given=given), Scored)
    assert str(info.value) == f"{named} replay RL agents; a Scored run takes split= and data.<key>="


def test_task_of_returns_a_scorable_task_and_refuses_the_rest():
    cls = model_eval.task_of(OmegaConf.create({"task": {"_target_": "pipeline.tasks.supervised.SupervisedTask"}}))
    assert cls.__name__ == "SupervisedTask"
    with pytest.raises(EvalError) as info:
        model_eval.task_of(OmegaConf.create({"task": {"_target_": "pipeline.tasks.dqn.DQNTask"}}))
    assert str(info.value) == ("this run (DQNTask) has no environment and its task declares no eval_splits: "
                               "pipeline.eval replays reinforcement-learning agents and scores supervised and GAN runs")
    with pytest.raises(EvalError) as info:
        model_eval.task_of(OmegaConf.create({"task": {"_target_": "collections.OrderedDict"}}))
    assert str(info.value) == "task._target_=collections.OrderedDict is not a pipeline.tasks.base.Task subclass"


def result(metrics: dict, data: dict | None = None) -> dict:
    return {"task": "SupervisedTask", "run_seed": 3, "split": "val", "data": data or {}, "primary_metric": "acc",
            "metrics": metrics}


def test_the_summary_puts_the_primary_metric_first_to_four_digits():
    line = model_eval.summary(result({"loss": 0.123456, "acc": 0.98765}, {"batch_size": "8", "noise": "0.5"}),
                              Path("runs/x/eval.json"))
    assert line == ("SupervisedTask seed 3, val split data.batch_size=8 data.noise=0.5: acc=0.9877 loss=0.1235 "
                    "-> runs/x/eval.json")


def test_the_summary_shows_four_metrics_and_counts_the_rest():
    four = {"b": 2.0, "acc": 1.0, "c": 3.0, "a": 4.0}
    assert model_eval.summary(result(four), Path("e.json")) == (
        "SupervisedTask seed 3, val split: acc=1 b=2 c=3 a=4 -> e.json")
    five = {**four, "d": 5.0}
    assert model_eval.summary(result(five), Path("e.json")) == (
        "SupervisedTask seed 3, val split: acc=1 b=2 c=3 a=4 (+1 more) -> e.json")
    six = {**four, "d": 5.0, "e": 123456.0}
    assert model_eval.summary(result(six), Path("e.json")) == (
        "SupervisedTask seed 3, val split: acc=1 b=2 c=3 a=4 (+2 more) -> e.json")


def test_one_line_is_the_first_line_of_the_root_cause():
    from hydra.errors import InstantiationException

    wrapped = InstantiationException("Error in call to target 'x':\nValueError('inner')")
    wrapped.__cause__ = ValueError("batch_size must be positive\nmore")
    assert model_eval._one_line(ValueError("first\nsecond")) == "first"
    assert model_eval._one_line(ValueError("  \n")) == "ValueError"
    assert model_eval._one_line(ValueError()) == "ValueError"
    assert model_eval._one_line(wrapped) == "batch_size must be positive"


def test_score_run_returns_what_eval_json_holds(make_cfg, tmp_path):
    """A supervised run saved by hand (config and untrained weights, no training), scored in-process."""
    import torch

    from pipeline.nets.mlp import MLP

    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(make_cfg("experiment=supervised_digits"), run_dir / ".hydra" / "config.yaml")
    torch.manual_seed(0)
    save_atomic(MLP(64, 10, hidden=[256, 128], dropout=0.2).state_dict(), run_dir / "model.pt")
    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    got = model_eval.score_run(Options(run_dir=run_dir, split="val", data={"batch_size": "32"}), cfg, 7)
    seconds = got.pop("seconds")
    metrics = got.pop("metrics")
    assert got == {"run_dir": str(run_dir), "task": "SupervisedTask", "run_seed": 7, "split": "val",
                   "data": {"batch_size": "32"}, "seed": None, "device": "cpu", "primary_metric": "test/acc"}
    assert sorted(metrics) == ["val/acc", "val/loss"] and 0 <= metrics["val/acc"] <= 1
    assert isinstance(seconds, float) and 0 <= seconds < 600 and round(seconds * 1000) == pytest.approx(seconds * 1000)

"""`python -m pipeline.eval` in-process, on run dirs written here (no training): its arguments, the device check,
what it prints, the replay-or-score dispatch and the one-line errors for bad input (tests/test_eval.py runs it on
trained runs, in subprocesses)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from pipeline import eval as evaluation
from pipeline.eval import main, options_path, parse_args
from pipeline.nets.mlp import MLP
from pipeline.runtime import devices
from pipeline.runtime.replay import EvalError, Options
from pipeline.store.checkpoint import save_atomic  # as the pipeline writes it: with its digest

USAGE = ("usage: python -m pipeline.eval <run dir> [device=cpu] [out=<dir for eval.json>]  "
         "RL (DQN, PPO, SAC, TD3, CEM): [episodes=10] [video=false] [seed=<first episode>] [weights=model|best]  "
         "supervised: [split=test|val|train] [data.<key>=<value>]  GAN: [seed=<noise seed>] [data.<key>=<value>]")
NUMBER = "expected a whole number >= 0 (>= 1 for episodes)"


def _error(argv: list[str]) -> str:
    with pytest.raises(EvalError) as err:
        parse_args(argv)
    return str(err.value)


def test_defaults_with_only_a_run_dir():
    assert parse_args(["runs/x"]) == Options(run_dir=Path("runs/x"), episodes=10, video=False, device="cpu", seed=None,
                                             split=None, data={}, given=set())


def test_every_option_and_the_names_given():
    options = parse_args(["episodes=3", "r", "video=TRUE", "seed=0", "split=val", "data.split_seed=1", "data.a=b=c"])
    assert options == Options(run_dir=Path("r"), episodes=3, video=True, seed=0, split="val",
                              data={"split_seed": "1", "a": "b=c"}, given={"episodes", "video", "seed", "split", "data"})
    assert parse_args(["r", "video=False"]).video is False and parse_args(["r", "video=true"]).video is True
    assert parse_args(["r", "episodes=1"]).episodes == 1


def test_a_run_dir_whose_name_holds_an_equals_sign_is_the_run_dir(tmp_path):
    """A sweep job's dir is named after its overrides (`optimizer.lr=0.01,seed=3`): an existing dir is the run dir,
    from eval and export alike; anything else with "=" is an option."""
    from pipeline.export import parse_args as export_args

    job = tmp_path / "optimizer.lr=0.01,seed=3"
    job.mkdir()
    assert parse_args([str(job), "episodes=2"]) == Options(run_dir=job, episodes=2, given={"episodes"})
    assert export_args([str(job), "n=3"]) == {"run_dir": job, "n": 3}
    assert _error([str(tmp_path / "lr=0.1")]) == f"expected one run dir, got 0; {USAGE}"  # not a dir: an option


@pytest.mark.parametrize("argv, count", [([], 0), (["a", "b"], 2), (["episodes=2"], 0)])
def test_one_run_dir_exactly(argv, count):
    assert _error(argv) == f"expected one run dir, got {count}; {USAGE}"


@pytest.mark.parametrize("item, message", [
    ("episodes=0", f"episodes=0: {NUMBER}"), ("episodes=two", f"episodes=two: {NUMBER}"),
    ("seed=-1", f"seed=-1: {NUMBER}"), ("seed=1.5", f"seed=1.5: {NUMBER}"),
    ("video=yes", "video=yes: expected true or false"), ("video=", "video=: expected true or false"),
    ("split=", f"split= needs a value: test, val or train; {USAGE}"),
    ("colour=red", f"unknown option 'colour'; {USAGE}"), ("data.=1", f"unknown option 'data.'; {USAGE}"),
    ("datax=1", f"unknown option 'datax'; {USAGE}"),
    ("device=tpu", "device=tpu: choose cpu, cuda, cuda:<n>, mps or auto"),
    ("device=cuda:x", "device=cuda:x: choose cpu, cuda, cuda:<n>, mps or auto"),
    ("device=:0", "device=:0: choose cpu, cuda, cuda:<n>, mps or auto"),
])
def test_bad_options_are_one_line(item, message):
    assert _error(["r", item]) == message


def test_the_first_bad_option_is_named():
    assert _error(["r", "seed=-2", "episodes=0"]) == f"seed=-2: {NUMBER}"


@pytest.mark.parametrize("given, resolved", [("cpu", "cpu"), ("CPU", "cpu"), ("cuda", "cuda"), ("gpu", "cuda"),
                                             ("cuda:1", "cuda:1"), ("Cuda:2", "cuda:2"), ("mps", "mps"),
                                             ("auto", "cuda")])
def test_the_device_is_resolved_now(monkeypatch, given, resolved):
    asked = []

    def resolve(kind):
        asked.append(kind)
        return {"cpu": "cpu", "cuda": "cuda", "gpu": "cuda", "mps": "mps", "auto": "cuda"}[kind]

    monkeypatch.setattr(devices, "resolve_accelerator", resolve)
    assert parse_args(["r", f"device={given}"]).device == resolved
    assert asked == [given.lower().partition(":")[0]]


def test_a_device_the_machine_lacks_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _error(["r", "device=cuda:0"]) == (
        "device=cuda was requested but torch sees no CUDA GPU; use device=cpu or device=auto")
    assert parse_args(["r", "device=auto"]).device in ("cpu", "mps")


def test_help_prints_the_usage_and_the_module_doc(capsys):
    for flag in ("-h", "--help"):
        assert main(["r", flag]) == 0
        out = capsys.readouterr().out
        assert out.startswith(USAGE + "\n\nEvaluate a trained run from its `model.pt`: `python -m pipeline.eval")
        assert out.endswith("torch and gymnasium take to import.\n")


def test_bad_input_is_one_line_on_stderr_and_exit_2(tmp_path, capsys):
    assert main([str(tmp_path / "none")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"error: {tmp_path / 'none'}: no such run dir\n"
    assert main(["a", "b"]) == 2
    assert capsys.readouterr().err == f"error: expected one run dir, got 2; {USAGE}\n"


def test_argv_defaults_to_the_command_line(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["pipeline.eval", "--help"])
    assert main() == 0 and capsys.readouterr().out.startswith(USAGE)
    monkeypatch.setattr("sys.argv", ["pipeline.eval"])
    assert main() == 2 and capsys.readouterr().err == f"error: expected one run dir, got 0; {USAGE}\n"


def _always_right() -> dict:
    net = MLP(4, 2, hidden=(8,))
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
        list(net.parameters())[-1][1] = 1.0
    return net.state_dict()


def test_an_rl_run_is_replayed_and_summed_up_in_one_line(tmp_path, capsys):
    cfg = {"seed": 5, "name": "r", "task": {"_target_": "pipeline.tasks.dqn.DQNTask"},
           "env": {"id": "CartPole-v1", "kwargs": {"max_episode_steps": 6}},
           "model": {"_target_": "pipeline.nets.mlp.MLP", "_partial_": True, "hidden": [8]}}
    (tmp_path / ".hydra").mkdir()
    OmegaConf.save(OmegaConf.create(cfg), tmp_path / ".hydra" / "config.yaml")
    save_atomic(_always_right(), tmp_path / "model.pt")
    assert main([str(tmp_path), "episodes=2", "seed=7"]) == 0
    # Pushing right for 6 steps never topples the pole: every episode runs to its limit, return 6.
    assert capsys.readouterr().out == (f"2 episodes of CartPole-v1: return 6.0 ± 0.0 (seeds 7-8) -> {tmp_path}/eval.json\n")
    written = json.loads((tmp_path / "eval.json").read_text())
    assert written["returns"] == [6.0, 6.0] and written["seeds"] == [7, 8] and written["logged_to"] == []
    assert main([str(tmp_path), "split=val"]) == 2
    assert capsys.readouterr().err == ("error: split= score supervised and GAN runs; an RL run is replayed in its env: "
                                       "episodes=, video=, seed=\n")


def test_the_replay_line_rounds_and_drops_an_undefined_spread(monkeypatch, capsys):
    result = {"run_dir": "runs/a", "env_id": "Pendulum-v1", "episodes": 3, "mean": -123.456, "std": 7.06,
              "seeds": [30_000, 30_001, 30_002]}
    monkeypatch.setattr(evaluation, "evaluate_run", lambda options, out=None, weights="model": dict(result))
    assert main(["runs/a"]) == 0
    assert capsys.readouterr().out == "3 episodes of Pendulum-v1: return -123.5 ± 7.1 (seeds 30000-30002) -> runs/a/eval.json\n"
    monkeypatch.setattr(evaluation, "evaluate_run", lambda options, out=None, weights="model": {**result, "std": float("nan"), "episodes": 1,
                                                                     "seeds": [4]})
    assert main(["runs/a"]) == 0
    assert capsys.readouterr().out == "1 episodes of Pendulum-v1: return -123.5 (seeds 4-4) -> runs/a/eval.json\n"


def test_a_scored_run_prints_its_metrics(monkeypatch, capsys):
    seen = []
    result = {"run_dir": "runs/s", "task": "ClassifierTask", "run_seed": 3, "split": "val", "data": {"split_seed": "1"},
              "primary_metric": "val/acc", "metrics": {"val/loss": 0.25, "val/acc": 0.875}}
    monkeypatch.setattr(evaluation, "evaluate_run", lambda options, out=None, weights="model": seen.append(options) or result)
    assert main(["runs/s", "split=val", "data.split_seed=1"]) == 0
    assert capsys.readouterr().out == (
        "ClassifierTask seed 3, val split data.split_seed=1: val/acc=0.875 val/loss=0.25 -> runs/s/eval.json\n")
    assert seen == [Options(run_dir=Path("runs/s"), split="val", data={"split_seed": "1"}, given={"split", "data"})]


def test_a_run_without_an_env_goes_to_the_scorer(tmp_path, monkeypatch, capsys):
    from pipeline.runtime import model_eval

    (tmp_path / ".hydra").mkdir()
    OmegaConf.save(OmegaConf.create({"seed": 2, "task": {"_target_": "S"}}), tmp_path / ".hydra" / "config.yaml")
    save_atomic({}, tmp_path / "model.pt")
    scored = {"run_dir": str(tmp_path), "task": "S", "run_seed": 2, "split": "test", "data": {},
              "primary_metric": "test/acc", "metrics": {"test/acc": 0.5}}
    monkeypatch.setattr(model_eval, "score_run", lambda options, cfg, seed: dict(scored))
    assert main([str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"S seed 2, test split: test/acc=0.5 -> {tmp_path}/eval.json\n"
    assert json.loads((tmp_path / "eval.json").read_text()) == scored


def test_options_path_is_eval_json_in_the_run_dir():
    assert options_path({"run_dir": "a/b"}) == "a/b/eval.json"

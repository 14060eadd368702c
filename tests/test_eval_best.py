"""`python -m pipeline.eval <run> weights=best` (rl-zoo's `enjoy --load-best`): the replay plays best.pt, the
weights `pipeline.load(run, weights="best")` acts with; a run that kept none, or a run without an env, is one line
naming why, before any work."""

import json

import gymnasium as gym
import pytest

import pipeline
from pipeline.eval import main as eval_main
from pipeline_testing import run_cli


@pytest.fixture(scope="module")
def kept_best(tmp_path_factory):
    """A debug DQN run that keeps its best-evaluated weights (one evaluation during training, at env step 128)."""
    run_dir = tmp_path_factory.mktemp("best") / "run"
    done = run_cli("experiment=dqn_cartpole", "trainer=debug", "task.keep_best=true", "seed=2", f"hydra.run.dir={run_dir}")
    assert done.returncode == 0, done.stderr[-2000:]
    import torch

    best, final = (torch.load(run_dir / name, weights_only=True) for name in ("best.pt", "model.pt"))
    assert any(not torch.equal(best[k], final[k]) for k in final)  # trained on after its evaluation: other weights
    return run_dir


def _returns(agent, seeds):
    env = gym.make("CartPole-v1")
    out = []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(agent.act(obs))
            total, done = total + float(reward), terminated or truncated
        out.append(total)
    env.close()
    return out


def test_weights_best_replays_best_pt(kept_best, tmp_path, capsys):
    assert eval_main([str(kept_best), "weights=best", "episodes=3", f"out={tmp_path / 'best'}"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("3 episodes of CartPole-v1 (best.pt): return ") and "\n" not in line, line
    best = json.loads((tmp_path / "best" / "eval.json").read_text())
    assert best["weights"] == "best" and best["seeds"] == [30_002, 30_003, 30_004]
    # The returns best.pt's own greedy policy gets on those start states, played here without the eval code.
    assert best["returns"] == _returns(pipeline.load(kept_best, weights="best"), best["seeds"])
    assert eval_main([str(kept_best), "episodes=3", f"out={tmp_path / 'model'}"]) == 0
    final = json.loads((tmp_path / "model" / "eval.json").read_text())
    assert final["weights"] == "model" and final["returns"] == _returns(pipeline.load(kept_best), final["seeds"])


@pytest.mark.parametrize(("experiment", "why"), [
    ("dqn_cartpole", "it ran without task.keep_best=true"),
    ("supervised_digits", "only RL runs keep their best-evaluated weights"),
])
def test_a_run_without_best_weights_is_one_line(make_cfg, tmp_path, capsys, experiment, why):
    from omegaconf import OmegaConf

    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(make_cfg(f"experiment={experiment}"), run_dir / ".hydra" / "config.yaml")
    (run_dir / "model.pt").write_bytes(b"")  # never read: the refusal comes first
    assert eval_main([str(run_dir), "weights=best"]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {run_dir / 'best.pt'}: no such file: this run kept no best-evaluated weights ({why}); "
                   "evaluate model.pt: leave out weights=best\n")
    assert not (run_dir / "eval.json").exists()


def test_weights_takes_model_or_best(tmp_path, capsys):
    assert eval_main([str(tmp_path), "weights=last"]) == 2
    assert capsys.readouterr().err == ("error: weights=last: choose model (model.pt, the weights at the end of training) "
                                       "or best (best.pt, an RL run's best-evaluated weights)\n")


def test_help_names_every_rl_algorithm_and_weights(capsys):
    assert eval_main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "RL (DQN, PPO, SAC, TD3, CEM)" in out and "weights=model|best" in out and "weights=best" in out

"""The worked example of docs/add_an_algorithm.md (tests/example_algorithm/: one file plus one YAML) runs end to end."""

import json
from pathlib import Path

import pandas as pd

from pipeline_testing import read_result, run_cli, run_module

EXAMPLE = Path(__file__).resolve().parents[1] / "example_algorithm"


def test_a_new_algorithm_from_its_own_config_dir_runs_and_records(tmp_path):
    proc = run_cli("--config-dir", "conf", "experiment=bandit", "task.steps=300", f"hydra.run.dir={tmp_path}", cwd=EXAMPLE)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "configure_optimizers" not in proc.stdout + proc.stderr  # Lightning warned of a `None` from it
    record = read_result(tmp_path)
    assert record["status"] == "ok" and record["task"] == "BanditTask" and record["primary_metric"] == "eval/best_arm"
    # arms 0, 0.5 and 1 with noise 0.1: ~30 exploring pulls find the best arm with certainty
    assert record["metrics"]["eval/best_arm"] == 1.0
    assert sum(record["pulls"]) == 300 and record["pulls"][2] > 200  # agent_record's field, from the task
    curve = pd.read_csv(tmp_path / "metrics.csv")
    assert curve["step"].tolist() == [50, 100, 150, 200, 250, 300]  # one row per log_every pulls, via self.curves
    assert curve["train/reward_mean"].iloc[-1] > 0.8


def test_its_config_is_typed(tmp_path):
    proc = run_cli("--config-dir", "conf", "experiment=bandit", "task.epsilon=high", f"hydra.run.dir={tmp_path}", cwd=EXAMPLE)
    assert proc.returncode == 2
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "task.epsilon" in line]
    assert errors == ["error: task.epsilon=high: expected a number; e.g. task.epsilon=0.1"], proc.stderr[-2000:]
    assert not (tmp_path / "result.json").exists()


def test_an_rl_algorithm_on_rltask_is_one_file_and_runs_k_seeds_durably(tmp_path):
    """docs/add_an_algorithm.md's RL example (reinforce.py: the algorithm only) gets from RLTask the K-agent batch,
    evaluations on schedule, one record and model.pt per seed, and checkpoints holding its own counters."""
    import torch

    from pipeline.nets.mlp import MLP

    proc = run_cli("--config-dir", "conf", "experiment=reinforce", "task.total_steps=4096", "task.eval_every=2048",
                   "seeds_per_process=2", "trainer.enable_progress_bar=false", f"hydra.run.dir={tmp_path}", cwd=EXAMPLE)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for seed in (0, 1):
        record = read_result(tmp_path / f"seed{seed}")
        assert record["status"] == "ok" and record["task"] == "ReinforceTask" and record["seed"] == seed
        assert record["env_steps"] == 4096 and [e["env_step"] for e in record["evaluations"]] == [2048, 4096]
        assert record["metrics"]["train/episodes"] > 0 and 0 < record["metrics"]["eval/return_mean"] <= 500
        net = MLP(4, 2, hidden=(32,))
        net.load_state_dict(torch.load(tmp_path / f"seed{seed}" / "model.pt", weights_only=True))
        curve = pd.read_csv(tmp_path / f"seed{seed}" / "metrics.csv")
        assert {"eval/return_mean", "train/episodic_return", "final_eval/return_mean"} <= set(curve.columns)
    state = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["format"] == "example.reinforce/1" and state["progress"]["updates"] == 4096 // (64 * 4)
    replayed_loaded_and_exported_as_its_policy_declares(tmp_path / "seed1")


def replayed_loaded_and_exported_as_its_policy_declares(run_dir):
    """The example's `policy = CategoricalPolicy`: `python -m pipeline.eval` (from its folder), `pipeline.load` and
    `python -m pipeline.export` play the most likely action of its MLP, computed here from model.pt by hand."""
    import numpy as np
    import torch

    from pipeline.nets.mlp import MLP

    net = MLP(4, 2, hidden=(32,))
    net.load_state_dict(torch.load(run_dir / "model.pt", weights_only=True))

    def by_hand(obs):
        with torch.no_grad():
            return net(torch.as_tensor(np.asarray(obs, dtype=np.float32))).argmax(-1).numpy()

    plays_as_by_hand(run_dir, by_hand, to_env=int)


def plays_as_by_hand(run_dir, by_hand, to_env=lambda action: action):
    """`python -m pipeline.eval` (from the examples' folder), `pipeline.load` and `python -m pipeline.export` play the
    deterministic actions `by_hand` computes from model.pt (observations [N, *obs_shape] -> actions [N, ...]; `to_env`
    makes one of them what the env steps on), and a stochastic act draws from its generator. Returns the
    observations the act and the export were compared on."""
    import numpy as np
    import torch

    import pipeline
    from pipeline.runtime.replay import REPLAY_SEED_OFFSET, find_config, run_env

    cfg, seed = find_config(run_dir)
    env, returns, seen = run_env(cfg), [], []
    for episode in range(2):  # the replay's episodes: seeds seed + 30,000 + i, the deterministic action each step
        obs, _ = env.reset(seed=seed + REPLAY_SEED_OFFSET + episode)
        total, done = 0.0, False
        while not done:
            seen.append(obs)
            obs, reward, terminated, truncated, _ = env.step(to_env(by_hand(obs[None])[0]))
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    env.close()
    proc = run_module("pipeline.eval", str(run_dir), "episodes=2", cwd=EXAMPLE)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((run_dir / "eval.json").read_text())["returns"] == returns
    agent = pipeline.load(run_dir)
    random_obs = np.random.default_rng(0).normal(size=(200, *seen[0].shape)).astype(np.float32)
    obs = np.concatenate([np.stack(seen), random_obs])
    assert np.array_equal(agent.act(obs), by_hand(obs))
    draws = [agent.act(obs[:50], deterministic=False, generator=torch.Generator().manual_seed(s)) for s in (1, 1, 2)]
    assert np.array_equal(draws[0], draws[1]) and not np.array_equal(draws[0], draws[2])
    proc = run_module("pipeline.export", str(run_dir), cwd=EXAMPLE)
    assert proc.returncode == 0, proc.stderr[-2000:]
    exported = torch.jit.load(str(run_dir / "policy.torchscript.pt"))
    with torch.no_grad():  # a continuous policy's file returns its weights' outputs, which require grad
        assert np.array_equal(exported(torch.as_tensor(obs)).numpy(), by_hand(obs))
    return obs

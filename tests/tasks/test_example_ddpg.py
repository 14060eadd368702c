"""docs/add_an_algorithm.md's off-policy example (tests/example_algorithm/ddpg.py plus its YAMLs) runs end to end from
`python -m pipeline` at K = 2, its seeds replay, load and export as its policy declares, and it learns Pendulum."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline_testing import read_result, run_cli
from tasks.test_example_algorithm import plays_as_by_hand

EXAMPLE = Path(__file__).resolve().parents[1] / "example_algorithm"
HIDDEN = (64, 64)  # conf/experiment/ddpg_pendulum.yaml's model.hidden


def actor_of(run_dir):
    """The seed's model.pt in the plain DeterministicActor, built with Pendulum's torque bounds as training built it."""
    import torch

    from pipeline.nets.continuous_control import DeterministicActor

    net = DeterministicActor(3, 1, HIDDEN, action_low=[-2.0], action_high=[2.0])
    net.load_state_dict(torch.load(run_dir / "model.pt", weights_only=True))
    return net


@pytest.mark.slow
def test_ddpg_on_the_off_policy_layer_is_one_file_and_runs_k_seeds(tmp_path):
    """The layer gives the example replay rows, its QNet critic and both targets, acting, evaluations on schedule, one
    record and model.pt per seed, and checkpoints holding the critic's optimizer and the replay."""
    import torch

    proc = run_cli("--config-dir", "conf", "experiment=ddpg_pendulum", "task.total_steps=400", "task.learning_starts=200",
                   "task.batch_size=32", "task.eval_every=200", "task.eval_episodes=2", "task.final_eval_episodes=2",
                   "seeds_per_process=2", "trainer.enable_progress_bar=false", f"hydra.run.dir={tmp_path}", cwd=EXAMPLE)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for seed in (0, 1):
        record = read_result(tmp_path / f"seed{seed}")
        assert record["status"] == "ok" and record["task"] == "DDPGTask" and record["seed"] == seed
        assert record["policy"] == "pipeline.rl.policies.DeterministicActorPolicy"
        assert record["env_steps"] == 400 and [e["env_step"] for e in record["evaluations"]] == [200, 400]
        assert record["metrics"]["train/updates"] == 200 and -2000 < record["metrics"]["eval/return_mean"] <= 0
        curve = pd.read_csv(tmp_path / f"seed{seed}" / "metrics.csv")
        assert {"train/q_loss", "train/q_mean", "train/actor_loss", "eval/return_mean"} <= set(curve.columns)
        actor_of(tmp_path / f"seed{seed}")  # model.pt is the plain actor
    state = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["format"] == "example.ddpg/1" and state["replay"]["size"] == 400
    assert state["critic"]["module.net.0.weight"].shape == (2, 64, 4)  # one QNet per agent (obs 3 + action 1), stacked
    assert state["critic_target"].keys() == state["critic"].keys() and "net.0.weight" in state["actor_target"]
    assert set(state["optimizers"]) == {"critic"} and state["progress"]["updates"] == [200, 200]
    replayed_loaded_and_exported_as_its_policy_declares(tmp_path / "seed1")


def replayed_loaded_and_exported_as_its_policy_declares(run_dir):
    """`policy = DeterministicActorPolicy`: `python -m pipeline.eval` (from the example's folder), `pipeline.load` and
    `python -m pipeline.export` play the actor's action, computed here from model.pt by hand; a stochastic act adds
    the run's exploration noise (task.exploration_noise 0.1 of Pendulum's torque scale 2)."""
    import torch

    import pipeline

    net = actor_of(run_dir)

    def by_hand(obs):
        with torch.no_grad():
            return net(torch.as_tensor(np.asarray(obs, dtype=np.float32))).clamp(-2.0, 2.0).numpy()

    obs = plays_as_by_hand(run_dir, by_hand)
    noisy = pipeline.load(run_dir).act(obs[:50], deterministic=False, generator=torch.Generator().manual_seed(1))
    assert 0 < np.abs(noisy - by_hand(obs[:50])).max() < 2 * 0.1 * 6  # within six standard deviations


def random_policy_returns(run_dir, episodes: int = 50) -> np.ndarray:
    """Returns of uniformly random torques on the run's env (its evaluation's distribution of start states)."""
    from pipeline.runtime.replay import find_config, run_env

    cfg, _ = find_config(run_dir)
    env, rng, returns = run_env(cfg), np.random.default_rng(0), []
    for episode in range(episodes):
        env.reset(seed=10_000 + episode)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(rng.uniform(-2.0, 2.0, size=(1,)).astype(np.float32))
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    env.close()
    return np.asarray(returns)


@pytest.mark.slow
def test_ddpg_learns_pendulum_in_5000_steps(tmp_path):
    """Each seed's final policy beats uniformly random torques by more than three of their episodes' standard
    deviations (measured: random -1,180 +- 274 over these 50 episodes, a bar of -358; DDPG's two seeds -144 and -146
    over 20 final episodes at 5,000 steps, as at 6,000 (-144, -142): learnt by then; at 4,000 -469 and -240)."""
    proc = run_cli("--config-dir", "conf", "experiment=ddpg_pendulum", "task.total_steps=5000", "task.eval_every=5000",
                   "seeds_per_process=2", "trainer.enable_progress_bar=false", f"hydra.run.dir={tmp_path}", cwd=EXAMPLE)
    assert proc.returncode == 0, proc.stderr[-2000:]
    random = random_policy_returns(tmp_path / "seed0")
    bar = random.mean() + 3 * random.std()
    assert -1500 < random.mean() < -1000  # Pendulum's random torques, as measured (a broken env would pass anything)
    for seed in (0, 1):
        record = read_result(tmp_path / f"seed{seed}")
        assert record["metrics"]["eval/return_mean"] > bar, (seed, record["metrics"]["eval/return_mean"], bar)

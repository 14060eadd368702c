"""MuJoCo envs through the vector-env path, and the one-line refusal where MuJoCo is not installed."""

import logging
import sys

import gymnasium as gym
import pytest
import torch

from pipeline.rl.envs import check_env_installed, make_env, mujoco_available, needs_mujoco
from pipeline.rl.vector import evaluate_agents, make_vector_env


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """Where MuJoCo would write MUJOCO_LOG.TXT without our handler: a folder of the test's own."""
    monkeypatch.chdir(tmp_path)


needs = pytest.mark.skipif(not mujoco_available(), reason='MuJoCo is not installed (pip install -e ".[mujoco]")')


def test_which_envs_need_mujoco():
    assert needs_mujoco("HalfCheetah-v5") and needs_mujoco("Hopper-v5") and needs_mujoco("Walker2d-v5")
    assert not needs_mujoco("Pendulum-v1") and not needs_mujoco("ALE/Pong-v5") and not needs_mujoco("NoSuchEnv-v0")


def test_refused_in_one_line_with_the_install_command_where_mujoco_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "mujoco", None)  # what `import mujoco` sees where it is not installed
    with pytest.raises(ValueError, match=r"env Hopper-v5 needs MuJoCo, which is not installed: pip install") as info:
        make_env("Hopper-v5")
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="mujoco==3.17.0"):
        make_vector_env({"id": "Walker2d-v5", "backend": "gym"}, [0], 1)
    check_env_installed("Pendulum-v1")  # other envs pass


@needs
@pytest.mark.parametrize("env_id, obs_dim, act_dim", [("HalfCheetah-v5", 17, 6), ("Hopper-v5", 11, 3), ("Walker2d-v5", 17, 6)])
def test_k_agents_step_mujoco_envs_seeded_like_single_runs(env_id, obs_dim, act_dim):
    env = make_vector_env({"id": env_id, "backend": "gym"}, [5, 6], 1)
    assert env.observation_shape == (obs_dim,) and env.n_actions is None and env.action_space.shape == (act_dim,)
    obs = env.reset()
    assert obs.shape == (2, obs_dim) and obs.dtype == torch.float32
    single = gym.make(env_id)
    first, _ = single.reset(seed=6)
    assert torch.allclose(obs[1], torch.as_tensor(first, dtype=torch.float32))
    actions = torch.full((2, act_dim), 0.3)
    step = env.step(actions)
    expected, reward, *_ = single.step(actions[1].numpy())
    assert torch.allclose(step.obs[1], torch.as_tensor(expected, dtype=torch.float32), atol=1e-6)
    assert step.reward[1].item() == pytest.approx(float(reward), rel=1e-5, abs=1e-6)
    env.close()
    single.close()


@needs
def test_mujoco_warnings_go_to_the_log_not_to_a_file(tmp_path, caplog):
    with caplog.at_level(logging.DEBUG, logger="pipeline.rl.envs"):
        make_env("HalfCheetah-v5").close()  # its model uses a deprecated compiler attribute: MuJoCo warns
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()
    assert any(r.getMessage().startswith("MuJoCo: ") for r in caplog.records)


@needs
def test_deterministic_evaluation_on_a_mujoco_env():
    env = {"id": "Hopper-v5", "backend": "gym", "kwargs": {"max_episode_steps": 20}}

    def still(obs: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*obs.shape[:2], 3)

    returns = evaluate_agents(still, env, [0, 1], 2, seed_offset=100)
    assert returns.shape == (2, 2) and torch.isfinite(returns).all()
    # Standing still for 20 steps earns the healthy reward (1 a step) and little else.
    assert ((returns > 15) & (returns < 25)).all()

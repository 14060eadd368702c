"""TensorAcrobot over whole episodes: trajectories next to gymnasium's through termination, truncation and
auto-reset, and a policy's returns. (The single-step checks are in test_acrobot_tensor.py.)"""

import gymnasium as gym
import numpy as np
import torch

from pipeline.rl.acrobot_tensor import TensorAcrobot
from pipeline.rl.tensor_env import seed_keys, tensor_episode_returns


def pump(obs: torch.Tensor) -> torch.Tensor:
    """Torque along the links' motion: swings up in 60-250 steps from most starts, never from some."""
    return torch.where(obs[:, 4] + 0.5 * obs[:, 5] > 0, 2, 0)


def test_trajectories_follow_gymnasium_through_termination_truncation_and_auto_reset():
    """16 envs for 520 steps next to 16 gymnasium twins started from the same states.

    Free-running, the two agree bitwise for the first dozens of steps and to 1e-14 after 200, but
    Acrobot is chaotic and the last-bit differences of cos/sin grow (1e-6 after 500 steps). So after
    the first 100 steps each tensor env is set back to its twin's state after every step: every
    later step is then checked to rounding from the state gymnasium is in.
    """
    n, swinging = 16, 12  # 12 envs swing up (and restart), 4 act at random: those run into the 500-step limit
    env = TensorAcrobot(n)
    obs = env.reset(list(range(100, 100 + n)))
    twins = [gym.make("Acrobot-v1") for _ in range(n)]
    for i, twin in enumerate(twins):
        twin.reset(seed=i)
        twin.unwrapped.state = env.state[i].numpy().copy()
    rng = np.random.default_rng(1)
    terminations = truncations = 0
    for t in range(520):
        random_actions = torch.from_numpy(rng.integers(0, 3, n))
        pushed = torch.from_numpy(rng.random(n) < 0.2) | (torch.arange(n) >= swinging)
        actions = torch.where(pushed, random_actions, pump(obs))
        step = env.step(actions)
        results = [twin.step(a) for twin, a in zip(twins, actions.tolist())]
        twin_obs, rewards, terminated, truncated = (np.array([r[k] for r in results]) for k in range(4))
        assert np.array_equal(step.terminated.numpy(), terminated) and np.array_equal(
            step.truncated.numpy(), truncated
        ), t
        assert np.array_equal(step.reward.numpy(), rewards) and set(rewards) <= {0.0, -1.0}
        assert np.allclose(step.final_obs.numpy(), twin_obs, rtol=1e-6, atol=1e-6), t
        done = terminated | truncated
        twin_states = np.stack([twin.unwrapped.state for twin in twins])
        tolerance = 1e-10 if t < 100 else 1e-13
        assert np.allclose(env.state.numpy()[~done], twin_states[~done], rtol=tolerance, atol=tolerance), t
        assert torch.equal(step.obs[~step.done], step.final_obs[~step.done])
        for i in np.flatnonzero(done):
            # The next episode starts where the tensor env's stream says; the twin follows it.
            twins[i].reset()
            twins[i].unwrapped.state = twin_states[i] = env.state[i].numpy().copy()
            assert np.array_equal(step.obs[i].numpy(), twins[i].unwrapped._get_ob())
        if t >= 100:
            env.rows = torch.from_numpy(twin_states).t().contiguous()
        terminations, truncations = terminations + terminated.sum(), truncations + truncated.sum()
        obs = step.obs
    assert terminations >= 15 and truncations == n - swinging


def test_truncation_at_500_restarts_at_the_next_episode():
    env = TensorAcrobot(2)
    env.reset([0, 1])
    for t in range(1, 501):
        step = env.step(torch.ones(2, dtype=torch.int64))  # no torque: hangs, never reaches the goal
        assert step.reward.tolist() == [-1.0, -1.0]
        assert bool(step.done.any()) == (t == 500)
    assert step.truncated.all() and not step.terminated.any()
    assert env.episodes.tolist() == [1, 1] and env.elapsed.tolist() == [0, 0]
    expected = env.initial_rows(seed_keys(torch.tensor([0, 1])), torch.ones(2, dtype=torch.int64))
    assert torch.equal(env.rows, expected)


def test_episode_returns_of_a_swing_up_policy():
    returns = tensor_episode_returns(TensorAcrobot, pump, range(20))
    # A terminated episode of k steps returns -(k - 1); a truncated one -500.
    assert returns.shape == (20,) and ((returns >= -500) & (returns <= 0)).all()
    assert (returns > -300).sum() >= 10 and (returns == -500).any()

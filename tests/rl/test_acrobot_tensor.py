"""TensorAcrobot against gymnasium's Acrobot-v1 in float64, and its own contract: seeding, auto-reset, truncation."""

import gymnasium as gym
import numpy as np
import torch

from pipeline.rl.acrobot_tensor import TensorAcrobot
from pipeline.rl.tensor_env import hashed_uniform, seed_keys, tensor_episode_returns


def pump(obs: torch.Tensor) -> torch.Tensor:
    """Torque along the links' motion: swings up in 60-250 steps from most starts, never from some."""
    return torch.where(obs[:, 4] + 0.5 * obs[:, 5] > 0, 2, 0)


def random_states(n: int, rng: np.random.Generator) -> np.ndarray:
    """[n, 4] states anywhere in Acrobot's state space: angles in [-pi, pi], velocities up to their bounds."""
    bounds = np.array([np.pi, np.pi, TensorAcrobot.MAX_VEL_1, TensorAcrobot.MAX_VEL_2])
    return rng.uniform(-bounds, bounds, size=(n, 4))


def test_one_step_from_anywhere_matches_gymnasium():
    rng = np.random.default_rng(0)
    states, actions = random_states(500, rng), rng.integers(0, 3, 500)
    env = TensorAcrobot(500)
    rows, terminated = env.physics(torch.from_numpy(states).t().contiguous(), torch.from_numpy(actions))
    twin = gym.make("Acrobot-v1").unwrapped
    twin.reset(seed=0)
    for i in range(500):
        twin.state = states[i].copy()
        obs, reward, done, _, _ = twin.step(int(actions[i]))
        # Rounding only: torch's and numpy's cos/sin may differ in the last bit.
        assert np.allclose(rows[:, i].numpy(), twin.state, rtol=1e-13, atol=1e-14), i
        assert bool(terminated[i]) == done
        assert np.allclose(env.observation_of(rows[:, i : i + 1])[0].numpy(), obs, rtol=1e-6, atol=1e-7)
    assert terminated.any() and not terminated.all()


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
        assert np.array_equal(step.terminated.numpy(), terminated) and np.array_equal(step.truncated.numpy(), truncated), t
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


def test_start_states_are_gymnasiums_distribution_from_each_envs_own_stream():
    env = TensorAcrobot(3)
    first = env.reset([5, 6, 7])
    # Uniform on [-0.1, 0.1] and rounded to float32, like gymnasium's reset.
    assert (env.state.abs() <= 0.1).all() and torch.equal(env.state, env.state.float().double())
    assert first.shape == (3, 6) and first.dtype == torch.float32
    assert torch.allclose(first[:, 0], torch.cos(env.state[:, 0]).float())
    alone = TensorAcrobot(1)
    assert torch.equal(alone.reset([6])[0], first[1])
    expected = (hashed_uniform(seed_keys(torch.tensor([5, 6, 7])), torch.zeros(3, dtype=torch.int64), 4) * 0.2 - 0.1).float()
    assert torch.equal(env.state.float(), expected.t())


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


def test_float32_is_accurate_per_step():
    rng = np.random.default_rng(2)
    states = torch.from_numpy(random_states(256, rng)).float().t().contiguous()
    actions = torch.from_numpy(rng.integers(0, 3, 256))
    rows64, _ = TensorAcrobot(256).physics(states.double(), actions)
    rows32, _ = TensorAcrobot(256, dtype="float32").physics(states, actions)
    # Wrapped angles can land on opposite sides of +-pi: compare them on the circle.
    gap = (rows32.double() - rows64).abs()
    gap[:2] = torch.minimum(gap[:2], 2 * np.pi - gap[:2])
    assert gap.max() < 1e-4

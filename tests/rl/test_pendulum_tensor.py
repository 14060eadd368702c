"""TensorPendulum against gymnasium's Pendulum-v1 in float64: single steps from anywhere, whole trajectories
through truncation and auto-reset, start states, rewards."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from pipeline.rl.pendulum_tensor import TensorPendulum, angle_normalize
from pipeline.rl.tensor_env import hashed_uniform, seed_keys, tensor_episode_returns


def twin_at(state: np.ndarray) -> gym.Env:
    twin = gym.make("Pendulum-v1")
    twin.reset(seed=0)
    twin.unwrapped.state = np.array(state, dtype=np.float64)
    return twin


def test_one_step_from_anywhere_matches_gymnasium_with_float32_torques_beyond_the_bounds():
    """States over several turns and past the speed limit, float32 torques in [-3, 3] (clipped to [-2, 2] by both)."""
    rng = np.random.default_rng(0)
    n = 400
    states = np.stack((rng.uniform(-4 * np.pi, 4 * np.pi, n), rng.uniform(-9.0, 9.0, n)), 1)
    actions = rng.uniform(-3.0, 3.0, (n, 1)).astype(np.float32)
    env = TensorPendulum(n)
    rows_before = torch.from_numpy(states).t().contiguous()
    rows, terminated = env.physics(rows_before, torch.from_numpy(actions))
    rewards = env.step_reward(rows_before, torch.from_numpy(actions), terminated)
    assert not terminated.any() and rewards.dtype == torch.float32
    twin = gym.make("Pendulum-v1").unwrapped
    twin.reset(seed=0)
    for i in range(n):
        twin.state = states[i].copy()
        obs, reward, term, trunc, _ = twin.step(actions[i])
        assert np.allclose(rows[:, i].numpy(), twin.state, rtol=1e-13, atol=1e-13), i
        # float32 at the boundary: the reward to within float32's rounding of numbers up to ~30.
        assert rewards[i].item() == pytest.approx(reward, rel=1e-6, abs=1e-6), i
        assert np.allclose(env.observation_of(rows[:, i : i + 1])[0].numpy(), obs, rtol=1e-6, atol=1e-7)
        assert not term and not trunc
    low, high = TensorPendulum.step_reward_bounds
    assert low == pytest.approx(-16.2736044, abs=1e-7) and high == 0.0
    assert ((rewards >= low - 1e-5) & (rewards <= high)).all()


def test_a_float32_torque_enters_in_float32_as_in_gymnasium():
    """3.0 * u rounded in float32 is what gymnasium computes for a float32 action; a float64 action stays float64."""
    state = np.array([0.3, -0.2])
    action32 = np.array([1.2345678], dtype=np.float32)
    env = TensorPendulum(1)
    rows32, _ = env.physics(torch.from_numpy(state)[:, None], torch.from_numpy(action32))
    rows64, _ = env.physics(torch.from_numpy(state)[:, None], torch.from_numpy(action32.astype(np.float64)))
    twin32, twin64 = twin_at(state), twin_at(state)
    twin32.step(action32)
    twin64.step(action32.astype(np.float64))
    assert rows32[:, 0].tolist() == pytest.approx(twin32.unwrapped.state.tolist(), abs=1e-15)
    assert rows64[:, 0].tolist() == pytest.approx(twin64.unwrapped.state.tolist(), abs=1e-15)
    assert abs(rows32[1, 0].item() - rows64[1, 0].item()) > 1e-10  # the two really differ


@pytest.mark.parametrize("seed", [0, 5])
def test_trajectories_follow_gymnasium_through_truncation_and_auto_reset(seed):
    """12 envs for 230 steps next to 12 gymnasium twins started from the same states: every state to 1e-12,
    truncation at step 200 (and only there), the next episode from the env's own stream."""
    n = 12
    env = TensorPendulum(n)
    obs = env.reset(list(range(seed, seed + n)))
    twins = [twin_at(env.state[i].numpy()) for i in range(n)]
    rng = np.random.default_rng(seed)
    for t in range(1, 231):
        # A swing-up-ish feedback with noise, float32 like a policy's output, sometimes past the bounds.
        feedback = -2.0 * obs[:, 2:3].numpy() * np.sign(obs[:, 0:1].numpy())
        actions = (feedback + rng.normal(0, 1.5, (n, 1))).astype(np.float32)
        step = env.step(torch.from_numpy(actions))
        results = [twin.step(actions[i]) for i, twin in enumerate(twins)]
        twin_obs = np.stack([r[0] for r in results])
        rewards = np.array([r[1] for r in results])
        truncated = np.array([r[3] for r in results])
        assert not step.terminated.any() and not any(r[2] for r in results)
        assert np.array_equal(step.truncated.numpy(), truncated) and truncated.all() == (t == 200), t
        assert np.allclose(step.reward.numpy(), rewards, rtol=1e-6, atol=1e-6), t
        assert np.allclose(step.final_obs.numpy(), twin_obs, rtol=1e-6, atol=1e-6), t
        twin_states = np.stack([twin.unwrapped.state for twin in twins])
        if t == 200:
            # The final state is where the twins ended; the new episode starts from the env's stream.
            expected = env.initial_rows(seed_keys(torch.arange(seed, seed + n)), torch.ones(n, dtype=torch.int64))
            assert torch.equal(env.rows, expected) and env.episodes.tolist() == [1] * n
            twins = [twin_at(env.state[i].numpy()) for i in range(n)]
            assert np.allclose(step.obs.numpy(), np.stack([tw.unwrapped._get_obs() for tw in twins]), atol=1e-7)
        else:
            assert np.allclose(env.state.numpy(), twin_states, rtol=1e-12, atol=1e-12), t
            assert torch.equal(step.obs, step.final_obs)
        obs = step.obs


def test_start_states_are_gymnasiums_distribution_from_each_envs_own_stream():
    env = TensorPendulum(4000)
    obs = env.reset(0)
    theta, thetadot = env.state.unbind(1)
    assert env.state.dtype == torch.float64 and obs.shape == (4000, 3) and obs.dtype == torch.float32
    assert theta.abs().max() <= math.pi and thetadot.abs().max() <= 1.0
    # Uniform: means near 0 (4 standard errors), and the spread of a uniform on [-a, a] (a / sqrt(3)).
    assert abs(theta.mean().item()) < 4 * math.pi / math.sqrt(3 * 4000)
    assert theta.std().item() == pytest.approx(math.pi / math.sqrt(3), rel=0.05)
    assert thetadot.std().item() == pytest.approx(1 / math.sqrt(3), rel=0.05)
    # Env 7's start is a function of its seed alone.
    alone = TensorPendulum(1)
    alone.reset([7])
    assert torch.equal(alone.state[0], env.state[7])
    u = hashed_uniform(seed_keys(torch.tensor([7])), torch.zeros(1, dtype=torch.int64), 2)[:, 0]
    assert env.state[7].tolist() == [u[0].item() * 2 * math.pi - math.pi, u[1].item() * 2 - 1]


def test_angle_normalize_is_gymnasiums():
    from gymnasium.envs.classic_control.pendulum import angle_normalize as gym_angle_normalize

    values = np.array([0.0, np.pi, -np.pi, 3 * np.pi, -3 * np.pi + 1e-3, 7.5, -7.5, 100.0, np.nextafter(np.pi, 0)])
    ours = angle_normalize(torch.from_numpy(values)).numpy()
    assert np.allclose(ours, gym_angle_normalize(values), rtol=0, atol=1e-13)
    assert (ours >= -np.pi).all() and (ours < np.pi).all()


def test_integer_and_flat_actions_are_torques_too():
    env = TensorPendulum(3)
    env.reset(0)
    rows = env.rows.clone()
    flat, _ = env.physics(rows, torch.tensor([-5, 0, 1]))
    column, _ = env.physics(rows, torch.tensor([[-2.0], [0.0], [1.0]], dtype=torch.float64))
    assert torch.equal(flat, column)


def test_episode_returns_of_doing_nothing_and_of_a_swing_up_controller():
    """No torque: the pendulum swings forever and pays for it every step. Energy pumping then a PD hold
    gets most starts upright within a second or two, which is the level PPO is asked to reach (-250)."""
    seeds = range(32)
    idle = tensor_episode_returns(TensorPendulum, lambda obs: torch.zeros(obs.shape[0], 1), seeds)

    def swing_up(obs: torch.Tensor) -> torch.Tensor:
        # thetadot' = 15 sin(theta) + 3 u: the energy 0.5 thetadot^2 + 15 cos(theta) is 15 upright at rest,
        # and the torque changes it at the rate 3 u thetadot. Pump it up, then hold with a PD law.
        cos, sin, speed = obs.unbind(1)
        energy = 0.5 * speed**2 + 15.0 * cos
        pump = torch.where(energy < 15.0, 2.0 * torch.sign(speed), torch.zeros_like(speed))
        hold = -10.0 * torch.atan2(sin, cos) - 2.0 * speed
        return torch.where(cos > 0.9, hold, pump).clamp(-2, 2).unsqueeze(1)

    controlled = tensor_episode_returns(TensorPendulum, swing_up, seeds)
    assert idle.shape == (32,) and (idle <= 0).all() and (idle >= 200 * TensorPendulum.step_reward_bounds[0]).all()
    # Measured on these seeds: idle median -1176 (none above -600), controlled median -123.
    assert idle.max() < -600 and controlled.median() > -250


def test_a_float32_env_keeps_its_state_in_float32_through_reset_and_auto_reset():
    env = TensorPendulum(3, dtype=torch.float32, max_episode_steps=2)
    env.reset([0, 1, 2])
    assert env.rows.dtype == torch.float32
    for _ in range(3):  # the second step truncates and auto-resets
        env.step(torch.zeros(3, 1))
        assert env.rows.dtype == torch.float32
    assert env.episodes.tolist() == [1, 1, 1]

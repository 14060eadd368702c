"""TensorAcrobot step by step against gymnasium's Acrobot-v1 in float64: dynamics, wrapping, rewards, start states,
options. Fast, so that `make mutate` runs them for every mutant; whole episodes are in test_acrobot_episodes.py."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from pipeline.rl.acrobot_tensor import TensorAcrobot, _wrap
from pipeline.rl.tensor_env import hashed_uniform, seed_keys


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


def test_minus_one_a_step_and_zero_for_the_step_that_reaches_the_goal():
    reward = TensorAcrobot(2).reward(torch.tensor([False, True]))
    assert reward.tolist() == [-1.0, 0.0] and reward.dtype == torch.float32


def test_start_states_are_gymnasiums_distribution_from_each_envs_own_stream():
    env = TensorAcrobot(3)
    first = env.reset([5, 6, 7])
    # Uniform on [-0.1, 0.1] and rounded to float32, like gymnasium's reset.
    assert env.state.dtype == torch.float64  # float32 numbers, held in the env's dtype
    assert (env.state.abs() <= 0.1).all() and torch.equal(env.state, env.state.float().double())
    assert first.shape == (3, 6) and first.dtype == torch.float32
    assert torch.allclose(first[:, 0], torch.cos(env.state[:, 0]).float())
    alone = TensorAcrobot(1)
    assert torch.equal(alone.reset([6])[0], first[1])
    expected = (hashed_uniform(seed_keys(torch.tensor([5, 6, 7])), torch.zeros(3, dtype=torch.int64), 4) * 0.2 - 0.1).float()
    assert torch.equal(env.state.float(), expected.t())


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


def test_angles_wrap_as_gymnasium_wraps_them_boundaries_included():
    from gymnasium.envs.classic_control.acrobot import wrap

    values = [np.pi, -np.pi, 4.0, -4.0, 3 * np.pi + 0.1, -5 * np.pi - 0.2, 0.5, np.nextafter(np.pi, 4)]
    for x in ([np.pi, 4.0], [-np.pi, -4.0], values):  # a bound kept as it is while another value wraps
        got = _wrap(torch.tensor(x, dtype=torch.float64), -np.pi, np.pi)
        assert got.tolist() == [wrap(v, -np.pi, np.pi) for v in x]


def test_a_diverged_angle_is_an_error_not_a_hang():
    """gymnasium's wrap loops forever on an infinite angle; ours stops after 1000 passes and says what diverged.
    An angle 1000 turns out still wraps (both directions); 1001 turns is refused."""
    def message(what):
        return rf"^acrobot: a joint angle {what} \(the state diverged\); check the actions and any state set by hand$"

    for bad in (float("inf"), float("-inf")):
        with pytest.raises(FloatingPointError, match=message("is not finite")):
            _wrap(torch.tensor([0.5, bad], dtype=torch.float64), -np.pi, np.pi)
    for sign in (1, -1):
        far = torch.tensor([sign * (1000 * 2 * np.pi + 0.25)], dtype=torch.float64)
        assert _wrap(far, -np.pi, np.pi).item() == pytest.approx(sign * 0.25, abs=1e-9)
        with pytest.raises(FloatingPointError, match=message("is over 1000 turns out of range")):
            _wrap(far + sign * 2 * np.pi, -np.pi, np.pi)


def test_other_link_constants_follow_gymnasium_too():
    """The dynamics read the class constants as gymnasium does: change them on both, they still agree."""
    constants = {"LINK_LENGTH_1": 1.3, "LINK_MASS_1": 0.8, "LINK_MASS_2": 0.7, "LINK_COM_POS_1": 0.6,
                 "LINK_COM_POS_2": 0.4, "LINK_MOI": 1.2}  # fmt: skip
    rng = np.random.default_rng(3)
    states, actions = random_states(200, rng), rng.integers(0, 3, 200)
    env = TensorAcrobot(200)
    twin = gym.make("Acrobot-v1").unwrapped
    twin.reset(seed=0)
    for name, value in constants.items():
        setattr(env, name, value)
        setattr(twin, name, value)
    rows, _ = env.physics(torch.from_numpy(states).t().contiguous(), torch.from_numpy(actions))
    for i in range(200):
        twin.state = states[i].copy()
        twin.step(int(actions[i]))
        assert np.allclose(rows[:, i].numpy(), twin.state, rtol=1e-12, atol=1e-13), i


def test_a_time_limit_and_no_auto_reset_are_passed_on():
    env = TensorAcrobot(2, max_episode_steps=3, auto_reset=False)
    env.reset([0, 1])
    for t in range(1, 4):
        step = env.step(torch.ones(2, dtype=torch.int64))
        assert step.truncated.tolist() == [t == 3] * 2
    # Without auto-reset the finished envs stay where they ended.
    assert torch.equal(step.obs, step.final_obs) and env.episodes.tolist() == [0, 0]
    restarting = TensorAcrobot(2, max_episode_steps=1)  # auto-reset unless asked otherwise
    restarting.reset([0, 1])
    step = restarting.step(torch.ones(2, dtype=torch.int64))
    assert restarting.episodes.tolist() == [1, 1] and not torch.equal(step.obs, step.final_obs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_the_accelerator_a_step_is_the_cpu_step():
    rng = np.random.default_rng(4)
    states, actions = torch.from_numpy(random_states(64, rng)).t().contiguous(), torch.from_numpy(rng.integers(0, 3, 64))
    cpu_rows, cpu_done = TensorAcrobot(64).physics(states, actions)
    cuda_rows, cuda_done = TensorAcrobot(64, device="cuda").physics(states.cuda(), actions.cuda())
    assert torch.allclose(cuda_rows.cpu(), cpu_rows, rtol=1e-12, atol=1e-12)
    assert torch.equal(cuda_done.cpu(), cpu_done)

"""TensorCartPole against gymnasium's CartPole-v1 from generated states, actions and step counts, in float64."""

import gymnasium as gym
import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from pipeline.rl.cartpole_tensor import TensorCartPole

# Past both termination limits (|x| > 2.4, |theta| > 12 deg) so both flags are exercised.
states = st.tuples(
    st.floats(-2.6, 2.6), st.floats(-4.0, 4.0), st.floats(-0.25, 0.25), st.floats(-4.0, 4.0)
)
envs = st.lists(st.tuples(states, st.integers(0, 499)), min_size=1, max_size=6)


def _twin(state: tuple[float, ...], elapsed: int, max_steps: int = 500) -> gym.Env:
    twin = gym.make("CartPole-v1", disable_env_checker=True, max_episode_steps=max_steps)
    twin.reset(seed=0)
    twin.unwrapped.state = np.array(state, dtype=np.float64)
    twin._elapsed_steps = elapsed  # the TimeLimit wrapper's counter
    return twin


@given(
    envs=envs,
    actions=st.lists(st.lists(st.integers(0, 1), min_size=6, max_size=6), min_size=1, max_size=4),
    max_steps=st.sampled_from([None, 1, 3, 200]),
)
def test_steps_match_gymnasium_to_rounding(envs, actions, max_steps):
    n = len(envs)
    limit = 500 if max_steps is None else max_steps  # None: CartPole-v1's own limit
    env = TensorCartPole(n, dtype=torch.float64, auto_reset=False, max_episode_steps=max_steps)
    env.reset(0)
    envs = [(s, e % limit) for s, e in envs]
    env.rows = torch.tensor([s for s, _ in envs], dtype=torch.float64).t().contiguous()
    env.elapsed = torch.tensor([e for _, e in envs], dtype=torch.int64)
    twins = [_twin(s, e, limit) for s, e in envs]
    alive = [True] * n
    for step_actions in actions:
        a = torch.tensor(step_actions[:n])
        step = env.step(a)
        for i, twin in enumerate(twins):
            if not alive[i]:
                continue
            obs, reward, terminated, truncated, _ = twin.step(int(a[i]))
            expected = torch.as_tensor(twin.unwrapped.state, dtype=torch.float64)
            torch.testing.assert_close(env.state[i], expected, rtol=0, atol=1e-12)
            # What the agent sees is the float32 rounding of that state, as gymnasium returns it.
            assert np.array_equal(step.final_obs[i].numpy(), obs)
            assert step.obs.dtype == torch.float32 and step.obs.is_contiguous()
            assert bool(step.terminated[i]) == terminated
            assert bool(step.truncated[i]) == truncated
            assert bool(step.done[i]) == (terminated or truncated)
            assert float(step.reward[i]) == reward == 1.0
            alive[i] = not (terminated or truncated)


@given(state=states, action=st.integers(0, 1))
def test_physics_alone_matches_gymnasium_to_rounding(state, action):
    env = TensorCartPole(1, dtype=torch.float64)
    rows, terminated = env.physics(torch.tensor(state, dtype=torch.float64).view(4, 1), torch.tensor([action]))
    twin = _twin(state, 0)
    _, _, expected_terminated, _, _ = twin.step(action)
    torch.testing.assert_close(rows[:, 0], torch.as_tensor(twin.unwrapped.state), rtol=0, atol=1e-12)
    assert bool(terminated[0]) == expected_terminated


@given(state=states, action=st.integers(0, 1))
def test_float32_physics_is_accurate_per_step(state, action):
    env = TensorCartPole(1, dtype=torch.float32)
    rows, _ = env.physics(torch.tensor(state, dtype=torch.float32).view(4, 1), torch.tensor([action]))
    twin = _twin(tuple(float(np.float32(v)) for v in state), 0)
    twin.step(action)
    torch.testing.assert_close(rows[:, 0].double(), torch.as_tensor(twin.unwrapped.state), rtol=1e-5, atol=1e-5)


def test_a_state_exactly_on_a_limit_is_not_terminated():
    # gymnasium ends an episode past |x| > 2.4 or |theta| > 12 degrees; exactly on the limit goes on.
    env = TensorCartPole(1, dtype=torch.float64)
    for state in ((2.4, 0.0, 0.0, 0.0), (0.0, 0.0, env.theta_threshold_radians, 0.0)):
        rows, terminated = env.physics(torch.tensor(state, dtype=torch.float64).view(4, 1), torch.tensor([1]))
        twin = _twin(state, 0)
        _, _, expected, _, _ = twin.step(1)
        assert rows[0, 0].item() == state[0] and rows[2, 0].item() == state[2]  # still exactly on it
        assert bool(terminated[0]) is expected is False


def test_float32_envs_start_and_stay_in_float32():
    env = TensorCartPole(3, dtype=torch.float32)
    obs = env.reset(0)
    assert env.state.dtype == torch.float32 and obs.dtype == torch.float32
    step = env.step(torch.tensor([0, 1, 0]))
    assert env.state.dtype == torch.float32 and step.obs.dtype == torch.float32
    assert step.reward.dtype == torch.float32 and step.reward.tolist() == [1.0, 1.0, 1.0]

"""The tensor CartPole against gymnasium's CartPole-v1, and its own contract: auto-reset, truncation, seeding."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from pipeline.rl.cartpole_tensor import TensorCartPole, episode_returns, hashed_uniform, seed_keys


def balance(obs: torch.Tensor) -> torch.Tensor:
    """A hand-tuned linear controller that keeps CartPole up for 500 steps."""
    x, x_dot, theta, theta_dot = obs.unbind(1)
    return (theta + 0.5 * theta_dot + 0.05 * x + 0.2 * x_dot > 0).long()


def gym_twins(env: TensorCartPole) -> list[gym.Env]:
    """One gymnasium CartPole-v1 per tensor env, started from the tensor env's exact (float64) states."""
    twins = []
    for i in range(env.num_envs):
        twin = gym.make("CartPole-v1")
        twin.reset(seed=0)
        twin.unwrapped.state = env.state[i].double().numpy().copy()
        twins.append(twin)
    return twins


@pytest.mark.parametrize("seed", [0, 1, 7, 123])
@pytest.mark.parametrize("policy", ["random", "mostly_balancing"])
def test_float64_trajectories_match_gymnasium_until_termination(seed, policy):
    n = 6
    env = TensorCartPole(n, dtype=torch.float64)
    obs = env.reset(seed * 100)
    twins = gym_twins(env)
    rng = np.random.default_rng(seed)
    alive = [True] * n
    steps = 0
    while any(alive):
        random_actions = torch.as_tensor(rng.integers(0, 2, n))
        if policy == "random":
            actions = random_actions
        else:
            # Long episodes are where rounding would show: balance, with a random push now and then.
            actions = torch.where(torch.as_tensor(rng.random(n) < 0.2), random_actions, balance(obs))
        step = env.step(actions)
        for i, twin in enumerate(twins):
            if not alive[i]:
                continue
            twin_obs, reward, terminated, truncated, _ = twin.step(int(actions[i]))
            # The state, in float64, before the auto-reset replaces it.
            expected = torch.as_tensor(twin.unwrapped.state, dtype=torch.float64)
            actual = step.final_obs[i].double() if step.done[i] else env.state[i]
            tolerance = 1e-5 if step.done[i] else 1e-12
            assert torch.allclose(actual, expected, atol=tolerance, rtol=0), (i, steps)
            assert np.allclose(step.final_obs[i].numpy(), twin_obs, atol=1e-5, rtol=0)
            assert bool(step.terminated[i]) == terminated and bool(step.truncated[i]) == truncated, (i, steps)
            assert float(step.reward[i]) == reward == 1.0
            if terminated or truncated:
                alive[i] = False
        obs = step.obs
        steps += 1
    assert steps > 10


def test_truncation_at_500_and_auto_reset():
    env = TensorCartPole(4)
    assert env.max_episode_steps == 500
    obs = env.reset([10, 11, 12, 13])
    for t in range(1, 501):
        step = env.step(balance(obs))
        if t < 500:
            assert not step.done.any()
        obs = step.obs
    assert step.truncated.all() and not step.terminated.any()
    # The next episode's start state from each env's own stream, not the 500th state.
    assert not torch.equal(step.final_obs, step.obs)
    expected = env.initial_rows(seed_keys(torch.tensor([10, 11, 12, 13])), torch.ones(4, dtype=torch.int64))
    assert torch.equal(step.obs, expected.t().float())
    assert env.elapsed.eq(0).all() and env.episodes.eq(1).all()


def test_terminated_envs_reset_alone():
    env = TensorCartPole(2)
    env.reset([0, 1])
    actions = torch.tensor([0, 0])
    done_at = None
    for t in range(100):
        step = env.step(actions)
        if step.done.any():
            done_at = t
            break
    assert done_at is not None and step.terminated.any()
    finished = step.done
    assert env.episodes.tolist() == finished.long().tolist()
    assert torch.equal(env.elapsed, torch.where(finished, 0, done_at + 1))
    assert (step.obs[finished].abs() <= 0.05).all()


def test_per_env_seeding_is_reproducible_and_independent_of_the_batch():
    a, b = TensorCartPole(3), TensorCartPole(3)
    assert torch.equal(a.reset([5, 6, 7]), b.reset([5, 6, 7]))
    assert torch.equal(a.reset(5), b.reset([5, 6, 7]))  # an int s means s, s+1, ...
    alone = TensorCartPole(1)
    assert torch.equal(alone.reset([6])[0], a.reset([5, 6, 7])[1])
    first = a.reset([5, 6, 7])
    assert (first.abs() <= 0.05).all() and len({tuple(r) for r in first.tolist()}) == 3
    actions = torch.randint(0, 2, (200, 3), generator=torch.Generator().manual_seed(0))
    for t in range(200):
        sa, sb = a.step(actions[t]), b.step(actions[t])
        assert torch.equal(sa.obs, sb.obs) and torch.equal(sa.done, sb.done)


def test_hashed_uniform_is_uniform_enough():
    u = hashed_uniform(seed_keys(torch.arange(2000)), torch.zeros(2000, dtype=torch.int64), 4)
    assert u.shape == (4, 2000) and (u >= 0).all() and (u < 1).all()
    assert abs(u.mean().item() - 0.5) < 0.02 and abs(u.var().item() - 1 / 12) < 0.005
    assert abs(np.corrcoef(u[0].numpy(), u[1].numpy())[0, 1]) < 0.1


def test_float32_is_accurate_per_step():
    env64, env32 = TensorCartPole(64, dtype=torch.float64), TensorCartPole(64, dtype="float32")
    env64.reset(0)
    env32.reset(0)
    actions = torch.randint(0, 2, (64,), generator=torch.Generator().manual_seed(1))
    # Start both from the same float32-representable state; one step must agree to float32 rounding.
    env64.rows = env32.rows.double()
    rows64, _ = env64.physics(env64.rows, actions)
    rows32, _ = env32.physics(env32.rows, actions)
    assert (rows32.double() - rows64).abs().max() < 1e-6


def test_keep_envs_keeps_each_envs_stream():
    env, reference = TensorCartPole(3), TensorCartPole(1)
    env.reset([1, 2, 3])
    reference.reset([3])
    actions = torch.randint(0, 2, (200, 3), generator=torch.Generator().manual_seed(0))
    for t in range(100):
        env.step(actions[t])
        reference.step(actions[t, 2:])
    env.keep_envs_(torch.tensor([2]))
    assert env.num_envs == 1
    for t in range(100, 200):
        assert torch.equal(env.step(actions[t, 2:]).obs, reference.step(actions[t, 2:]).obs)


def test_episode_returns_of_fixed_policies():
    def always_left(obs: torch.Tensor) -> torch.Tensor:
        return torch.zeros(obs.shape[0], dtype=torch.int64)

    returns = episode_returns(always_left, seeds=range(5))
    assert returns.shape == (5,) and ((returns >= 5) & (returns < 50)).all()
    assert torch.equal(returns, episode_returns(always_left, seeds=range(5)))
    assert episode_returns(balance, seeds=[3, 4]).tolist() == [500.0, 500.0]


def test_step_before_reset_fails():
    with pytest.raises(RuntimeError, match="reset"):
        TensorCartPole(2).step(torch.zeros(2, dtype=torch.int64))


def test_without_auto_reset_finished_envs_run_on():
    env = TensorCartPole(2, auto_reset=False)
    env.reset([0, 1])
    for _ in range(60):
        step = env.step(torch.zeros(2, dtype=torch.int64))
    assert step.terminated.all() and env.episodes.eq(0).all()
    assert torch.equal(step.obs, step.final_obs)

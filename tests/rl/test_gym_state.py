"""Snapshots of single gymnasium envs: what is restored exactly, and what is refused."""

import warnings

import gymnasium as gym
import numpy as np
import pytest

from pipeline.rl.envs import make_env
from pipeline.rl.gym_state import derived_seed, restore_env, snapshot_env


def run(env, actions):
    return [env.step(int(a)) for a in actions]


@pytest.mark.parametrize("steps_before", [0, 2])
def test_a_snapshot_keeps_the_time_limit_where_it_was(steps_before):
    env = make_env("CartPole-v1", max_episode_steps=5)
    obs, _ = env.reset(seed=1)
    for a in [1, 0][:steps_before]:
        obs = env.step(a)[0]
    state = snapshot_env(env)
    twin = make_env("CartPole-v1", max_episode_steps=5)
    assert restore_env(twin, state, obs)
    actions = [0, 1, 0, 1, 0][steps_before:]
    steps, twin_steps = run(env, actions), run(twin, actions)
    assert [s[3] for s in twin_steps] == [s[3] for s in steps] == [False] * (len(actions) - 1) + [True]
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(steps, twin_steps))


class Counting(gym.Wrapper):
    """A wrapper with state of its own, which the snapshot does not know."""

    def __init__(self, env):
        super().__init__(env)
        self.count = 0

    def step(self, action):
        self.count += 1
        return self.env.step(action)


class Custom(gym.Env):
    """Not a classic-control env, though it keeps a numpy `state` as they do."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,))
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.state = np.zeros(2)
        return self.state.astype(np.float32), {}

    def step(self, action):
        self.state = self.state + 0.1
        return self.state.astype(np.float32), 0.0, False, False, {}


@pytest.mark.parametrize("kind", ["unknown wrapper", "unknown env"])
def test_what_the_snapshot_cannot_restore_is_marked_inexact_and_refused(kind):
    env = Counting(gym.make("CartPole-v1")) if kind == "unknown wrapper" else Custom()
    obs, _ = env.reset(seed=0)
    state = snapshot_env(env)
    assert state["exact"] is False
    assert restore_env(env, state, obs) is False


def test_derived_seeds_are_reproducible_64_bit_and_differ_per_episode():
    seeds = [derived_seed(7, episode) for episode in range(4)]
    assert seeds == [derived_seed(7, episode) for episode in range(4)]
    assert len(set(seeds)) == 4 and derived_seed(8, 0) not in seeds
    # Beyond 2**32: no seed a run hands out (agent seeds, plus e << 32 for env e) is that large for small E.
    assert all(2**32 <= s < 2**64 for s in seeds)


def test_a_lost_life_survives_the_snapshot():
    """Breakout with a terminal at every lost life, snapshot right at one (4 lives left, the game goes on):
    the restored wrapper counts lives from 4 as the original does, not from the 5 of a new game."""
    kwargs = {"terminal_on_life_loss": True, "clip_rewards": True}
    env = make_env("ALE/Breakout-v5", **kwargs)
    obs, _ = env.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(2000):
        obs, _, terminated, truncated, _ = env.step(int(rng.integers(4)))
        if terminated or truncated:
            break
    assert terminated and env.unwrapped.ale.lives() == 4
    state = snapshot_env(env)
    twin = make_env("ALE/Breakout-v5", **kwargs)
    assert restore_env(twin, state, obs)
    actions = rng.integers(4, size=60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # stepping on after a terminal: the game itself is not over
        for a, b in zip(run(env, actions), run(twin, actions)):
            assert np.array_equal(a[0], b[0]) and a[1:4] == b[1:4]

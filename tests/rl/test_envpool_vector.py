"""The EnvPool backend stepped side by side with the gymnasium path (GymVectorEnv) it stands in for.

EnvPool draws start states from its own C++ generator, so an env seeded s does not start where
gymnasium's env seeded s does: CartPole is compared step by step from the same states (gymnasium's
envs are put where EnvPool's are before every step); Atari without randomness (one no-op, no sticky
actions) starts identically and is compared frame by frame.
"""

import sys

import numpy as np
import pytest
import torch

pytest.importorskip("envpool", reason="envpool is not installed (pip install envpool==1.2.5)")

from pipeline.rl.envpool_vector import EnvPoolVectorEnv  # noqa: E402
from pipeline.rl.vector import GymVectorEnv, env_seeds, make_vector_env  # noqa: E402

SHORT_CARTPOLE = {"max_episode_steps": 30}  # many episodes end by the time limit, many by falling


def test_cartpole_steps_like_gymnasium_from_the_same_states():
    seeds, per_agent = [3, 4], 2
    pool = EnvPoolVectorEnv("CartPole-v1", SHORT_CARTPOLE, env_seeds(seeds, per_agent), "cpu")
    gym_vec = GymVectorEnv("CartPole-v1", SHORT_CARTPOLE, env_seeds(seeds, per_agent), "cpu")
    obs = pool.reset()
    gym_vec.reset()
    bases = [env.unwrapped for env in gym_vec.envs]
    x_limit, theta_limit = bases[0].x_threshold, bases[0].theta_threshold_radians
    actions = torch.from_numpy(np.random.default_rng(0).integers(0, 2, size=(600, pool.num_envs)))
    ends = {"terminated": 0, "truncated": 0, "both": 0}
    for t in range(actions.shape[0]):
        for base, row in zip(bases, obs.numpy()):
            base.state = row.astype(np.float64)
        a, g = pool.step(actions[t]), gym_vec.step(actions[t])
        # One Euler step (tau = 0.02) from states equal to float32 rounding (|values| < 8: < 1e-6): 1e-5 is ample.
        torch.testing.assert_close(a.final_obs, g.final_obs, rtol=0, atol=1e-5)
        assert torch.equal(a.reward, g.reward)
        final = g.final_obs.numpy()
        on_edge = (np.abs(np.abs(final[:, 0]) - x_limit) < 1e-5) | (np.abs(np.abs(final[:, 2]) - theta_limit) < 1e-5)
        sure = torch.from_numpy(~on_edge)
        assert torch.equal(a.truncated[sure], g.truncated[sure]), t
        # A fall on the time limit's last step: gymnasium says terminated and truncated, EnvPool truncated only.
        assert torch.equal(a.terminated[sure], (g.terminated & ~g.truncated)[sure]), t
        assert torch.equal(a.done[sure], g.done[sure])
        assert torch.equal(a.obs[~a.done], a.final_obs[~a.done])
        if a.done.any():  # the next episode's first observation, from CartPole's start range
            assert a.obs[a.done].abs().max() <= 0.05 and not torch.equal(a.obs[a.done], a.final_obs[a.done])
        ends["terminated"] += int((g.terminated & ~g.truncated).sum())
        ends["truncated"] += int((g.truncated & ~g.terminated).sum())
        ends["both"] += int((g.terminated & g.truncated).sum())
        obs = a.obs
    assert ends["terminated"] > 20 and ends["truncated"] > 5, ends
    assert pool.episodes.tolist() == gym_vec.episodes.tolist()
    pool.close()
    gym_vec.close()


def rollout(env: EnvPoolVectorEnv, steps: int, seed: int = 0) -> list[torch.Tensor]:
    rng = np.random.default_rng(seed)
    seen = [env.reset()]
    for _ in range(steps):
        step = env.step(torch.from_numpy(rng.integers(0, 2, size=env.num_envs)))
        seen += [step.final_obs, step.obs]
    return seen


def test_rows_are_seeded_per_agent_and_reproducibly():
    seeds = [7, 8]
    two_agents = EnvPoolVectorEnv("CartPole-v1", {}, env_seeds(seeds, 2), "cpu")
    again = EnvPoolVectorEnv("CartPole-v1", {}, env_seeds(seeds, 2), "cpu")
    first = rollout(two_agents, 80)
    assert all(torch.equal(x, y) for x, y in zip(first, rollout(again, 80)))
    starts = first[0]
    assert len({tuple(row.tolist()) for row in starts}) == 4  # no two rows share a start
    # An agent's first env is seeded like the single run of its seed (as on the gym path with E = 1).
    for agent, seed in enumerate(seeds):
        alone = EnvPoolVectorEnv("CartPole-v1", {}, [seed], "cpu")
        assert torch.equal(alone.reset()[0], starts[2 * agent])


def test_dropped_agents_leave_the_kept_ones_untouched():
    seeds = env_seeds([1, 2, 3], 1)
    full, pruned = (EnvPoolVectorEnv("CartPole-v1", SHORT_CARTPOLE, seeds, "cpu") for _ in range(2))
    full.reset()
    pruned.reset()
    pruned.keep_envs_(torch.tensor([0, 2]))
    actions = torch.from_numpy(np.random.default_rng(1).integers(0, 2, size=(120, 3)))
    for t in range(actions.shape[0]):
        a, b = full.step(actions[t]), pruned.step(actions[t, [0, 2]])
        for field in ("obs", "final_obs", "reward", "terminated", "truncated"):
            assert torch.equal(getattr(a, field)[[0, 2]], getattr(b, field)), (t, field)
    assert pruned.num_envs == 2 and pruned.seeds == [seeds[0], seeds[2]]


def test_make_vector_env_builds_the_pool_for_backend_envpool():
    env = make_vector_env({"id": "CartPole-v1", "kwargs": {"max_episode_steps": 30}, "backend": "envpool"}, [3, 4], 2)
    assert isinstance(env, EnvPoolVectorEnv) and env.num_envs == 4 and env.n_actions == 2
    assert env.return_bounds == (0.0, 30.0)  # one point a step for at most 30 steps
    assert env.reset().shape == (4, 4) and env.restarted == []


def test_resume_restarts_every_env_on_a_new_episode():
    env = EnvPoolVectorEnv("CartPole-v1", {}, env_seeds([5, 6], 1), "cpu")
    rollout(env, 40)
    state = env.state_dict()
    resumed, twin = (EnvPoolVectorEnv("CartPole-v1", {}, env_seeds([5, 6], 1), "cpu") for _ in range(2))
    resumed.load_state_dict(state)
    twin.load_state_dict(state)
    assert resumed.restarted == [0, 1]
    assert resumed.episodes.tolist() == (state["episodes"] + 1).tolist()
    assert torch.equal(resumed.observation(), twin.observation())  # the restart is reproducible
    assert resumed.observation().abs().max() <= 0.05 and not torch.equal(resumed.observation(), state["obs"])
    with pytest.raises(ValueError, match="cannot load into 3 x CartPole-v1"):
        EnvPoolVectorEnv("CartPole-v1", {}, [1, 2, 3], "cpu").load_state_dict(state)


def test_mujoco_spaces_are_gymnasiums():
    pytest.importorskip("mujoco", reason="the gymnasium side needs mujoco (pip install -e '.[mujoco]')")
    # EnvPool's MuJoCo state is not settable from an observation (x position is left out), so only the spaces are compared.
    pool = EnvPoolVectorEnv("HalfCheetah-v5", {}, [0, 1], "cpu")
    gym_vec = GymVectorEnv("HalfCheetah-v5", {}, [0, 1], "cpu")
    assert pool.observation_shape == gym_vec.observation_shape and pool.obs_dtype == gym_vec.obs_dtype == torch.float32
    assert pool.action_space == gym_vec.action_space and pool.n_actions is None
    assert pool.reward_threshold == gym_vec.reward_threshold
    pool.reset()
    step = pool.step(torch.zeros(2, *pool.action_space.shape))
    assert step.obs.shape == (2, *gym_vec.observation_shape) and step.reward.dtype == torch.float32
    pool.close()
    gym_vec.close()


@pytest.mark.parametrize(
    ("env_id", "kwargs", "message"),
    [
        ("ALE/Pong-v5", {"terminal_on_life_loss": True}, "restarts the game at a lost life"),
        ("ALE/Pong-v5", {"noop_max": 0}, "noop_max=0"),
        ("CartPole-v1", {"gravity": 3.0}, r"takes no env.kwargs \['gravity'\]"),
        ("NoSuchEnv-v0", {}, "has no NoSuchEnv-v0"),
    ],
)
def test_what_envpool_cannot_do_is_refused_in_one_line(env_id, kwargs, message):
    with pytest.raises(ValueError, match=message):
        EnvPoolVectorEnv(env_id, kwargs, [0], "cpu")


def test_without_envpool_the_backend_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", None)  # import envpool now raises ImportError
    with pytest.raises(ValueError, match=r'needs envpool, which is not installed: pip install "envpool=='):
        EnvPoolVectorEnv("CartPole-v1", {}, [0], "cpu")


@pytest.mark.slow
def test_atari_frames_match_gymnasium_frame_for_frame():
    pytest.importorskip("ale_py", reason="Atari needs ale-py, a dependency of the project: pip install -e .")
    # One no-op and no sticky actions: nothing random is left, so both start from the same frames.
    kwargs = {"frame_skip": 4, "screen_size": 84, "noop_max": 1, "frame_stack": 4, "clip_rewards": True,
              "repeat_action_probability": 0.0}
    pool = EnvPoolVectorEnv("ALE/Pong-v5", kwargs, [0, 1], "cpu")
    gym_vec = GymVectorEnv("ALE/Pong-v5", kwargs, [0, 1], "cpu")
    assert pool.observation_shape == gym_vec.observation_shape and pool.n_actions == gym_vec.n_actions
    assert torch.equal(pool.reset(), gym_vec.reset())
    actions = torch.from_numpy(np.random.default_rng(0).integers(0, pool.n_actions, size=(900, 2)))
    games_over = points = 0
    for t in range(actions.shape[0]):
        a, g = pool.step(actions[t]), gym_vec.step(actions[t])
        for field in ("obs", "reward", "terminated", "truncated"):
            assert torch.equal(getattr(a, field), getattr(g, field)), (t, field)
        # A game-over step's observation: gymnasium keeps the frames from before the last one, EnvPool shows it.
        assert torch.equal(a.final_obs[~g.done], g.final_obs[~g.done]), t
        games_over += int(g.done.sum())
        points += int(g.reward.abs().sum())
    assert games_over >= 1 and points > 30
    pool.close()
    gym_vec.close()

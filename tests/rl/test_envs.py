import gymnasium as gym
import numpy as np
import pytest
import torch

from pipeline.rl.envs import (
    _to_env_actions,
    batch_to_tensor,
    env_threshold,
    evaluate_greedy,
    is_atari,
    make_env,
    obs_to_tensor,
)


def test_env_threshold():
    assert env_threshold("CartPole-v1") == 475.0


def test_make_env_is_seeded_and_records_episodes():
    a, b = make_env("CartPole-v1", seed=3), make_env("CartPole-v1", seed=3)
    obs_a, _ = a.reset()
    obs_b, _ = b.reset()
    assert np.array_equal(obs_a, obs_b)
    assert a.action_space.sample() == b.action_space.sample()
    done, info = False, {}
    while not done:
        _, _, terminated, truncated, info = a.step(0)
        done = terminated or truncated
    assert "episode" in info


def test_obs_to_tensor_is_float32():
    t = obs_to_tensor(np.zeros(4, dtype=np.float64))
    assert t.dtype == torch.float32 and t.shape == (4,)


def test_evaluate_greedy_with_a_trivial_policy():
    def always_left(obs: torch.Tensor) -> torch.Tensor:
        return torch.zeros(obs.shape[0], dtype=torch.int64)

    returns = evaluate_greedy(always_left, "CartPole-v1", n_episodes=5, seed=0)
    assert len(returns) == 5
    assert all(5 <= r < 50 for r in returns)
    assert returns == evaluate_greedy(always_left, "CartPole-v1", n_episodes=5, seed=0)


def test_evaluate_greedy_restores_training_mode():
    net = torch.nn.Sequential(torch.nn.Linear(4, 2))
    seen = []

    class Greedy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, obs):
            seen.append(self.training)
            return self.net(obs).argmax(dim=1)

    policy = Greedy().train()
    evaluate_greedy(policy, "CartPole-v1", n_episodes=2, seed=0)
    assert seen and not any(seen)
    assert policy.training


def test_env_threshold_is_none_for_an_env_without_one():
    assert env_threshold("Pendulum-v1") is None and env_threshold("MountainCar-v0") == -110.0


def _chain(env):
    chain = []
    while isinstance(env, gym.Wrapper):
        chain.append(env)
        env = env.env
    return chain, env


def test_atari_ids_get_the_dqn_preprocessing_by_default_and_as_asked():
    assert is_atari("ALE/Pong-v5") and not is_atari("CartPole-v1")
    env = make_env("ALE/Pong-v5", seed=0)
    chain, base = _chain(env)
    assert [type(w).__name__ for w in chain][:4] == [
        "RecordEpisodeStatistics", "FrameStackObservation", "TransformReward", "AtariPreprocessing"
    ]  # fmt: skip
    stack, clip, pre = chain[1:4]
    assert stack.stack_size == 4 and base._frameskip == 1  # the wrapper skips frames, not ALE
    assert (pre.noop_max, pre.frame_skip, pre.screen_size, pre.terminal_on_life_loss) == (30, 4, (84, 84), False)
    assert pre.grayscale_obs and not pre.scale_obs
    assert [clip.func(r) for r in (5.0, -2.0, 0.0)] == [1.0, -1.0, 0.0]  # rewards clipped to their sign
    obs, _ = env.reset()
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    kwargs = dict(frame_skip=2, screen_size=64, noop_max=5, frame_stack=2, terminal_on_life_loss=True)
    chain, _ = _chain(make_env("ALE/Pong-v5", clip_rewards=False, max_episode_steps=100, **kwargs))
    names = [type(w).__name__ for w in chain]
    assert "TransformReward" not in names and chain[1].stack_size == 2
    pre = chain[names.index("AtariPreprocessing")]
    assert (pre.frame_skip, pre.screen_size, pre.noop_max, pre.terminal_on_life_loss) == (2, (64, 64), 5, True)
    assert chain[names.index("TimeLimit")].spec.max_episode_steps == 100


def test_atari_evaluation_plays_whole_games_with_unclipped_rewards():
    """Space Invaders, sweeping right and left while firing: points of 5-30 an alien, a life lost within 1000
    frames and more points after it, so either clipping or a stop at the lost life would change the return."""
    sweep = [4] * 8 + [5] * 8  # RIGHTFIRE, LEFTFIRE
    calls = []

    def policy(obs: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return torch.full((obs.shape[0],), sweep[(len(calls) - 1) % 16], dtype=torch.int64)

    kwargs = {"max_episode_steps": 1000}
    returns = evaluate_greedy(policy, "ALE/SpaceInvaders-v5", 1, seed=0,
                              env_kwargs={**kwargs, "clip_rewards": True, "terminal_on_life_loss": True})  # fmt: skip
    env = make_env("ALE/SpaceInvaders-v5", clip_rewards=False, terminal_on_life_loss=False, **kwargs)
    env.reset(seed=0)
    total, rewards, done, t, lives_at = 0.0, [], False, 0, None
    while not done:
        _, reward, terminated, truncated, _ = env.step(sweep[t % 16])
        total, done, t = total + reward, terminated or truncated, t + 1
        rewards.append(reward)
        if lives_at is None and env.unwrapped.ale.lives() < 3:
            lives_at = t
    assert max(rewards) > 1 and lives_at is not None and sum(rewards[lives_at:]) > 0
    assert returns == [total]


def test_an_evaluation_steps_as_often_as_its_longest_episode_with_the_given_env_options():
    batches = []

    def left(obs: torch.Tensor) -> torch.Tensor:
        batches.append(obs.shape[0])
        return torch.zeros(obs.shape[0], dtype=torch.int64)

    returns = evaluate_greedy(left, "CartPole-v1", n_episodes=4, seed=0)
    assert len(batches) == max(returns) and batches[0] == 4 and batches[-1] >= 1  # finished episodes drop out
    assert sorted(batches, reverse=True) == batches
    assert evaluate_greedy(left, "CartPole-v1", 3, seed=0, env_kwargs={"max_episode_steps": 3}) == [3.0] * 3


def test_make_env_seeds_both_spaces_and_passes_options_on():
    a, b = make_env("CartPole-v1", seed=5, max_episode_steps=7), make_env("CartPole-v1", seed=5)
    assert a.spec.max_episode_steps == 7
    assert [a.action_space.sample() for _ in range(20)] == [b.action_space.sample() for _ in range(20)]
    assert all(np.array_equal(a.observation_space.sample(), b.observation_space.sample()) for _ in range(5))


def test_batches_become_float32_tensors_or_stay_uint8_frames():
    frames = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)[:, ::-1]  # not contiguous
    t = batch_to_tensor(frames)
    assert t.dtype == torch.uint8 and torch.equal(t, torch.from_numpy(frames.copy()))
    floats = batch_to_tensor(np.ones((2, 3), dtype=np.float64))
    assert floats.dtype == torch.float32 and torch.equal(floats, torch.ones(2, 3))
    assert obs_to_tensor(torch.ones(3, dtype=torch.float64)).dtype == torch.float32


def test_policy_outputs_become_env_actions():
    assert _to_env_actions(torch.tensor([1, 0]), 2) == [1, 0]
    assert _to_env_actions(torch.tensor(1), 1) == [1]
    continuous = _to_env_actions(torch.tensor([[0.5, -0.5], [1.0, 0.0]]), 2)
    assert len(continuous) == 2 and all(np.array_equal(a, b) for a, b in zip(continuous, [[0.5, -0.5], [1.0, 0.0]]))
    assert _to_env_actions(np.array([1, 0]), 2) == [1, 0] and _to_env_actions([0, 1], 2) == [0, 1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_observations_go_to_the_device_asked_for():
    assert obs_to_tensor(np.zeros(3), "cuda").device.type == "cuda"
    assert obs_to_tensor(torch.zeros(3), "cuda").device.type == "cuda"
    assert batch_to_tensor(np.zeros((2, 3), dtype=np.uint8), "cuda").device.type == "cuda"
    assert batch_to_tensor(np.zeros((2, 3)), "cuda").device.type == "cuda"
    devices = set()

    def left(obs: torch.Tensor) -> torch.Tensor:
        devices.add(obs.device.type)
        return torch.zeros(obs.shape[0], dtype=torch.int64, device=obs.device)

    evaluate_greedy(left, "CartPole-v1", 2, seed=0, device="cuda")
    assert devices == {"cuda"}

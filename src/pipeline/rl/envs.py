"""Environment construction, the float32 boundary, and greedy evaluation."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch
from torch import nn


def make_atari_env(
    env_id: str,
    frame_skip: int = 4,
    screen_size: int = 84,
    noop_max: int = 30,
    frame_stack: int = 4,
    terminal_on_life_loss: bool = False,
    clip_rewards: bool = True,
    **kwargs,
) -> gym.Env:
    """The standard DQN preprocessing (Mnih et al. 2015) from gymnasium's own wrappers: up to `noop_max`
    no-ops at reset, `frame_skip` with max-pooling, 84x84 grayscale uint8, a stack of 4 frames, rewards
    clipped to their sign, optionally a terminal at every lost life. Observations: uint8 (4, 84, 84)."""
    import ale_py

    gym.register_envs(ale_py)
    # The wrapper does the frame skipping; ALE's own must be off.
    env = gym.make(env_id, frameskip=1, **kwargs)
    env = gym.wrappers.AtariPreprocessing(
        env, noop_max=noop_max, frame_skip=frame_skip, screen_size=screen_size,
        terminal_on_life_loss=terminal_on_life_loss, grayscale_obs=True, scale_obs=False,
    )
    if clip_rewards:
        env = gym.wrappers.TransformReward(env, lambda r: float(np.sign(r)))
    return gym.wrappers.FrameStackObservation(env, frame_stack)


def is_atari(env_id: str) -> bool:
    return env_id.startswith("ALE/")


def make_env(env_id: str, seed: int | None = None, **kwargs) -> gym.Env:
    """`gymnasium.make` plus episode statistics, seeded when `seed` is given.

    `ALE/...` ids get the Atari preprocessing of `make_atari_env` (its options pass through `kwargs`);
    RecordEpisodeStatistics sits outside it, so its returns are the clipped training rewards.

    Seeding resets the env once with `seed` and seeds its action space, so
    later `reset()` calls without a seed continue a reproducible stream and
    `action_space.sample()` (random exploration) is reproducible too.
    """
    base = make_atari_env(env_id, **kwargs) if is_atari(env_id) else gym.make(env_id, **kwargs)
    env = gym.wrappers.RecordEpisodeStatistics(base)
    if seed is not None:
        env.reset(seed=int(seed))
        env.action_space.seed(int(seed))
        env.observation_space.seed(int(seed))
    return env


def obs_to_tensor(obs, device: str | torch.device = "cpu") -> torch.Tensor:
    """Convert an env observation to float32 once, here, so nothing downstream sees float64."""
    if isinstance(obs, torch.Tensor):
        return obs.to(device=device, dtype=torch.float32)
    return torch.as_tensor(np.asarray(obs, dtype=np.float32), device=device)


def env_threshold(env_id: str) -> float | None:
    """The env's registered `reward_threshold` (475 for CartPole-v1), or None."""
    threshold = gym.spec(env_id).reward_threshold
    return None if threshold is None else float(threshold)


def evaluate_greedy(
    policy: Callable[[torch.Tensor], torch.Tensor],
    env_id: str,
    n_episodes: int,
    seed: int,
    device: str | torch.device = "cpu",
    env_kwargs: dict | None = None,
) -> list[float]:
    """Undiscounted returns of `n_episodes` episodes of `policy`, on envs separate from training.

    `policy` maps a (B, *obs_shape) float32 batch of observations to B
    actions. The episodes run side by side, one batched forward per step for
    all episodes still running: an evaluation costs about as many forwards
    as its longest episode instead of the sum of all of them.
    Episode i resets with seed `seed + i`, so two evaluations with the same
    seed face the same start states and the training env's RNG is untouched.
    An `nn.Module` policy is put in eval() mode (e.g. noise off) and restored.
    """
    env_kwargs = dict(env_kwargs or {})
    if is_atari(env_id):
        # Score the game as players do: unclipped rewards, the whole game rather than one life.
        env_kwargs.update(clip_rewards=False, terminal_on_life_loss=False)
    envs = [make_env(env_id, **env_kwargs) for _ in range(n_episodes)]
    was_training = isinstance(policy, nn.Module) and policy.training
    if isinstance(policy, nn.Module):
        policy.eval()
    returns = [0.0] * n_episodes
    try:
        obs = [env.reset(seed=int(seed) + i)[0] for i, env in enumerate(envs)]
        alive = list(range(n_episodes))
        with torch.inference_mode():
            while alive:
                stacked = np.stack([obs[i] for i in alive])
                # uint8 frames stay uint8 (the network scales them); everything else becomes float32.
                batch = torch.from_numpy(stacked).to(device) if stacked.dtype == np.uint8 else obs_to_tensor(stacked, device)
                actions = _to_env_actions(policy(batch), len(alive))
                still_alive = []
                for i, action in zip(alive, actions):
                    obs[i], reward, terminated, truncated, _ = envs[i].step(action)
                    returns[i] += float(reward)
                    if not (terminated or truncated):
                        still_alive.append(i)
                alive = still_alive
    finally:
        for env in envs:
            env.close()
        if was_training:
            policy.train()
    return returns


def _to_env_actions(actions, n: int) -> list:
    if isinstance(actions, torch.Tensor):
        actions = actions.detach().cpu()
        if actions.dim() <= 1:
            return actions.reshape(n).tolist()
        return list(actions.numpy())
    return list(actions)

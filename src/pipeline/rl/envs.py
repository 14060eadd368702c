"""Environment construction, the float32 boundary, and greedy evaluation."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch
from torch import nn


def make_env(env_id: str, seed: int | None = None, **kwargs) -> gym.Env:
    """`gymnasium.make` plus episode statistics, seeded when `seed` is given.

    Seeding resets the env once with `seed` and seeds its action space, so
    later `reset()` calls without a seed continue a reproducible stream and
    `action_space.sample()` (random exploration) is reproducible too.
    """
    env = gym.wrappers.RecordEpisodeStatistics(gym.make(env_id, **kwargs))
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
    envs = [gym.make(env_id) for _ in range(n_episodes)]
    was_training = isinstance(policy, nn.Module) and policy.training
    if isinstance(policy, nn.Module):
        policy.eval()
    returns = [0.0] * n_episodes
    try:
        obs = [env.reset(seed=int(seed) + i)[0] for i, env in enumerate(envs)]
        alive = list(range(n_episodes))
        with torch.inference_mode():
            while alive:
                batch = obs_to_tensor(np.stack([obs[i] for i in alive]), device)
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

"""CartPole-v1 as batched tensor operations: B environments stepped by a few dozen kernels, on any device.

The dynamics, termination, truncation (500 steps) and reward are gymnasium's CartPole-v1, written in
its exact operation order: in float64 a trajectory matches gymnasium's to rounding (1e-16 measured)
until termination, which the tests check. float32 is accurate per step (~3e-7) but an episode
drifts late because the pole amplifies rounding, so float64 is the default; on CPU the two cost the
same for the batch sizes we use (the step is per-kernel overhead, not arithmetic).

Start states are uniform on [-0.05, 0.05]^4 like gymnasium's, drawn per (seed, episode) by the
counter-based hash of `pipeline.rl.tensor_env` (which also holds auto-reset and truncation).
"""

from __future__ import annotations

import math
from functools import partial

import gymnasium as gym
import torch

from pipeline.rl.tensor_env import TensorEnv, TensorStep, hashed_uniform, seed_keys, tensor_episode_returns

__all__ = ["TensorCartPole", "TensorStep", "episode_returns", "hashed_uniform", "seed_keys"]


class TensorCartPole(TensorEnv):
    """B independent CartPole-v1 envs as tensors: observations [B, 4], rewards and flags [B]."""

    # CartPole-v1's constants (gymnasium.envs.classic_control.CartPoleEnv).
    gravity = 9.8
    masscart = 1.0
    masspole = 0.1
    total_mass = masspole + masscart
    length = 0.5
    polemass_length = masspole * length
    force_mag = 10.0
    tau = 0.02
    theta_threshold_radians = 12 * 2 * math.pi / 360
    x_threshold = 2.4

    env_id = "CartPole-v1"
    observation_shape = (4,)
    n_actions = 2
    action_space = gym.spaces.Discrete(2)
    reward_threshold = 475.0
    state_size = 4
    time_limit = 500

    def __init__(self, num_envs: int, device: str | torch.device = "cpu", dtype: torch.dtype | str = torch.float64,
                 max_episode_steps: int | None = None, auto_reset: bool = True):
        super().__init__(num_envs, device, dtype, max_episode_steps, auto_reset)
        self.forces = torch.tensor([-self.force_mag, self.force_mag], dtype=self.dtype, device=self.device)

    def initial_rows(self, keys: torch.Tensor, episodes: torch.Tensor) -> torch.Tensor:
        """Start states [4, B], uniform on [-0.05, 0.05] like gymnasium's reset."""
        return (hashed_uniform(keys, episodes, 4) * 0.1 - 0.05).to(self.dtype)

    def observation_of(self, rows: torch.Tensor) -> torch.Tensor:
        return rows.t().to(torch.float32).contiguous()

    def reward(self, terminated: torch.Tensor) -> torch.Tensor:
        # Every step of CartPole-v1 (the terminating one included) is worth 1.
        return torch.ones(terminated.shape, dtype=torch.float32, device=self.device)

    def physics(self, rows: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """gymnasium's Euler step in its operation order (so float64 agrees to rounding).

        rows [4, B], actions [B] -> (next rows [4, B], terminated [B]).
        """
        x, x_dot, theta, theta_dot = rows.unbind(0)
        force = self.forces.index_select(0, actions.reshape(-1).long())
        costheta = torch.cos(theta)
        sintheta = torch.sin(theta)
        temp = (force + self.polemass_length * torch.square(theta_dot) * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * torch.square(costheta) / self.total_mass)
        )
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        # gymnasium's four Euler updates (x + tau * x_dot, ...) as one multiply-add over the rows:
        # the same two roundings per element, a quarter of the kernel launches.
        rows = rows + self.tau * torch.stack((x_dot, xacc, theta_dot, thetaacc))
        # |x| > t is exactly (x < -t or x > t).
        terminated = (rows[0].abs() > self.x_threshold) | (rows[2].abs() > self.theta_threshold_radians)
        return rows, terminated


# One CartPole episode per seed, side by side: episode_returns(policy, seeds, device, dtype) -> [len(seeds)] returns.
episode_returns = partial(tensor_episode_returns, TensorCartPole)

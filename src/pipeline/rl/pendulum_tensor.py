"""Pendulum-v1 as batched tensor operations: B torque-driven pendulums stepped together, on any device.

gymnasium's Pendulum-v1 (one explicit Euler step of dt = 0.05 per action: the speed first, clipped to
8, then the angle from the new speed; the torque clipped to [-2, 2]; the cost theta^2 + 0.1 thetadot^2
+ 0.001 u^2 of the state before the step, with theta wrapped to [-pi, pi); no termination; truncated
after 200 steps), written in its operation order and with numpy's type promotion: a float32 torque
(what a policy sends) enters the torque terms in float32, as it does in gymnasium, so in float64 a
trajectory follows gymnasium's to rounding (the tests check it).

Start states are uniform on [-pi, pi] x [-1, 1] like gymnasium's (not rounded to float32), drawn per
(seed, episode) by the counter-based hash of `pipeline.rl.tensor_env`.
"""

from __future__ import annotations

from math import pi

import gymnasium as gym
import numpy as np
import torch

from pipeline.rl.tensor_env import TensorEnv, hashed_uniform


class TensorPendulum(TensorEnv):
    """B independent Pendulum-v1 envs as tensors: observations [B, 3] (cos theta, sin theta, thetadot),
    actions [B, 1] or [B] (torques, clipped to [-2, 2] here), rewards and flags [B]."""

    # PendulumEnv's constants (gymnasium.envs.classic_control.pendulum), g at its default.
    max_speed = 8.0
    max_torque = 2.0
    dt = 0.05
    g = 10.0
    m = 1.0
    l = 1.0  # noqa: E741 (gymnasium's name)

    env_id = "Pendulum-v1"
    observation_shape = (3,)
    action_space = gym.spaces.Box(-max_torque, max_torque, shape=(1,), dtype=np.float32)
    reward_threshold = None
    state_size = 2  # theta (not wrapped, as gymnasium keeps it), thetadot
    time_limit = 200
    # The per-step reward's range: 0 upright and still, -(pi^2 + 0.1 * 8^2 + 0.001 * 2^2) at worst.
    step_reward_bounds = (-(pi**2 + 0.1 * max_speed**2 + 0.001 * max_torque**2), 0.0)

    def initial_rows(self, keys: torch.Tensor, episodes: torch.Tensor) -> torch.Tensor:
        """Start states [2, B]: theta uniform on [-pi, pi], thetadot on [-1, 1], as gymnasium's reset draws them."""
        high = torch.tensor([[pi], [1.0]], dtype=torch.float64, device=keys.device)
        return (hashed_uniform(keys, episodes, 2) * (2 * high) - high).to(self.dtype)

    def observation_of(self, rows: torch.Tensor) -> torch.Tensor:
        theta, thetadot = rows.unbind(0)
        return torch.stack((torch.cos(theta), torch.sin(theta), thetadot), 1).to(torch.float32)

    def torque(self, actions: torch.Tensor) -> torch.Tensor:
        """[B] torques clipped to the bounds, in the actions' own float dtype (np.clip keeps a float32 action float32)."""
        u = actions.reshape(-1)
        if not u.is_floating_point():
            u = u.to(self.dtype)
        return u.clamp(-self.max_torque, self.max_torque)

    def physics(self, rows: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """PendulumEnv.step's update: rows [2, B], actions [B(, 1)] -> (next rows [2, B], terminated [B] all False)."""
        theta, thetadot = rows.unbind(0)
        g, m, l, dt = self.g, self.m, self.l, self.dt  # noqa: E741 (gymnasium's names)
        u = self.torque(actions)
        # A Python float times a float32 tensor stays float32, then meets the float64 term: numpy's promotion.
        new_thetadot = thetadot + (3 * g / (2 * l) * torch.sin(theta) + 3.0 / (m * l**2) * u) * dt
        new_thetadot = torch.clamp(new_thetadot, -self.max_speed, self.max_speed)
        new_theta = theta + new_thetadot * dt
        terminated = torch.zeros(theta.shape, dtype=torch.bool, device=theta.device)
        return torch.stack((new_theta, new_thetadot)), terminated

    def step_reward(self, rows: torch.Tensor, actions: torch.Tensor, terminated: torch.Tensor) -> torch.Tensor:
        """-(angle_normalize(theta)^2 + 0.1 thetadot^2 + 0.001 u^2) of the state the step started from."""
        theta, thetadot = rows.unbind(0)
        u = self.torque(actions)
        costs = angle_normalize(theta) ** 2 + 0.1 * thetadot**2 + 0.001 * (u**2)
        return (-costs).to(torch.float32)


def angle_normalize(x: torch.Tensor) -> torch.Tensor:
    """gymnasium's ((x + pi) % (2 pi)) - pi: a floored modulo, so the result lies in [-pi, pi)."""
    return torch.remainder(x + pi, 2 * pi) - pi

"""Acrobot-v1 as batched tensor operations: B two-link pendulums stepped together, on any device.

gymnasium's Acrobot-v1 ("book" dynamics, one RK4 step of dt = 0.2 per action, no torque noise,
angles wrapped to [-pi, pi], velocities clipped to 4 pi and 9 pi, terminal once the tip is a link's
length above the bar, -1 per step and 0 on the terminating one, truncated after 500 steps), written
in its exact operation order so that in float64 a trajectory follows gymnasium's to rounding (the
tests check it). The dynamics are deterministic, like CartPole's; only the start states are random.

Start states are uniform on [-0.1, 0.1]^4 and rounded to float32 like gymnasium's, drawn per
(seed, episode) by the counter-based hash of `pipeline.rl.tensor_env`.
"""

from __future__ import annotations

from math import pi

import gymnasium as gym
import torch

from pipeline.rl.tensor_env import TensorEnv, hashed_uniform


class TensorAcrobot(TensorEnv):
    """B independent Acrobot-v1 envs as tensors: observations [B, 6]
    (cos and sin of both angles, both angular velocities), rewards and flags [B]."""

    # AcrobotEnv's constants (gymnasium.envs.classic_control.acrobot).
    dt = 0.2
    LINK_LENGTH_1 = 1.0
    LINK_MASS_1 = 1.0
    LINK_MASS_2 = 1.0
    LINK_COM_POS_1 = 0.5
    LINK_COM_POS_2 = 0.5
    LINK_MOI = 1.0
    MAX_VEL_1 = 4 * pi
    MAX_VEL_2 = 9 * pi
    AVAIL_TORQUE = (-1.0, 0.0, 1.0)

    env_id = "Acrobot-v1"
    observation_shape = (6,)
    n_actions = 3
    action_space = gym.spaces.Discrete(3)
    reward_threshold = -100.0
    state_size = 4
    time_limit = 500

    def __init__(self, num_envs: int, device: str | torch.device = "cpu", dtype: torch.dtype | str = torch.float64,
                 max_episode_steps: int | None = None, auto_reset: bool = True):
        super().__init__(num_envs, device, dtype, max_episode_steps, auto_reset)
        self.torques = torch.tensor(self.AVAIL_TORQUE, dtype=self.dtype, device=self.device)
        self.max_vel = torch.tensor([[self.MAX_VEL_1], [self.MAX_VEL_2]], dtype=self.dtype, device=self.device)

    def initial_rows(self, keys: torch.Tensor, episodes: torch.Tensor) -> torch.Tensor:
        """Start states [4, B], uniform on [-0.1, 0.1] and rounded to float32, as gymnasium's reset does."""
        return (hashed_uniform(keys, episodes, 4) * 0.2 - 0.1).to(torch.float32).to(self.dtype)

    def observation_of(self, rows: torch.Tensor) -> torch.Tensor:
        theta1, theta2, dtheta1, dtheta2 = rows.unbind(0)
        obs = torch.stack((torch.cos(theta1), torch.sin(theta1), torch.cos(theta2), torch.sin(theta2), dtheta1, dtheta2), 1)
        return obs.to(torch.float32)

    def reward(self, terminated: torch.Tensor) -> torch.Tensor:
        # -1 per step, 0 for the step that reaches the goal.
        return terminated.to(torch.float32) - 1.0

    def dsdt(self, rows: torch.Tensor, torque: torch.Tensor) -> torch.Tensor:
        """AcrobotEnv._dsdt ("book"), term by term in its order: [4, B] derivatives of (theta1, theta2, dtheta1, dtheta2)."""
        m1, m2, l1 = self.LINK_MASS_1, self.LINK_MASS_2, self.LINK_LENGTH_1
        lc1, lc2, I1, I2 = self.LINK_COM_POS_1, self.LINK_COM_POS_2, self.LINK_MOI, self.LINK_MOI
        g = 9.8
        a = torque
        theta1, theta2, dtheta1, dtheta2 = rows.unbind(0)
        cos2, sin2 = torch.cos(theta2), torch.sin(theta2)
        d1 = m1 * lc1**2 + m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * cos2) + I1 + I2
        d2 = m2 * (lc2**2 + l1 * lc2 * cos2) + I2
        phi2 = m2 * lc2 * g * torch.cos(theta1 + theta2 - pi / 2.0)
        phi1 = (
            -m2 * l1 * lc2 * dtheta2**2 * sin2
            - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * sin2
            + (m1 * lc1 + m2 * l1) * g * torch.cos(theta1 - pi / 2)
            + phi2
        )
        ddtheta2 = (a + d2 / d1 * phi1 - m2 * l1 * lc2 * dtheta1**2 * sin2 - phi2) / (m2 * lc2**2 + I2 - d2**2 / d1)
        ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
        return torch.stack((dtheta1, dtheta2, ddtheta1, ddtheta2))

    def physics(self, rows: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One RK4 step of dt (gymnasium's rk4 over t = [0, dt]), wrap, clip, terminal test.

        rows [4, B], actions [B] -> (next rows [4, B], terminated [B]).
        """
        torque = self.torques.index_select(0, actions.reshape(-1).long())
        dt = self.dt
        dt2 = dt / 2.0
        k1 = self.dsdt(rows, torque)
        k2 = self.dsdt(rows + dt2 * k1, torque)
        k3 = self.dsdt(rows + dt2 * k2, torque)
        k4 = self.dsdt(rows + dt * k3, torque)
        ns = rows + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
        # Both angles wrapped and both velocities clipped by one op each (elementwise, so the same numbers).
        ns = torch.cat((_wrap(ns[:2], -pi, pi), torch.clamp(ns[2:], -self.max_vel, self.max_vel)))
        terminated = -torch.cos(ns[0]) - torch.cos(ns[1] + ns[0]) > 1.0
        return ns, terminated


def _wrap(x: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """gymnasium's `wrap`: add or subtract the period one at a time (so the rounding is the same)
    until x is in [low, high]. A sync per pass on an accelerator; one or two passes in practice."""
    period = high - low
    passes = 0
    while bool((x > high).any()):
        x = torch.where(x > high, x - period, x)
        passes = _one_more_pass(x, passes)
    while bool((x < low).any()):
        x = torch.where(x < low, x + period, x)
        passes = _one_more_pass(x, passes)
    return x


_MAX_WRAPS = 1000


def _one_more_pass(x: torch.Tensor, passes: int) -> int:
    """A state that needs more than `_MAX_WRAPS` passes has diverged: an infinite angle would loop forever
    (gymnasium's `wrap` hangs there), a huge one for hours. Either is an error that says which."""
    if passes < _MAX_WRAPS:
        return passes + 1
    what = "is not finite" if not bool(torch.isfinite(x).all()) else f"is over {_MAX_WRAPS} turns out of range"
    raise FloatingPointError(f"acrobot: a joint angle {what} (the state diverged); check the actions and any state set by hand")

"""CartPole-v1 as batched tensor operations: B environments stepped by a few dozen kernels, on any device.

The dynamics, termination, truncation (500 steps) and reward are gymnasium's CartPole-v1, written in
its exact operation order: in float64 a trajectory matches gymnasium's to rounding (1e-16 measured)
until termination, which the tests check. float32 is accurate per step (~3e-7) but an episode
drifts late because the pole amplifies rounding, so float64 is the default; on CPU the two cost the
same for the batch sizes we use (the step is per-kernel overhead, not arithmetic).

Initial states are a pure function of (the env's seed, its episode number), computed by a
counter-based hash (splitmix64) in integer tensor ops: each env has its own reproducible stream of
start states, auto-reset needs no per-env generator, and the streams are the same on every device.
They are drawn uniformly from [-0.05, 0.05]^4 like gymnasium's, from a different generator, so an
env seeded with s does not start where `gym.make("CartPole-v1").reset(seed=s)` does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _splitmix64(x: torch.Tensor) -> torch.Tensor:
    # Relies on int64 multiplication wrapping modulo 2^64, as it does on every torch backend.
    x = x + _GOLDEN
    x = (x ^ _shr(x, 30)) * _MIX1
    x = (x ^ _shr(x, 27)) * _MIX2
    return x ^ _shr(x, 31)


def seed_keys(seeds: torch.Tensor) -> torch.Tensor:
    """The per-stream key of `hashed_uniform`, computed once per seed."""
    return _splitmix64(seeds.to(torch.int64))


def hashed_uniform(keys: torch.Tensor, counters: torch.Tensor, n: int) -> torch.Tensor:
    """[n, B] float64 uniforms in [0, 1): column b is a deterministic function of (keys[b], counters[b])."""
    lanes = torch.arange(n, device=keys.device, dtype=torch.int64).unsqueeze(1)
    bits = _splitmix64(keys ^ (counters.to(torch.int64) * n + lanes))
    # The top 53 bits make an exactly representable float64 in [0, 1).
    return _shr(bits, 11).to(torch.float64) * 2.0**-53


class TensorStep(NamedTuple):
    """One batched step with auto-reset.

    `final_obs` is where each env's action led (the terminal or truncated observation for envs that
    just finished: what a replay buffer stores as next state); `obs` is what the agent sees next:
    the same, except that finished envs already show their next episode's first observation.
    """

    obs: torch.Tensor
    reward: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    final_obs: torch.Tensor
    done: torch.Tensor  # terminated | truncated: the envs that were reset


class TensorCartPole:
    """B independent CartPole-v1 envs as tensors, with per-env seeds and auto-reset.

    `reset(seeds)` gives env i the seed `seeds[i]` (an int s means s, s+1, ..., s+B-1) and starts
    episode 0 of its stream; `step(actions)` advances every env and restarts finished ones at their
    next episode's start state. Observations [B, 4], rewards and flags [B] come back as float32 /
    bool tensors on `device` (the float32 boundary), whatever `dtype` the physics runs in.
    """

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
    reward_threshold = 475.0

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str = torch.float64,
        max_episode_steps: int = 500,
        auto_reset: bool = True,
    ):
        if num_envs <= 0:
            raise ValueError(f"num_envs must be positive, got {num_envs}")
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        self.dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        if self.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be float32 or float64, got {dtype}")
        self.max_episode_steps = int(max_episode_steps)
        # Without auto-reset a finished env keeps stepping past its end (flags stay meaningful only
        # until then): for one-episode-per-env loops such as evaluation, which ignore finished envs.
        self.auto_reset = bool(auto_reset)
        # Stored [4, B] (x, x_dot, theta, theta_dot as contiguous rows): elementwise kernels on
        # strided columns of a [B, 4] tensor were 2-4x slower per op on CPU.
        self.rows = torch.zeros(4, self.num_envs, dtype=self.dtype, device=self.device)
        self.elapsed = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)
        self.seeds = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)
        self.keys = seed_keys(self.seeds)
        self.episodes = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)
        self.forces = torch.tensor([-self.force_mag, self.force_mag], dtype=self.dtype, device=self.device)
        self._needs_reset = True
        # A host sync is free on CPU, so there a step skips the hash when no env finished;
        # on an accelerator the hash always runs rather than waiting for the device.
        self._gate_resets = self.device.type == "cpu"

    @property
    def state(self) -> torch.Tensor:
        """The physical state [B, 4] (x, x_dot, theta, theta_dot) in `dtype`."""
        return self.rows.t()

    def initial_rows(self, keys: torch.Tensor, episodes: torch.Tensor) -> torch.Tensor:
        """Start states [4, B], uniform on [-0.05, 0.05] like gymnasium's reset."""
        return (hashed_uniform(keys, episodes, 4) * 0.1 - 0.05).to(self.dtype)

    def reset(self, seeds: int | Sequence[int] | torch.Tensor) -> torch.Tensor:
        if isinstance(seeds, int):
            seeds = torch.arange(self.num_envs, dtype=torch.int64) + seeds
        seeds = torch.as_tensor(seeds, dtype=torch.int64).to(self.device).reshape(-1)
        if seeds.numel() != self.num_envs:
            raise ValueError(f"reset got {seeds.numel()} seeds for {self.num_envs} envs")
        self.seeds = seeds.clone()
        self.keys = seed_keys(self.seeds)
        self.episodes = torch.zeros_like(self.seeds)
        self.elapsed = torch.zeros_like(self.seeds)
        self.rows = self.initial_rows(self.keys, self.episodes)
        self._needs_reset = False
        return self.observation()

    def observation(self) -> torch.Tensor:
        return _obs(self.rows)

    def keep_envs_(self, envs: torch.Tensor) -> None:
        """Keep only `envs` (indices, in that order), each with its state and its stream of start states."""
        envs = envs.to(self.device)
        self.rows = self.rows.index_select(1, envs)
        self.elapsed, self.seeds, self.keys, self.episodes = (
            t.index_select(0, envs) for t in (self.elapsed, self.seeds, self.keys, self.episodes)
        )
        self.num_envs = int(envs.numel())

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

    def step(self, actions: torch.Tensor) -> TensorStep:
        if self._needs_reset:
            raise RuntimeError("call reset(seeds) before step()")
        rows, terminated = self.physics(self.rows, actions)
        self.elapsed = self.elapsed + 1
        # The TimeLimit wrapper's rule: truncated once 500 steps have run, even on a terminating step.
        truncated = self.elapsed >= self.max_episode_steps
        final_obs = _obs(rows)
        done = terminated | truncated
        if self.auto_reset and (not self._gate_resets or bool(done.any())):
            self.episodes = self.episodes + done
            rows = torch.where(done, self.initial_rows(self.keys, self.episodes), rows)
            self.elapsed = self.elapsed.masked_fill(done, 0)
            obs = _obs(rows)
        else:
            obs = final_obs
        self.rows = rows
        # Every step of CartPole-v1 (the terminating one included) is worth 1.
        reward = torch.ones(self.num_envs, dtype=torch.float32, device=self.device)
        return TensorStep(obs, reward, terminated, truncated, final_obs, done)


def _obs(rows: torch.Tensor) -> torch.Tensor:
    return rows.t().to(torch.float32, memory_format=torch.contiguous_format)


@torch.no_grad()
def episode_returns(
    policy: Callable[[torch.Tensor], torch.Tensor],
    seeds: Sequence[int] | torch.Tensor,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str = torch.float64,
    max_episode_steps: int | None = None,
    env_cls: type = TensorCartPole,
) -> torch.Tensor:
    """One episode per seed, all side by side: [len(seeds)] undiscounted returns of `policy`.

    `policy` maps a [B, *obs_shape] float32 batch of observations to B actions. Envs that finished
    keep stepping (a batch does not shrink; no reset either) but stop counting, and the loop ends
    when all have finished. `env_cls` is any tensor env (TensorCartPole, TensorAcrobot); its
    registered episode length unless `max_episode_steps` is given.
    """
    seeds = torch.as_tensor(seeds, dtype=torch.int64)
    limit = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
    env = env_cls(seeds.numel(), device=device, dtype=dtype, auto_reset=False, **limit)
    obs = env.reset(seeds)
    returns = torch.zeros(env.num_envs, dtype=torch.float32, device=env.device)
    alive = torch.ones(env.num_envs, dtype=torch.bool, device=env.device)
    for _ in range(env.max_episode_steps):
        step = env.step(policy(obs))
        returns += step.reward * alive
        alive &= ~step.done
        obs = step.obs
        if not bool(alive.any()):
            break
    return returns

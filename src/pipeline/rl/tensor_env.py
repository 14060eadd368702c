"""What every tensor-native env shares: counter-based start states, auto-reset, truncation, batch surgery.

A tensor env holds B independent copies of one gymnasium env as a [state_size, B] tensor and steps
them all with a few dozen kernels, on any device. A subclass writes its dynamics (`physics`), its
start-state distribution (`initial_rows`), its observation (`observation_of`) and its reward
(`reward` of the termination flags, or `step_reward` of the state and action where it depends on them).

Initial states are a pure function of (the env's seed, its episode number), computed by a
counter-based hash (splitmix64) in integer tensor ops: each env has its own reproducible stream of
start states, auto-reset needs no per-env generator, and the streams are the same on every device.
They follow gymnasium's start distributions but come from a different generator, so an env seeded
with s does not start where `gym.make(id).reset(seed=s)` does.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import NamedTuple

import gymnasium as gym
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


class TensorClock(NamedTuple):
    """What a step of B rows advances: states [state_size, B], steps into the episode, episode numbers, stream keys."""

    rows: torch.Tensor
    elapsed: torch.Tensor
    episodes: torch.Tensor
    keys: torch.Tensor


class TensorEnv(ABC):
    """B independent copies of a gymnasium env as tensors, with per-env seeds and auto-reset.

    `reset(seeds)` gives env i the seed `seeds[i]` (an int s means s, s+1, ..., s+B-1) and starts
    episode 0 of its stream; `step(actions)` advances every env and restarts finished ones at their
    next episode's start state. Observations, rewards and flags come back as float32 / bool tensors
    on `device` (the float32 boundary), whatever `dtype` the physics runs in.
    """

    env_id: str
    observation_shape: tuple[int, ...]
    n_actions: int  # discrete envs
    action_space: gym.spaces.Space  # the space of one env's action, as gymnasium's env has it
    reward_threshold: float | None
    state_size: int
    time_limit = 500

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str = torch.float64,
        max_episode_steps: int | None = None,
        auto_reset: bool = True,
    ):
        if num_envs <= 0:
            raise ValueError(f"num_envs must be positive, got {num_envs}")
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        self.dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        if self.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be float32 or float64, got {dtype}")
        self.max_episode_steps = int(self.time_limit if max_episode_steps is None else max_episode_steps)
        # Without auto-reset a finished env keeps stepping past its end (flags stay meaningful only
        # until then): for one-episode-per-env loops such as evaluation, which ignore finished envs.
        self.auto_reset = bool(auto_reset)
        # Stored [state_size, B] (one contiguous row per state variable): elementwise kernels on
        # strided columns of a [B, state_size] tensor were 2-4x slower per op on CPU.
        self.rows = torch.zeros(self.state_size, self.num_envs, dtype=self.dtype, device=self.device)
        self.elapsed = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)
        self.seeds = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)
        self.keys = seed_keys(self.seeds)
        self.episodes = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)
        self._needs_reset = True
        # A host sync is free on CPU, so there a step skips the hash when no env finished;
        # on an accelerator the hash always runs rather than waiting for the device.
        self.gate_resets = self.device.type == "cpu"

    # ---- what a subclass defines -------------------------------------------------------------
    @abstractmethod
    def initial_rows(self, keys: torch.Tensor, episodes: torch.Tensor) -> torch.Tensor:
        """Start states [state_size, B] of episode `episodes[b]` of the stream `keys[b]`."""

    @abstractmethod
    def physics(self, rows: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """rows [state_size, B], actions [B] -> (next rows, terminated [B])."""

    @abstractmethod
    def observation_of(self, rows: torch.Tensor) -> torch.Tensor:
        """[B, *observation_shape] float32 observations of states `rows`."""

    def __init_subclass__(cls, **kwargs) -> None:
        """An env must say what a step pays: refused when the class is made, not at its first step."""
        super().__init_subclass__(**kwargs)
        if cls.reward is TensorEnv.reward and cls.step_reward is TensorEnv.step_reward:
            raise TypeError(f"{cls.__name__} defines neither reward(terminated) nor step_reward(rows, actions, terminated)")

    def reward(self, terminated: torch.Tensor) -> torch.Tensor:
        """[B] float32 rewards of a step whose termination flags are `terminated`: the reward of envs
        whose reward depends on termination only (CartPole, Acrobot). Others define `step_reward`."""
        raise TypeError(f"{type(self).__name__} defines neither reward(terminated) nor step_reward(rows, actions, terminated)")

    def step_reward(self, rows: torch.Tensor, actions: torch.Tensor, terminated: torch.Tensor) -> torch.Tensor:
        """[B] float32 rewards of the step from states `rows` under `actions` that ended with `terminated`."""
        return self.reward(terminated)

    # ---- the shared machinery ----------------------------------------------------------------
    @property
    def state(self) -> torch.Tensor:
        """The physical state [B, state_size] in `dtype`."""
        return self.rows.t()

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
        return self.observation_of(self.rows)

    def keep_envs_(self, envs: torch.Tensor) -> None:
        """Keep only `envs` (indices, in that order), each with its state and its stream of start states."""
        envs = envs.to(self.device)
        self.rows = self.rows.index_select(1, envs)
        self.elapsed, self.seeds, self.keys, self.episodes = (
            t.index_select(0, envs) for t in (self.elapsed, self.seeds, self.keys, self.episodes)
        )
        self.num_envs = int(envs.numel())

    def step(self, actions: torch.Tensor) -> TensorStep:
        if self._needs_reset:
            raise RuntimeError("call reset(seeds) before step()")
        clock, out = self.transition(self.clock(), actions, self.gate_resets)
        self.set_clock(clock)
        return out

    def clock(self) -> TensorClock:
        """The state a step advances (`transition`'s input)."""
        return TensorClock(self.rows, self.elapsed, self.episodes, self.keys)

    def set_clock(self, clock: TensorClock) -> None:
        """Continue from `clock` (a `transition`'s output for this env's B rows)."""
        self.rows, self.elapsed, self.episodes = clock.rows, clock.elapsed, clock.episodes

    def transition(self, clock: TensorClock, actions: torch.Tensor, gate_resets: bool = False) -> tuple[TensorClock, TensorStep]:
        """One step of every row from `clock` under `actions`, with auto-reset: (the next clock, the step). A pure
        function of its tensors (this env's constants aside), so that torch.compile can fuse it into a caller's graph.

        `gate_resets`: skip the start-state hash when no row finished (a host sync: worth it eagerly on CPU); without it
        the step is branch-free, with the same results."""
        rows, terminated = self.physics(clock.rows, actions)
        reward = self.step_reward(clock.rows, actions, terminated)
        elapsed, episodes = clock.elapsed + 1, clock.episodes
        # The TimeLimit wrapper's rule: truncated once the limit is reached, even on a terminating step.
        truncated = elapsed >= self.max_episode_steps
        final_obs = self.observation_of(rows)
        done = terminated | truncated
        if self.auto_reset and (not gate_resets or bool(done.any())):
            episodes = episodes + done
            rows = torch.where(done, self.initial_rows(clock.keys, episodes), rows)
            elapsed = elapsed.masked_fill(done, 0)
            obs = self.observation_of(rows)
        else:
            obs = final_obs
        return TensorClock(rows, elapsed, episodes, clock.keys), TensorStep(obs, reward, terminated, truncated, final_obs, done)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Everything a resumed run needs to continue in distribution and bitwise: states, clocks, streams."""
        return {name: getattr(self, name).cpu().clone() for name in ("rows", "elapsed", "seeds", "episodes")}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        rows = state["rows"]
        if rows.shape[0] != self.state_size:
            raise ValueError(f"state_dict holds {rows.shape[0]} state variables; {self.env_id} has {self.state_size}")
        self.rows = rows.to(self.device, self.dtype)
        self.elapsed, self.seeds, self.episodes = (state[k].to(self.device, torch.int64) for k in ("elapsed", "seeds", "episodes"))
        self.keys = seed_keys(self.seeds)
        self.num_envs = int(rows.shape[1])
        self._needs_reset = False


@torch.no_grad()
def tensor_episode_returns(
    env_cls: type[TensorEnv],
    policy: Callable[[torch.Tensor], torch.Tensor],
    seeds: Sequence[int] | torch.Tensor,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str = torch.float64,
    max_episode_steps: int | None = None,
) -> torch.Tensor:
    """One episode of `env_cls` per seed, all side by side: [len(seeds)] undiscounted returns of `policy`.

    `policy` maps a [B, *obs_shape] float32 batch of observations to B actions. Envs that finished
    keep stepping (a batch does not shrink; no reset either) but stop counting, and the loop ends
    when all have finished.
    """
    seeds = torch.as_tensor(seeds, dtype=torch.int64)
    env = env_cls(seeds.numel(), device=device, dtype=dtype, max_episode_steps=max_episode_steps, auto_reset=False)
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

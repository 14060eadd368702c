"""K agents x E envs behind one interface: tensor-native envs, or any gymnasium id in one vector env.

`make_vector_env(env_cfg, seeds, envs_per_agent, device)` is what a K-agent task calls. Row i*E + e
is agent i's env e, seeded with `seeds[i] + (e << 32)`: with E = 1 agent i's env is seeded like the
single run of seed `seeds[i]`. Every backend answers `reset()` and `step(actions)` with float32 (or,
for Atari frames, uint8) tensors on `device` and auto-resets finished envs (`TensorStep`: `final_obs`
is where the action led, `obs` what the agent sees next).

- backend: tensor -- the env's dynamics as batched tensor ops (TensorCartPole, TensorAcrobot, TensorPendulum), all
  agents in a few kernels on any device. Start states come from a counter-based hash of (seed,
  episode), not from gymnasium's generator.
- backend: gym -- `pipeline.rl.envs.make_env` copies (Atari preprocessing, the env group's `imports` and
  `wrappers` included: each copy is wrapped as an evaluation or replay env is) in one gymnasium SyncVectorEnv with
  same-step auto-reset; each copy is reset with its seed once and then continues its own generator, exactly as the
  single-seed loop does.
- backend: envpool -- EnvPool's C++ pool (pipeline.rl.envpool_vector), same step result; start states
  from EnvPool's generator; a resume restarts every env.

`state_dict()` / `load_state_dict()` carry the envs across a resume: tensor envs and gymnasium's
classic-control and Atari envs continue exactly (pipeline.rl.gym_state); any other gymnasium env
restarts on a new episode from a seed derived from its own; `restarted` lists the rows the last
`load_state_dict` restarted ([] when all continue). `observation()` is what the agents see now.

`evaluate_agents` plays greedy episodes for K agents side by side on separate, separately seeded envs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from pipeline.rl.acrobot_tensor import TensorAcrobot
from pipeline.rl.cartpole_tensor import TensorCartPole
from pipeline.rl.envs import (
    CurrentObservation,
    EnvSettings,
    batch_to_tensor,
    discrete_size,
    env_threshold,
    make_env,
    play_episodes,
)
from pipeline.rl.gym_state import derived_seed, restore_env, snapshot_env
from pipeline.rl.pendulum_tensor import TensorPendulum
from pipeline.rl.tensor_env import TensorStep, tensor_episode_returns

TENSOR_ENVS: dict[str, type] = {"CartPole-v1": TensorCartPole, "Acrobot-v1": TensorAcrobot, "Pendulum-v1": TensorPendulum}

# Per-step reward bounds of envs whose every step is worth a fixed amount: an episode's return lies
# in [steps * low, steps * high] for at most `max_episode_steps` steps.
STEP_REWARD_BOUNDS = {
    "CartPole-v1": (0.0, 1.0), "Acrobot-v1": (-1.0, 0.0), "MountainCar-v0": (-1.0, 0.0),
    "Pendulum-v1": TensorPendulum.step_reward_bounds,
}


class VectorEnv(Protocol):
    num_envs: int
    observation_shape: tuple[int, ...]
    obs_dtype: torch.dtype
    action_space: gym.spaces.Space  # one env's
    n_actions: int | None  # a discrete space's size; None for a continuous one
    reward_threshold: float | None
    return_bounds: tuple[float, float] | None  # range of an episode's undiscounted return, when known
    restarted: list[int]  # rows the last load_state_dict started on a new episode; [] when all continued

    def reset(self) -> torch.Tensor: ...
    def observation(self) -> torch.Tensor: ...
    def step(self, actions: torch.Tensor) -> TensorStep: ...
    def keep_envs_(self, rows: torch.Tensor) -> None: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...
    def close(self) -> None: ...


def env_seeds(seeds: Sequence[int], envs_per_agent: int) -> list[int]:
    """Row i*E + e gets seeds[i] + (e << 32): an agent's first env has the agent's own seed."""
    return [int(s) + (e << 32) for s in seeds for e in range(envs_per_agent)]


def make_vector_env(env: dict, seeds: Sequence[int], envs_per_agent: int, device: str | torch.device = "cpu") -> VectorEnv:
    """K = len(seeds) agents x `envs_per_agent` envs of the `env` config group (`id`, `kwargs`, `imports`, `wrappers`,
    `backend`, `dtype`)."""
    if not seeds or envs_per_agent <= 0:
        raise ValueError(f"make_vector_env needs at least one seed and envs_per_agent >= 1; got {len(seeds)} seeds, E={envs_per_agent}")
    env_id, kwargs = env["id"], dict(env.get("kwargs") or {})
    backend = env.get("backend", "gym")
    rows = env_seeds(seeds, envs_per_agent)
    if backend != "gym" and EnvSettings.of(env).wrappers:
        raise ValueError(f"env.wrappers wrap gymnasium envs; env.backend={backend} builds its own: use env.backend=gym")
    if backend == "tensor":
        if env_id not in TENSOR_ENVS:
            raise ValueError(f"env.backend=tensor has no tensor form of {env_id}; tensor envs: {', '.join(TENSOR_ENVS)} (or env.backend=gym)")
        return TensorVectorEnv(TENSOR_ENVS[env_id], rows, device, env.get("dtype", "float64"), **kwargs)
    if backend == "gym":
        return GymVectorEnv(env, {}, rows, device)
    if backend == "envpool":
        from pipeline.rl.envpool_vector import EnvPoolVectorEnv

        return EnvPoolVectorEnv(env_id, kwargs, rows, device, step_reward_bounds=STEP_REWARD_BOUNDS.get(env_id))
    raise ValueError(f"env.backend={backend!r}; choose gym, tensor or envpool")


class TensorVectorEnv:
    """A tensor env (TensorCartPole, TensorAcrobot, TensorPendulum) seeded per row, behind the VectorEnv interface."""

    obs_dtype = torch.float32

    def __init__(self, env_cls: type, seeds: Sequence[int], device, dtype="float64", max_episode_steps: int | None = None, **kwargs):
        if kwargs:
            raise ValueError(f"tensor {env_cls.env_id} takes only env.kwargs.max_episode_steps; got {sorted(kwargs)} (use env.backend=gym)")
        limit = {} if max_episode_steps is None else {"max_episode_steps": int(max_episode_steps)}
        self.env = env_cls(len(seeds), device=device, dtype=dtype, **limit)
        self.seeds = torch.as_tensor(list(seeds), dtype=torch.int64)
        self.observation_shape = tuple(env_cls.observation_shape)
        self.action_space = env_cls.action_space
        self.n_actions = discrete_size(self.action_space)
        self.reward_threshold = env_cls.reward_threshold
        low, high = STEP_REWARD_BOUNDS[env_cls.env_id]
        self.return_bounds = (low * self.env.max_episode_steps, high * self.env.max_episode_steps)
        self.restarted: list[int] = []  # tensor envs always continue exactly

    @property
    def num_envs(self) -> int:
        return self.env.num_envs

    def reset(self) -> torch.Tensor:
        return self.env.reset(self.seeds)

    def step(self, actions: torch.Tensor) -> TensorStep:
        return self.env.step(actions)

    def keep_envs_(self, rows: torch.Tensor) -> None:
        self.env.keep_envs_(rows)
        self.seeds = self.seeds.index_select(0, rows.cpu())

    def observation(self) -> torch.Tensor:
        return self.env.observation()

    def state_dict(self) -> dict:
        return self.env.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.env.load_state_dict(state)
        self.seeds = self.env.seeds.cpu()

    def close(self) -> None:
        pass


class GymVectorEnv(CurrentObservation):
    """`make_env` copies, one per row, stepped by one gymnasium SyncVectorEnv with same-step auto-reset.

    One env alone (K * E = 1, the single-seed job's hot loop) is stepped directly instead. Measured on
    CartPole, one CPU thread, shared machine (so ratios): SyncVectorEnv over one env ran at 0.45x the
    speed of this direct path (12k vs 23-28k steps/s); the direct path runs at 0.45-0.5x a bare
    `env.step` loop (46-64k steps/s), the difference being the five small tensors a step returns.
    At 16 envs SyncVectorEnv runs at 0.7x a bare loop over the envs (32-36k vs 49k steps/s).
    """

    def __init__(self, env: str | dict | EnvSettings, kwargs: dict, seeds: Sequence[int], device):
        """`env`: an id or the env group (as `make_env` takes it); `kwargs` on top of its kwargs."""
        self.settings = EnvSettings.of(env, **kwargs)
        env_id = self.env_id = self.settings.id
        self.kwargs, self.device = self.settings.kwargs, torch.device(device)
        self.seeds = [int(s) for s in seeds]
        self.envs = [make_env(self.settings) for _ in self.seeds]
        space, actions = self.envs[0].observation_space, self.envs[0].action_space
        if not isinstance(actions, gym.spaces.Discrete | gym.spaces.Box):
            raise ValueError(f"a vector env takes a Discrete or Box action space; {env_id} has {actions}")
        self.observation_shape = tuple(space.shape)
        self.np_dtype = np.uint8 if space.dtype == np.uint8 else np.float32
        self.obs_dtype = torch.uint8 if self.np_dtype == np.uint8 else torch.float32
        self.action_space = actions
        self.n_actions = discrete_size(actions)
        self.reward_threshold = env_threshold(self.settings)
        self.return_bounds = _gym_return_bounds(env_id, self.envs[0])
        self.episodes = np.zeros(len(self.envs), dtype=np.int64)
        self.restarted: list[int] = []
        self._vector = self._batch(self.envs)
        self._current: torch.Tensor | None = None  # set by reset / step / load_state_dict
        # A bare function on CPU: this runs five times per step of the single-seed loop.
        self._tensor = torch.from_numpy if self.device.type == "cpu" else lambda a: torch.from_numpy(a).to(self.device)

    @property
    def num_envs(self) -> int:
        return len(self.envs)

    @staticmethod
    def _batch(envs: list[gym.Env]) -> gym.vector.SyncVectorEnv | None:
        if len(envs) == 1:
            return None
        return gym.vector.SyncVectorEnv(
            [lambda env=env: env for env in envs], copy=False, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
        )

    def _obs(self, obs) -> torch.Tensor:
        # astype copies: the vector env reuses its observation buffer.
        return self._tensor(np.asarray(obs).astype(self.np_dtype))

    def _obs_row(self, obs) -> torch.Tensor:
        """One env's observation as a batch of one (a copy: an env may reuse its array)."""
        return self._tensor(np.array(obs, dtype=self.np_dtype)[None])

    def reset(self) -> torch.Tensor:
        self.episodes[:] = 0
        self._current = self._obs(np.stack([env.reset(seed=seed)[0] for env, seed in zip(self.envs, self.seeds)]))
        return self._current

    def set_position(self, obs: torch.Tensor, finished_episodes: int) -> None:
        """For a caller that stepped the single env itself (DQN's one-env fast path): where it is now."""
        self._current = obs
        self.episodes[0] += int(finished_episodes)

    def step(self, actions: torch.Tensor) -> TensorStep:
        if self._vector is None:
            return self._step_one(actions.item() if self.n_actions is not None else actions.reshape(-1).cpu().numpy())
        obs, rewards, terminated, truncated, infos = self._vector.step(actions.cpu().numpy())
        self._current = final_t = self._obs(obs)
        if "_final_obs" in infos:
            ended = infos["_final_obs"]
            final = np.array(obs)
            final[ended] = np.stack(infos["final_obs"][ended])
            final_t = self._obs(final)
        done = terminated | truncated
        self.episodes += done
        return TensorStep(
            self._current, self._tensor(rewards.astype(np.float32)), self._tensor(terminated),
            self._tensor(truncated), final_t, self._tensor(done),
        )

    def _step_one(self, action: int | np.ndarray) -> TensorStep:
        # torch.from_numpy over small numpy arrays: torch.tensor([...]) costs 4-6 us a call here.
        env = self.envs[0]
        final, reward, terminated, truncated, _ = env.step(action)
        done = terminated or truncated
        final_t = self._obs_row(final)
        obs_t = self._obs_row(env.reset()[0]) if done else final_t
        self.episodes[0] += done
        self._current = obs_t
        tensor = self._tensor
        return TensorStep(
            obs_t, tensor(np.array([reward], dtype=np.float32)), tensor(np.array([terminated])), tensor(np.array([truncated])),
            final_t, tensor(np.array([done])),
        )

    def keep_envs_(self, rows: torch.Tensor) -> None:
        current = self._started("keep_envs_()")
        keep = [int(r) for r in rows.tolist()]
        for i in set(range(len(self.envs))) - set(keep):
            self.envs[i].close()
        self.envs = [self.envs[i] for i in keep]
        self.seeds = [self.seeds[i] for i in keep]
        self.episodes = self.episodes[keep]
        self._current = current.index_select(0, rows.to(current.device))
        self._vector = self._batch(self.envs)

    def state_dict(self) -> dict:
        """Every env mid-episode (see pipeline.rl.gym_state), loadable with torch.load(weights_only=True)."""
        return {
            "env_id": self.env_id,
            "seeds": torch.tensor(self.seeds, dtype=torch.int64),
            "episodes": torch.from_numpy(self.episodes.copy()),
            "obs": self._started("state_dict()").cpu().clone(),
            "envs": [snapshot_env(env) for env in self.envs],
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue where `state_dict` was taken: exactly for classic control and Atari envs. Any other
        env starts a new episode from `derived_seed(its seed, its next episode)`; `self.restarted`
        lists those rows."""
        if state["env_id"] != self.env_id or len(state["envs"]) != self.num_envs:
            raise ValueError(
                f"env state of {len(state['envs'])} x {state['env_id']} cannot load into {self.num_envs} x {self.env_id}; "
                "build the vector env with the same env and seeds first"
            )
        self.seeds = [int(s) for s in state["seeds"].tolist()]
        self.episodes = state["episodes"].numpy().copy()
        obs = state["obs"].numpy().copy()
        self.restarted = []
        for i, (env, saved) in enumerate(zip(self.envs, state["envs"])):
            if not restore_env(env, saved, obs[i]):
                self.episodes[i] += 1
                obs[i] = env.reset(seed=derived_seed(self.seeds[i], int(self.episodes[i])))[0]
                self.restarted.append(i)
        self._current = self._obs(obs)

    def close(self) -> None:
        for env in self.envs:
            env.close()


def _gym_return_bounds(env_id: str, env: gym.Env) -> tuple[float, float] | None:
    steps = env.spec.max_episode_steps if env.spec is not None else None
    if env_id not in STEP_REWARD_BOUNDS or steps is None:
        return None
    low, high = STEP_REWARD_BOUNDS[env_id]
    return (low * steps, high * steps)


def evaluate_agents(
    policy: Callable[[torch.Tensor], torch.Tensor],
    env: dict,
    agent_seeds: Sequence[int],
    n_episodes: int,
    seed_offset: int,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """[K, n_episodes] undiscounted returns (float64, CPU) of `policy`'s greedy play for K agents.

    `policy` maps observations [K, n_episodes, *obs_shape] to actions [K, n_episodes] (or
    [K, n_episodes, *action_shape] for continuous ones; one batched call per step; finished episodes are fed their last observation and their actions ignored).
    Agent i's episode j starts from seed `agent_seeds[i] + seed_offset + j` on its own env, apart
    from training. Atari plays whole games with unclipped rewards. An `nn.Module` policy runs in
    eval() mode under inference_mode and is put back in its mode.
    """
    K, n = len(agent_seeds), int(n_episodes)
    seeds = [int(s) + int(seed_offset) + j for s in agent_seeds for j in range(n)]
    was_training = isinstance(policy, nn.Module) and policy.training
    if isinstance(policy, nn.Module):
        policy.eval()
    try:
        with torch.inference_mode():
            if env.get("backend", "gym") == "tensor":
                returns = _tensor_returns(policy, env, seeds, K, n, device)
            else:
                returns = _gym_returns(policy, env, seeds, K, n, device)
    finally:
        if was_training:
            policy.train()
    return returns.view(K, n)


def _tensor_returns(policy, env: dict, seeds: list[int], K: int, n: int, device) -> torch.Tensor:
    env_id = env["id"]
    if env_id not in TENSOR_ENVS:
        raise ValueError(f"env.backend=tensor has no tensor form of {env_id}; tensor envs: {', '.join(TENSOR_ENVS)} (or env.backend=gym)")
    env_cls = TENSOR_ENVS[env_id]
    limit = (env.get("kwargs") or {}).get("max_episode_steps")

    def flat_policy(obs: torch.Tensor) -> torch.Tensor:
        actions = policy(obs.view(K, n, *obs.shape[1:]))
        return actions.reshape(K * n, *actions.shape[2:])

    returns = tensor_episode_returns(env_cls, flat_policy, seeds, device, env.get("dtype", "float64"), limit)
    return returns.to("cpu", torch.float64)


def _gym_returns(policy, env: dict, seeds: list[int], K: int, n: int, device) -> torch.Tensor:
    def actions_for(obs: np.ndarray, alive: np.ndarray) -> np.ndarray:
        batch = batch_to_tensor(obs, device)
        actions = policy(batch.view(K, n, *batch.shape[1:]))
        return actions.reshape(K * n, *actions.shape[2:]).cpu().numpy()[alive]

    return torch.from_numpy(play_episodes(env, None, seeds, actions_for))

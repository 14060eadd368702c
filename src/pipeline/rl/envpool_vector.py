"""K agents x E envs of a gymnasium id stepped by EnvPool (C++ envs, one thread pool), behind the VectorEnv interface.

`env.backend=envpool` covers the ids EnvPool ships (classic control such as CartPole-v1, Atari as
`ALE/<Game>-v5`, MuJoCo such as HalfCheetah-v5) with the gymnasium path's semantics
(pipeline.rl.vector.GymVectorEnv):

- Same-step auto-reset: EnvPool resets a finished env on the NEXT step (that step ignores the action
  and returns the new episode's first observation); here finished envs are reset right away, so a
  step answers `final_obs` (where the action led: a truncated step's bootstrap state) and `obs` (the
  next episode's first observation), as `TensorStep` does on every backend.
- terminated / truncated as gymnasium's, except a step that ends the episode exactly at the time
  limit: gymnasium's TimeLimit says terminated and truncated, EnvPool truncated only.
- Seeding: row i*E + e gets the gym path's seed `seeds[i] + (e << 32)`; EnvPool takes int32 seeds, so a
  seed outside [0, 2^31) is folded into it by numpy's SeedSequence (an agent's first env keeps its
  own seed). EnvPool draws start states (and Atari no-ops) from its own C++ generator, so an env
  seeded s does not start where gymnasium's env seeded s does; the dynamics, rewards and
  preprocessing are the same (tests/rl/test_envpool_vector.py steps both from the same states).
- Atari: the project's preprocessing options map onto EnvPool's (frame_skip, screen_size, noop_max,
  frame_stack, clip_rewards; sticky actions 0.25 and 108,000 frames per game as ALE v5; no fire
  reset). Frames, rewards and ends match gymnasium's frame for frame, except the observation of a
  game-over step (gymnasium keeps the frames from before the last one, EnvPool shows it).
  terminal_on_life_loss is refused (gymnasium restarts the game at a lost life, EnvPool only the
  life), and so is noop_max=0 (EnvPool 1.2.5 crashes on it).
- Dropped agents (`keep_envs_`): EnvPool cannot remove envs, so their envs keep stepping with a fixed
  action and their results are discarded.
- Resume: EnvPool cannot snapshot its envs. `load_state_dict` builds a fresh pool whose every env
  starts a new episode from `derived_seed(its seed, its next episode)`, the gym path's rule for envs
  it cannot restore; `restarted` lists every row.

Evaluation (`evaluate_agents`) plays on gymnasium's own envs whatever the training backend.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch

from pipeline.rl.envs import (
    CurrentObservation,
    discrete_size,
    env_threshold,
    envpool_module,
    envpool_task,
    is_atari,
)
from pipeline.rl.gym_state import derived_seed
from pipeline.rl.tensor_env import TensorStep


def pool_seed(seed: int) -> int:
    """An int32 seed for EnvPool: `seed` itself when it is in [0, 2^31), else 31 bits of SeedSequence(seed)."""
    seed = int(seed)
    if 0 <= seed < 2**31:
        return seed
    return int(np.random.SeedSequence(seed).generate_state(1, np.uint32)[0]) >> 1


class EnvPoolVectorEnv(CurrentObservation):
    """One EnvPool of K * E envs (row i*E + e seeded from `seeds[i*E + e]`), stepped synchronously."""

    def __init__(
        self, env_id: str, kwargs: dict, seeds: Sequence[int], device, num_threads: int | None = None,
        step_reward_bounds: tuple[float, float] | None = None,
    ):
        """`step_reward_bounds`: one step's reward range when every step's is bounded (pipeline.rl.vector's
        STEP_REWARD_BOUNDS); with the time limit it gives `return_bounds`."""
        self.env_id, self.kwargs, self.device = env_id, dict(kwargs), torch.device(device)
        self.task, self.config = envpool_task(env_id, self.kwargs)
        self.num_threads = num_threads
        self.seeds = [int(s) for s in seeds]
        self.pool = self._make_pool(self.seeds)
        self.action_space = self.pool.action_space
        if not isinstance(self.action_space, gym.spaces.Discrete | gym.spaces.Box):
            raise ValueError(f"a vector env takes a Discrete or Box action space; {env_id} has {self.action_space}")
        if isinstance(self.action_space, gym.spaces.Box):  # EnvPool's MuJoCo bounds are float64, gymnasium's float32
            low, high = self.action_space.low, self.action_space.high
            self.action_space = gym.spaces.Box(low.astype(np.float32), high.astype(np.float32), dtype=np.float32)
        self.n_actions = discrete_size(self.action_space)
        self.observation_shape = tuple(self.pool.observation_space.shape)
        # uint8 frames stay uint8 (the network scales them), everything else becomes float32, as on the gym path.
        frames = self.pool.observation_space.dtype == np.uint8
        self.np_dtype, self.obs_dtype = (np.uint8, torch.uint8) if frames else (np.float32, torch.float32)
        self.reward_threshold = None if is_atari(env_id) else env_threshold(env_id)
        steps = self.pool.config.get("max_episode_steps")
        bounds = step_reward_bounds
        self.return_bounds = None if bounds is None or steps is None else (bounds[0] * steps, bounds[1] * steps)
        self.episodes = np.zeros(len(self.seeds), dtype=np.int64)
        self.restarted: list[int] = []
        self._current: torch.Tensor | None = None

    def _make_pool(self, seeds: list[int]):
        envpool = envpool_module()
        threads = self.num_threads or min(len(seeds), torch.get_num_threads())
        with warnings.catch_warnings():  # EnvPool's float64 space bounds cast to float32 by gymnasium's Box
            warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32", category=UserWarning)
            pool = envpool.make(
                self.task, env_type="gymnasium", num_envs=len(seeds), batch_size=len(seeds), num_threads=threads,
                seed=[pool_seed(s) for s in seeds], **self.config,
            )
            pool.observation_space, pool.action_space  # noqa: B018 (built lazily: build them under the filter)
        self.rows = np.arange(len(seeds))  # the pool's envs that are still rows here, in row order
        self._pool_size = len(seeds)  # EnvPool's num_envs property costs a dict lookup through Python
        act = pool.action_space
        self._actions = np.zeros((len(seeds), *act.shape), dtype=np.int32 if isinstance(act, gym.spaces.Discrete) else act.dtype)
        return pool

    @property
    def num_envs(self) -> int:
        return len(self.rows)

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        tensor = torch.from_numpy(np.ascontiguousarray(array))
        return tensor if self.device.type == "cpu" else tensor.to(self.device)

    def _obs(self, obs: np.ndarray) -> torch.Tensor:
        return self._tensor(obs.astype(self.np_dtype, copy=False))

    @staticmethod
    def _by_env(values: np.ndarray, env_ids: np.ndarray, n: int) -> np.ndarray:
        """EnvPool's outputs in env order (a synchronous pool answers in order; this checks it)."""
        if len(env_ids) == n and (env_ids == np.arange(n)).all():
            return values
        ordered = np.empty((n, *values.shape[1:]), dtype=values.dtype)
        ordered[env_ids] = values
        return ordered

    def reset(self) -> torch.Tensor:
        if len(self.rows) != self.pool.num_envs:
            self.pool.close()
            self.pool = self._make_pool(self.seeds)
        self.episodes[:] = 0
        self.restarted = []
        obs, info = self.pool.reset()
        self._current = self._obs(self._by_env(obs, info["env_id"], self.pool.num_envs))
        return self._current

    def _row_order(self, env_ids: np.ndarray) -> np.ndarray | None:
        """The index that puts EnvPool's answer in row order; None when it already is (all envs kept, answered in order)."""
        if len(self.rows) == self._pool_size and (env_ids == self.rows).all():
            return None
        position = np.empty(self._pool_size, dtype=np.int64)
        position[env_ids] = np.arange(len(env_ids))
        return position[self.rows]

    def step(self, actions: torch.Tensor) -> TensorStep:
        self._started("step()")
        chosen = actions.detach().cpu().numpy().reshape(len(self.rows), *self._actions.shape[1:])
        if len(self.rows) == self._pool_size:
            self._actions[:] = chosen
        else:
            self._actions[self.rows] = chosen
        obs, reward, terminated, truncated, info = self.pool.step(self._actions)
        order = self._row_order(info["env_id"])
        if order is not None:
            obs, reward, terminated, truncated = obs[order], reward[order], terminated[order], truncated[order]
        final = obs.astype(self.np_dtype, copy=False)  # EnvPool answers each call in new arrays
        done = terminated | truncated
        final_t = self._obs(final)
        if done.any():
            # Same-step auto-reset: start the finished envs' next episodes now (EnvPool would on the next step).
            ended = np.flatnonzero(done)
            first, reset_info = self.pool.reset(self.rows[ended].astype(np.int32))
            position = {int(env): i for i, env in enumerate(self.rows[ended])}
            nxt = final.copy()
            nxt[ended[[position[int(env)] for env in reset_info["env_id"]]]] = first
            self._current = self._obs(nxt)
            self.episodes += done
        else:
            self._current = final_t
        return TensorStep(
            self._current, self._tensor(reward.astype(np.float32, copy=False)), self._tensor(terminated),
            self._tensor(truncated), final_t, self._tensor(done),
        )

    def keep_envs_(self, rows: torch.Tensor) -> None:
        current = self._started("keep_envs_()")
        keep = [int(r) for r in rows.tolist()]
        self.rows = self.rows[keep]
        self.seeds = [self.seeds[i] for i in keep]
        self.episodes = self.episodes[keep]
        self._current = current.index_select(0, rows.to(current.device))

    def state_dict(self) -> dict:
        """Seeds, episode counts and observations: EnvPool has no state API, so its envs' inner state is not saved."""
        return {
            "env_id": self.env_id,
            "backend": "envpool",
            "seeds": torch.tensor(self.seeds, dtype=torch.int64),
            "episodes": torch.from_numpy(self.episodes.copy()),
            "obs": self._started("state_dict()").cpu().clone(),
        }

    def load_state_dict(self, state: dict) -> None:
        """A fresh pool, every env on a new episode from `derived_seed(its seed, its next episode)`: `restarted` lists all rows."""
        if state["env_id"] != self.env_id or len(state["seeds"]) != self.num_envs:
            raise ValueError(
                f"env state of {len(state['seeds'])} x {state['env_id']} cannot load into {self.num_envs} x {self.env_id}; "
                "build the vector env with the same env and seeds first"
            )
        self.seeds = [int(s) for s in state["seeds"].tolist()]
        self.episodes = state["episodes"].numpy().copy() + 1
        self.pool.close()
        self.pool = self._make_pool([derived_seed(s, int(e)) for s, e in zip(self.seeds, self.episodes)])
        obs, info = self.pool.reset()
        self._current = self._obs(self._by_env(obs, info["env_id"], self.pool.num_envs))
        self.restarted = list(range(self.num_envs))

    def close(self) -> None:
        self.pool.close()

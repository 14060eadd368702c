"""Environment construction, the float32 boundary, and greedy evaluation.

Importing this module loads gymnasium and numpy, not torch: the start-up checks (pipeline.config.env_ids) call
`check_env_installed` and `envpool_task` before torch loads. The functions that make tensors import it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np

if TYPE_CHECKING:
    import torch


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

    quiet_ale(ale_py)
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


class CurrentObservation:
    """`observation()` of a vector env that keeps what its agents see in `_current` (None before reset)."""

    env_id: str
    _current: torch.Tensor | None

    def observation(self) -> torch.Tensor:
        """What the agents see now (after reset, a step or load_state_dict)."""
        return self._started("observation()")

    def _started(self, what: str) -> torch.Tensor:
        if self._current is None:
            raise RuntimeError(f"{self.env_id} vector env: {what} before reset(); call reset() (or load_state_dict) first")
        return self._current


def discrete_size(space: gym.spaces.Space) -> int | None:
    """The number of actions of a Discrete space; None for any other (a Box: continuous actions)."""
    return int(space.n) if isinstance(space, gym.spaces.Discrete) else None


def is_atari(env_id: str) -> bool:
    return env_id.startswith("ALE/")


MUJOCO_INSTALL = 'pip install "mujoco==3.17.0" (or the project\'s extra: pip install -e ".[mujoco]")'


def needs_mujoco(env_id: str) -> bool:
    """Whether gymnasium builds `env_id` on MuJoCo (HalfCheetah-v5, Hopper-v5, Walker2d-v5, ...)."""
    try:
        entry = gym.spec(env_id).entry_point
    except gym.error.Error:
        return False
    return isinstance(entry, str) and entry.startswith("gymnasium.envs.mujoco")


def mujoco_available() -> bool:
    try:
        import mujoco  # noqa: F401
    except ImportError:
        return False
    return True


ENVPOOL_INSTALL = 'pip install "envpool==1.2.5" (or the project\'s extra: pip install -e ".[envpool]")'

# The project's Atari options (make_atari_env) as EnvPool's config keys.
_ATARI_KEYS = {
    "frame_skip": "frame_skip", "noop_max": "noop_max", "frame_stack": "stack_num", "clip_rewards": "reward_clip",
    "repeat_action_probability": "repeat_action_probability", "full_action_space": "full_action_space",
}
_ALE_V5_FRAMES = 108_000  # ALE v5's max_num_frames_per_episode


def envpool_module():
    """The envpool package, or a one-line refusal with the install command."""
    try:
        import envpool
    except ImportError:
        raise ValueError(f"env.backend=envpool needs envpool, which is not installed: {ENVPOOL_INSTALL}") from None
    return envpool


def envpool_task(env_id: str, kwargs: dict) -> tuple[str, dict]:
    """EnvPool's task id and config for gymnasium id `env_id` with the project's env kwargs; refuses what it cannot map
    (pipeline.rl.envpool_vector builds the pool from them)."""
    envpool = envpool_module()
    kwargs = dict(kwargs)
    if is_atari(env_id):
        task = env_id.removeprefix("ALE/")
        if kwargs.pop("terminal_on_life_loss", False):
            raise ValueError(
                "env.backend=envpool: terminal_on_life_loss=true restarts the game at a lost life on the gym path but only "
                "the life in EnvPool; use env.backend=gym or env.kwargs.terminal_on_life_loss=false"
            )
        if int(kwargs.get("noop_max", 30)) < 1:
            raise ValueError("env.backend=envpool: EnvPool 1.2.5 crashes (segfault) with noop_max=0; use env.kwargs.noop_max >= 1 or env.backend=gym")
        config = {"use_fire_reset": False, "reward_clip": True, "repeat_action_probability": 0.25}
        if "screen_size" in kwargs:
            config["img_height"] = config["img_width"] = int(kwargs.pop("screen_size"))
        frames = int(kwargs.pop("max_num_frames_per_episode", _ALE_V5_FRAMES))
        config.update({_ATARI_KEYS[k]: kwargs.pop(k) for k in list(kwargs) if k in _ATARI_KEYS})
        config["max_episode_steps"] = frames // int(config.get("frame_skip", 4))
    else:
        task, config = env_id, {}
    if task not in envpool.list_all_envs():
        raise ValueError(f"EnvPool {envpool.__version__} has no {env_id}; see envpool.list_all_envs() (or env.backend=gym)")
    known = envpool.make_spec(task).config._asdict()
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        raise ValueError(f"env.backend=envpool: {env_id} takes no env.kwargs {unknown} in EnvPool (use env.backend=gym)")
    config.update(kwargs)
    return task, config


def check_env_installed(env_id: str) -> None:
    """Refuse, in one line with the install command, an env whose simulator is not installed. MuJoCo's own warnings
    go to this module's logger (DEBUG) instead of a MUJOCO_LOG.TXT in the working directory and stderr."""
    if not needs_mujoco(env_id):
        return
    if not mujoco_available():
        raise ValueError(f"env {env_id} needs MuJoCo, which is not installed: {MUJOCO_INSTALL}")
    import mujoco

    mujoco.set_mju_user_warning(_log_mujoco_warning)


def _log_mujoco_warning(message: str) -> None:
    logging.getLogger(__name__).debug("MuJoCo: %s", message.strip())


def make_env(env_id: str, seed: int | None = None, **kwargs) -> gym.Env:
    """`gymnasium.make` plus episode statistics, seeded when `seed` is given.

    `ALE/...` ids get the Atari preprocessing of `make_atari_env` (its options pass through `kwargs`);
    RecordEpisodeStatistics sits outside it, so its returns are the clipped training rewards.

    Seeding resets the env once with `seed` and seeds its action space, so
    later `reset()` calls without a seed continue a reproducible stream and
    `action_space.sample()` (random exploration) is reproducible too.
    """
    check_env_installed(env_id)
    base = make_atari_env(env_id, **kwargs) if is_atari(env_id) else gym.make(env_id, **kwargs)
    env = gym.wrappers.RecordEpisodeStatistics(base)
    if seed is not None:
        env.reset(seed=int(seed))
        env.action_space.seed(int(seed))
        env.observation_space.seed(int(seed))
    return env


def obs_to_tensor(obs, device: str | torch.device = "cpu") -> torch.Tensor:
    """Convert an env observation to float32 once, here, so nothing downstream sees float64."""
    import torch

    if isinstance(obs, torch.Tensor):
        return obs.to(device=device, dtype=torch.float32)
    return torch.as_tensor(np.asarray(obs, dtype=np.float32), device=device)


def env_threshold(env_id: str) -> float | None:
    """The env's registered `reward_threshold` (475 for CartPole-v1), or None."""
    threshold = gym.spec(env_id).reward_threshold
    return None if threshold is None else float(threshold)


def batch_to_tensor(stacked: np.ndarray, device: str | torch.device = "cpu") -> torch.Tensor:
    """A stacked batch of observations as a tensor: uint8 frames stay uint8 (the network scales them), the rest float32."""
    import torch

    if stacked.dtype == np.uint8:
        return torch.from_numpy(np.ascontiguousarray(stacked)).to(device)
    return obs_to_tensor(stacked, device)


def play_episodes(
    env_id: str, env_kwargs: dict | None, seeds: list[int], actions_for: Callable[[np.ndarray, np.ndarray], list]
) -> np.ndarray:
    """One episode per seed, each on its own `make_env` env reset with that seed, all side by side.

    `actions_for(obs, alive)` gets the stacked observations of every episode (finished ones frozen at
    their last) and the indices of the running ones, and returns those episodes' actions. Atari plays
    whole games with unclipped rewards, as players score them. Returns the undiscounted returns.
    """
    import torch

    env_kwargs = dict(env_kwargs or {})
    if is_atari(env_id):
        env_kwargs.update(clip_rewards=False, terminal_on_life_loss=False)
    envs = [make_env(env_id, **env_kwargs) for _ in seeds]
    returns = np.zeros(len(envs))
    try:
        obs = np.stack([env.reset(seed=int(seed))[0] for env, seed in zip(envs, seeds)])
        alive = np.arange(len(envs))
        with torch.inference_mode():
            while alive.size:
                still_alive = []
                for i, action in zip(alive.tolist(), actions_for(obs, alive)):
                    obs[i], reward, terminated, truncated, _ = envs[i].step(action)
                    returns[i] += float(reward)
                    if not (terminated or truncated):
                        still_alive.append(i)
                alive = np.array(still_alive, dtype=np.int64)
    finally:
        for env in envs:
            env.close()
    return returns


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
    from torch import nn

    was_training = isinstance(policy, nn.Module) and policy.training
    if isinstance(policy, nn.Module):
        policy.eval()

    def actions_for(obs: np.ndarray, alive: np.ndarray) -> list:
        return _to_env_actions(policy(batch_to_tensor(obs[alive], device)), len(alive))

    try:
        return play_episodes(env_id, env_kwargs, [int(seed) + i for i in range(n_episodes)], actions_for).tolist()
    finally:
        if was_training:
            policy.train()


def _to_env_actions(actions, n: int) -> list:
    import torch

    if isinstance(actions, torch.Tensor):
        actions = actions.detach().cpu()
        if actions.dim() <= 1:
            return actions.reshape(n).tolist()
        return list(actions.numpy())
    return list(actions)


def quiet_ale(ale_py) -> None:
    """ALE prints a banner ("A.L.E: Arcade Learning Environment ... [Powered by Stella]") for every emulator it
    starts; errors still print. Call right after `import ale_py`."""
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)

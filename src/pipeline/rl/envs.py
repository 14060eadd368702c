"""Environment construction, the float32 boundary, and greedy evaluation.

Every env of a run is built by `make_env` from the run's `env` config group (`EnvSettings`): the modules named in
`env.imports` and the `module:` prefix of `env.id` (gymnasium's own form, `my_pkg.envs:Corridor-v0`) are imported
first, so an env a user's module registers is found in every process (training, evaluation envs, sweep jobs,
`python -m pipeline.eval`, `pipeline.load`, export); `env.kwargs` go to `gymnasium.make`; `env.wrappers` wrap it in
their order. Video frames of a MuJoCo env on a machine without a display render through EGL or OSMesa
(`headless_gl`).

Importing this module loads gymnasium and numpy, not torch: the start-up checks (pipeline.config.env_ids) call
`check_env_installed`, `envpool_task`, `import_env_modules` and `wrapper_entries` before torch loads. The functions
that make tensors import it.
"""

from __future__ import annotations

import ctypes.util
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


class EnvError(ValueError):
    """A problem with the env config the user fixes (a module that cannot be imported, an id nothing registers, a
    wrapper that cannot be found or applied): one line naming the key and the fix."""


@dataclass(frozen=True)
class EnvSettings:
    """The `env` config group as every env of a run is built from it (`EnvSettings.of(cfg_env)`).

    `id` is a gymnasium id, or `module:Id` (gymnasium imports `module` first); `imports` are modules imported before
    the id is looked up (each registers envs when imported); `kwargs` go to `gymnasium.make`; `wrappers` wrap the env
    in their order, each a class (or function of the env) by its dotted path, a name in `gymnasium.wrappers`, or
    `{"_target_": path, **its keyword arguments}`.
    """

    id: str
    kwargs: dict = field(default_factory=dict)
    imports: tuple[str, ...] = ()
    wrappers: tuple = ()

    @classmethod
    def of(cls, env: str | Mapping | EnvSettings, **kwargs) -> EnvSettings:
        """From an id or the env group (a dict: `id`, `kwargs`, `imports`, `wrappers`); `kwargs` update its kwargs."""
        if isinstance(env, EnvSettings):
            return cls(env.id, {**env.kwargs, **kwargs}, env.imports, env.wrappers)
        if isinstance(env, str):
            return cls(env, dict(kwargs))
        imports = env.get("imports") or ()
        wrappers = env.get("wrappers") or ()
        return cls(str(env["id"]), {**dict(env.get("kwargs") or {}), **kwargs},
                   (str(imports),) if isinstance(imports, str) else tuple(str(m) for m in imports),
                   (wrappers,) if isinstance(wrappers, str | Mapping) else tuple(wrappers))

    @property
    def registered_id(self) -> str:
        """The id as gymnasium's registry holds it (without the `module:` prefix)."""
        return self.id.rpartition(":")[2]

    @property
    def modules(self) -> list[str]:
        """What is imported before the id is looked up: `imports`, then the id's `module:` prefix."""
        prefix = self.id.rpartition(":")[0]
        return [*self.imports, *([prefix] if prefix else [])]

    @property
    def custom(self) -> bool:
        """Whether the env needs more than gymnasium's make of a registered id (modules to import, wrappers)."""
        return bool(self.modules or self.wrappers)


def import_module_for(name: str, key: str):
    """`importlib.import_module(name)`, or one line (EnvError) naming `key` (the config key that names it), what went
    wrong and the fix."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(f"{exc.name}.")):
            raise EnvError(f"{key}: no module named {name!r} here; run from the folder that holds it, or add that folder "
                           "to PYTHONPATH") from None
        raise EnvError(f"{key}: importing {name} failed: {_where(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - the user's module raised: one line with where, not a traceback
        raise EnvError(f"{key}: importing {name} failed: {_where(exc)}") from None


def _where(exc: BaseException) -> str:
    """`Type: message (file:line)` of an exception, the line where it was raised."""
    text = (str(exc).strip().splitlines() or [""])[0]
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]  # the user's code
    at = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {text}{at}"


def import_env_modules(env: str | Mapping | EnvSettings) -> EnvSettings:
    """Import the modules that register the env (`env.imports`, the id's `module:` prefix); Python imports each once
    per process. Returns the settings."""
    settings = EnvSettings.of(env)
    for name in settings.imports:
        import_module_for(name, f"env.imports: {name}")
    prefix = settings.id.rpartition(":")[0]
    if prefix:
        import_module_for(prefix, f"env.id={settings.id}")
    return settings


def unregistered_hint(settings: EnvSettings) -> str:
    """What to do about an id nothing registered, by what the settings already import."""
    if settings.modules:
        return f"importing {', '.join(settings.modules)} registered no {settings.registered_id}"
    return (f"if a module of yours registers it, name the module: env.id=<module>:{settings.id} or "
            "env.imports=[<module>]")


def check_registered(settings: EnvSettings) -> None:
    """After `import_env_modules`: an id gymnasium does not know is one line (EnvError) saying what to import."""
    if is_atari(settings.registered_id) or settings.registered_id in gym.registry:
        return
    raise EnvError(f"env.id={settings.id} is not a registered gymnasium environment; {unregistered_hint(settings)}")


@dataclass(frozen=True)
class WrapperEntry:
    label: str  # `env.wrappers[i]=<path>`, for messages
    wrap: Callable[..., gym.Env]
    kwargs: dict


def wrapper_entries(env: str | Mapping | EnvSettings) -> list[WrapperEntry]:
    """`env.wrappers` resolved (their modules imported), in order; a bad entry is one line (EnvError)."""
    entries = []
    for i, entry in enumerate(EnvSettings.of(env).wrappers):
        if isinstance(entry, Mapping):
            kwargs = {str(k): v for k, v in entry.items() if k != "_target_"}
            path = entry.get("_target_")
        else:
            kwargs, path = {}, entry
        if not isinstance(path, str) or not path:
            raise EnvError(f"env.wrappers[{i}]={entry!r}: expected a class's dotted path or {{_target_: <path>, <keyword>: "
                           "<value>, ...}; e.g. env.wrappers=[gymnasium.wrappers.ClipAction]")
        label = f"env.wrappers[{i}]={path}"
        module, attr = (path.split(":", 1) if ":" in path else
                        path.rsplit(".", 1) if "." in path else ("gymnasium.wrappers", path))
        found = import_module_for(module, label)
        for part in attr.split("."):
            found = getattr(found, part, None)
        if not callable(found):
            raise EnvError(f"{label}: {module} has no class or function {attr!r}")
        entries.append(WrapperEntry(label, found, kwargs))
    return entries


def apply_wrappers(env: gym.Env, entries: Sequence[WrapperEntry]) -> gym.Env:
    """`env` inside each wrapper in turn (the first entry innermost); a wrapper that fails is one line (EnvError)."""
    for entry in entries:
        try:
            wrapped = entry.wrap(env, **entry.kwargs)
        except Exception as exc:  # noqa: BLE001 - a wrapper's own error, named by its config entry
            env.close()
            raise EnvError(f"{entry.label}: wrapping the env failed: {_where(exc)}") from None
        if not isinstance(wrapped, gym.Env):
            env.close()
            raise EnvError(f"{entry.label}: returned {type(wrapped).__name__}, not a gymnasium env (a gymnasium.Wrapper "
                           "subclass takes the env as its first argument)")
        env = wrapped
    return env


# MuJoCo's off-screen renderers, in the order tried on a machine without a display: the EGL and OSMesa libraries
# each needs (tools/headless_gl.sh installs them).
_HEADLESS_GL = (("egl", ("EGL",), ("EGL_mesa", "EGL_nvidia")), ("osmesa", ("OSMesa",), ()))
HEADLESS_GL_INSTALL = "sudo bash tools/headless_gl.sh (Debian/Ubuntu: apt-get install libegl1 libegl-mesa0 libgl1-mesa-dri)"


@cache
def headless_gl() -> str | None:
    """The OpenGL backend MuJoCo renders with (`MUJOCO_GL`): the user's choice when set; on Linux without a display
    (no DISPLAY or WAYLAND_DISPLAY) EGL, else OSMesa, whichever is installed, set in MUJOCO_GL before MuJoCo creates
    its context (gymnasium's own fallback cannot switch once PyOpenGL has loaded for another platform); None where
    a window system renders (a display, macOS, Windows) or neither library is installed."""
    chosen = os.environ.get("MUJOCO_GL")
    if chosen or not sys.platform.startswith("linux") or _display():
        return chosen or None
    for name, libraries, vendors in _HEADLESS_GL:
        if all(ctypes.util.find_library(lib) for lib in libraries) and (
                not vendors or any(ctypes.util.find_library(lib) for lib in vendors)):
            os.environ["MUJOCO_GL"] = name
            return name
    return None


def _display() -> str | None:
    return os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")


def rendering_note(env: gym.Env) -> str | None:
    """For an env made with a render_mode: one line saying how a MuJoCo env's frames render (None for other envs);
    a MuJoCo env with neither a display nor an off-screen backend is one line (EnvError) with the install."""
    mujoco_env = sys.modules.get("gymnasium.envs.mujoco.mujoco_env")
    if mujoco_env is None or not isinstance(env.unwrapped, mujoco_env.MujocoEnv):
        return None
    backend = os.environ.get("MUJOCO_GL")
    if backend:
        return f"MuJoCo frames render with MUJOCO_GL={backend}" + ("" if _display() else " (no display)")
    if _display() or not sys.platform.startswith("linux"):
        return "MuJoCo frames render through the display (glfw)"
    raise EnvError(f"no display, and no EGL or OSMesa library for MuJoCo to render off-screen; install one: "
                   f"{HEADLESS_GL_INSTALL}")


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
    except ImportError:  # an OSError (its library or GL backend) goes up: the start-up check names it in one line
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


def make_env(env: str | Mapping | EnvSettings, seed: int | None = None, **kwargs) -> gym.Env:
    """`gymnasium.make` plus episode statistics, seeded when `seed` is given.

    `env`: a gymnasium id, or the run's env group (`EnvSettings`: its modules imported first, its kwargs, its wrappers
    around the env in their order); `kwargs` are gymnasium.make's (on top of the group's).
    `ALE/...` ids get the Atari preprocessing of `make_atari_env` (its options pass through `kwargs`), inside the
    wrappers; RecordEpisodeStatistics sits outside all of it, so its returns are the rewards training sees.

    Seeding resets the env once with `seed` and seeds its action space, so
    later `reset()` calls without a seed continue a reproducible stream and
    `action_space.sample()` (random exploration) is reproducible too.
    """
    settings = import_env_modules(EnvSettings.of(env, **kwargs))
    check_registered(settings)
    wrappers = wrapper_entries(settings)
    env_id, kwargs, rendered = settings.id, settings.kwargs, settings.kwargs.get("render_mode") is not None
    check_env_installed(settings.registered_id)
    if rendered:
        headless_gl()  # before MuJoCo makes its OpenGL context
    base = make_atari_env(env_id, **kwargs) if is_atari(settings.registered_id) else gym.make(env_id, **kwargs)
    try:
        note = rendering_note(base) if rendered else None
    except EnvError:
        base.close()
        raise
    if note is not None:
        _say_once(note)
    env = gym.wrappers.RecordEpisodeStatistics(apply_wrappers(base, wrappers))
    if seed is not None:
        env.reset(seed=int(seed))
        env.action_space.seed(int(seed))
        env.observation_space.seed(int(seed))
    return env


@cache
def _say_once(line: str) -> None:
    log.info(line)


def obs_to_tensor(obs, device: str | torch.device = "cpu") -> torch.Tensor:
    """Convert an env observation to float32 once, here, so nothing downstream sees float64."""
    import torch

    if isinstance(obs, torch.Tensor):
        return obs.to(device=device, dtype=torch.float32)
    return torch.as_tensor(np.asarray(obs, dtype=np.float32), device=device)


def env_threshold(env: str | Mapping | EnvSettings) -> float | None:
    """The env's registered `reward_threshold` (475 for CartPole-v1), or None (an env registered without one)."""
    settings = import_env_modules(env)
    check_registered(settings)
    threshold = gym.spec(settings.registered_id).reward_threshold
    return None if threshold is None else float(threshold)


def run_threshold(env: str | Mapping | EnvSettings, given: float | None) -> float | None:
    """The return that counts as solved for a record's time_to_threshold_s: `given` (task.threshold), else the env's
    registered reward_threshold; with neither, one log line says so and the records hold null."""
    if given is not None:
        return float(given)
    threshold = env_threshold(env)
    if threshold is None:
        log.info(f"time_to_threshold_s: {EnvSettings.of(env).id} registers no reward_threshold and task.threshold is null, "
                 "so the records hold null; set task.threshold=<return> to time one")
    return threshold


def batch_to_tensor(stacked: np.ndarray, device: str | torch.device = "cpu") -> torch.Tensor:
    """A stacked batch of observations as a tensor: uint8 frames stay uint8 (the network scales them), the rest float32."""
    import torch

    if stacked.dtype == np.uint8:
        return torch.from_numpy(np.ascontiguousarray(stacked)).to(device)
    return obs_to_tensor(stacked, device)


def play_episodes(
    env: str | Mapping | EnvSettings, env_kwargs: dict | None, seeds: list[int],
    actions_for: Callable[[np.ndarray, np.ndarray], list],
) -> np.ndarray:
    """One episode per seed, each on its own `make_env(env, **env_kwargs)` env reset with that seed, all side by side.

    `actions_for(obs, alive)` gets the stacked observations of every episode (finished ones frozen at
    their last) and the indices of the running ones, and returns those episodes' actions. Atari plays
    whole games with unclipped rewards, as players score them. Returns the undiscounted returns.
    """
    import torch

    env_kwargs = dict(env_kwargs or {})
    if is_atari(EnvSettings.of(env).registered_id):
        env_kwargs.update(clip_rewards=False, terminal_on_life_loss=False)
    envs = [make_env(env, **env_kwargs) for _ in seeds]
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
    env: str | Mapping | EnvSettings,
    n_episodes: int,
    seed: int,
    device: str | torch.device = "cpu",
    env_kwargs: dict | None = None,
) -> list[float]:
    """Undiscounted returns of `n_episodes` episodes of `policy`, on envs separate from training (`env`: an id or the
    env group, as `make_env` takes it).

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
        return play_episodes(env, env_kwargs, [int(seed) + i for i in range(n_episodes)], actions_for).tolist()
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

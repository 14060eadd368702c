"""The `env` group at start-up: the id must be a registered gymnasium env, its action space what the task takes, and
image observations go to a convolutional network.

gymnasium and `pipeline.rl.envs` (which loads no torch), never the env wrappers that load torch: an unknown id, a missing
simulator (MuJoCo) or what EnvPool cannot run (`env.backend=envpool`) is one line before Lightning loads. Atari ids
(`ALE/...`) are registered by importing ale_py, as `pipeline.rl.envs` does.
"""

from __future__ import annotations

import difflib
from functools import cache

from pipeline.config.conf_tree import group_options
from pipeline.config.errors import ConfigError


def _registry() -> dict:
    import gymnasium

    return gymnasium.envs.registry


@cache
def _register_atari() -> bool:
    try:
        import ale_py
        import gymnasium
    except ImportError:
        return False
    gymnasium.register_envs(ale_py)
    return True


def check_env_id(env_id: str) -> None:
    """`env.id=NoSuchEnv-v0` -> one line with the closest registered ids. An id `module:Name-v0` (gymnasium imports
    the module that registers it) is left to gymnasium."""
    if ":" in env_id or env_id in _registry():
        return
    if _register_atari() and env_id in _registry():
        return
    ids = sorted(_registry())
    close = difflib.get_close_matches(env_id, ids, n=3, cutoff=0.6)
    if not close:  # case and version typos: `cartpole-v1`, `CartPole-v9`
        lowered = {i.lower(): i for i in ids}
        close = [lowered[c] for c in difflib.get_close_matches(env_id.lower(), list(lowered), n=3, cutoff=0.6)]
    if close:
        hint = f"did you mean {' or '.join(f'env.id={c}' for c in close)}?"
    else:
        shipped = "|".join(o for o in group_options().get("env", []) if o != "none")
        hint = f"e.g. env.id=CartPole-v1, or a shipped env: env={shipped}"
    raise ConfigError(f"env.id={env_id} is not a registered gymnasium environment; {hint}")


def _check_installed(env_id: str) -> None:
    """A simulator the env needs and that is not installed (MuJoCo) -> one line with the install command. It also sends
    MuJoCo's warnings to a logger instead of a MUJOCO_LOG.TXT in the working directory."""
    from pipeline.rl.envs import check_env_installed

    try:
        check_env_installed(env_id)
    except ValueError as error:
        raise ConfigError(str(error)) from None


# The vector-env backends (pipeline.rl.vector.make_vector_env) and the ids with a tensor form (rl.vector.TENSOR_ENVS;
# tests/test_config_ranges.py keeps both in sync without importing torch here).
BACKENDS = ("gym", "tensor", "envpool")
TENSOR_ENV_IDS = ("CartPole-v1", "Acrobot-v1", "Pendulum-v1")


def check_env_backend(env_id: str, kwargs: dict | None, backend: str | None) -> None:
    """An unknown `env.backend`, `env.backend=tensor` for an env without a tensor form, or `env.backend=envpool` with
    an env or env.kwargs EnvPool cannot run (or without envpool installed) -> one line naming the fix."""
    backend = "gym" if backend is None else str(backend)
    if backend not in BACKENDS:
        raise ConfigError(f"env.backend={backend}: choose one of {', '.join(BACKENDS)}; e.g. env.backend=gym")
    if backend == "tensor" and env_id not in TENSOR_ENV_IDS:
        raise ConfigError(f"env.backend=tensor has no tensor form of {env_id}; tensor envs: {', '.join(TENSOR_ENV_IDS)} "
                          "(or env.backend=gym)")
    if backend != "envpool":
        return
    from pipeline.rl.envs import envpool_task

    try:
        envpool_task(env_id, dict(kwargs or {}))
    except ValueError as error:
        raise ConfigError(str(error)) from None


_SPACES: dict[tuple, tuple | None] = {}


def _spaces(env_id: str, kwargs: dict) -> tuple | None:
    """The env's (observation space, action space), made once per id and kwargs; None when gymnasium cannot make it
    here."""
    key = (env_id, tuple(sorted((str(k), repr(v)) for k, v in kwargs.items())))
    if key not in _SPACES:
        import gymnasium

        _check_installed(env_id)
        try:
            env = gymnasium.make(env_id, **kwargs)
        except Exception:  # noqa: BLE001 - an env that cannot be made here is reported by the task that makes it
            _SPACES[key] = None
        else:
            _SPACES[key] = (env.observation_space, env.action_space)
            env.close()
    return _SPACES[key]


def _action_space(env_id: str, kwargs: dict):
    spaces = _spaces(env_id, kwargs)
    return None if spaces is None else spaces[1]


def image_observations(env_id: str, kwargs: dict | None = None) -> str | None:
    """The env's observations as text when they are images (Atari games' frame stacks; a Box of >= 2 axes of uint8),
    None when they are not or the env cannot be made here."""
    if env_id.startswith("ALE/"):
        return "uint8 frame stacks (an Atari game)"
    import gymnasium
    import numpy as np

    spaces = _spaces(env_id, dict(kwargs or {}))
    if spaces is None:
        return None
    obs = spaces[0]
    if isinstance(obs, gymnasium.spaces.Box) and len(obs.shape) >= 2 and obs.dtype == np.uint8:
        return f"images {obs}"
    return None


def action_kind(env_id: str, kwargs: dict | None = None) -> tuple[str, str] | None:
    """("discrete" | "box" | the space's class name, the space as text) of the env's actions; None when it cannot be
    made here (the task then reports why). Atari games are discrete."""
    if env_id.startswith("ALE/"):
        return "discrete", "Discrete (an Atari game)"
    import gymnasium

    kwargs = dict(kwargs or {})
    space = _action_space(env_id, kwargs)
    if space is None:
        return None
    if isinstance(space, gymnasium.spaces.Discrete):
        return "discrete", str(space)
    if isinstance(space, gymnasium.spaces.Box):
        return "box", str(space)
    return type(space).__name__, str(space)

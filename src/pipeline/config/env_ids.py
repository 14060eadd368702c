"""The `env` group at start-up: the modules it names import, the id is then a registered gymnasium env, its wrappers
exist, its action space is what the task takes, and image observations go to a convolutional network.

gymnasium and `pipeline.rl.envs` (which loads no torch), never the env wrappers that load torch: a module that does not
import, an unknown id, a wrapper that is not there, a missing simulator (MuJoCo) or what EnvPool cannot run
(`env.backend=envpool`) is one line before Lightning loads. Atari ids (`ALE/...`) are registered by importing ale_py,
as `pipeline.rl.envs` does; a user's env by importing the modules of `env.imports` and the id's `module:` prefix.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping
from functools import cache

from omegaconf import DictConfig, OmegaConf, open_dict

from pipeline.config.conf_tree import group_options
from pipeline.config.errors import ConfigError

log = logging.getLogger("pipeline")


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


def check_env(env: Mapping) -> None:
    """The env group (a plain dict) at start-up: its modules, its id (`check_env_id`), its wrappers, its backend."""
    from pipeline.rl.envs import EnvError, EnvSettings, wrapper_entries

    settings = EnvSettings.of(env)
    check_env_id(settings.id, settings.imports)
    backend = env.get("backend")
    if settings.wrappers and backend not in (None, "gym"):
        raise ConfigError(f"env.wrappers wrap gymnasium envs, and env.backend={backend} builds its own; use env.backend=gym "
                          "(or env.wrappers=[])")
    try:
        wrapper_entries(settings)
    except EnvError as error:
        raise ConfigError(str(error)) from None
    check_env_backend(settings.id, settings.kwargs, backend)


def check_env_id(env_id: str, imports: tuple[str, ...] | list[str] = ()) -> None:
    """`env.id=NoSuchEnv-v0` -> one line with the closest registered ids. The modules of `imports` and the id's
    `module:` prefix (gymnasium's form `module:Name-v0`) are imported first, as every process of the run imports them;
    one that does not import, or an id still unknown after, is one line naming the module."""
    from pipeline.rl.envs import EnvError, EnvSettings, import_env_modules, unregistered_hint

    settings = EnvSettings(env_id, imports=tuple(imports))
    try:
        import_env_modules(settings)
    except EnvError as error:
        raise ConfigError(str(error)) from None
    name = settings.registered_id
    if name in _registry() or (_register_atari() and name in _registry()):
        return
    ids = sorted(_registry())
    packages = {m.split(".")[0] for m in settings.modules}
    own = [i for i in ids if (registering_module(i) or "").split(".")[0] in packages]
    ids = own if difflib.get_close_matches(name, own, n=1, cutoff=0.6) else ids  # the user's modules' ids first
    close = difflib.get_close_matches(name, ids, n=3, cutoff=0.6)
    if not close:  # case and version typos: `cartpole-v1`, `CartPole-v9`
        lowered = {i.lower(): i for i in ids}
        close = [lowered[c] for c in difflib.get_close_matches(name.lower(), list(lowered), n=3, cutoff=0.6)]
    prefix = env_id[: len(env_id) - len(name)]
    if close:
        hint = f"did you mean {' or '.join(f'env.id={prefix}{c}' for c in close)}? ({unregistered_hint(settings)})"
    elif settings.modules:
        hint = unregistered_hint(settings)
    else:
        shipped = "|".join(o for o in group_options().get("env", []) if o != "none")
        hint = f"e.g. env.id=CartPole-v1, or a shipped env: env={shipped}; {unregistered_hint(settings)}"
    raise ConfigError(f"env.id={env_id} is not a registered gymnasium environment; {hint}")


def registering_module(env_id: str) -> str | None:
    """The module whose import registers `env_id` in a fresh process, as far as its entry point tells: None for
    gymnasium's own envs, Atari's and an unknown id; `__main__` for an env a script or notebook registered."""
    spec = _registry().get(env_id.rpartition(":")[2])
    if spec is None:
        return None
    entry = spec.entry_point
    module = entry.partition(":")[0] if isinstance(entry, str) else getattr(entry, "__module__", None)
    if not module or module.split(".")[0] in ("gymnasium", "ale_py", "shimmy"):
        return None
    return module


def carry_env_imports(cfg: DictConfig) -> None:
    """A run started from Python after `import my_envs` trains on an env the config does not name a module for: add
    the module registering it to `env.imports`, so that a later `python -m pipeline.eval` (a fresh process) imports it
    too. An env registered by `__main__` (a script, a notebook) cannot be imported there: one warning line says so."""
    env = cfg.get("env")
    if not isinstance(env, DictConfig) or not env.get("id"):
        return
    env_id, imports = str(env.id), [str(m) for m in (env.get("imports") or [])]
    module = registering_module(env_id)
    if module is None or ":" in env_id or module in imports:
        return
    if module == "__main__":
        log.warning(f"env.id={env_id} is registered by this script (__main__), which a later python -m pipeline.eval of the "
                    "run cannot import; register it in a module of its own and name it: env.imports=[<module>]")
        return
    with open_dict(cfg):
        cfg.env.imports = OmegaConf.create([*imports, module])


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


_SPACES: dict[str, tuple | None] = {}


def _spaces(env: str | Mapping, kwargs: dict) -> tuple | None:
    """The env's (observation space, action space) as the run makes it (`env`: an id, or the env group with its
    imports and wrappers; `kwargs` on top of its kwargs), made once per settings; None when it cannot be made here."""
    from pipeline.rl.envs import EnvSettings, make_env

    settings = EnvSettings.of(env, **kwargs)
    key = repr(settings)
    if key not in _SPACES:
        _check_installed(settings.registered_id)
        try:
            made = make_env(settings)
        except Exception:  # noqa: BLE001 - an env that cannot be made here is reported by the task that makes it
            _SPACES[key] = None
        else:
            _SPACES[key] = (made.observation_space, made.action_space)
            made.close()
    return _SPACES[key]


def _env_id(env: str | Mapping) -> str:
    return env if isinstance(env, str) else str(env["id"])


def image_observations(env: str | Mapping, kwargs: dict | None = None) -> str | None:
    """The env's observations as text when they are images (Atari games' frame stacks; a Box of >= 2 axes of uint8),
    None when they are not or the env cannot be made here. `env`: an id, or the env group (a plain dict)."""
    if _env_id(env).startswith("ALE/"):
        return "uint8 frame stacks (an Atari game)"
    import gymnasium
    import numpy as np

    spaces = _spaces(env, dict(kwargs or {}))
    if spaces is None:
        return None
    obs = spaces[0]
    if isinstance(obs, gymnasium.spaces.Box) and len(obs.shape) >= 2 and obs.dtype == np.uint8:
        return f"images {obs}"
    return None


def action_kind(env: str | Mapping, kwargs: dict | None = None) -> tuple[str, str] | None:
    """("discrete" | "box" | the space's class name, the space as text) of the env's actions; None when it cannot be
    made here (the task then reports why). Atari games are discrete. `env`: an id, or the env group (a plain dict)."""
    if _env_id(env).startswith("ALE/"):
        return "discrete", "Discrete (an Atari game)"
    import gymnasium

    spaces = _spaces(env, dict(kwargs or {}))
    if spaces is None:
        return None
    space = spaces[1]
    if isinstance(space, gymnasium.spaces.Discrete):
        return "discrete", str(space)
    if isinstance(space, gymnasium.spaces.Box):
        return "box", str(space)
    return type(space).__name__, str(space)

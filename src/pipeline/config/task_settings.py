"""The `task:` and `data:` nodes against their typed Configs, at start-up: types, declared ranges and cross-field
rules (`pipeline.config.ranges`), and what a task's Config declares it runs with (`precisions`, `action_spaces`).

A Config is found by the `_target_` it declares, among the dataclasses of the torch-free modules in `CONFIG_MODULES`
(the shipped tasks' `pipeline.tasks.configs`, the data's `pipeline.config.data_settings`). The tasks sit a layer
above this one, so those modules are imported by name, as Hydra imports a `_target_`; nothing here imports a task,
torch or Lightning. A task whose Config lives elsewhere is checked when the run builds it.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from collections.abc import Mapping
from functools import cache
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pipeline.config import env_ids
from pipeline.config.conf_tree import conf_root
from pipeline.config.errors import ConfigError
from pipeline.config.ranges import check_config, example_of

# Torch-free modules holding typed Configs, each naming the class it configures in its `_target_` default.
CONFIG_MODULES = ["pipeline.tasks.configs", "pipeline.config.data_settings"]


@cache
def configs_by_target() -> dict[str, type]:
    found: dict[str, type] = {}
    for name in CONFIG_MODULES:
        for obj in vars(importlib.import_module(name)).values():
            if isinstance(obj, type) and dataclasses.is_dataclass(obj):
                target = next((f.default for f in dataclasses.fields(obj) if f.name == "_target_"), None)
                if isinstance(target, str):
                    found[target] = obj
    return found


def config_class(target: Any) -> type | None:
    """The typed Config whose `_target_` is `target` (None: not one of CONFIG_MODULES')."""
    return configs_by_target().get(str(target))


def _field(cls: type, dotted: str) -> tuple[type, dataclasses.Field] | None:
    """The (owner Config, field) at a dotted key of a Config, through nested Config fields."""
    owner: Any = cls
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        fields = {f.name: f for f in dataclasses.fields(owner)}
        if part not in fields:
            return None
        if i == len(parts) - 1:
            return owner, fields[part]
        default = fields[part].default_factory() if fields[part].default_factory is not dataclasses.MISSING else fields[part].default
        if not dataclasses.is_dataclass(default):
            return None
        owner = type(default)
    return None


_KINDS = {"int": "a whole number", "float": "a number", "bool": "true or false", "str": "a string", "list": "a list"}


def _expected(field: dataclasses.Field) -> str:
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))
    base = kind.split("|")[0].split("[")[0].strip()
    what = _KINDS.get(base, kind)
    return f"{what} (or null)" if "None" in kind else what


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else str(value).replace(" ", "")


def typed_node(cfg: DictConfig, group: str, choices: Mapping[str, str | None]) -> tuple[type, Any, dict] | None:
    """(Config class, the group's node as its instance, the node's values as given); None when its Config is not
    known here. A wrong type or an unknown key is one line naming the key, what it takes and an example."""
    node = cfg.get(group)
    if not isinstance(node, DictConfig):
        return None
    cls = config_class(node.get("_target_"))
    if cls is None:
        return None
    try:
        values = {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if k != "_target_"}
    except OmegaConfBaseException:
        return None  # an interpolation that does not resolve: the run's own composition reports it
    name = f"{group}={choices[group]}" if choices.get(group) else (_task_name(cls, choices) if group == "task" else cls.__name__)
    known = [f.name for f in dataclasses.fields(cls) if f.name != "_target_"]
    for key in values:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean {group}.{close[0]}?" if close else f"its settings: {', '.join(known)}"
            raise ConfigError(f"{group}.{key} is not a setting of {name}; {hint}")
    try:
        return cls, OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), values)), values
    except OmegaConfBaseException as exc:
        key = str(exc.full_key or exc.key or "")
        found = _field(cls, key) if key else None
        if found is None:
            raise ConfigError(f"{group}.{key}: {str(exc).splitlines()[0]}" if key else f"{group}: {str(exc).splitlines()[0]}") from None
        owner, field = found
        value = OmegaConf.select(OmegaConf.create(values), key, default=None)
        example = example_of(owner, field.name)
        raise ConfigError(f"{group}.{key}={_shown(value)}: expected {_expected(field)}"
                          + (f"; e.g. {group}.{key}={example}" if example else "")) from None


def check_group_settings(cfg: DictConfig, group: str, choices: Mapping[str, str | None]) -> tuple[type, Any] | None:
    """The group's node against its typed Config (types, ranges, rules); (Config class, instance), or None when
    its Config is not known here."""
    typed = typed_node(cfg, group, choices)
    if typed is None:
        return None
    cls, config, values = typed
    check_config(config, group, values)
    return cls, config


def check_task_settings(cfg: DictConfig, choices: Mapping[str, str | None]) -> None:
    """Types, ranges and rules of the task's Config, then the precision and env it declares it runs with."""
    checked = check_group_settings(cfg, "task", choices)
    if checked is None:
        return
    cls = checked[0]
    name = _task_name(cls, choices)
    precisions = getattr(cls, "precisions", None)
    precision = OmegaConf.select(cfg, "device.precision", default=None)
    if precisions and precision is not None and str(precision) not in precisions:
        raise ConfigError(f"device.precision={precision}: {name} trains only in {' or '.join(precisions)}; "
                          f"use device.precision={precisions[0]}")
    spaces = getattr(cls, "action_spaces", None)
    env = cfg.get("env")
    if spaces is None or not isinstance(env, DictConfig) or env.get("id") in (None, ""):
        return
    env_id = str(env.get("id"))
    plain = OmegaConf.to_container(env, resolve=True)  # the env group as the run gets it (imports, wrappers, kwargs)
    env_ids.check_env(plain)
    found = env_ids.action_kind(plain)
    if found is not None and found[0] not in spaces:
        others = [t for t, c in _shipped_tasks().items() if found[0] in (getattr(c, "action_spaces", None) or ())]
        hint = f", or {' or '.join(f'task={t}' for t in others)} for its actions" if others else ""
        raise ConfigError(f"{name} takes {' or '.join(spaces)} actions, and env.id={env_id} has {found[1]}: choose another "
                          f"env{hint}")
    _check_image_model(cfg, name, plain)


# Models that flatten their input: on image observations they learn from raw pixels as a flat vector.
FLAT_MODELS = {
    "pipeline.nets.mlp.MLP": "model=mlp",
    "pipeline.nets.actor_critic.ActorCritic": "model=actor_critic",
    "pipeline.nets.heads.DuelingQNet": "model=dueling",
    "pipeline.nets.heads.NoisyQNet": "model=noisy",
}
# A task's convolutional model and preset, named in the refusal.
IMAGE_MODELS = {"task=ppo": "model=actor_critic_cnn (or experiment=ppo_atari)",
                "task=dqn": "model=atari_cnn (or experiment=dqn_atari)"}


def _check_image_model(cfg: DictConfig, name: str, env: dict) -> None:
    """A flat network (`FLAT_MODELS`) on image observations is one line naming the convolutional model to use."""
    model = cfg.get("model")
    target = str(model.get("_target_")) if isinstance(model, DictConfig) else ""
    if target not in FLAT_MODELS:
        return
    images = env_ids.image_observations(env)
    if images is None:
        return
    fix = IMAGE_MODELS.get(name, "a convolutional model (e.g. model=atari_cnn)")
    raise ConfigError(f"{FLAT_MODELS[target]} flattens its input, and env.id={env['id']} gives {images}: use {fix}")


def _task_name(cls: type, choices: Mapping[str, str | None]) -> str:
    """`task=ppo` as the user chose it, else the shipped option whose Config it is, else the Config's name."""
    if choices.get("task"):
        return f"task={choices['task']}"
    option = next((t for t, c in _shipped_tasks().items() if c is cls), None)
    return f"task={option}" if option else cls.__name__


@cache
def _shipped_tasks() -> dict[str, type]:
    """{option: Config} of the shipped conf/task/ options whose Config is known here."""
    out = {}
    for path in sorted((conf_root() / "task").glob("*.yaml")):
        cls = config_class(OmegaConf.load(path).get("_target_"))
        if cls is not None:
            out[path.stem] = cls
    return out

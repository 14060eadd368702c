"""The `task:` and `data:` nodes against their typed Configs, at start-up: types, declared ranges and cross-field
rules (`pipeline.config.ranges`), and what a task's Config declares it runs with (`precisions`, `action_spaces`).

A shipped Config is found by the `_target_` it declares, among the dataclasses of the torch-free modules in
`CONFIG_MODULES`: the shipped tasks' `pipeline.tasks.configs` (the one import of this layer into the tasks' package,
declared in pyproject.toml's layer contract: a schema module that imports nothing of the tasks, torch or Lightning)
and the data's `pipeline.config.data_settings`. A task of the user's own hands its Config in (`cls=`): the start-up
check imports its class once (`pipeline.config.startup`).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from functools import cache
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pipeline.config import data_settings, env_ids
from pipeline.config.conf_tree import conf_root
from pipeline.config.errors import ConfigError
from pipeline.config.ranges import check_config, example_of
from pipeline.tasks import configs as task_configs

# Torch-free modules holding typed Configs, each naming the class it configures in its `_target_` default.
CONFIG_MODULES = (task_configs, data_settings)

# What a task's Config declares for start-up (pipeline.tasks.configs says what each means), and what a Config that
# leaves one out gets.
DECLARATIONS = {"uses": frozenset(), "trains_seeds_together": False, "monitorable_metrics": None, "precisions": None,
                "action_spaces": None, "data_parallel": False, "model_contract": None}


def declared(config_cls: type | None, name: str) -> Any:
    """What `config_cls` declares as `name` (one of DECLARATIONS), or the default."""
    return getattr(config_cls, name, DECLARATIONS[name]) if config_cls is not None else DECLARATIONS[name]


@cache
def configs_by_target() -> dict[str, type]:
    found: dict[str, type] = {}
    for module in CONFIG_MODULES:
        for obj in vars(module).values():
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


def typed_node(cfg: DictConfig, group: str, choices: Mapping[str, str | None],
               cls: type | None = None) -> tuple[type, Any, dict] | None:
    """(Config class, the group's node as its instance, the node's values as given): the one merge of a node into its
    typed Config (`cls`, else the shipped Config its `_target_` names); None when its Config is not known. A wrong type
    or an unknown key is one line naming the key, what it takes and an example."""
    node = cfg.get(group)
    if not isinstance(node, DictConfig):
        return None
    cls = cls if cls is not None else config_class(node.get("_target_"))
    if cls is None:
        return None
    try:
        values = {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if k != "_target_"}
    except OmegaConfBaseException:
        return None  # an interpolation that does not resolve: the run's own composition reports it
    name = f"{group}={choices[group]}" if choices.get(group) else (task_name(cls, choices) if group == "task" else cls.__name__)
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


def check_group_settings(cfg: DictConfig, group: str, choices: Mapping[str, str | None],
                         cls: type | None = None) -> tuple[type, Any] | None:
    """The group's node against its typed Config (types, ranges, rules); (Config class, instance), or None when
    its Config is not known here."""
    typed = typed_node(cfg, group, choices, cls)
    if typed is None:
        return None
    cls, config, values = typed
    check_config(config, group, values)
    return cls, config


def check_task_settings(cfg: DictConfig, choices: Mapping[str, str | None], cls: type | None = None) -> Any:
    """Types, ranges and rules of the task's Config, then the precision and env it declares it runs with; the task's
    typed Config (None when its Config is not known)."""
    checked = check_group_settings(cfg, "task", choices, cls)
    if checked is None:
        return None
    cls, config = checked
    name = task_name(cls, choices)
    precisions = declared(cls, "precisions")
    precision = OmegaConf.select(cfg, "device.precision", default=None)
    if precisions and precision is not None and str(precision) not in precisions:
        raise ConfigError(f"device.precision={precision}: {name} trains only in {' or '.join(precisions)}; "
                          f"use device.precision={precisions[0]}")
    spaces = declared(cls, "action_spaces")
    env = cfg.get("env")
    if spaces is None or not isinstance(env, DictConfig) or env.get("id") in (None, ""):
        return config
    env_id = str(env.get("id"))
    plain = OmegaConf.to_container(env, resolve=True)  # the env group as the run gets it (imports, wrappers, kwargs)
    env_ids.check_env(plain)
    found = env_ids.action_kind(plain)
    if found is not None and found[0] not in spaces:
        others = [t for t, c in shipped_tasks().items() if found[0] in (declared(c, "action_spaces") or ())]
        hint = f", or {' or '.join(f'task={t}' for t in others)} for its actions" if others else ""
        raise ConfigError(f"{name} takes {' or '.join(spaces)} actions, and env.id={env_id} has {found[1]}: choose another "
                          f"env{hint}")
    _check_image_model(cfg, name, plain)
    return config


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


def task_name(cls: type, choices: Mapping[str, str | None]) -> str:
    """`task=ppo` as the user chose it, else the shipped option whose Config it is, else the Config's name."""
    if choices.get("task"):
        return f"task={choices['task']}"
    option = next((t for t, c in shipped_tasks().items() if c is cls), None)
    return f"task={option}" if option else cls.__name__


@cache
def shipped_tasks() -> dict[str, type]:
    """{option: Config} of the shipped conf/task/ options whose Config is known here."""
    out = {}
    for path in sorted((conf_root() / "task").glob("*.yaml")):
        cls = config_class(OmegaConf.load(path).get("_target_"))
        if cls is not None:
            out[path.stem] = cls
    return out

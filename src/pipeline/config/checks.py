"""Catch config mistakes at start-up with one line that names the key and the fix, never deep inside training."""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from pipeline.config.conf_tree import conf_root, group_options
from pipeline.config.errors import ConfigError
from pipeline.config.task_settings import check_group_settings, check_task_settings, config_class, declared

_SWEEP_FN = re.compile(r"^\w+\((.*)\)$")


def _options_in(value: str) -> list[str]:
    """Option names in an override value: `mlp`, `[csv,wandb]`, `mlp,dueling`, `choice(mlp,dueling)`."""
    value = value.strip()
    match = _SWEEP_FN.match(value)
    if match:
        value = match.group(1)
    value = value.strip("[]")
    return [v.strip().strip("'\"") for v in value.split(",") if v.strip()]


def check_group_overrides(overrides: Iterable[str]) -> None:
    """`model=nope` -> ConfigError naming the group and its options (before Hydra prints a long report)."""
    groups = group_options()
    for item in overrides:
        if "=" not in item or item.startswith("-"):
            continue
        key, value = item.split("=", 1)
        key = key.lstrip("+~").removeprefix("override ").strip()
        if key not in groups or key.startswith("hydra/") or item.startswith("~"):
            continue
        if value.strip() in ("", "null") and key != "experiment":
            fix = f"{key}=none" if "none" in groups[key] else f"one of {', '.join(groups[key])}"
            raise ConfigError(f"{key}={value.strip() or 'null'} does not choose an option of config group {key!r}; use {fix}")
        if value.strip() in ("", "null"):
            continue
        for option in _options_in(value):
            if option not in groups[key]:
                raise ConfigError(
                    f"unknown option {option!r} for config group {key!r}; choose one of: {', '.join(groups[key])}"
                )


def _leaves(node, prefix: str = ""):
    if isinstance(node, Mapping | DictConfig):
        for k, v in node.items():
            if k == "defaults" and not prefix:
                continue
            yield from _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix, node


def _kind(value) -> str | None:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, list | ListConfig):
        return "list"
    return None


def check_types(cfg: DictConfig, choices: Mapping[str, str | None]) -> None:
    """Each value must keep the type of the shipped default it replaces (a number stays a number, ...)."""
    root = conf_root()
    sources: list[tuple[str, Path]] = [("", root / "config.yaml")]
    for group, option in choices.items():
        if option and not group.startswith("hydra") and group != "experiment":
            sources.append((group, root / group / f"{option}.yaml"))
    for prefix, path in sources:
        if not path.is_file():
            continue  # an option from the user's own config dir: nothing shipped to compare with
        default = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        default.pop("hydra", None)
        for key, default_value in _leaves(default):
            if key.startswith("hydra") or key.startswith("_"):
                continue
            full = f"{prefix}.{key}" if prefix else key
            expected = _kind(default_value)
            if expected is None:
                continue
            actual_value = OmegaConf.select(cfg, full, default=None, throw_on_missing=False)
            if actual_value is None:
                continue
            if _kind(actual_value) != expected:
                shown = default_value
                shown = str(shown).lower() if isinstance(shown, bool) else str(shown).replace(" ", "")
                raise ConfigError(f"{full}: expected a {expected}, got {actual_value!r}; e.g. {full}={shown}")


def check_missing(cfg: DictConfig) -> None:
    missing = sorted(OmegaConf.missing_keys(cfg))
    missing = [m for m in missing if not m.startswith("hydra")]
    if missing:
        raise ConfigError(f"missing required value {missing[0]!r}; set it on the command line, e.g. {missing[0]}=...")


# ---- values that make no sense: refused at start-up, before any record is written -----------------------

SEED_MAX = 2**32 - 1  # numpy's and Lightning's seed range; negative seeds are refused by every task alike
# The most seeds one process trains (K agents, each with its nets, optimizer state and envs, built one by one):
# 4x the largest batch measured (K = 1024 on a GPU, docs/speed.md); more run as several processes.
SEEDS_PER_PROCESS_MAX = 4096
# Groups the pipeline always reads: removing one (`~device`) is an error; any other group removed (`~scheduler`)
# means its `none` option.
REQUIRED_GROUPS = ("task", "device", "seeding", "logger", "trainer")
# Groups that are read key by key (not instantiated): a key the shipped option lacks would be silently ignored.
CLOSED_GROUPS = ("device", "seeding")
# lightning.Trainer.__init__'s parameters (tests/test_config_ranges.py keeps the list in sync with the installed
# Lightning): a trainer.* key is checked against them without importing Lightning.
TRAINER_ARGS = (
    "accelerator", "strategy", "devices", "num_nodes", "precision", "logger", "callbacks", "fast_dev_run", "max_epochs",
    "min_epochs", "max_steps", "min_steps", "max_time", "limit_train_batches", "limit_val_batches", "limit_test_batches",
    "limit_predict_batches", "overfit_batches", "val_check_interval", "check_val_every_n_epoch", "num_sanity_val_steps",
    "log_every_n_steps", "enable_checkpointing", "enable_progress_bar", "enable_model_summary", "accumulate_grad_batches",
    "gradient_clip_val", "gradient_clip_algorithm", "deterministic", "benchmark", "inference_mode",
    "use_distributed_sampler", "profiler", "detect_anomaly", "barebones", "plugins", "sync_batchnorm",
    "reload_dataloaders_every_n_epochs", "default_root_dir", "enable_autolog_hparams", "model_registry",
)
# Lightning's precision values (lightning.fabric.connector._PRECISION_INPUT; tests/test_checks_units.py keeps them
# in sync): device.precision=17 is one line at start-up, not a failed run.
PRECISIONS = ("32-true", "16-mixed", "bf16-mixed", "64-true", "16-true", "bf16-true", "transformer-engine",
              "transformer-engine-float16", "64", "32", "16", "bf16")
# Trainer arguments the pipeline sets from its own groups: the key to use instead (refused at start-up).
TRAINER_OWNED = {
    "precision": "device.precision (e.g. device.precision=16-mixed or bf16-mixed)",
    "accelerator": "device=cpu|cuda|mps|auto (device.accelerator)",
    "logger": "logger=csv|tensorboard|wandb|many",
    "callbacks": "callbacks=default or +callbacks.<name>._target_=...",
    "default_root_dir": "hydra.run.dir=<dir>",
    "deterministic": "seeding=deterministic",
    "enable_checkpointing": "callbacks=model_checkpoint (Lightning's checkpoints) or checkpoint.enabled=false (the pipeline's)",
}


# The trainer keys that make one run span several processes (trainer=ddp), and the pipeline's own key beside them.
PROCESS_KEYS = ("strategy", "devices", "num_nodes")
PIPELINE_TRAINER_KEYS = ("ddp_timeout_s",)


def process_count(cfg: DictConfig) -> int:
    """How many processes one run spans: trainer.devices x trainer.num_nodes under trainer.strategy=ddp, else 1."""
    trainer = cfg.get("trainer") or {}
    if str(trainer.get("strategy") or "auto") != "ddp":
        return 1
    return int(trainer.get("devices") or 1) * int(trainer.get("num_nodes") or 1)


def _check_processes(cfg: DictConfig, config_cls: type | None = None) -> None:
    """trainer.strategy/devices/num_nodes: whole numbers, `ddp` or nothing, and only for a task that shards its data
    (its Config declares `data_parallel`)."""
    trainer = cfg.get("trainer") or {}
    strategy = str(trainer.get("strategy") or "auto")
    for key in ("devices", "num_nodes"):
        value = trainer.get(key)
        if value is not None and (not _is_int(value) or value < 1):
            raise ConfigError(f"trainer.{key}={value}: a process count is a whole number >= 1; e.g. trainer=ddp trainer.{key}=2")
    timeout = trainer.get("ddp_timeout_s")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0):
        raise ConfigError(f"trainer.ddp_timeout_s={timeout}: seconds a rank waits for the others, a number > 0; e.g. trainer.ddp_timeout_s=120")
    if strategy not in ("auto", "ddp"):
        raise ConfigError(f"trainer.strategy={strategy}: the pipeline runs one run on several processes with trainer=ddp "
                          "(trainer.strategy=ddp); drop trainer.strategy for one process")
    many = int(trainer.get("devices") or 1) * int(trainer.get("num_nodes") or 1)
    if strategy != "ddp" and many > 1:
        given = " ".join(f"trainer.{k}={trainer.get(k)}" for k in ("devices", "num_nodes") if trainer.get(k) is not None)
        raise ConfigError(f"{given} without trainer.strategy=ddp: choose trainer=ddp for one run on several processes "
                          "(or -m seed=... / seeds_per_process for several seeds)")
    if many <= 1:
        return
    target = str(OmegaConf.select(cfg, "task._target_", default=""))
    if not declared(config_cls if config_cls is not None else config_class(target), "data_parallel"):
        name = target.rsplit(".", 1)[-1] or "this task"
        raise ConfigError(f"trainer=ddp shards a data loader over processes, which {name} does not train from (task=supervised "
                          "and task=gan do); run its seeds side by side in one process with seeds_per_process=N, or as a "
                          "sweep with -m seed='range(0,N)'")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_seed(cfg: DictConfig) -> None:
    seed = cfg.get("seed")
    if not _is_int(seed) or not 0 <= seed <= SEED_MAX:
        raise ConfigError(f"seed={seed}: a seed is a whole number from 0 to {SEED_MAX}; e.g. seed=0, or -m seed='range(0,10)'")
    k = cfg.get("seeds_per_process", 1)
    if not _is_int(k) or k < 1:
        raise ConfigError(f"seeds_per_process={k}: the number of seeds trained in one process is a whole number >= 1")
    if k > SEEDS_PER_PROCESS_MAX:
        raise ConfigError(f"seeds_per_process={k}: at most {SEEDS_PER_PROCESS_MAX} seeds train in one process; run more as "
                          f"processes of up to {SEEDS_PER_PROCESS_MAX}, e.g. -m seed='range(0,{k},{SEEDS_PER_PROCESS_MAX})' "
                          f"seeds_per_process={SEEDS_PER_PROCESS_MAX}")
    if seed + k - 1 > SEED_MAX:
        raise ConfigError(f"seed={seed} seeds_per_process={k}: the batch's seeds {seed}..{seed + k - 1} pass the largest seed "
                          f"{SEED_MAX}; e.g. seed={SEED_MAX - k + 1}")


def fill_removed_groups(cfg: DictConfig) -> None:
    """`~scheduler` removes the group: it then reads as `scheduler=none`; `~device` (needed) is an error."""
    options = group_options()
    for group in sorted(g for g in options if "/" not in g and g != "experiment"):
        if group in cfg:
            continue
        if group in REQUIRED_GROUPS or "none" not in options[group]:
            raise ConfigError(f"~{group} removes a group every run needs; choose an option: {group}={'|'.join(options[group])}")
        with open_dict(cfg):
            cfg[group] = {}


def _shipped_default(key: str, choices: Mapping[str, str | None]) -> object:
    group, _, rest = key.partition(".")
    path = conf_root() / group / f"{choices.get(group)}.yaml" if rest else conf_root() / "config.yaml"
    if not path.is_file():
        return None
    return OmegaConf.select(OmegaConf.load(path), rest or key, default=None)


def _check_numbers(cfg: DictConfig, choices: Mapping[str, str | None] | None = None) -> None:
    lr = OmegaConf.select(cfg, "optimizer.lr", default=None)
    if isinstance(lr, int | float) and not isinstance(lr, bool) and not (math.isfinite(lr) and lr > 0):
        raise ConfigError(f"optimizer.lr={lr}: a learning rate is a finite number > 0; e.g. optimizer.lr=0.001")
    for key, value in _leaves(OmegaConf.to_container(cfg, resolve=False)):
        if not isinstance(value, float) or key.startswith("hydra") or math.isfinite(value):
            continue
        if math.isnan(value) or key.split(".")[0] in BUILT_GROUPS:
            default = _shipped_default(key, choices or {})
            example = f"e.g. {key}={default}" if isinstance(default, int | float) and not isinstance(default, bool) else "give a finite number"
            raise ConfigError(f"{key}={value}: not a finite number; {example}")
    _check_checkpoint(cfg)
    batch = OmegaConf.select(cfg, "data.batch_size", default=None)
    if batch is not None and (not _is_int(batch) or batch < 1):
        raise ConfigError(f"data.batch_size={batch}: a batch is a whole number of samples >= 1; e.g. data.batch_size=64")
    threads = OmegaConf.select(cfg, "device.num_threads", default=None)
    if threads is not None and (not _is_int(threads) or threads < 1):
        raise ConfigError(f"device.num_threads={threads}: the CPU thread count is a whole number >= 1 (null: torch's default); "
                          f"e.g. device.num_threads=1")
    model = cfg.get("model") or {}
    for key, widths in model.items():
        if not str(key).endswith("hidden") or not isinstance(widths, ListConfig | list):
            continue
        bad = [w for w in widths if not _is_int(w) or w < 1]
        if bad:
            raise ConfigError(f"model.{key}={list(widths)}: layer widths are whole numbers >= 1; e.g. model.{key}=[128,128]")


# The `checkpoint:` node's keys (conf/config.yaml): an interval in seconds may be fractional, one in steps is whole.
CHECKPOINT_KEYS = {"enabled": "checkpoint.enabled=true", "every_s": "checkpoint.every_s=60",
                   "every_steps": "checkpoint.every_steps=10000"}


def _check_checkpoint(cfg: DictConfig) -> None:
    """`checkpoint.every_steps=abc` (its default is null, so no type to compare with) or an unknown key: one line
    naming the key, not a failure when the first checkpoint is due."""
    node = cfg.get("checkpoint")
    if node is None:
        return
    if not isinstance(node, DictConfig):
        raise ConfigError(f"checkpoint={node}: checkpoint is a group of settings ({', '.join(CHECKPOINT_KEYS)}); "
                          "e.g. checkpoint.every_s=60")
    for key in node:
        if key not in CHECKPOINT_KEYS:
            close = difflib.get_close_matches(str(key), CHECKPOINT_KEYS, n=1)
            hint = f"did you mean checkpoint.{close[0]}?" if close else f"its settings: {', '.join(CHECKPOINT_KEYS)}"
            raise ConfigError(f"checkpoint.{key} is not a checkpoint setting (it would be ignored); {hint}")
    enabled = node.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"checkpoint.enabled={enabled}: true or false; e.g. {CHECKPOINT_KEYS['enabled']}")
    for key, whole in (("every_s", False), ("every_steps", True)):
        value = node.get(key)
        number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if value is None or (number and value >= 0 and (not whole or float(value).is_integer())):
            continue
        what = "a whole number of steps" if whole else "a number of seconds"
        raise ConfigError(f"checkpoint.{key}={value}: a checkpoint interval is {what} >= 0 (null: not by this measure); "
                          f"e.g. {CHECKPOINT_KEYS[key]}, or checkpoint.enabled=false for no periodic checkpoints")


def _check_precision(cfg: DictConfig) -> None:
    precision = OmegaConf.select(cfg, "device.precision", default=None)
    if precision is None or str(precision) in PRECISIONS:
        return
    close = difflib.get_close_matches(str(precision), PRECISIONS, n=1)
    fix = f"did you mean device.precision={close[0]}?" if close else "e.g. device.precision=32-true"
    raise ConfigError(f"device.precision={precision} is not a Lightning precision (one of {', '.join(PRECISIONS[:6])}, ...); {fix}")


def _check_closed_groups(cfg: DictConfig, choices: Mapping[str, str | None]) -> None:
    root = conf_root()
    for group in CLOSED_GROUPS:
        path = root / group / f"{choices.get(group)}.yaml"
        node = cfg.get(group)
        if not path.is_file() or not isinstance(node, DictConfig):
            continue  # the user's own option: nothing shipped to compare with
        known = set(OmegaConf.load(path).keys())
        for key in node:
            if key not in known:
                raise ConfigError(f"{group}.{key} is not a setting of {group}={choices.get(group)} (it would be ignored); "
                                  f"its settings: {', '.join(sorted(known))}")
    trainer = cfg.get("trainer") or {}
    for key, instead in TRAINER_OWNED.items():
        if key in trainer:
            raise ConfigError(f"trainer.{key} is set by the pipeline; use {instead} instead")
    for key in trainer:
        if key not in TRAINER_ARGS and key not in PIPELINE_TRAINER_KEYS:
            close = difflib.get_close_matches(str(key), TRAINER_ARGS, n=1)
            hint = f"did you mean trainer.{close[0]}?" if close else "see lightning.pytorch.Trainer's arguments"
            raise ConfigError(f"trainer.{key} is not a Lightning Trainer argument; {hint}")


def runtime_choices(cfg: DictConfig) -> dict:
    """The option chosen in each group, from the config's hydra node or the running Hydra app ({} outside both)."""
    node = OmegaConf.select(cfg, "hydra.runtime.choices", default=None)
    if node is None:
        try:
            from hydra.core.hydra_config import HydraConfig

            node = HydraConfig.get().runtime.choices
        except ValueError:
            return {}
    return {str(k): (None if v is None else str(v)) for k, v in node.items()}


# Groups built with hydra.utils.instantiate: a node with keys must name its class.
BUILT_GROUPS = ("model", "loss", "optimizer", "scheduler")


def _check_built_groups(cfg: DictConfig) -> None:
    """`model=none` under a preset that sets `model.hidden` leaves the keys without a class: one line, not a
    "'DictConfig' object is not callable" from deep inside the task."""
    for group in BUILT_GROUPS:
        node = cfg.get(group)
        if isinstance(node, DictConfig) and len(node) and "_target_" not in node:
            options = "|".join(o for o in group_options().get(group, []) if o != "none")
            raise ConfigError(
                f"{group} has keys ({', '.join(map(str, node.keys()))}) but no _target_ ({group}=none keeps the preset's "
                f"{group}.* keys); choose one with {group}={options}"
            )


def check_values(cfg: DictConfig, choices: Mapping[str, str | None] | None = None,
                 config_cls: type | None = None) -> tuple[object, object]:
    """Refuse, with one line naming the key and the fix, values no run could use: a seed that is not a whole
    number in [0, 2^32) or a batch of seeds running past it, seeds_per_process outside [1, SEEDS_PER_PROCESS_MAX],
    a key a group would silently ignore (`+device.x=1`, `+callbacks.x=1`), a trainer key the pipeline sets from
    another group or that is no Trainer argument, several processes (trainer=ddp) for a task that does not shard a
    data loader or a strategy other than ddp, the task's settings against its typed Config (types, declared
    ranges, cross-field rules, the precisions and action spaces it declares; `pipeline.config.task_settings`), an
    env id gymnasium does not know, a NaN anywhere (or an infinite model/optimizer value), a learning rate <= 0, a
    layer width < 1, a negative checkpoint interval, device.num_threads < 1, and the data's settings against its
    typed Config where it has one (`pipeline.config.data_settings`: e.g. an auction data path that is a directory
    or missing, a bidder count outside [2, 100]).
    Also fills a removed optional group (`~scheduler`) with its `none` option. `config_cls`: the task's typed Config
    (None: the shipped one its `_target_` names). Returns the typed task and data Configs (None where not known)."""
    choices = runtime_choices(cfg) if choices is None else choices
    config_cls = config_cls if config_cls is not None else config_class(OmegaConf.select(cfg, "task._target_", default=None))
    _check_seed(cfg)
    fill_removed_groups(cfg)
    _check_closed_groups(cfg, choices)
    _check_processes(cfg, config_cls)
    _check_precision(cfg)
    _check_built_groups(cfg)
    check_callback_entries(cfg)
    task = check_task_settings(cfg, choices, config_cls)
    data = check_group_settings(cfg, "data", choices)
    _check_numbers(cfg, choices)
    return task, None if data is None else data[1]


def callback_entries(cfg: DictConfig) -> list[tuple[str, object]]:
    node = OmegaConf.select(cfg, "callbacks", default=None)
    if node is None:
        return []
    if not isinstance(node, DictConfig):
        raise ConfigError(f"callbacks: expected named callback configs, got {node!r}; e.g. callbacks=default")
    return list(node.items())


def check_callback_entries(cfg: DictConfig) -> None:
    """Each cfg.callbacks entry must be a config with a _target_ (`+callbacks.x=1` is refused, not ignored)."""
    for name, entry in callback_entries(cfg):
        if not isinstance(entry, DictConfig) or "_target_" not in entry:
            raise ConfigError(
                f"callbacks.{name}: expected a callback config with a _target_, got {entry!r}; "
                f"e.g. +callbacks.{name}._target_=lightning.pytorch.callbacks.EarlyStopping"
            )


def _monitoring_entries(cfg: DictConfig) -> list[tuple[str, str]]:
    """(name, monitor) of each configured EarlyStopping or ModelCheckpoint (or subclass) that monitors a metric."""
    entries = [(str(name), entry) for name, entry in callback_entries(cfg)
               if isinstance(entry, DictConfig) and "_target_" in entry and entry.get("monitor") is not None]
    if not entries:
        return []  # Lightning is imported only to check a callback that names a metric
    from hydra.utils import get_class
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    found = []
    for name, entry in entries:
        try:
            cls = get_class(str(entry._target_))
        except Exception:  # noqa: BLE001 - building the callbacks reports a bad _target_ in one line
            continue
        if isinstance(cls, type) and issubclass(cls, EarlyStopping | ModelCheckpoint):
            found.append((name, str(entry.monitor), issubclass(cls, EarlyStopping)))
    return found


def check_monitors(cfg: DictConfig, config_cls: type | None = None) -> None:
    """The `monitor` of a configured EarlyStopping or ModelCheckpoint must name a metric the task's Config declares
    it logs (`monitorable_metrics`): `val_acc` for `val/acc` is one line at start-up, not a RuntimeError after the
    first epoch. A task that declares nothing (None) is not checked. `config_cls` None: the shipped Config of
    task._target_."""
    target = str(OmegaConf.select(cfg, "task._target_", default="") or "")
    config_cls = config_cls if config_cls is not None else config_class(target)
    logged = declared(config_cls, "monitorable_metrics")
    if logged is None:
        return
    entries = _monitoring_entries(cfg)
    if not entries:
        return
    task = target.rsplit(".", 1)[-1] or config_cls.__name__
    for name, monitor, stops in entries:
        if monitor in logged:
            continue
        key = f"callbacks.{name}.monitor"
        if logged:
            close = difflib.get_close_matches(monitor, logged, n=1)
            fix = f"did you mean {key}={close[0]}?" if close else f"e.g. {key}={logged[0]}"
            raise ConfigError(f"{key}={monitor}: {task} logs no metric {monitor!r} for callbacks (it logs {', '.join(logged)}); {fix}")
        own = dataclasses.is_dataclass(config_cls) and "stop_at_return" in {f.name for f in dataclasses.fields(config_cls)}
        why = " (it stops early by itself with task.stop_at_return)" if own else ""
        fix = f"drop the callback with ~callbacks.{name}" if stops else f"keep the latest checkpoint with {key}=null"
        raise ConfigError(f"{key}={monitor}: {task} logs no metric a callback can monitor{why}; {fix}")


def root_cause(exc: BaseException) -> BaseException:
    """Hydra wraps errors raised in a constructor; the user needs the original one."""
    while type(exc).__name__ == "InstantiationException" and exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def one_line(exc: BaseException) -> str:
    exc = root_cause(exc)
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")

"""Which runs are seeds of one configuration: equality of the resolved config, minus keys that do not change results.

Grouping by how a command was typed splits two spellings of one configuration and lets a progress-bar
flag start a new group; grouping by the resolved config does neither. A run stores
``semantic_config(resolved)`` in result.json (``config``); the report puts runs with equal configs in
one group and names each group by the keys where it differs from the others (``differences``).

Keys that never change what a run computes (``IGNORED``), each dropped with everything under it:

- ``seed``: what varies inside a group;
- ``logger``, ``hydra``: where numbers and files go (run and sweep dirs, launcher, job name);
- ``resume``, ``ckpt_path``: how a run restarts, not what it trains;
- ``trial``: Optuna's bookkeeping of a tuning trial;
- ``device.num_threads``: speed only (runs on one or more CPU threads give the same numbers);
- ``seeds_per_process``: K seeds in one process are K ordinary runs of their seeds;
- ``trainer.enable_progress_bar``, ``trainer.enable_model_summary``, ``callbacks.rich_progress_bar``,
  ``callbacks.model_summary``: what the console shows;
- ``run_dir``, ``sweep_dir``: where a run writes;
- ``checkpoint``, ``isolate_jobs``, ``task.save_replay``, ``task.replay_save_max_mb``: how often and what a
  run saves to survive being killed, and whether sweep jobs run in their own processes (durability, not results).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from pipeline.config.conf_tree import INTERNAL_GROUPS

# The CLI gives each sweep invocation an id in this environment variable (shared with launcher workers).
SWEEP_ENV = "PIPELINE_SWEEP_UID"

IGNORED = (
    "seed",
    "logger",
    "hydra",
    "resume",
    "ckpt_path",
    "trial",
    "device.num_threads",
    "seeds_per_process",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "callbacks.rich_progress_bar",
    "callbacks.model_summary",
    "run_dir",
    "sweep_dir",
    "checkpoint",
    "isolate_jobs",
    "task.save_replay",
    "task.replay_save_max_mb",
)
# Hydra choices of these groups say nothing about the result (see IGNORED); `experiment` is the name.
IGNORED_CHOICES = ("logger", "experiment", "callbacks/rich_progress_bar", "callbacks/model_summary")
MAX_SHOWN = 4
MAX_VALUE_CHARS = 40


def is_ignored(key: str, ignored: Iterable[str] = IGNORED) -> bool:
    return any(key == i or key.startswith(i + ".") for i in ignored)


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists stay values. An empty dict stays a key (``scheduler: {}``)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, path + "."))
        else:
            flat[path] = dict(value) if isinstance(value, Mapping) else value
    return flat


# One run on several processes (trainer=ddp): each process takes data.batch_size a step, so the run computes what one
# process computes with the effective batch (processes x data.batch_size): its config reads as that run's, and a
# report groups it with single-process runs only where their effective batch sizes agree.
PROCESS_KEYS = ("trainer.strategy", "trainer.devices", "trainer.num_nodes", "trainer.ddp_timeout_s")


def semantic_config(resolved: Mapping[str, Any]) -> dict[str, Any]:
    """The resolved config as flat dotted keys, without the keys that do not change results (nor the process
    topology of a run on several processes, whose data.batch_size reads as its effective batch)."""
    flat = flatten(resolved)
    processes = 1
    if flat.get("trainer.strategy") == "ddp":
        processes = int(flat.get("trainer.devices") or 1) * int(flat.get("trainer.num_nodes") or 1)
    if processes > 1 and isinstance(flat.get("data.batch_size"), int):
        flat["data.batch_size"] = flat["data.batch_size"] * processes
    return {k: v for k, v in sorted(flat.items()) if not is_ignored(k) and k not in PROCESS_KEYS}


def config_id(resolved: Mapping[str, Any], already_semantic: bool = False) -> str:
    """8 hex digits that are equal exactly when the semantic configs are equal."""
    semantic = dict(sorted(resolved.items())) if already_semantic else semantic_config(resolved)
    text = json.dumps(semantic, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def group_name(resolved: Mapping[str, Any], experiment: str) -> str:
    """A run's group as one string (W&B's group, result.json's ``group``): ``<experiment> <config id>``.

    Equal for two spellings of one configuration, different when anything that changes results differs.
    Which keys differ is only known across runs: the report names groups with ``differences``.
    """
    return f"{experiment} {config_id(resolved)}"


# Floats in a group's name: this many significant digits, more only where fewer would show two values alike (a
# tuner's 0.0023456789012345678 reads 0.002346). Display only: the config id still tells every value apart.
FLOAT_DIGITS = 4


def _rounded(value: Any, digits: int) -> Any:
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, list):
        return [_rounded(v, digits) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v, digits) for k, v in value.items()}
    return value


def _short(value: Any, digits: int = 17) -> str:
    text = json.dumps(_rounded(value, digits), default=str) if not isinstance(value, str) else value
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 1] + "…"


def _digits(values: list[Any]) -> int:
    """The fewest significant digits (FLOAT_DIGITS or more) that show `values` as distinct as they are."""
    distinct = len({json.dumps(v, default=str) for v in values})
    for digits in range(FLOAT_DIGITS, 17):
        if len({json.dumps(_rounded(v, digits), default=str) for v in values}) == distinct:
            return digits
    return 17


def differences(configs: Mapping[str, Mapping[str, Any]], choices: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, str]:
    """A display name per config: what sets it apart from the others, e.g. ``seeding.deterministic=true``.

    ``configs`` maps a group key to its semantic config (flat). A key differs when its value (or its
    absence) is not the same in every config. Where Hydra choices are known and a config group's option
    differs, ``model=dueling`` replaces the list of that group's keys. Configs that differ in nothing
    shown get an empty name (there is only one config, or the differences were all collapsed away).
    """
    keys = sorted({k for config in configs.values() for k in config})
    differing = [k for k in keys if len({json.dumps(c[k], default=str) if k in c else "<absent>"
                                          for c in configs.values()}) > 1]
    choices = choices or {}
    chosen_groups = sorted({g for cs in choices.values() for g in cs if not is_ignored(g.replace("/", "."))
                            and g not in IGNORED_CHOICES and g.split("/")[0] not in INTERNAL_GROUPS})
    differing_groups = [g for g in chosen_groups
                        if len({(choices.get(name) or {}).get(g) for name in configs}) > 1]
    digits = {k: _digits([c[k] for c in configs.values() if k in c]) for k in differing}
    names = {}
    for name, config in configs.items():
        parts = [f"{g}={(choices.get(name) or {}).get(g)}" for g in differing_groups]
        covered = tuple(g.replace("/", ".") for g in differing_groups)
        shown = [k for k in differing if not is_ignored(k, covered)]
        parts += [f"{k}={_short(config[k], digits[k])}" if k in config else f"{k}=<absent>" for k in shown]
        if len(parts) > MAX_SHOWN:
            parts = parts[:MAX_SHOWN] + [f"+{len(parts) - MAX_SHOWN} more"]
        names[name] = " ".join(parts)
    return names


def sweep_id() -> str | None:
    """The id of this sweep invocation (start_sweep_id), or None outside a sweep."""
    return os.environ.get(SWEEP_ENV) or None


def start_sweep_id(kept: str | None = None) -> str:
    """One short random id per sweep invocation, made once (when the sweep starts, or when the default sweep dir's
    name asks for it, whichever is first) and shared with launcher workers and their jobs through the environment.
    It comes from the sweep, not from its dir's name: a sweep in a dir of the user's choosing has one too.
    `kept`: the id a resumed sweep had (store.layout.kept_sweep_id of its dir), which it keeps."""
    if kept:
        os.environ[SWEEP_ENV] = kept
        return kept
    uid = sweep_id()
    if not uid:
        import uuid

        uid = uuid.uuid4().hex[:6]
        os.environ[SWEEP_ENV] = uid
    return uid

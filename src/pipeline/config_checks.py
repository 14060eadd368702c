"""Catch config mistakes at start-up with one line that names the key and the fix, never deep inside training."""

from __future__ import annotations

import importlib.resources
import re
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf


class ConfigError(ValueError):
    """A config problem the user can fix on the command line."""


def conf_root() -> Path:
    """The packaged config dir (the checkout's conf/ in an editable install)."""
    return Path(str(importlib.resources.files("pipeline.conf")))


@cache
def group_options() -> dict[str, list[str]]:
    """{'model': ['dueling', 'mlp', ...], 'hydra/launcher': [...], ...} from the shipped conf/ tree."""
    root = conf_root()
    groups: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.yaml")):
        rel = path.relative_to(root)
        if len(rel.parts) < 2:
            continue
        groups.setdefault("/".join(rel.parts[:-1]), []).append(rel.stem)
    return {g: sorted(opts) for g, opts in groups.items()}


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
        if key not in groups or key.startswith("hydra/") or value.strip() in ("", "null"):
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

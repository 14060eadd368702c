"""The search space: Hydra's override grammar (`interval`, `choice`, `range`, `tag(log, ...)`) -> Optuna distributions.

A parameter keeps the override form of each value (`model.hidden=[64,64]`), because Optuna's categorical
choices must be plain scalars: lists are stored in the study as their override text.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import MissingMandatoryValue


class TuneError(ValueError):
    """A tuning set-up the user can fix on the command line (one line, names the problem and the fix)."""


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # "float" | "int" | "categorical"
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: int | None = None
    choices: tuple = ()

    def distribution(self):
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.kind == "float":
            return FloatDistribution(self.low, self.high, log=self.log)
        if self.kind == "int":
            return IntDistribution(self.low, self.high, log=self.log, step=self.step or 1)
        return CategoricalDistribution(self.choices)

    def grid_values(self) -> list:
        if self.kind == "categorical":
            return list(self.choices)
        if self.kind == "int" and not self.log:
            return list(range(self.low, self.high + 1, self.step or 1))
        raise TuneError(
            f"search space: {self.name} is an interval, which hydra.sweeper.sampler=grid cannot enumerate; "
            f"use choice(...) or range(...) for it, or sampler=tpe"
        )


def format_value(value: Any) -> str:
    """A value as Hydra's override grammar reads it back."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, list | tuple):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{format_value(v)}" for k, v in value.items()) + "}"
    return repr(value) if isinstance(value, float) else str(value)


def _choice(value: Any) -> Any:
    # Optuna's categorical choices: None, bool, int, float or str; anything else travels as override text.
    return value if value is None or isinstance(value, bool | int | float | str) else format_value(value)


def _param_from_override(override, config: DictConfig, groups: Mapping[str, list[str]]) -> Param:
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep

    name = override.get_key_element()
    _check_known(name, override, config, groups)
    sweep = override.value()
    log = "log" in getattr(sweep, "tags", set())
    if isinstance(sweep, ChoiceSweep):
        if len(sweep.list) < 2:
            raise TuneError(f"search space: {name}=choice(...) has {len(sweep.list)} option; give at least two or set {name} as a fixed override")
        if log:
            raise TuneError(f"search space: tag(log, ...) applies to interval(...) or range(...), not to {name}=choice(...)")
        return Param(name, "categorical", choices=tuple(_choice(v) for v in sweep.list))
    if isinstance(sweep, RangeSweep):
        values = list(override.sweep_iterator())
        if len(values) < 2:
            raise TuneError(f"search space: {name}=range({sweep.start}, {sweep.stop}, {sweep.step}) holds {len(values)} value; widen it")
        if not all(isinstance(v, int) for v in values):
            return Param(name, "categorical", choices=tuple(values))
        if log and sweep.step != 1:
            raise TuneError(f"search space: {name}: tag(log, range(...)) needs step 1 (Optuna samples log-int with step 1)")
        return Param(name, "int", low=values[0], high=values[-1], log=log, step=int(sweep.step))
    if isinstance(sweep, IntervalSweep):
        low, high = sweep.start, sweep.end
        if not low < high:
            raise TuneError(f"search space: {name}=interval({low}, {high}) is empty; the first bound must be below the second")
        if log and low <= 0:
            raise TuneError(f"search space: {name}=tag(log, interval({low}, {high})) needs a positive lower bound")
        if isinstance(low, int) and isinstance(high, int):
            return Param(name, "int", low=low, high=high, log=log)
        return Param(name, "float", low=float(low), high=float(high), log=log)
    raise TuneError(f"search space: {name}: unsupported sweep {override.input_line!r}; use interval, choice or range")


def _candidates(override) -> list:
    """The values of a sweep that bound what a trial can get: every choice, a range's or an interval's two ends."""
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep

    sweep = override.value()
    if isinstance(sweep, ChoiceSweep):
        return list(sweep.list)
    if isinstance(sweep, IntervalSweep):
        return [sweep.start, sweep.end]
    values = list(override.sweep_iterator())
    return [values[0], values[-1]] if values else []


def _config_errors(config: DictConfig, choices: Mapping[str, str | None], name: str | None = None, value: Any = None):
    """The start-up check's one line for the config with `name` set to `value` (None: it passes; "": the config
    cannot be checked here)."""
    from pipeline.config.errors import ConfigError
    from pipeline.config.startup import check_run

    job = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
    with open_dict(job):
        job.pop("hydra", None)
        if name is not None:
            OmegaConf.update(job, name, value, force_add=True)
    try:
        check_run(job, choices)
    except ConfigError as exc:
        return str(exc)
    except Exception:  # noqa: BLE001 - e.g. a `???` the sweep fills: not a value a run refuses
        return "" if name is None else None
    return None


def check_space_values(overrides: Iterable, config: DictConfig, groups: Mapping[str, list[str]]) -> None:
    """Each value a trial could get passes the start-up checks a run makes (`model.hidden=choice([64],[0])` is one
    line now, not a failed trial later). Skipped when the base config itself fails them: the sweep reports that."""
    from pipeline.config.checks import runtime_choices

    choices = runtime_choices(config)
    if _config_errors(config, choices) is not None:
        return
    for override in overrides:
        name = override.get_key_element()
        if name in groups:
            continue  # a group's options: each is a shipped config, checked when a trial composes it
        for value in _candidates(override):
            error = _config_errors(config, choices, name, value)
            if error is not None:
                raise TuneError(f"search space: {override.input_line} can give {name}={format_value(value)}, which a run "
                                f"refuses: {error}")


def _check_known(name: str, override, config: DictConfig, groups: Mapping[str, list[str]]) -> None:
    if name in groups or override.is_add():
        return
    try:
        if OmegaConf.select(config, name, default=_MISSING, throw_on_missing=True) is not _MISSING:
            return
    except MissingMandatoryValue:
        return  # a `???` value: the key is there, waiting for the value the sweep gives it
    parent, _, leaf = name.rpartition(".")
    node = OmegaConf.select(config, parent, default=None) if parent else config
    known = [f"{parent}.{k}" if parent else str(k) for k in node.keys()] if isinstance(node, DictConfig) else []
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]}?" if close else f"add it with +{name}=..."
    raise TuneError(f"search space: unknown parameter {name!r} (not in the composed config); {hint}")


_MISSING = object()


def parse_space(arguments: Iterable[str], params: Mapping[str, Any] | None, config: DictConfig,
                groups: Mapping[str, list[str]]) -> tuple[list[str], list[Param]]:
    """Split the command line into fixed overrides (every job gets them) and the search space.

    The space comes from the sweep overrides on the command line and from `hydra.sweeper.params`
    (the command line wins for a key given in both).
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    overrides = parser.parse_overrides(list(arguments))
    fixed, space = [], {}
    for item in overrides:
        key = item.get_key_element()
        if key in ("seed", "seeds_per_process") and item.is_sweep_override():
            raise TuneError(f"{key} is chosen by the tuner; set the number of seeds per trial with hydra.sweeper.seeds=<K>")
        if key == "seeds_per_process":
            continue  # the tuner decides how a trial's seeds run
        if item.is_sweep_override():
            space[key] = item
        else:
            fixed.append(item.input_line)
    fixed_keys = {o.get_key_element() for o in overrides if not o.is_sweep_override()}
    for key, value in (params or {}).items():
        if key not in space and key not in fixed_keys:
            space[key] = parser.parse_overrides([f"{key}={value}"])[0]
            if not space[key].is_sweep_override():
                raise TuneError(f"hydra.sweeper.params.{key}={value} is one value; give a sweep such as choice(a,b) or interval(lo,hi)")
    if not space:
        raise TuneError("nothing to tune: give a search space, e.g. 'optimizer.lr=tag(log, interval(1e-4, 1e-2))'")
    params = [_param_from_override(o, config, groups) for o in space.values()]
    check_space_values(space.values(), config, groups)
    return fixed, params

"""Valid ranges declared on a typed Config's fields, checked once at start-up by `check_config`.

A field states its range where it is declared, and a rule between fields is a `cross_checks` method:

    @dataclass
    class MyConfig:
        _target_: str = "mypkg.MyTask"
        total_steps: int = count(100_000)              # a whole number >= 1
        eval_every: int = count(0, low=0, note="0: never")
        gamma: float = unit(0.99)                      # a number in [0, 1]
        clip_coef: float = positive(0.2)               # a finite number > 0
        ent_coef: float = number(0.01, low=0)          # a finite number >= 0
        max_grad_norm: float | None = positive(0.5)    # `| None`: null is allowed too
        target_update: str = one_of("hard", "soft")    # the first is the default
        hidden: list[int] = items([64, 64], whole=True, low=1)

        def cross_checks(self):                        # only when every field is in range
            if self.total_steps < self.eval_every:
                yield "total_steps", f"is less than task.eval_every={self.eval_every}"

`check_config(config, "task")` raises `ConfigError` with one line naming the key, what it must be, and a valid
example (the field's default unless `example=` says otherwise): `task.clip_coef=0: must be a finite number > 0;
e.g. task.clip_coef=0.2`. A float field is finite unless declared with `finite=False`. A nested dataclass field is
checked with its own ranges. Standard library only: any layer may declare ranges with it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from pipeline.config.errors import ConfigError

_RANGE = "pipeline.range"
_UNSET: Any = object()


@dataclasses.dataclass(frozen=True)
class Range:
    """What values a field takes: numbers in [low, high] (open ends with low_open/high_open), whole numbers only,
    one of `choices`, or (each=True) a list of such values."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    whole: bool = False
    finite: bool = True
    choices: tuple = ()
    each: bool = False
    example: Any = _UNSET
    note: str = ""

    def describe(self) -> str:
        if self.choices:
            what = "one of " + ", ".join(_show(c) for c in self.choices)
        else:
            what = "a whole number" if self.whole else ("a finite number" if self.finite else "a number")
            if self.low is not None and self.high is not None:
                what = f"{what} in {'(' if self.low_open else '['}{_show(self.low)}, {_show(self.high)}{')' if self.high_open else ']'}"
            elif self.low is not None:
                what = f"{what} {'>' if self.low_open else '>='} {_show(self.low)}"
            elif self.high is not None:
                what = f"{what} {'<' if self.high_open else '<='} {_show(self.high)}"
        if self.each:
            what = f"a list, each item {what}"
        return what + (f" ({self.note})" if self.note else "")

    def admits(self, value: Any) -> bool:
        if self.each:
            return isinstance(value, list | tuple) and all(dataclasses.replace(self, each=False).admits(v) for v in value)
        if self.choices:
            return any(type(value) is type(c) and value == c for c in self.choices)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.whole and not (isinstance(value, int) or (math.isfinite(value) and float(value).is_integer())):
            return False
        if self.finite and not math.isfinite(value):
            return False
        if math.isnan(value):
            return not (self.low is not None or self.high is not None)
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.high_open else value > self.high))


def _field(default: Any, rng: Range) -> Any:
    if isinstance(default, list | dict):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata={_RANGE: rng})
    return dataclasses.field(default=default, metadata={_RANGE: rng})


def count(default: Any, low: int = 1, high: int | None = None, note: str = "", example: Any = _UNSET) -> Any:
    """A whole number >= low (and <= high)."""
    return _field(default, Range(low=low, high=high, whole=True, note=note, example=example))


def number(default: Any, low: float | None = None, high: float | None = None, *, low_open: bool = False,
           high_open: bool = False, finite: bool = True, note: str = "", example: Any = _UNSET) -> Any:
    """A (finite) number within the given bounds."""
    return _field(default, Range(low=low, high=high, low_open=low_open, high_open=high_open, finite=finite, note=note,
                                 example=example))


def positive(default: Any, note: str = "", example: Any = _UNSET) -> Any:
    """A finite number > 0."""
    return number(default, low=0, low_open=True, note=note, example=example)


def unit(default: Any, note: str = "", example: Any = _UNSET) -> Any:
    """A number in [0, 1]: a probability, a discount, a fraction."""
    return number(default, low=0, high=1, note=note, example=example)


def one_of(default: Any, *others: Any, note: str = "") -> Any:
    """One of the listed values, the first being the default."""
    return _field(default, Range(choices=(default, *others), note=note))


def items(default: list, *, whole: bool = False, low: float | None = None, high: float | None = None,
          low_open: bool = False, choices: tuple = (), note: str = "", example: Any = _UNSET) -> Any:
    """A list whose every item is in range."""
    return _field(default, Range(low=low, high=high, low_open=low_open, whole=whole, choices=choices, each=True,
                                 note=note, example=example))


def range_of(field: dataclasses.Field) -> Range | None:
    return field.metadata.get(_RANGE)


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_show(v) for v in value) + "]"
    return str(value)


def example_of(cls: type, name: str) -> str | None:
    """The field's example value as typed on the command line: its declared `example`, else its default."""
    field = {f.name: f for f in dataclasses.fields(cls)}.get(name)
    if field is None:
        return None
    rng = range_of(field)
    if rng is not None and rng.example is not _UNSET:
        return _show(rng.example)
    if field.default is not dataclasses.MISSING and field.default is not None:
        return _show(field.default)
    if field.default_factory is not dataclasses.MISSING:
        return _show(field.default_factory())
    return None


def _nullable(field: dataclasses.Field) -> bool:
    kind = field.type if isinstance(field.type, str) else repr(field.type)
    return "None" in kind or "Optional" in kind


def problems(config: Any, prefix: str, typed: Mapping | None = None) -> Iterator[str]:
    """Each out-of-range value of a Config instance, then (when all fields are in range) each broken cross-field
    rule, as a one-line message. `typed`: the values as the user gave them ({"clip_coef": 0}), shown instead of
    the Config's converted ones (0.0)."""
    typed = typed if isinstance(typed, Mapping) else {}
    found = False
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        key = f"{prefix}.{field.name}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            for line in problems(value, key, typed.get(field.name)):
                found = True
                yield line
            continue
        rng = range_of(field)
        if rng is None:
            continue
        if value is None:
            if _nullable(field):
                continue
        elif rng.admits(value):
            continue
        found = True
        example = example_of(type(config), field.name)
        yield f"{key}={_show(typed.get(field.name, value))}: must be {rng.describe()}" + (f"; e.g. {key}={example}" if example else "")
    if found:
        return
    rules = getattr(config, "cross_checks", None)
    for name, message in (rules() if rules is not None else ()):
        yield f"{prefix}.{name}={_show(typed.get(name, getattr(config, name)))}: {message}"


def check_config(config: Any, prefix: str = "task", typed: Mapping | None = None) -> None:
    """Raise ConfigError with the first problem of `config` (a dataclass instance with declared ranges)."""
    for line in problems(config, prefix, typed):
        raise ConfigError(line)


def unchecked_fields(cls: type, prefix: str = "") -> Iterable[str]:
    """Fields of a Config (and its nested Configs) that declare no range: strings, flags and paths are expected."""
    for field in dataclasses.fields(cls):
        default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
        if dataclasses.is_dataclass(default):
            yield from unchecked_fields(type(default), f"{prefix}{field.name}.")
        elif range_of(field) is None:
            yield prefix + field.name

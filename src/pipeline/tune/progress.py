"""What the tuner says while it searches: a short line per trial with "N of M", and how many jobs it plans (so the
sweep's own progress line reads "[7/23 done, ..., ETA 4 min]"); the launcher's per-job lines are left out (each
repeated the trial's whole override list, ~330 characters with its Optuna settings)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any


def shown(params: dict[str, Any]) -> str:
    """A trial's parameters for a person: floats to 4 significant digits (the overrides keep every digit)."""
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def trial_started(number: int, ordinal: int, total: int, params: dict[str, Any], seeds: list[int]) -> str:
    span = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {seeds[0]}-{seeds[-1]}"
    return f"[trial {number}, {ordinal} of {total}] {shown(params)} on {span}"


def trial_scored(number: int, params: dict[str, Any], objective: str, value: float, seeds: int, failed: list[int]) -> str:
    note = f", failed seeds {failed} (worst value)" if failed else ""
    return f"[trial {number}] {shown(params)} -> {objective}={value:.4g} over {seeds} seeds{note}"


def planned_jobs(trials_left: int, per_trial: int, confirm_top: int, n_trials: int, per_confirmation: int) -> int:
    """Jobs this search will launch: `per_trial` for each trial left, then `per_confirmation` for each of the best
    `confirm_top` (at most one per trial) and for the preset (1 each when a run's seeds train in one process)."""
    confirmed = min(confirm_top, n_trials) + 1 if confirm_top > 0 else 0
    return max(0, trials_left) * per_trial + confirmed * per_confirmation


def launcher_logger(launcher) -> logging.Logger:
    """The logger a Hydra launcher writes its "Launching N jobs" and per-job override lines to: its module's for
    Hydra's own, its plugin package's for a plugin (joblib's write from a helper module in the package)."""
    module = type(launcher).__module__
    if module.startswith("hydra_plugins."):
        module = ".".join(module.split(".")[:2])
    return logging.getLogger(module)


@contextlib.contextmanager
def quiet_launches(launcher) -> Iterator[None]:
    """The launcher's INFO lines off while the tuner launches (its warnings still show)."""
    logger = launcher_logger(launcher)
    level = logger.level
    logger.setLevel(max(logging.WARNING, level))
    try:
        yield
    finally:
        logger.setLevel(level)

"""Exploration schedules."""

from __future__ import annotations

from collections.abc import Callable


def epsilon_at(step: int, start: float, end: float, duration: int) -> float:
    """Linear interpolation from `start` (step 0) to `end` (step `duration`), then constant."""
    if duration <= 0:
        return float(end)
    frac = min(max(step / duration, 0.0), 1.0)
    # This form is exact at both ends (start + frac * (end - start) can miss `end` by one ulp).
    return float(start * (1.0 - frac) + end * frac)


def linear_schedule(start: float, end: float, duration: int) -> Callable[[int], float]:
    """`epsilon_at` with its constants bound, for code that wants a step -> value callable."""

    def schedule(step: int) -> float:
        return epsilon_at(step, start, end, duration)

    return schedule

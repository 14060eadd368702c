"""Learning curves as rliable draws them: per step, the IQM over seeds with a 95% stratified bootstrap band.

A seed that stopped early (say at the first evaluation of 500 on CartPole) stays in the aggregate to the
end of the grid instead of leaving it: otherwise a group where every seed solved the task ends at the value
of whichever seed ran longest. What it holds is its *final* evaluation when the record has one on the
curve's metric (DQN: 20 greedy episodes after training, where the in-training evaluation that stopped it
had 10), else its last logged value. When the curve's metric is the table's metric, the curve ends with
one more point at the last step: every seed's final value, so the curve's last point is the table's IQM
and CI, the same numbers. The band is clipped to what the metric can take when the record says
(``metric_bounds``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline.report.collect import ReportedRun
from pipeline.report.stats import (
    CONFIDENCE,
    DEFAULT_REPS,
    DEFAULT_SEED,
    interval_estimates,
    seeded_global_numpy,
)

# Past this many distinct steps the union grid is replaced by an even grid: interpolation makes the
# difference invisible and the bootstrap stays cheap for long runs logged at irregular steps.
MAX_GRID_POINTS = 200


def align_held(
    curves: Sequence[tuple[np.ndarray, np.ndarray]], finals: Sequence[float | None] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-seed curves on one step grid: ``(grid, values[seed, step], live[seed, step])``.

    Inside its own logged range a seed is interpolated linearly; after its last step it holds
    ``finals[seed]`` (its final evaluation) when given, else its last value (``live`` False there);
    before its first step it is NaN (nothing is invented before the start).
    """
    grid = np.unique(np.concatenate([steps for steps, _ in curves]))
    if grid.size > MAX_GRID_POINTS:
        grid = np.linspace(grid[0], grid[-1], MAX_GRID_POINTS)
    finals = list(finals) if finals is not None else [None] * len(curves)
    values = np.full((len(curves), grid.size), np.nan)
    live = np.zeros((len(curves), grid.size), dtype=bool)
    for row, ((steps, ys), final) in enumerate(zip(curves, finals)):
        started = grid >= steps[0]
        live[row] = started & (grid <= steps[-1])
        values[row, started] = np.interp(grid[started], steps, ys)  # np.interp holds the last value beyond the end
        if final is not None:
            values[row, grid > steps[-1]] = final
    return grid, values, live


def nan_iqm(scores: np.ndarray) -> np.ndarray:
    """IQM over axis 0 (seeds) of ``scores[seed, step]``, ignoring NaN: rliable's 25% trimmed mean per step.

    Vectorised over steps (scipy's trim_mean per step and per resample is ~100x slower); the tests check it
    against ``rliable.metrics.aggregate_iqm`` step by step.
    """
    ordered = np.sort(scores, axis=0)  # NaN sorts last
    n = np.sum(np.isfinite(ordered), axis=0)
    cut = (n // 4)[None, :]
    rank = np.arange(ordered.shape[0])[:, None]
    kept = (rank >= cut) & (rank < n[None, :] - cut)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(kept, ordered, 0.0).sum(axis=0) / np.where(n > 0, n - 2 * cut[0], np.nan)


def iqm_curve(
    values: np.ndarray, reps: int = DEFAULT_REPS, seed: int = DEFAULT_SEED
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(iqm, ci_low, ci_high)`` per step; seeds are resampled with replacement (rliable's stratified bootstrap).

    At each step the point and the band are over the seeds that have a value there (a seed whose curve starts
    later is NaN before its first step): steps that share those seeds share one bootstrap, so the band is never
    NaN where the point is not (a resample of only missing seeds would make it so). One seed: no band.
    """
    from rliable import library

    point = nan_iqm(values)
    low, high = point.copy(), point.copy()
    if values.shape[0] < 2:
        return point, low, high
    patterns, which = np.unique(np.isfinite(values).T, axis=0, return_inverse=True)
    which = which.reshape(-1)
    for k, seeds in enumerate(patterns):
        if seeds.sum() < 2:
            continue
        steps = which == k
        # rliable wants (runs, tasks, ...): one task, steps last.
        scores = values[seeds][:, steps][:, None, :]
        with seeded_global_numpy(seed), np.errstate(invalid="ignore"):
            _, intervals = library.get_interval_estimates(
                {"group": scores}, lambda s: nan_iqm(s[:, 0, :]), reps=reps, confidence_interval_size=CONFIDENCE
            )
        low[steps], high[steps] = np.asarray(intervals["group"], dtype=float)
    return point, low, high


def final_on_curve(run: ReportedRun) -> float | None:
    """The run's final value when it is a value of its curve's metric (DQN, GAN), else None (supervised:
    the curve is val/acc, the table test/acc)."""
    return run.primary_value if run.primary_curve is not None and run.primary_curve == run.primary_metric else None


def group_curve(
    runs: Sequence[ReportedRun], reps: int = DEFAULT_REPS, seed: int = DEFAULT_SEED
) -> tuple[dict[str, Any], list[tuple[np.ndarray, np.ndarray, float | None]]] | None:
    """The group's primary curve for report.json, and the per-seed curves ``(steps, values, final)`` for the plot;
    None without curves.

    When every run's final value is on the curve's metric, the curve ends with a final point: the IQM and CI
    of the final values, computed as the table computes them (``stats.interval_estimates``, same reps and
    seed), so the two agree to the last digit.
    """
    loaded = [(run, run.load_curve()) for run in runs]
    with_curve = [(run, curve) for run, curve in loaded if curve is not None]
    if not with_curve:
        return None
    metric = with_curve[0][0].primary_curve
    finals = [final_on_curve(run) for run, _ in loaded]
    final_point = all(f is not None for f in finals)
    per_seed, row_finals = [], []
    for (run, curve), final in zip(loaded, finals):
        if curve is None:
            continue
        _, steps, ys = curve
        stopped_at = run.get_float("env_steps") if run.counts_env_steps and curve[0] == "env_step" else None
        if final is not None and stopped_at is not None and stopped_at > steps[-1]:
            # The final evaluation ran at the agent's last env step, after its last in-training evaluation.
            steps, ys = np.append(steps, stopped_at), np.append(ys, final)
        per_seed.append((steps, ys, final))
        row_finals.append(final)
    grid, values, live = align_held([(steps, ys) for steps, ys, _ in per_seed], row_finals)
    iqm, low, high = iqm_curve(values, reps=reps, seed=seed)
    n_seeds, n_live = np.sum(np.isfinite(values), axis=0), np.sum(live, axis=0)
    if final_point:
        table = interval_estimates(finals, reps=reps, seed=seed)
        grid = np.append(grid, grid[-1])
        iqm, low, high = np.append(iqm, table["iqm"]), np.append(low, table["iqm_ci"][0]), np.append(high, table["iqm_ci"][1])
        n_seeds, n_live = np.append(n_seeds, len(finals)), np.append(n_live, 0)
    lows, highs = zip(*(run.metric_bounds(metric) for run, _ in with_curve))
    lower = min((b for b in lows if b is not None), default=None)
    upper = max((b for b in highs if b is not None), default=None)
    if lower is not None or upper is not None:
        iqm, low, high = (np.clip(a, lower, upper) for a in (iqm, low, high))
    x_columns = sorted({x for _, (x, _, _) in with_curve})
    env_steps = all(run.counts_env_steps for run, _ in with_curve)
    summary = {
        "metric": metric,
        "x": "env steps" if env_steps else ("logged row" if x_columns == ["row"] else "training step"),
        "bounds": [lower, upper] if lower is not None or upper is not None else None,
        "steps": grid,
        "iqm": iqm,
        "ci_low": low,
        "ci_high": high,
        "n_seeds": n_seeds,
        "n_live": n_live,
        # "final": the last point is every seed's final value (the table's IQM and CI); "held": the last logged values.
        "last_point": "final" if final_point else "held",
        "held_from": [float(steps[-1]) if steps[-1] < grid[-1] else None for steps, _, _ in per_seed],
    }
    return summary, per_seed

"""A report's numbers: runs grouped by resolved config (groups.py), per-group stats and comparisons
(stats.py) and learning curves (curves.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeline.report.collect import ReportedRun
from pipeline.report.curves import group_curve
from pipeline.report.groups import group_runs
from pipeline.report.stats import DEFAULT_REPS, DEFAULT_SEED, compare_groups, group_stats


def summarize(runs: Sequence[ReportedRun], reps: int = DEFAULT_REPS, seed: int = DEFAULT_SEED) -> dict[str, Any]:
    """Group runs by their resolved configs (report/groups.py), compute per-group stats, curves and comparisons.

    ``curve_seeds`` holds each group's per-seed curves for the plots; it is not part of report.json.
    """
    by_group = group_runs(runs)
    groups = {name: group_stats(name, members, reps=reps, seed=seed) for name, members in by_group.items()}
    curve_seeds = {}
    for name, members in by_group.items():
        # In the table's order, so the curve's final point resamples exactly as the table's CI does.
        by_dir = {str(run.dir): run for run in members}
        valid = [by_dir[entry["dir"]] for entry in groups[name]["per_seed"].values()]
        curve = group_curve(valid, reps=reps, seed=seed)
        groups[name]["curve"], curve_seeds[name] = curve if curve is not None else (None, [])
    comparisons, notes = compare_groups(groups, reps=reps, seed=seed)
    warnings_out = [w for stats in groups.values() for w in stats["warnings"]] + notes
    return {"groups": groups, "comparisons": comparisons, "warnings": warnings_out, "curve_seeds": curve_seeds}

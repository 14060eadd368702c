"""Seed-distribution statistics: per-group summaries, IQM with stratified bootstrap CIs, comparisons.

rliable drives every bootstrap (stratified resampling and percentile intervals). Two details:

* rliable 1.2 draws its resampling indices from numpy's *global* RNG and ignores ``random_state``
  for them, so each bootstrap runs inside ``seeded_global_numpy`` which seeds and then restores the
  global state: reports are deterministic and the caller's RNG stream is left untouched.
* Inside the bootstrap loop we pass exact re-implementations of ``metrics.aggregate_iqm`` and
  ``metrics.probability_of_improvement``: scipy's per-call overhead made a 2000-rep probability of
  improvement take ~2 s per pair. Point estimates come from rliable itself, and the tests check
  that the fast versions give the same numbers.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from pipeline.report.collect import STATUSES, ReportedRun

DEFAULT_REPS = 2000
DEFAULT_SEED = 0
CONFIDENCE = 0.95
MIN_SEEDS = 5
PROFILE_POINTS = 101


@contextlib.contextmanager
def seeded_global_numpy(seed: int) -> Iterator[None]:
    """Around every rliable bootstrap: numpy's global RNG seeded (and restored after), and rliable's
    "Calculating estimates for ..." INFO lines (absl logging, which reaches Hydra's handler as [HYDRA] lines,
    two per sweep and ten per tuning study) held back; the absl logger's level is restored after."""
    state = np.random.get_state()
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.WARNING)
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)
        absl.setLevel(level)


def _as_runs_by_tasks(values: Sequence[float] | np.ndarray) -> np.ndarray:
    # rliable's score matrices are (num_runs, num_tasks); a group is one task.
    return np.asarray(values, dtype=float).reshape(-1, 1)


def iqm(values: Sequence[float] | np.ndarray) -> float:
    """Interquartile mean as rliable defines it: scipy's 25% trimmed mean over all scores.

    It trims ``floor(n / 4)`` values from each end, so with fewer than 4 values nothing is trimmed
    and the IQM equals the mean.
    """
    from rliable import metrics

    scores = _as_runs_by_tasks(values)
    if scores.size == 0:
        raise ValueError("IQM of an empty list is undefined")
    return float(metrics.aggregate_iqm(scores))


def fast_iqm(scores: np.ndarray) -> float:
    flat = np.sort(np.asarray(scores, dtype=float), axis=None)
    cut = int(0.25 * flat.size)
    return float(flat[cut : flat.size - cut].sum() / (flat.size - 2 * cut))


def fast_probability_of_improvement(scores_x: np.ndarray, scores_y: np.ndarray) -> float:
    """``metrics.probability_of_improvement`` without scipy: the Mann-Whitney U of x over y counts
    the pairs where x wins plus half the ties, divided by the number of pairs; averaged over tasks."""
    pairs = scores_x.shape[0] * scores_y.shape[0]
    total = 0.0
    for task in range(scores_x.shape[1]):
        x = scores_x[:, task][:, None]
        y = scores_y[:, task][None, :]
        total += (np.count_nonzero(x > y) + 0.5 * np.count_nonzero(x == y)) / pairs
    return total / scores_x.shape[1]


def _iqm_and_mean(scores: np.ndarray) -> np.ndarray:
    return np.array([fast_iqm(scores), scores.sum() / scores.size])


def interval_estimates(
    values: Sequence[float] | np.ndarray, reps: int = DEFAULT_REPS, seed: int = DEFAULT_SEED
) -> dict[str, Any]:
    """IQM and mean with 95% stratified bootstrap CIs (percentile method), from one set of resamples."""
    from rliable import library

    scores = _as_runs_by_tasks(values)
    if scores.size == 0:
        raise ValueError("interval estimates of an empty list are undefined")
    with seeded_global_numpy(seed):
        _, intervals = library.get_interval_estimates(
            {"group": scores},
            _iqm_and_mean,
            reps=reps,
            confidence_interval_size=CONFIDENCE,
        )
    (iqm_low, mean_low), (iqm_high, mean_high) = intervals["group"]
    return {
        "iqm": iqm(scores),
        "iqm_ci": [float(iqm_low), float(iqm_high)],
        "mean": float(np.mean(scores)),
        "mean_ci": [float(mean_low), float(mean_high)],
        "ci_note": ci_note(scores.size),
    }


def ci_note(n: int) -> str | None:
    if n == 1:
        return "1 seed: every bootstrap resample is that seed, so the CI collapses to the point; it says nothing"
    if n < 4:
        return (
            f"{n} seeds: nothing is trimmed, so the IQM equals the mean, and the bootstrap CI only "
            f"mixes {n} values; treat it as indicative"
        )
    return None


def probability_of_improvement(
    scores_x: Sequence[float] | np.ndarray,
    scores_y: Sequence[float] | np.ndarray,
    reps: int = DEFAULT_REPS,
    seed: int = DEFAULT_SEED,
) -> dict[str, Any]:
    """P(X > Y) (ties count half) with a 95% stratified independent bootstrap CI.

    P(Y > X) is ``1 - P(X > Y)`` exactly, on the data and on every resample, so the reverse pair's CI
    is ``[1 - high, 1 - low]`` and costs nothing; see ``reverse``.
    """
    from rliable import library, metrics

    x, y = _as_runs_by_tasks(scores_x), _as_runs_by_tasks(scores_y)
    if x.size == 0 or y.size == 0:
        raise ValueError("probability of improvement needs at least one score on each side")
    with seeded_global_numpy(seed):
        _, intervals = library.get_interval_estimates(
            {"pair": [x, y]},
            fast_probability_of_improvement,
            reps=reps,
            confidence_interval_size=CONFIDENCE,
        )
    low, high = np.asarray(intervals["pair"], dtype=float).reshape(2)
    return {"p": float(metrics.probability_of_improvement(x, y)), "ci": [float(low), float(high)]}


def reverse(improvement: dict[str, Any]) -> dict[str, Any]:
    low, high = improvement["ci"]
    return {"p": 1.0 - improvement["p"], "ci": [1.0 - high, 1.0 - low]}


def profile_thresholds(score_lists: Sequence[Sequence[float]], points: int = PROFILE_POINTS) -> np.ndarray:
    everything = np.concatenate([np.asarray(s, dtype=float) for s in score_lists])
    low, high = float(everything.min()), float(everything.max())
    if high == low:
        pad = max(abs(low) * 0.05, 1.0)
        low, high = low - pad, high + pad
    return np.linspace(low, high, points)


def performance_profile(
    scores_by_group: dict[str, Sequence[float]],
    taus: np.ndarray,
    higher_is_better: bool = True,
    reps: int = DEFAULT_REPS,
    seed: int = DEFAULT_SEED,
) -> dict[str, Any]:
    """Fraction of seeds scoring better than each threshold tau, with 95% bootstrap bands (rliable)."""
    from rliable import library

    def fraction_better(scores: np.ndarray, tau_list: np.ndarray) -> np.ndarray:
        # Vectorised over tau: rliable's default np.vectorize profile is ~100x slower per resample.
        flat = scores.reshape(-1, 1)
        better = flat > tau_list[None, :] if higher_is_better else flat < tau_list[None, :]
        return better.mean(axis=0)

    score_dict = {name: _as_runs_by_tasks(values) for name, values in scores_by_group.items()}
    with seeded_global_numpy(seed):
        profiles, cis = library.create_performance_profile(
            score_dict, np.asarray(taus, dtype=float), custom_profile_func=fraction_better, reps=reps
        )
    return {
        "taus": [float(t) for t in taus],
        "direction": "score > tau" if higher_is_better else "score < tau",
        "profiles": {name: [float(v) for v in profiles[name]] for name in score_dict},
        "ci_low": {name: [float(v) for v in cis[name][0]] for name in score_dict},
        "ci_high": {name: [float(v) for v in cis[name][1]] for name in score_dict},
    }


def describe(values: Sequence[float]) -> dict[str, Any]:
    array = np.asarray(values, dtype=float)
    n = int(array.size)
    if n == 0:
        return {"mean": None, "std": None, "median": None, "min": None, "max": None}
    return {
        "mean": float(array.mean()),
        "std": float(array.std(ddof=1)) if n > 1 else 0.0,
        "median": float(np.median(array)),
        "min": float(array.min()),
        "max": float(array.max()),
    }


def _seed_sort_key(run: ReportedRun) -> tuple[int, Any, str]:
    seed = run.seed
    if isinstance(seed, (int, float)) and not isinstance(seed, bool):
        return (0, seed, str(run.dir))
    return (1, str(seed), str(run.dir))


def seed_keys(runs: Sequence[ReportedRun]) -> list[str]:
    """One JSON key per run: the seed, suffixed ``#2``, ``#3`` when a seed repeats."""
    keys, counts = [], defaultdict(int)
    for run in runs:
        base = str(run.seed)
        counts[base] += 1
        keys.append(base if counts[base] == 1 else f"{base}#{counts[base]}")
    return keys


def duplicate_seed_warnings(runs: Sequence[ReportedRun], group: str) -> list[str]:
    by_seed: dict[str, list[ReportedRun]] = defaultdict(list)
    for run in runs:
        by_seed[str(run.seed)].append(run)
    return [
        f"group {group} has seed {seed} {len(same)} times ({', '.join(r.relative_dir for r in same)}); "
        "each counts as a sample, so the spread is understated if they are re-runs"
        for seed, same in by_seed.items()
        if len(same) > 1
    ]


def threshold_stats(runs: Sequence[ReportedRun]) -> dict[str, Any]:
    """Time-to-threshold over ok seeds; a seed that never reached it is null, not dropped."""
    per_seed = {key: run.get_float("time_to_threshold_s") for key, run in zip(seed_keys(runs), runs)}
    reached = sorted(t for t in per_seed.values() if t is not None)
    thresholds = {run.get_float("threshold") for run in runs} - {None}
    n = len(per_seed)
    # With never-reached seeds counted as infinitely slow the median is still defined while
    # more than half of the seeds reached the threshold.
    ordered = reached + [math.inf] * (n - len(reached))
    median_all = float(np.median(ordered)) if n else None
    return {
        "threshold": thresholds.pop() if len(thresholds) == 1 else (sorted(thresholds) or None),
        "n_seeds": n,
        "n_reached": len(reached),
        "reached_fraction": len(reached) / n if n else None,
        "per_seed_s": per_seed,
        "median_reached_s": float(np.median(reached)) if reached else None,
        "min_reached_s": reached[0] if reached else None,
        "max_reached_s": reached[-1] if reached else None,
        "median_all_s": median_all if median_all is not None and math.isfinite(median_all) else None,
    }


def config_value(runs: Sequence[ReportedRun], key: str) -> Any:
    """A resolved-config value (flat dotted key) that every run shares, or None."""
    values = {json_key(run.result.get("config") or {}, key) for run in runs}
    return values.pop() if len(values) == 1 else None


def json_key(config: dict, key: str) -> Any:
    value = config.get(key)
    return value if isinstance(value, (int, float, str)) and not isinstance(value, bool) else None


def table_value_note(runs: Sequence[ReportedRun], metric: str | None, curve: str | None) -> str | None:
    """Which evaluation the table's number is: said in the report next to the curve."""
    if not runs or metric is None:
        return None
    final_episodes = config_value(runs, "task.final_eval_episodes")
    eval_episodes = config_value(runs, "task.eval_episodes")
    if final_episodes is not None:
        during = f" ({eval_episodes} episodes each)" if eval_episodes is not None else ""
        text = (f"the table's `{metric}` is each seed's final evaluation after training ({final_episodes} greedy "
                f"episodes, `task.final_eval_episodes`)")
        if curve == metric:
            return text + f"; the curve's points are the in-training evaluations{during}, and its last point is that final evaluation"
        return text
    if curve == metric:
        return f"the table's `{metric}` is each seed's final value; the curve's last point is the same value"
    if curve:
        return f"the table's `{metric}` is each seed's final value after training; the curve draws `{curve}` during training, another metric"
    return f"the table's `{metric}` is each seed's final value after training"


def wall_times(runs: Sequence[ReportedRun]) -> dict[str, Any]:
    """What the group cost, labelled: per seed (a K-seed process's wall time / K) and per process (a batch of K)."""
    costs = [c for c in (run.seed_cost_s for run in runs) if c is not None]
    batches = {run.batch_dir: run.get_float("wall_time_s") for run in runs if run.seeds_per_process > 1}
    batch_times = [t for t in batches.values() if t is not None]
    return {
        "seeds_per_process": sorted({run.seeds_per_process for run in runs}),
        "seed_cost_s_mean": describe(costs)["mean"],
        "batch_wall_time_s_mean": describe(batch_times)["mean"],
        "n_batches": len(batches),
    }


def status_warning(group: str, status: str, n: int) -> str:
    runs = f"{n} {status} run{'s' if n != 1 else ''}"
    if status == "running":
        return f"group {group} has {n} run{'s' if n != 1 else ''} still running: this report is partial; build it again when they finish"
    if status == "interrupted":
        return f"group {group} has {runs}: resume them (each record's `interrupted.resume` says how) to complete the group"
    if status == "pruned":
        return f"group {group} has {n} run{'s' if n != 1 else ''} pruned by the tuner: shortened runs, left out of the statistics"
    if status == "failed":
        return f"group {group} has {runs}"
    return f"group {group} has {n} run{'s' if n != 1 else ''} with status {status!r}, left out of the statistics"


def group_stats(
    name: str, runs: Sequence[ReportedRun], reps: int = DEFAULT_REPS, seed: int = DEFAULT_SEED
) -> dict[str, Any]:
    """Everything the report says about one configuration's seeds."""
    runs = sorted(runs, key=_seed_sort_key)
    warnings_out: list[str] = []
    ok_runs = [run for run in runs if run.ok]
    # Every status a record can hold is counted and listed (failed, interrupted, pruned, running, and any
    # other a record names); none of them enters the statistics.
    not_ok: dict[str, list[dict[str, Any]]] = {status: [] for status in STATUSES if status != "ok"}
    for run in runs:
        if not run.ok:
            not_ok.setdefault(run.status, []).append(
                {"seed": run.seed, "error": run.error, "dir": str(run.dir), "relative_dir": run.relative_dir}
            )
    failed = not_ok["failed"]
    metric_counts = Counter(run.primary_metric for run in runs if run.primary_metric)
    metric = metric_counts.most_common(1)[0][0] if metric_counts else None
    if len(metric_counts) > 1:
        warnings_out.append(
            f"group {name} mixes primary metrics {sorted(metric_counts)}; only {metric} (the most common) is summarised"
        )
    directions = {run.higher_is_better for run in runs}
    higher_is_better = directions != {False}

    valid, excluded = [], []
    for run in ok_runs:
        if run.primary_metric != metric:
            excluded.append((run, f"primary metric {run.primary_metric} differs from the group's {metric}"))
        elif run.primary_value is None:
            excluded.append((run, f"ok run without a finite value for {metric}"))
        else:
            valid.append(run)

    warnings_out += duplicate_seed_warnings(valid, name)
    per_seed = {}
    for key, run in zip(seed_keys(valid), valid):
        entry = {
            "seed": run.seed,
            "value": run.primary_value,
            "wall_time_s": run.get_float("wall_time_s"),
            "seed_cost_s": run.seed_cost_s,
            "dir": str(run.dir),
            "relative_dir": run.relative_dir,
        }
        if run.is_rl:
            entry.update(
                time_to_threshold_s=run.get_float("time_to_threshold_s"),
                env_steps=run.get_float("env_steps"),
                env_steps_per_s=run.get_float("env_steps_per_s"),
            )
        per_seed[key] = entry
    values = [run.primary_value for run in valid]

    stats: dict[str, Any] = {
        "group": name,
        "experiment": runs[0].result.get("experiment"),
        "task": runs[0].result.get("task"),
        "primary_metric": metric,
        "higher_is_better": higher_is_better,
        "primary_curve": next((run.primary_curve for run in runs if run.primary_curve), None),
        "table_value": table_value_note(valid, metric, next((run.primary_curve for run in runs if run.primary_curve), None)),
        "n_runs": len(runs),
        "n_ok": len(valid),
        "n_failed": len(failed),
        "n_interrupted": len(not_ok["interrupted"]),
        "n_pruned": len(not_ok["pruned"]),
        "n_running": len(not_ok["running"]),
        "status_counts": {"ok": len(ok_runs), **{status: len(entries) for status, entries in not_ok.items()}},
        "n_excluded": len(excluded),
        "values": values,
        "per_seed": per_seed,
        **describe(values),
        "iqm": None,
        "iqm_ci": None,
        "mean_ci": None,
        "ci_note": None,
        "failed": failed,
        "interrupted": not_ok["interrupted"],
        "pruned": not_ok["pruned"],
        "running": not_ok["running"],
        "other_status": {status: entries for status, entries in not_ok.items() if status not in STATUSES},
        "excluded": [
            {"seed": run.seed, "reason": reason, "dir": str(run.dir), "relative_dir": run.relative_dir}
            for run, reason in excluded
        ],
        **wall_times(valid),
        "threshold": threshold_stats([run for run in ok_runs if run.is_rl]) if any(r.is_rl for r in ok_runs) else None,
    }
    if values:
        estimates = interval_estimates(values, reps=reps, seed=seed)
        stats.update(iqm=estimates["iqm"], iqm_ci=estimates["iqm_ci"], mean_ci=estimates["mean_ci"])
        stats["ci_note"] = estimates["ci_note"]

    for run, reason in excluded:
        warnings_out.append(f"group {name}, seed {run.seed} ({run.relative_dir}) excluded: {reason}")
    if len(valid) < MIN_SEEDS:
        warnings_out.append(
            f"group {name} has only {len(valid)} ok seed{'s' if len(valid) != 1 else ''}; "
            f"with fewer than {MIN_SEEDS} the CIs are wide and a comparison is anecdotal, "
            "run more seeds (e.g. seed='range(0,10)')"
        )
    for status, entries in not_ok.items():
        if entries:
            warnings_out.append(status_warning(name, status, len(entries)))
    stats["warnings"] = warnings_out
    return stats


def compare_groups(
    groups: dict[str, dict[str, Any]], reps: int = DEFAULT_REPS, seed: int = DEFAULT_SEED
) -> tuple[dict[str, Any], list[str]]:
    """Probability of improvement for every ordered pair and performance profiles, per primary metric.

    Only groups that share a primary metric are compared: mixing accuracy and return is meaningless.
    """
    by_metric: dict[str, list[str]] = defaultdict(list)
    for name, stats in groups.items():
        if stats["primary_metric"] and stats["values"]:
            by_metric[stats["primary_metric"]].append(name)
    comparisons: dict[str, Any] = {}
    notes: list[str] = []
    for metric, names in sorted(by_metric.items()):
        if len(names) < 2:
            continue
        directions = {groups[name]["higher_is_better"] for name in names}
        higher_is_better = directions != {False}
        if len(directions) > 1:
            notes.append(f"groups on {metric} disagree on higher_is_better; comparing as higher is better")
        sign = 1.0 if higher_is_better else -1.0
        improvements = []
        for x, y in itertools.combinations(names, 2):
            forward = probability_of_improvement(
                sign * np.asarray(groups[x]["values"]), sign * np.asarray(groups[y]["values"]), reps=reps, seed=seed
            )
            improvements.append({"x": x, "y": y, **forward})
            improvements.append({"x": y, "y": x, **reverse(forward)})
        scores = {name: groups[name]["values"] for name in names}
        comparisons[metric] = {
            "groups": names,
            "higher_is_better": higher_is_better,
            "probability_of_improvement": improvements,
            "performance_profile": performance_profile(
                scores, profile_thresholds(list(scores.values())), higher_is_better, reps=reps, seed=seed
            ),
        }
    return comparisons, notes

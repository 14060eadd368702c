"""Report figures: learning curves, final-score strips, IQM CIs, time to threshold,
performance profiles and probability of improvement. Each function writes one PNG and returns its
image entry ``{"kind", "file", "title", "metric"}`` (``file`` relative to the report dir).

Figures are plain ``matplotlib.figure.Figure`` objects rendered by Agg on save, never pyplot: building a
report in a notebook or a training process must not switch the user's backend or leak open figures.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure

DPI = 110
JITTER = 0.12


def group_colors(names: Sequence[str]) -> dict[str, Any]:
    cmap = matplotlib.colormaps["tab10" if len(names) <= 10 else "tab20"]
    return {name: cmap(i % cmap.N) for i, name in enumerate(names)}


def _subplots(figsize: tuple[float, float], **kwargs: Any) -> tuple[Figure, Any]:
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(**kwargs)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_") or "metric"


def _file_name(kind: str, key: str | None, multiple: bool) -> str:
    return f"{kind}-{_slug(key)}.png" if multiple and key else f"{kind}.png"


def _save(fig: Figure, out_dir: Path, name: str) -> None:
    fig.tight_layout()
    fig.savefig(out_dir / name, dpi=DPI)


def _label(name: str, n: int) -> str:
    return f"{name} (n={n})"


def plot_learning_curves(
    groups: dict[str, dict[str, Any]], curve_seeds: dict[str, list], colors: dict[str, Any], out_dir: Path
) -> list[dict[str, Any]]:
    """One figure per curve metric: each group's IQM with its bootstrap band, and thin per-seed lines,
    solid while the seed ran and dashed where it stopped early and holds its final evaluation. Where the
    curve ends with the final evaluation (the table's IQM), that point is a marker with the table's CI."""
    by_metric: dict[str, list[str]] = defaultdict(list)
    for name, stats in groups.items():
        if stats.get("curve"):
            by_metric[stats["curve"]["metric"]].append(name)
    images = []
    for metric, names in sorted(by_metric.items()):
        fig, ax = _subplots((8, 5))
        any_held = any_final = False
        for name in names:
            curve, color = groups[name]["curve"], colors[name]
            final = curve.get("last_point") == "final"
            any_final |= final
            end = curve["steps"][-1]
            for steps, values, held in curve_seeds[name]:
                ax.plot(steps, values, color=color, alpha=0.3, linewidth=0.8)
                if steps[-1] < end:
                    any_held = True
                    level = values[-1] if held is None else held
                    ax.plot([steps[-1], end], [level, level], color=color, alpha=0.5, linewidth=0.9, linestyle="--")
            steps = np.asarray(curve["steps"], dtype=float)
            iqm, low, high = (np.asarray(curve[k], dtype=float) for k in ("iqm", "ci_low", "ci_high"))
            last = len(steps) - 1 if final else len(steps)  # the final point is drawn on its own below
            ax.plot(steps[:last], iqm[:last], color=color, linewidth=2.2, label=f"{_label(name, len(curve_seeds[name]))} IQM")
            if len(curve_seeds[name]) > 1:
                ax.fill_between(steps[:last], low[:last], high[:last], color=color, alpha=0.2, linewidth=0)
            if final:
                ax.errorbar(steps[-1], iqm[-1], yerr=[[max(iqm[-1] - low[-1], 0.0)], [max(high[-1] - iqm[-1], 0.0)]],
                            fmt="D", color=color, markeredgecolor="k", markersize=7, capsize=4, zorder=5)
        bounds = groups[names[0]]["curve"]["bounds"]
        if bounds:
            low, high = ax.get_ylim()
            pad = 0.03 * ((bounds[1] if bounds[1] is not None else high) - (bounds[0] if bounds[0] is not None else low))
            ax.set_ylim(low if bounds[0] is None else bounds[0] - pad, high if bounds[1] is None else bounds[1] + pad)
        ax.set_xlabel(" / ".join(sorted({groups[n]["curve"]["x"] for n in names})))
        ax.set_ylabel(metric)
        notes = ["IQM over seeds, 95% stratified bootstrap band, thin lines = seeds"]
        if any_final:
            notes.append("diamond = final evaluation (the table's IQM and CI)")
        if any_held:
            notes.append("dashed = a seed that stopped early, held at its " + ("final" if any_final else "last") + " evaluation")
        ax.set_title(f"Learning curves: {metric}\n" + "\n".join(notes), fontsize="medium")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="best")
        file = _file_name("learning_curves", metric, len(by_metric) > 1)
        _save(fig, out_dir, file)
        images.append({"kind": "learning_curves", "file": file, "title": f"Learning curves ({metric})", "metric": metric})
    return images


def _by_metric(groups: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    by_metric: dict[str, list[str]] = defaultdict(list)
    for name, stats in groups.items():
        if stats["primary_metric"] and stats["values"]:
            by_metric[stats["primary_metric"]].append(name)
    return dict(sorted(by_metric.items()))


def plot_final_scores(
    groups: dict[str, dict[str, Any]], colors: dict[str, Any], out_dir: Path
) -> list[dict[str, Any]]:
    by_metric = _by_metric(groups)
    rng = np.random.default_rng(0)
    images = []
    for metric, names in by_metric.items():
        fig, ax = _subplots((max(5.0, 1.4 * len(names) + 2), 5))
        for i, name in enumerate(names):
            values = np.asarray(groups[name]["values"])
            jitter = rng.uniform(-JITTER, JITTER, size=values.size) if values.size > 1 else np.zeros(1)
            ax.scatter(i + jitter, values, color=colors[name], alpha=0.8, s=36, edgecolor="k", linewidth=0.4,
                       label="seed" if i == 0 else None, zorder=3)
            ax.hlines(groups[name]["mean"], i - 0.3, i + 0.3, color="k", linewidth=2,
                      label="mean" if i == 0 else None, zorder=4)
            ax.scatter([i + 0.34], [groups[name]["iqm"]], marker="D", color="crimson", s=50,
                       label="IQM" if i == 0 else None, zorder=4)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels([_label(n, groups[n]["n_ok"]) for n in names], rotation=20, ha="right")
        ax.set_xlim(-0.6, len(names) - 0.4)
        ax.set_xlabel("group")
        ax.set_ylabel(f"final {metric}")
        arrow = "higher is better" if groups[names[0]]["higher_is_better"] else "lower is better"
        ax.set_title(f"Final {metric} per seed ({arrow})")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize="small", loc="best")
        file = _file_name("final_scores", metric, len(by_metric) > 1)
        _save(fig, out_dir, file)
        images.append({"kind": "final_scores", "file": file, "title": f"Final {metric} per seed", "metric": metric})
    return images


def plot_interval_estimates(
    groups: dict[str, dict[str, Any]], colors: dict[str, Any], out_dir: Path
) -> list[dict[str, Any]]:
    by_metric = _by_metric(groups)
    images = []
    for metric, names in by_metric.items():
        fig, axes = _subplots((10, 1.0 + 0.6 * len(names)), ncols=2, sharey=True, squeeze=False)
        for ax, (key, title) in zip(axes[0], (("iqm", "IQM"), ("mean", "Mean"))):
            for i, name in enumerate(names):
                point = groups[name][key]
                low, high = groups[name][f"{key}_ci"]
                # A percentile CI need not contain the point (skewed resamples); clamp so it still draws.
                xerr = [[max(point - low, 0.0)], [max(high - point, 0.0)]]
                ax.errorbar(point, i, xerr=xerr, fmt="o", color=colors[name],
                            capsize=5, markersize=7, linewidth=2)
            ax.set_title(f"{title} with 95% bootstrap CI")
            ax.set_xlabel(metric)
            ax.grid(axis="x", alpha=0.3)
        axes[0][0].set_yticks(range(len(names)))
        axes[0][0].set_yticklabels([_label(n, groups[n]["n_ok"]) for n in names])
        axes[0][0].set_ylim(-0.6, len(names) - 0.4)
        axes[0][0].invert_yaxis()
        fig.suptitle(f"Aggregate {metric} over seeds (stratified bootstrap, percentile CI)")
        file = _file_name("interval_estimates", metric, len(by_metric) > 1)
        _save(fig, out_dir, file)
        images.append({"kind": "interval_estimates", "file": file, "title": f"IQM and mean of {metric} with 95% CIs",
                       "metric": metric})
    return images


def plot_time_to_threshold(
    groups: dict[str, dict[str, Any]], colors: dict[str, Any], out_dir: Path
) -> list[dict[str, Any]]:
    names = [name for name, stats in groups.items() if stats["threshold"] and stats["threshold"]["n_seeds"]]
    if not names:
        return []
    reached_all = [t for n in names for t in groups[n]["threshold"]["per_seed_s"].values() if t is not None]
    top = max(reached_all) if reached_all else 1.0
    never_x = top * 1.15 if top > 0 else 1.0
    fig, ax = _subplots((9, 1.4 + 0.6 * len(names)))
    rng = np.random.default_rng(0)
    never_labelled = False
    for i, name in enumerate(names):
        times = list(groups[name]["threshold"]["per_seed_s"].values())
        reached = np.array([t for t in times if t is not None], dtype=float)
        never = sum(t is None for t in times)
        if reached.size:
            ax.scatter(reached, i + rng.uniform(-JITTER, JITTER, reached.size), color=colors[name], s=36,
                       edgecolor="k", linewidth=0.4, label="seed reached threshold" if i == 0 else None, zorder=3)
            ax.vlines(np.median(reached), i - 0.3, i + 0.3, color="k", linewidth=2,
                      label="median of reached" if i == 0 else None)
        if never:
            ax.scatter(np.full(never, never_x), i + rng.uniform(-JITTER, JITTER, never), marker="x", color="crimson",
                       s=50, label=None if never_labelled else "never reached", zorder=3)
            never_labelled = True
    ax.axvline(top * 1.075 if top > 0 else 0.5, color="grey", linestyle="--", linewidth=1)
    ax.text(never_x, len(names) - 0.45, "never", ha="center", va="bottom", color="crimson", fontsize="small")
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(
        [f"{n} ({groups[n]['threshold']['n_reached']}/{groups[n]['threshold']['n_seeds']} reached)" for n in names]
    )
    ax.set_ylim(-0.6, len(names) - 0.2)
    ax.invert_yaxis()
    ax.set_xlim(left=0, right=never_x * 1.08)
    ax.set_xlabel("wall-clock seconds to reach the threshold")
    thresholds = {str(groups[n]["threshold"]["threshold"]) for n in names}
    ax.set_title(f"Time to threshold per seed (threshold {', '.join(sorted(thresholds))})")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    _save(fig, out_dir, "time_to_threshold.png")
    return [{"kind": "time_to_threshold", "file": "time_to_threshold.png", "title": "Time to threshold per seed",
             "metric": None}]


def plot_performance_profiles(
    comparisons: dict[str, dict[str, Any]], colors: dict[str, Any], out_dir: Path
) -> list[dict[str, Any]]:
    from rliable import plot_utils

    images = []
    for metric, comparison in comparisons.items():
        profile = comparison["performance_profile"]
        names = comparison["groups"]
        fig, ax = _subplots((8, 5))
        plot_utils.plot_performance_profiles(
            {n: np.asarray(profile["profiles"][n]) for n in names},
            np.asarray(profile["taus"]),
            performance_profile_cis={
                n: (np.asarray(profile["ci_low"][n]), np.asarray(profile["ci_high"][n])) for n in names
            },
            ax=ax,
            colors={n: colors[n] for n in names},
            xlabel=rf"{metric} threshold $\tau$",
            ylabel=rf"fraction of seeds with {metric} {'>' if comparison['higher_is_better'] else '<'} $\tau$",
            labelsize="medium",
            ticklabelsize="medium",
        )
        ax.set_title(f"Performance profile of {metric} (95% bootstrap bands)")
        ax.legend(fontsize="small", loc="best")
        file = _file_name("performance_profile", metric, len(comparisons) > 1)
        _save(fig, out_dir, file)
        images.append({"kind": "performance_profile", "file": file, "title": f"Performance profile ({metric})",
                       "metric": metric})
    return images


def plot_probability_of_improvement(
    comparisons: dict[str, dict[str, Any]], out_dir: Path
) -> list[dict[str, Any]]:
    images = []
    for metric, comparison in comparisons.items():
        pairs = comparison["probability_of_improvement"]
        fig, ax = _subplots((10, 1.8 + 0.45 * len(pairs)))
        for i, pair in enumerate(pairs):
            low, high = pair["ci"]
            # A degenerate CI (e.g. P = 1 on every resample) still gets a visible sliver.
            width = max(high - low, 0.006)
            ax.barh(i, width, left=min(low, 1.0 - width), height=0.6,
                    color="tab:blue" if pair["p"] >= 0.5 else "tab:orange", alpha=0.6)
            ax.vlines(pair["p"], i - 0.3, i + 0.3, color="k", linewidth=2)
            ax.text(1.04, i, f"{pair['p']:.2f} [{low:.2f}, {high:.2f}]", va="center", fontsize="small")
        ax.axvline(0.5, color="grey", linestyle="--", linewidth=1)
        ax.set_yticks(range(len(pairs)))
        ax.set_yticklabels([f"{p['x']}  vs  {p['y']}" for p in pairs])
        ax.set_ylim(-0.6, len(pairs) - 0.4)
        ax.invert_yaxis()
        ax.set_xlim(-0.02, 1.02)
        better = "higher" if comparison["higher_is_better"] else "lower"
        ax.set_xlabel(f"P(X better than Y): chance that a seed of X has {better} {metric}")
        ax.set_ylabel("X  vs  Y")
        ax.set_title(f"Probability of improvement on {metric}\n"
                     "bar = 95% bootstrap CI, tick = estimate, dashed = no difference")
        ax.grid(axis="x", alpha=0.3)
        file = _file_name("probability_of_improvement", metric, len(comparisons) > 1)
        _save(fig, out_dir, file)
        images.append({"kind": "probability_of_improvement", "file": file,
                       "title": f"Probability of improvement ({metric})", "metric": metric})
    return images


def make_plots(summary: dict[str, Any], out_dir: Path) -> list[dict[str, Any]]:
    """Write every figure that the data supports into ``out_dir``."""
    groups, comparisons = summary["groups"], summary["comparisons"]
    colors = group_colors(list(groups))
    return [
        *plot_learning_curves(groups, summary["curve_seeds"], colors, out_dir),
        *plot_final_scores(groups, colors, out_dir),
        *plot_interval_estimates(groups, colors, out_dir),
        *plot_time_to_threshold(groups, colors, out_dir),
        *plot_performance_profiles(comparisons, colors, out_dir),
        *plot_probability_of_improvement(comparisons, out_dir),
    ]

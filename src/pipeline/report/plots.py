"""Report figures: learning curves, final-score strips, IQM CIs, time to threshold,
performance profiles and probability of improvement. Each function writes one PNG and returns its
image entry ``{"kind", "file", "title", "metric"}`` (``file`` relative to the report dir).

Figures are plain ``matplotlib.figure.Figure`` objects rendered by Agg on save, never pyplot: building a
report in a notebook or a training process must not switch the user's backend or leak open figures.
"""

from __future__ import annotations

import re
import textwrap
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.style
import numpy as np
from matplotlib.figure import Figure

DPI = 110
JITTER = 0.12
LABEL_CHARS = 44  # group names wrap past this many characters
LEGEND_INSIDE = 4  # legends with more entries go beside the axes
HEATMAP_GROUPS = 5  # probability of improvement: pairs as bars up to this many groups, a matrix beyond


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


def fit_to_text(fig: Figure, margin: float = 0.08, rounds: int = 4) -> None:
    """Lay the figure out so that every label, title and legend lies inside it: tight_layout, then, where text
    still reaches past an edge (labels wider than the figure), grow the figure by the overhang and lay out again."""
    import warnings

    for _ in range(rounds):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "not compatible with tight_layout": the next round makes room
            fig.tight_layout()
        fig.canvas.draw()  # Agg (plain Figure): positions of text depend on the renderer
        box = fig.get_tightbbox(fig.canvas.get_renderer())
        width, height = fig.get_size_inches()
        over = [max(0.0, -box.x0), max(0.0, box.x1 - width), max(0.0, -box.y0), max(0.0, box.y1 - height)]
        if max(over) <= 0.01:
            return
        fig.set_size_inches(width + over[0] + over[1] + 2 * margin, height + over[2] + over[3] + 2 * margin)


def _save(fig: Figure, out_dir: Path, name: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fit_to_text(fig)
    fig.savefig(out_dir / name, dpi=DPI)


def wrap(text: str, width: int = LABEL_CHARS) -> str:
    """A long group name on several lines, broken between its overrides (never inside one)."""
    return textwrap.fill(text, width=width, break_long_words=False, break_on_hyphens=False)


def _label(name: str, n: int) -> str:
    return wrap(f"{name} (n={n})")


def _legend(ax: Any, entries: int) -> None:
    """Inside the axes while it is small; beside them (the figure grows to hold it) when it would hide the data."""
    if entries <= LEGEND_INSIDE:
        ax.legend(fontsize="small", loc="best")
    else:
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


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
        _legend(ax, len(names))
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
        # One row per group (names on the left never collide, however many and however long).
        fig, ax = _subplots((9, 1.4 + 0.7 * len(names)))
        for i, name in enumerate(names):
            values = np.asarray(groups[name]["values"])
            jitter = rng.uniform(-JITTER, JITTER, size=values.size) if values.size > 1 else np.zeros(1)
            ax.scatter(values, i + jitter, color=colors[name], alpha=0.8, s=36, edgecolor="k", linewidth=0.4,
                       label="seed" if i == 0 else None, zorder=3)
            ax.vlines(groups[name]["mean"], i - 0.3, i + 0.3, color="k", linewidth=2,
                      label="mean" if i == 0 else None, zorder=4)
            ax.scatter([groups[name]["iqm"]], [i + 0.34], marker="D", color="crimson", s=50,
                       label="IQM" if i == 0 else None, zorder=4)
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels([_label(n, groups[n]["n_ok"]) for n in names])
        ax.set_ylim(-0.6, len(names) - 0.4)
        ax.invert_yaxis()
        ax.set_xlabel(f"final {metric}")
        arrow = "higher is better" if groups[names[0]]["higher_is_better"] else "lower is better"
        ax.set_title(f"Final {metric} per seed ({arrow})")
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
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
        fig, axes = _subplots((10, 1.2 + 0.7 * len(names)), ncols=2, sharey=True, squeeze=False)
        for ax, (key, title) in zip(axes[0], (("iqm", "IQM"), ("mean", "Mean"))):
            for i, name in enumerate(names):
                point = groups[name][key]
                low, high = groups[name][f"{key}_ci"]
                # A percentile CI need not contain the point (skewed resamples); clamp so it still draws.
                xerr = [[max(point - low, 0.0)], [max(high - point, 0.0)]]
                ax.errorbar(point, i, xerr=xerr, fmt="o", color=colors[name],
                            capsize=5, markersize=7, linewidth=2)
            ax.set_title(f"{title}, 95% bootstrap CI")
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
        [wrap(f"{n} ({groups[n]['threshold']['n_reached']}/{groups[n]['threshold']['n_seeds']} reached)") for n in names]
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
        handles, labels = ax.get_legend_handles_labels()
        ax.legend(handles, [wrap(label) for label in labels], fontsize="small",
                  **({"loc": "best"} if len(names) <= LEGEND_INSIDE else
                     {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0}))
        file = _file_name("performance_profile", metric, len(comparisons) > 1)
        _save(fig, out_dir, file)
        images.append({"kind": "performance_profile", "file": file, "title": f"Performance profile ({metric})",
                       "metric": metric})
    return images


def _pairs_once(comparison: dict[str, Any]) -> list[dict[str, Any]]:
    """Each unordered pair once (P(Y > X) is 1 - P(X > Y)), the better-scoring group first."""
    seen, pairs = set(), []
    for pair in comparison["probability_of_improvement"]:
        key = frozenset((pair["x"], pair["y"]))
        if key in seen:
            continue
        seen.add(key)
        if pair["p"] < 0.5:
            pair = next(p for p in comparison["probability_of_improvement"] if (p["x"], p["y"]) == (pair["y"], pair["x"]))
        pairs.append(pair)
    return pairs


def _improvement_bars(ax: Any, pairs: list[dict[str, Any]], metric: str, better: str) -> None:
    for i, pair in enumerate(pairs):
        low, high = pair["ci"]
        # A degenerate CI (e.g. P = 1 on every resample) still gets a visible sliver.
        width = max(high - low, 0.006)
        ax.barh(i, width, left=min(low, 1.0 - width), height=0.6,
                color="tab:blue" if low > 0.5 else "tab:gray", alpha=0.6)
        ax.vlines(pair["p"], i - 0.3, i + 0.3, color="k", linewidth=2)
    ax.axvline(0.5, color="grey", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(pairs)))
    ax.set_yticklabels([f"{wrap(p['x'])}\n  vs  {wrap(p['y'])}" for p in pairs], fontsize="small")
    ax.set_ylim(-0.6, len(pairs) - 0.4)
    ax.invert_yaxis()
    ax.set_xlim(-0.02, 1.02)
    # The values as tick labels of a twin axis: part of the layout, so never cut off at the edge.
    values = ax.twinx()
    values.set_ylim(ax.get_ylim())
    values.set_yticks(range(len(pairs)))
    values.set_yticklabels([f"{p['p']:.2f} [{p['ci'][0]:.2f}, {p['ci'][1]:.2f}]" for p in pairs], fontsize="small")
    values.set_ylabel("P [95% CI]")
    ax.set_xlabel(f"P(X better than Y): chance that a seed of X has {better} {metric}")
    ax.grid(axis="x", alpha=0.3)


def _improvement_matrix(fig: Figure, ax: Any, comparison: dict[str, Any], metric: str, better: str) -> None:
    names = comparison["groups"]
    index = {name: i for i, name in enumerate(names)}
    matrix = np.full((len(names), len(names)), np.nan)
    for pair in comparison["probability_of_improvement"]:
        matrix[index[pair["x"]], index[pair["y"]]] = pair["p"]
    image = ax.imshow(matrix, cmap="RdBu", vmin=0.0, vmax=1.0)
    for (i, j), p in np.ndenumerate(matrix):
        if np.isfinite(p):
            ax.text(j, i, f"{p:.2f}", ha="center", va="center", fontsize="x-small",
                    color="white" if abs(p - 0.5) > 0.35 else "black")
    # Names on the rows, numbers on the columns: a dozen long names side by side would overlap.
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([str(i + 1) for i in range(len(names))], fontsize="small")
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels([f"{wrap(name, 36)}  {i + 1}" for i, name in enumerate(names)], fontsize="small")
    ax.set_xlabel("Y (numbered as the rows)")
    ax.set_ylabel("X")
    fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02).set_label(f"P(X better than Y): X has {better} {metric}")


def plot_probability_of_improvement(
    comparisons: dict[str, dict[str, Any]], out_dir: Path
) -> list[dict[str, Any]]:
    """Pairs as bars with their CI (each pair once, the better group first) up to HEATMAP_GROUPS groups; beyond,
    a matrix of P(row better than column) (the CIs are in report.md's table)."""
    images = []
    for metric, comparison in comparisons.items():
        better = "higher" if comparison["higher_is_better"] else "lower"
        if len(comparison["groups"]) <= HEATMAP_GROUPS:
            pairs = _pairs_once(comparison)
            fig, ax = _subplots((9, 1.8 + 0.7 * len(pairs)))
            _improvement_bars(ax, pairs, metric, better)
            how = "bar = 95% bootstrap CI (blue: all above 0.5), tick = estimate, dashed = no difference"
        else:
            n = len(comparison["groups"])
            fig, ax = _subplots((3.0 + 0.55 * n, 2.5 + 0.5 * n))
            _improvement_matrix(fig, ax, comparison, metric, better)
            how = "row X against column Y; 0.5 = no difference; the 95% CIs are in report.md"
        ax.set_title(f"Probability of improvement on {metric}\n{how}", fontsize="medium")
        file = _file_name("probability_of_improvement", metric, len(comparisons) > 1)
        _save(fig, out_dir, file)
        images.append({"kind": "probability_of_improvement", "file": file,
                       "title": f"Probability of improvement ({metric})", "metric": metric})
    return images


def make_plots(summary: dict[str, Any], out_dir: Path) -> list[dict[str, Any]]:
    """Write every figure that the data supports into ``out_dir``."""
    groups, comparisons = summary["groups"], summary["comparisons"]
    colors = group_colors(list(groups))
    # Matplotlib's default style, whatever the process set globally (Optuna's plots switch it to ggplot).
    with matplotlib.style.context("default"):
        return _draw_all(groups, comparisons, summary, colors, out_dir)


def _draw_all(groups: dict[str, Any], comparisons: dict[str, Any], summary: dict[str, Any], colors: dict[str, Any],
              out_dir: Path) -> list[dict[str, Any]]:
    return [
        *plot_learning_curves(groups, summary["curve_seeds"], colors, out_dir),
        *plot_final_scores(groups, colors, out_dir),
        *plot_interval_estimates(groups, colors, out_dir),
        *plot_time_to_threshold(groups, colors, out_dir),
        *plot_performance_profiles(comparisons, colors, out_dir),
        *plot_probability_of_improvement(comparisons, out_dir),
    ]

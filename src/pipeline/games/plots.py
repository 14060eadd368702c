"""Figures and coverage for counterfactual tables (the dicts `pipeline.games.rmac.counterfactual_table` returns).

`plot_revenue_vs_reserve` redraws the paper's auction figure: predicted revenue against the
second-price reserve, the point estimate (a band across seeds when several tables are given),
the robust bounds of each epsilon as shaded bands, and the truth dashed when the tables carry
``.../truth`` keys (merge `truth_table` in for simulated data). Uses matplotlib's Agg canvas
directly, so it never touches the global pyplot backend.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from pipeline.games.rules import eps_label, parse_rule


def _second_price_rules(table: Mapping[str, float], prefix: str) -> list[tuple[float, str]]:
    found = set()
    for key in table:
        m = re.fullmatch(rf"{re.escape(prefix)}/(second_price_r[^/]+)/point", key)
        if m:
            rule = parse_rule(m.group(1))
            found.add((rule.reserve, rule.name))
    return sorted(found)


def _epsilons(table: Mapping[str, float], prefix: str) -> list[str]:
    labels = {
        m.group(1) for key in table if (m := re.fullmatch(rf"{re.escape(prefix)}/[^/]+/lower_eps(.+)", key))
    }
    return sorted(labels, key=float)


def plot_revenue_vs_reserve(
    tables: Sequence[Mapping[str, float]],
    out_path: str | Path,
    title: str | None = None,
    prefix: str = "cf",
) -> Path:
    """Save a PNG of revenue vs reserve for the second-price rules found in ``tables`` (one per seed).

    Bounds are drawn as the seeds' mean lower to mean upper bound, the widest epsilon palest.
    Set ``prefix="cfw"`` for welfare tables.
    """
    if not tables:
        raise ValueError("plot_revenue_vs_reserve needs at least one table")
    rules = _second_price_rules(tables[0], prefix)
    if not rules:
        raise ValueError(f"no '{prefix}/second_price_r<reserve>/point' keys in the first table")
    reserves = np.array([r for r, _ in rules])

    def column(what: str) -> np.ndarray:
        return np.array([[t[f"{prefix}/{name}/{what}"] for _, name in rules] for t in tables])

    fig = Figure(figsize=(6.4, 4.4), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    labels = _epsilons(tables[0], prefix)
    shades = np.linspace(0.12, 0.35, len(labels)) if labels else []
    for label, alpha in zip(reversed(labels), shades):
        lower, upper = column(f"lower_eps{label}").mean(0), column(f"upper_eps{label}").mean(0)
        ax.fill_between(
            reserves, lower, upper, color="tab:blue", alpha=alpha, lw=0, label=f"bounds, eps={label}"
        )
    point = column("point")
    ax.plot(reserves, point.mean(0), color="tab:blue", lw=2, label="point estimate (eps=0)")
    if len(tables) > 1:
        ax.fill_between(
            reserves,
            point.min(0),
            point.max(0),
            color="tab:orange",
            alpha=0.35,
            lw=0,
            label=f"point, range over {len(tables)} seeds",
        )
    if all(f"{prefix}/{name}/truth" in t for t in tables for _, name in rules):
        ax.plot(reserves, column("truth")[0], "k--", lw=1.5, label="truth")
    statistic = "welfare" if prefix == "cfw" else "revenue"
    ax.set_xlabel("reserve price (second price)")
    ax.set_ylabel(f"expected {statistic}")
    ax.set_title(title or f"Counterfactual {statistic} vs reserve")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path)
    return out_path


def coverage(
    tables: Sequence[Mapping[str, float]],
    rules: Sequence[str],
    epsilons: Sequence[float],
    prefix: str = "cf",
) -> dict[str, dict[float, float]]:
    """Fraction of tables (seeds) whose bounds contain the truth: ``{rule: {eps: fraction}}``.

    Every table must carry ``<prefix>/<rule>/truth`` (merge in `truth_table`).
    """
    if not tables:
        raise ValueError("coverage needs at least one table")
    result: dict[str, dict[float, float]] = {}
    for rule in rules:
        name = parse_rule(rule).name
        result[name] = {}
        for eps in epsilons:
            hits = []
            for table in tables:
                base = f"{prefix}/{name}"
                if f"{base}/truth" not in table:
                    raise KeyError(f"{base}/truth missing: merge truth_table(...) into each table first")
                lower, upper = (
                    table[f"{base}/lower_eps{eps_label(eps)}"],
                    table[f"{base}/upper_eps{eps_label(eps)}"],
                )
                hits.append(lower <= table[f"{base}/truth"] <= upper)
            result[name][eps] = sum(hits) / len(hits)
    return result

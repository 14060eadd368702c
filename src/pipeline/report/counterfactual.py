"""Report section for counterfactual-auction sweeps: coverage of the robust bounds over seeds, and the figure."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pipeline.report.collect import ReportedRun

_TRUTH = re.compile(r"^cf/(?P<rule>[^/]+)/truth$")
_EPS = re.compile(r"^cf/[^/]+/lower_eps(?P<eps>[0-9.e-]+)$")


def counterfactual_sections(runs: list[ReportedRun], out_dir: Path) -> dict[str, Any]:
    """{group: {n_seeds, coverage: {rule: {eps: fraction}}, figure}} for groups of ok runs with cf/ truths."""
    from pipeline.games.plots import coverage, plot_revenue_vs_reserve

    by_group: dict[str, list[dict]] = {}
    for run in runs:
        metrics = run.result.get("metrics") or {}
        if run.result.get("status") == "ok" and any(_TRUTH.match(k) for k in metrics):
            by_group.setdefault(run.group, []).append(metrics)
    sections: dict[str, Any] = {}
    for i, (group, tables) in enumerate(sorted(by_group.items())):
        rules = sorted({m.group("rule") for k in tables[0] if (m := _TRUTH.match(k))})
        epsilons = sorted({float(m.group("eps")) for k in tables[0] if (m := _EPS.match(k))})
        cover = coverage(tables, rules, epsilons)
        section: dict[str, Any] = {
            "n_seeds": len(tables),
            "coverage": {rule: {str(e): frac for e, frac in by_eps.items()} for rule, by_eps in cover.items()},
        }
        if any(r.startswith("second_price") for r in rules):
            name = f"revenue_vs_reserve_{i}.png"
            plot_revenue_vs_reserve(tables, out_dir / name, title=f"{group}: revenue vs reserve over {len(tables)} seed(s)")
            section["figure"] = name
        sections[group] = section
    return sections


def counterfactual_markdown(sections: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for group, section in sections.items():
        epsilons = sorted({e for by_eps in section["coverage"].values() for e in by_eps}, key=float)
        lines += [
            f"## Counterfactual coverage: {group}",
            "",
            f"Fraction of the {section['n_seeds']} seed(s) whose robust bounds contain the true value.",
            "",
            "| rule | " + " | ".join(f"eps {e}" for e in epsilons) + " |",
            "|---|" + "---|" * len(epsilons),
        ]
        for rule, by_eps in section["coverage"].items():
            lines.append(f"| {rule} | " + " | ".join(f"{by_eps.get(e, float('nan')):.2f}" for e in epsilons) + " |")
        if "figure" in section:
            lines += ["", f"![revenue vs reserve]({section['figure']})"]
        lines.append("")
    return lines

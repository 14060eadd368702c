"""Render the report dict as a Markdown page that reads on its own (tables, warnings, figures)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pipeline.report.collect import NOT_OK

ERROR_CELL_CHARS = 240
STATUS_TITLES = {"failed": "Failed runs", "interrupted": "Interrupted runs (resume them to complete the group)",
                 "pruned": "Pruned runs (stopped by the tuner)", "running": "Runs still running (this report is partial)"}


def fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        # 4 significant digits, but large counts (env steps) in full rather than as 2e+04.
        return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"
    return str(value)


def fmt_ci(ci: Sequence[float] | None) -> str:
    return "—" if not ci else f"[{fmt(ci[0])}, {fmt(ci[1])}]"


def one_line(text: Any, limit: int | None = None) -> str:
    flat = " ".join(fmt(text).split())
    if limit and len(flat) > limit:
        flat = flat[: limit - 1] + "…"
    return flat


def cell(text: Any) -> str:
    """One table cell: a multi-line traceback or a `|` would break the row."""
    return one_line(text).replace("|", "\\|")


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return lines + [""]


def _images(report: dict[str, Any], kinds: Sequence[str], metric: str | None = None) -> list[str]:
    lines = []
    for image in report["images"]:
        if image["kind"] in kinds and (metric is None or image["metric"] == metric):
            lines += [f"![{image['title']}]({image['file']})", ""]
    return lines


def _summary(groups: dict[str, Any]) -> list[str]:
    rows = []
    for name, g in groups.items():
        mean_std = "—" if g["mean"] is None else f"{fmt(g['mean'])} ± {fmt(g['std'])}"
        iqm = "—" if g["iqm"] is None else f"{fmt(g['iqm'])} {fmt_ci(g['iqm_ci'])}"
        rows.append(
            [name, g["primary_metric"], g["n_ok"], *(g[f"n_{status}"] for status in NOT_OK), mean_std, fmt(g["median"]),
             iqm, fmt(g["min"]), fmt(g["max"])]
        )
    header = ["group", "primary metric", "ok", *NOT_OK, "mean ± std", "median", "IQM [95% CI]", "min", "max"]
    return ["## Summary", "", *table(header, rows)]


def _thresholds(groups: dict[str, Any]) -> list[str]:
    rows = []
    for name, g in groups.items():
        t = g["threshold"]
        if not t:
            continue
        rows.append(
            [name, fmt(t["threshold"]), f"{t['n_reached']}/{t['n_seeds']}", fmt(t["median_reached_s"]),
             fmt(t["min_reached_s"]), fmt(t["max_reached_s"]), fmt(t["median_all_s"])]
        )
    if not rows:
        return []
    header = ["group", "threshold", "seeds reached", "median s (reached)", "min s", "max s",
              "median s (all seeds, never = ∞)"]
    return [
        "## Time to threshold",
        "",
        "Wall-clock seconds until the evaluation return first reached the threshold. Seeds that never "
        "reached it are not dropped: the last column counts them as infinitely slow, so it is `—` when "
        "half or more of the seeds never got there.",
        "",
        *table(header, rows),
    ]


def _comparisons(report: dict[str, Any]) -> list[str]:
    lines = []
    for metric, comparison in report["comparisons"].items():
        better = "higher" if comparison["higher_is_better"] else "lower"
        lines += [
            f"## Comparison on {metric}",
            "",
            f"P(X better than Y) is the chance that a random seed of X has a {better} final {metric} than a "
            "random seed of Y (ties count half); 0.5 means no difference. CIs are 95% stratified bootstrap.",
            "",
        ]
        rows = [[p["x"], p["y"], fmt(p["p"]), fmt_ci(p["ci"])] for p in comparison["probability_of_improvement"]]
        lines += table(["X", "Y", "P(X better than Y)", "95% CI"], rows)
        lines += _images(report, ("probability_of_improvement", "performance_profile"), metric)
    return lines


def _cost_lines(g: dict[str, Any]) -> list[str]:
    if g["seed_cost_s_mean"] is None:
        return []
    ks = g["seeds_per_process"]
    if ks == [1]:
        return [f"- wall time per run: mean {fmt(g['seed_cost_s_mean'])} s"]
    k = "/".join(str(v) for v in ks)
    lines = [f"- cost per seed: mean {fmt(g['seed_cost_s_mean'])} s (a process's wall time / the seeds it trained, "
             f"seeds_per_process={k})"]
    if g["batch_wall_time_s_mean"] is not None:
        lines.append(f"- wall time per batch of {k} seeds (one process): mean {fmt(g['batch_wall_time_s_mean'])} s "
                     f"over {g['n_batches']} batch{'es' if g['n_batches'] != 1 else ''}")
    return lines


def _group_section(name: str, g: dict[str, Any]) -> list[str]:
    direction = "higher is better" if g["higher_is_better"] else "lower is better"
    lines = [
        f"### {name}",
        "",
        f"- experiment: `{g['experiment']}`, task: `{g['task']}`",
        f"- primary metric: `{g['primary_metric']}` ({direction}); learning curve: `{g['primary_curve']}`",
        f"- runs: {g['n_runs']} ({g['n_ok']} ok, " + ", ".join(f"{g[f'n_{status}']} {status}" for status in NOT_OK)
        + "".join(f", {len(entries)} {status}" for status, entries in g["other_status"].items())
        + f", {g['n_excluded']} excluded)",
    ]
    lines += _cost_lines(g)
    if g["iqm"] is not None:
        lines.append(f"- IQM {fmt(g['iqm'])} {fmt_ci(g['iqm_ci'])}, mean {fmt(g['mean'])} {fmt_ci(g['mean_ci'])}")
    if g.get("table_value"):
        lines.append(f"- value: {g['table_value']}")
    curve = g.get("curve")
    if curve and curve["steps"]:
        held = sum(h is not None for h in curve["held_from"])
        final = curve.get("last_point") == "final"
        ends = "ends at the final evaluation, the table's IQM" if final else "ends at"
        lines.append(
            f"- curve `{curve['metric']}` {ends}: IQM {fmt(curve['iqm'][-1])} "
            f"{fmt_ci([curve['ci_low'][-1], curve['ci_high'][-1]])} at {fmt(curve['steps'][-1])} {curve['x']}"
            + (f"; {held} of {len(curve['held_from'])} seeds stopped earlier and hold their "
               f"{'final evaluation' if final else 'last value'}" if held else "")
        )
    if g["ci_note"]:
        lines.append(f"- note: {g['ci_note']}")
    lines.append("")

    rl = g["threshold"] is not None
    batched = g["seeds_per_process"] != [1]
    header = ["seed", g["primary_metric"] or "value", "seed cost s (batch / K)" if batched else "wall time s"]
    if rl:
        header += ["time to threshold s", "env steps", "env steps/s"]
    header.append("dir")
    rows = []
    for entry in g["per_seed"].values():
        row = [entry["seed"], fmt(entry["value"]), fmt(entry["seed_cost_s"] if batched else entry["wall_time_s"])]
        if rl:
            reached = entry.get("time_to_threshold_s")
            row += ["never" if reached is None else fmt(reached), fmt(entry.get("env_steps")),
                    fmt(entry.get("env_steps_per_s"))]
        rows.append([*row, f"`{entry['relative_dir']}`"])
    if rows:
        lines += ["Per seed:", "", *table(header, rows)]
    listed = {**{status: g[status] for status in NOT_OK}, **g["other_status"]}
    for status, entries in listed.items():
        if entries:
            title = STATUS_TITLES.get(status, f"Runs with status `{status}`")
            rows = [[e["seed"], one_line(e["error"], ERROR_CELL_CHARS), f"`{e['relative_dir']}`"] for e in entries]
            lines += [f"{title}:", "", *table(["seed", "error" if status == "failed" else "why", "dir"], rows)]
    if g["excluded"]:
        excluded_rows = [[e["seed"], e["reason"], f"`{e['relative_dir']}`"] for e in g["excluded"]]
        lines += ["Excluded runs (status ok, no usable final value):", "", *table(["seed", "reason", "dir"], excluded_rows)]
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    settings = report["settings"]
    lines = [
        "# Seed-distribution report",
        "",
        f"{report['n_runs']} runs in {len(report['groups'])} group(s), read from:",
        "",
        *[f"- `{path}`" for path in report["inputs"]],
        "",
        "IQM is the interquartile mean (25% trimmed mean, as in rliable), robust to an outlier seed. "
        f"CIs are {int(settings['confidence'] * 100)}% stratified bootstrap percentile intervals "
        f"({settings['bootstrap_reps']} resamples, seed {settings['seed']}). std uses ddof=1.",
        "",
    ]
    counts = report["status_counts"]
    lines += ["Runs by status: " + ", ".join(f"{status} {n}" for status, n in counts.items()) + ".", ""]
    if report["partial"]:
        lines += [f"> **Partial report:** {counts['running']} run(s) still running; every number below may change "
                  "when they finish. Build the report again then.", ""]
    for warning in report["warnings"]:
        lines += [f"> **Warning:** {one_line(warning)}", ""]
    lines += _summary(report["groups"])
    lines += _thresholds(report["groups"])
    lines += _comparisons(report)
    figures = _images(report, ("learning_curves", "final_scores", "interval_estimates", "time_to_threshold"))
    if figures:
        lines += ["## Figures", "", *figures]
    if report.get("counterfactual"):
        from pipeline.report.counterfactual import counterfactual_markdown

        lines += counterfactual_markdown(report["counterfactual"])
    lines += ["## Groups", ""]
    for name, g in report["groups"].items():
        lines += _group_section(name, g)
    return "\n".join(lines).rstrip() + "\n"

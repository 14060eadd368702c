"""Build a seed-distribution report: collect run records, compute statistics, draw, write md + json."""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.report.collect import STATUSES, ReportInputError, RunRecordWarning, collect_runs
from pipeline.report.stats import CONFIDENCE, DEFAULT_REPS, DEFAULT_SEED
from pipeline.report.summary import summarize

REPORT_DIR = "report"
MARKDOWN_FILE = "report.md"
JSON_FILE = "report.json"


def to_strict_json(value: Any) -> Any:
    """Plain JSON types only: numpy scalars become Python numbers, NaN and infinities become null."""
    if isinstance(value, dict):
        return {str(k): to_strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_strict_json(v) for v in value]
    if isinstance(value, np.ndarray):
        return to_strict_json(value.tolist())
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, os.PathLike):
        return os.fsdecode(value)  # the path itself, for any PathLike (str() of one that is not a Path is its repr)
    return value


def status_counts(groups: dict[str, dict[str, Any]]) -> dict[str, int]:
    """Runs per status over all groups: every status of STATUSES, then any other a record names."""
    counts = dict.fromkeys(STATUSES, 0)
    for g in groups.values():
        for status, n in g["status_counts"].items():
            counts[status] = counts.get(status, 0) + n
    return counts


def default_out_dir(inputs: Sequence[str | os.PathLike[str]]) -> Path:
    if len(inputs) != 1:
        raise ReportInputError(
            f"{len(inputs)} input dirs given and no output dir; pass --out DIR (out_dir=...) to say where the report goes"
        )
    return Path(inputs[0]).expanduser() / REPORT_DIR


def build_report(
    inputs: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str] | None = None,
    *,
    reps: int = DEFAULT_REPS,
    seed: int = DEFAULT_SEED,
) -> dict[str, Any]:
    """Write ``report.md``, ``report.json`` and PNG figures for the runs under ``inputs``; return the report.

    ``out_dir`` defaults to ``<input>/report`` when there is exactly one input.
    """
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    inputs = list(inputs)
    target = Path(out_dir).expanduser() if out_dir is not None else default_out_dir(inputs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RunRecordWarning)
        runs = collect_runs(inputs)
    skipped = [str(w.message) for w in caught if issubclass(w.category, RunRecordWarning)]
    for message in skipped:
        warnings.warn(message, RunRecordWarning, stacklevel=2)

    summary = summarize(runs, reps=reps, seed=seed)
    target.mkdir(parents=True, exist_ok=True)

    from pipeline.report.plots import make_plots

    images = make_plots(summary, target)
    from pipeline.report.counterfactual import counterfactual_sections

    counterfactual = counterfactual_sections(runs, target)
    report = to_strict_json(
        {
            "inputs": [str(Path(p).expanduser().resolve()) for p in inputs],
            "out_dir": str(target.resolve()),
            "n_runs": len(runs),
            "n_groups": len(summary["groups"]),
            "status_counts": status_counts(summary["groups"]),
            # Runs still training: every number below may change when they finish.
            "partial": any(g["n_running"] for g in summary["groups"].values()),
            "settings": {"bootstrap_reps": reps, "seed": seed, "confidence": CONFIDENCE},
            "groups": summary["groups"],
            "comparisons": summary["comparisons"],
            "warnings": skipped + summary["warnings"],
            "images": images,
            "counterfactual": counterfactual,
            "files": {"markdown": MARKDOWN_FILE, "json": JSON_FILE},
        }
    )
    from pipeline.report.markdown import render_markdown

    (target / MARKDOWN_FILE).write_text(render_markdown(report), encoding="utf-8")
    (target / JSON_FILE).write_text(json.dumps(report, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return report

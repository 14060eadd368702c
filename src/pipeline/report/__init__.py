"""Seed-distribution reports from run records: ``build_report(dirs)`` or ``python -m pipeline.report DIR``.

The names below load on first use: `python -m pipeline.report --help` should not wait for matplotlib.
"""

from __future__ import annotations

__all__ = ["ReportInputError", "ReportedRun", "build_report", "collect_runs"]


def __getattr__(name: str):
    if name == "build_report":
        from pipeline.report.build import build_report

        return build_report
    if name in ("ReportInputError", "ReportedRun", "collect_runs"):
        from pipeline.report import collect

        return getattr(collect, name)
    raise AttributeError(f"module 'pipeline.report' has no attribute {name!r}")

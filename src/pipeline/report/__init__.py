"""Seed-distribution reports from run records: ``build_report(dirs)`` or ``python -m pipeline.report DIR``."""

from pipeline.report.build import build_report
from pipeline.report.collect import ReportInputError, RunRecord, collect_runs

__all__ = ["ReportInputError", "RunRecord", "build_report", "collect_runs"]

"""Hydra callback for multi-seed sweeps: one line per finished job, and the seed-distribution report at the end."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger("pipeline.sweep")


class SweepReportCallback(Callback):
    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        try:
            record = job_return.return_value
        except Exception as exc:  # the job raised past run(): still say so, and let the other seeds go on
            print(f"[job {job_return.hydra_cfg.hydra.job.num}] failed: {exc}", flush=True)
            return
        if isinstance(record, dict) and config.hydra.mode is not None and str(config.hydra.mode) == "RunMode.MULTIRUN":
            from pipeline.cli import summary_line

            print(f"[job {config.hydra.job.num}] {summary_line(record)}", flush=True)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        try:
            from pipeline.report import build_report
        except ImportError as exc:
            log.warning(f"no report: {exc}")
            return
        try:
            report = build_report([sweep_dir], sweep_dir / "report")
        except Exception as exc:  # a broken report must not hide the finished runs
            log.error(f"report failed: {exc}; rebuild it with: python -m pipeline.report {sweep_dir}")
            return
        print(f"report: {sweep_dir / 'report' / 'report.md'}", flush=True)
        wandb_cfg = (config.get("logger") or {}).get("wandb")
        if wandb_cfg is not None:
            from pipeline.report.wandb_summary import log_report_to_wandb

            log_report_to_wandb(report, sweep_dir / "report", project=wandb_cfg.get("project", "pipeline"),
                                group=str(config.name), entity=wandb_cfg.get("entity"), mode=wandb_cfg.get("mode"))

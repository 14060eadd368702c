"""Build Lightning loggers (csv, tensorboard, wandb) from the `logger` config group."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger

KNOWN = ("csv", "tensorboard", "wandb")


def wandb_mode(requested: str | None) -> str:
    """offline unless the user asked otherwise (config first, then $WANDB_MODE): we never wait for a server."""
    return str(requested or os.environ.get("WANDB_MODE") or "offline")


def build_loggers(
    spec: Mapping[str, Any] | None,
    run_dir: Path,
    *,
    run_name: str,
    group: str,
    job_type: str,
    seed: int,
    config: dict,
) -> list[Logger]:
    """One logger per key of `spec`. The CSV logger is always first: `metrics.csv` is part of the run record."""
    spec = dict(spec or {})
    unknown = sorted(set(spec) - set(KNOWN))
    if unknown:
        raise ValueError(f"unknown logger {unknown[0]!r}; choose from {', '.join(KNOWN)} (e.g. logger=[csv,wandb])")
    # name="" and version="" put metrics.csv directly in the run dir.
    loggers: list[Logger] = [CSVLogger(save_dir=str(run_dir), name="", version="")]
    if "tensorboard" in spec:
        opts = dict(spec["tensorboard"] or {})
        loggers.append(
            TensorBoardLogger(save_dir=str(run_dir), name="tensorboard", version="", log_graph=bool(opts.get("log_graph", False)))
        )
    if "wandb" in spec:
        from lightning.pytorch.loggers import WandbLogger

        opts = dict(spec["wandb"] or {})
        os.environ.setdefault("WANDB_SILENT", "true")
        tags = [f"seed={seed}", *[str(t) for t in opts.get("tags") or []]]
        loggers.append(
            WandbLogger(
                project=opts.get("project", "pipeline"),
                entity=opts.get("entity"),
                name=run_name,
                group=group,
                job_type=job_type,
                tags=tags,
                save_dir=str(run_dir),
                mode=wandb_mode(opts.get("mode")),
                config=config,
                # Each run is its own process's run: no reinit surprises under joblib.
                settings=_wandb_settings(),
            )
        )
    return loggers


def _wandb_settings():
    import wandb

    return wandb.Settings(init_timeout=30, silent=True, console="off")


def finish_loggers(loggers: list[Logger], status: str) -> None:
    """Flush every logger; finish the W&B run with an exit code that says whether the run failed."""
    for logger in loggers:
        try:
            logger.finalize("success" if status == "ok" else "failed")
        except Exception:  # a logger that cannot flush must not hide the run's own error
            pass
    if any(type(lg).__name__ == "WandbLogger" for lg in loggers):
        import wandb

        if wandb.run is not None:
            wandb.finish(exit_code=0 if status == "ok" else 1)


def log_records_to_wandb(records: list[dict], run_dirs: list[Path], wandb_cfg: dict, config: dict) -> None:
    """One W&B run per seed of a seed-batched run, replaying its metrics.csv, so W&B sees K ordinary seeds."""
    import csv
    import math

    import wandb

    for record, run_dir in zip(records, run_dirs):
        run = wandb.init(
            project=wandb_cfg.get("project", "pipeline"), entity=wandb_cfg.get("entity"), group=record["group"],
            job_type=record["task"], name=f"{record['experiment']}-seed{record['seed']}",
            tags=[f"seed={record['seed']}", *[str(t) for t in wandb_cfg.get("tags") or []]],
            config={**config, "seed": record["seed"]}, dir=str(run_dir), mode=wandb_mode(wandb_cfg.get("mode")),
            settings=_wandb_settings(), reinit="create_new",
        )
        with open(Path(run_dir) / "metrics.csv", newline="") as f:
            for row in csv.DictReader(f):
                values = {k: float(v) for k, v in row.items() if k != "step" and v not in ("", None)}
                values = {k: v for k, v in values.items() if math.isfinite(v)}
                if values:
                    run.log(values, step=int(float(row["step"])))
        run.summary.update({k: v for k, v in record["metrics"].items() if v is not None})
        run.finish()

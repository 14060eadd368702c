"""Build Lightning loggers (csv, tensorboard, wandb) from the `logger` config group."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment

from pipeline.config.grouping import sweep_id
from pipeline.store.atomic import write_atomically
from pipeline.store.curves import CurveLog, read_run_curve
from pipeline.store.layout import ids_path, model_path, read_ids

KNOWN = ("csv", "tensorboard", "wandb")


def wandb_mode(requested: str | None) -> str:
    """offline unless the user asked otherwise (config first, then $WANDB_MODE): we never wait for a server."""
    return str(requested or os.environ.get("WANDB_MODE") or "offline")


# What a run's W&B summary holds besides the final metrics (result.json's values, not the last logged ones).
RECORD_SUMMARY_KEYS = ("status", "time_to_threshold_s", "env_steps", "wall_time_s")


def wandb_tags(seed, extra, sweep: str | None = None) -> list[str]:
    """Seed and sweep as tags: two sweeps of one config share a W&B group and stay apart by their sweep tag."""
    sweep = sweep or sweep_id()
    return [f"seed={seed}", *([f"sweep={sweep}"] if sweep else []), *[str(t) for t in extra or []]]


def wandb_config(config: dict, sweep: str | None = None) -> dict:
    sweep = sweep or sweep_id()
    return {**config, "sweep_id": sweep} if sweep else dict(config)


def wandb_identity(run_dir: Path, resuming: bool) -> tuple[str, str | None]:
    """The W&B run id and sweep id of the run in `run_dir`: a resume (``ckpt_path``, a sweep's ``resume=true``) keeps
    the ones its first start wrote (one W&B run per seed, in its first sweep); a fresh start makes and writes new ones."""
    kept = read_ids(run_dir) if resuming else {}
    if isinstance(kept.get("wandb_run_id"), str) and kept["wandb_run_id"]:
        return kept["wandb_run_id"], kept.get("sweep_id") or sweep_id()
    import uuid

    ids = {"wandb_run_id": uuid.uuid4().hex[:8], "sweep_id": sweep_id()}  # as wandb makes its ids: 8 of [0-9a-z]
    write_atomically(ids_path(run_dir), lambda f: f.write(json.dumps(ids).encode()), fsync=False)
    return ids["wandb_run_id"], ids["sweep_id"]


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
            # No hp_metric placeholder (-1 at step 0): publish_record writes the real final metrics to HParams.
            TensorBoardLogger(save_dir=str(run_dir), name="tensorboard", version="", log_graph=bool(opts.get("log_graph", False)),
                              default_hp_metric=False)
        )
    if "wandb" in spec:
        from lightning.pytorch.loggers import WandbLogger

        opts = dict(spec["wandb"] or {})
        os.environ.setdefault("WANDB_SILENT", "true")
        run_id, sweep = wandb_identity(run_dir, resuming=bool(config.get("ckpt_path") or config.get("resume")))
        tags = wandb_tags(seed, opts.get("tags"), sweep)
        wandb_logger = WandbLogger(
            # A resumed run continues its W&B run: offline, each segment is its own offline-run-*-<id> dir under
            # <run dir>/wandb, and `wandb sync` puts them into the one run of that id.
            id=run_id,
            resume="allow",
            project=opts.get("project", "pipeline"),
            entity=opts.get("entity"),
            name=run_name,
            group=group,
            job_type=job_type,
            tags=tags,
            save_dir=str(Path(run_dir).resolve()),  # absolute: see report/wandb_summary.py
            mode=wandb_mode(opts.get("mode")),
            config=wandb_config(config, sweep),
            settings=_wandb_settings(opts.get("init_timeout")),
            # A run of its own even beside others in this process (K seeds trained together: one run per seed);
            # it leaves wandb.run alone, so finish_loggers finishes each logger's run itself.
            reinit="create_new",
        )
        # Lightning always passes anonymous=None to wandb.init, and wandb >= 0.2x warns on every run that the
        # setting has no effect; not passing it changes nothing else.
        wandb_logger._wandb_init.pop("anonymous", None)
        try:  # start the W&B run now, so a server that cannot be reached is one line before any training
            wandb_logger.experiment  # noqa: B018 - the property starts the run
        except Exception as exc:
            raise WandbUnreachable(explain_wandb_failure(exc, wandb_logger._wandb_init.get("mode"), opts.get("init_timeout"))) from None
        loggers.append(wandb_logger)
    return loggers


# Seconds wandb.init may wait for its server before giving up (wandb's own default is 90): long enough for a
# slow first contact, short enough that a machine without a network hears about it soon (logger.wandb.init_timeout).
WANDB_INIT_TIMEOUT_S = 20


class WandbUnreachable(RuntimeError):
    """An online W&B run could not start (no network, a server that does not answer, no API key)."""


def explain_wandb_failure(exc: BaseException, mode: str | None, timeout: float | None) -> str:
    """One line: what wandb said (its first line) and the fix, for a W&B run that could not start."""
    said = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if mode != "online":
        return f"W&B ({mode}) could not start: {said}"
    waited = timeout if timeout is not None else WANDB_INIT_TIMEOUT_S
    return (f"W&B could not start an online run ({said}): no network? use WANDB_MODE=offline (or logger.wandb.mode=offline) "
            f"and `wandb sync` the run later; on a slow network raise logger.wandb.init_timeout (now {waited} s)")


def _wandb_settings(init_timeout: float | None = None):
    from pipeline.report.wandb_summary import quiet_settings

    return quiet_settings(init_timeout=WANDB_INIT_TIMEOUT_S if init_timeout is None else float(init_timeout))


def finish_loggers(loggers: list[Logger], status: str) -> None:
    """Flush every logger; finish the W&B run with an exit code that says whether the run failed."""
    for logger in loggers:
        try:
            logger.finalize("success" if status == "ok" else "failed")
        except Exception:  # a logger that cannot flush must not hide the run's own error
            pass
    for logger in loggers:
        if type(logger).__name__ == "WandbLogger":
            logger.experiment.finish(exit_code=0 if status == "ok" else 1)


def replay_unlogged_curve(loggers: list[Logger], run_dir: Path) -> None:
    """A seed's metrics.csv into its live W&B run when the task logged nothing to it while training."""
    import math

    for logger in loggers:
        if type(logger).__name__ == "WandbLogger" and logger.experiment.step == 0:
            rows = {s: {k: v for k, v in row.items() if math.isfinite(v)} for s, row in read_run_curve(run_dir).items()}
            for step, values in sorted(rows.items()):
                if values:  # as the task would have logged it: trainer/global_step = the row's step
                    logger.log_metrics(values, step=step)


def record_summary(record: dict) -> dict:
    """What the W&B summary must hold: result.json's final metrics plus status, time to threshold, env steps, wall time."""
    final = {k: v for k, v in (record.get("metrics") or {}).items() if v is not None}
    final.update({k: record.get(k) for k in RECORD_SUMMARY_KEYS})
    return final


def publish_to_wandb(run, record: dict, run_dir: Path) -> None:
    """Summary = ``record_summary(record)`` exactly (a stale last-logged number would contradict result.json),
    and model.pt as a `model` artifact when the run wrote one."""
    import wandb

    final = record_summary(record)
    for key in list(run.summary.keys()):
        if not key.startswith("_") and key not in final and isinstance(run.summary[key], int | float):
            del run.summary[key]
    run.summary.update(final)
    model = model_path(run_dir)
    if model.is_file():
        artifact = wandb.Artifact(
            f"model-{run.id}", type="model",
            metadata={"experiment": record.get("experiment"), "seed": record.get("seed"), "status": record.get("status"),
                      "sweep_id": sweep_id(), "metrics": final},
        )
        artifact.add_file(str(model), name=model.name)
        run.log_artifact(artifact)


def _hparam_value(value):
    # TensorBoard's HParams tab takes numbers, strings and booleans; a list or None becomes its text.
    return value if isinstance(value, bool | int | float | str) else str(value)


def publish_to_tensorboard(logger: TensorBoardLogger, record: dict) -> None:
    """HParams tab: the record's config (minus keys that do not change results) against its final metrics.

    The metrics go under ``final/<name>``, so the training curves keep only what was logged during training.
    """
    from lightning.pytorch.core.saving import save_hparams_to_yaml

    from pipeline.config.grouping import semantic_config

    params = {"experiment": record.get("experiment"), "seed": record.get("seed"), "status": record.get("status"),
              **({"sweep_id": sweep_id()} if sweep_id() else {}), **semantic_config(record.get("config") or {})}
    params = {k: _hparam_value(v) for k, v in params.items()}
    metrics = {f"final/{k}": float(v) for k, v in record_summary(record).items()
               if isinstance(v, int | float) and not isinstance(v, bool)}
    logger.log_hyperparams(params, metrics=metrics or None, step=0)
    logger.experiment.flush()
    # Lightning writes hparams.yaml only when it does not exist yet (often still empty then): write it now.
    save_hparams_to_yaml(Path(logger.log_dir) / TensorBoardLogger.NAME_HPARAMS_FILE, params)


def publish_record(loggers: list[Logger], record: dict, run_dir: Path) -> None:
    """Once the record is final and before ``finish_loggers``: W&B summary and model artifact, TensorBoard HParams."""
    for logger in loggers:
        if isinstance(logger, TensorBoardLogger):
            publish_to_tensorboard(logger, record)
        elif type(logger).__name__ == "WandbLogger":
            publish_to_wandb(logger.experiment, record, run_dir)


class CurveLogger(Logger):
    """A Lightning logger writing into a CurveLog (so `self.log` lands in the run's metrics.csv)."""

    def __init__(self, curve: CurveLog):
        super().__init__()
        self.curve = curve

    @property
    def name(self) -> str:
        return "curves"

    @property
    def version(self) -> str:
        return ""

    @property
    @rank_zero_experiment
    def experiment(self) -> CurveLog:
        return self.curve

    def log_hyperparams(self, params, *args, **kwargs) -> None:  # the record holds the config
        pass

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        values = {k: (v.item() if hasattr(v, "item") else v) for k, v in metrics.items()}
        self.curve.log(int(step or 0), {k: v for k, v in values.items() if isinstance(v, int | float)})

    def save(self) -> None:
        self.curve.flush()

    def finalize(self, status: str) -> None:
        self.curve.flush()

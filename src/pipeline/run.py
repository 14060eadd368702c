"""The composition root: config -> objects -> fit -> evaluate -> run record.

Only this module (and the CLI) knows about Hydra and config objects; everything it builds takes
plain arguments and can be made by hand in a notebook.
"""

from __future__ import annotations

import inspect
import logging
import os
import time
import traceback
import warnings
from pathlib import Path

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import get_class, instantiate
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from omegaconf import DictConfig, OmegaConf

from pipeline import config_checks
from pipeline.devices import setup_device
from pipeline.loggers import build_loggers, finish_loggers
from pipeline.record import RESULT, git_commit, read_result, versions, write_json
from pipeline.seeding import seed_everything

log = logging.getLogger("pipeline")

# The run dir is ours: metrics.csv is rewritten on purpose (e.g. when resuming).
warnings.filterwarnings("ignore", message=".*exists and is not empty.*")
warnings.filterwarnings("ignore", message=".*isinstance.treespec, LeafSpec.*")


class ValidationTimer(Callback):
    """Time spent in validation, so the fit time can be split into train and val."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def on_validation_start(self, trainer, pl_module) -> None:
        self._start = time.perf_counter()

    def on_validation_end(self, trainer, pl_module) -> None:
        self.seconds += time.perf_counter() - self._start


def _is_empty(node) -> bool:
    return node is None or (isinstance(node, DictConfig) and len(node) == 0)


def _accepted(cls, candidates: dict) -> dict:
    """Only the parts the task's constructor asks for (a supervised task has no env, a DQN no datamodule)."""
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return candidates
    return {k: v for k, v in candidates.items() if k in params}


def build_task(cfg: DictConfig, datamodule, device: torch.device, run_dir: Path, n_agents: int | None = None):
    task_cfg = cfg.task
    cls = get_class(task_cfg._target_)
    variant = getattr(cls, "batched_variant", None)
    if n_agents is not None and variant is not None:
        # `experiment=dqn_cartpole seeds_per_process=16`: the same recipe, K agents in lockstep,
        # one env per agent (each agent is then an ordinary run of its seed, in distribution).
        cls = get_class(variant)
        params = inspect.signature(cls.__init__).parameters
        kept = {k: v for k, v in OmegaConf.to_container(task_cfg, resolve=True).items() if k in params}
        task_cfg = OmegaConf.create({"_target_": variant, **kept})
    parts = {
        "net": None if _is_empty(cfg.model) else instantiate(cfg.model),
        "loss": None if _is_empty(cfg.loss) else instantiate(cfg.loss),
        "optimizer": None if _is_empty(cfg.optimizer) else instantiate(cfg.optimizer),
        "scheduler": None if _is_empty(cfg.scheduler) else instantiate(cfg.scheduler),
        "env": None if _is_empty(cfg.env) else OmegaConf.to_container(cfg.env, resolve=True),
        "seed": int(cfg.seed),
        "run_dir": run_dir,
        "datamodule": datamodule,
        "data_device": device,
        "n_agents": n_agents,
    }
    for attr in ("in_features", "n_classes", "image_shape"):
        if datamodule is not None and hasattr(datamodule, attr):
            parts[attr] = getattr(datamodule, attr)
    parts = {k: v for k, v in _accepted(cls, parts).items() if v is not None}
    return instantiate(task_cfg, **parts, _convert_="all")


def group_name(cfg: DictConfig) -> str:
    """The experiment plus every override that is not the seed: runs with equal groups are seeds of one config."""
    skip = ("seed", "experiment", "resume", "ckpt_path", "hydra", "device.num_threads", "logger")
    extra = []
    try:
        overrides = HydraConfig.get().overrides.task
    except ValueError:
        overrides = []
    for item in overrides:
        key = item.split("=", 1)[0].lstrip("+~")
        if not key.startswith(skip):
            extra.append(item)
    return " ".join([str(cfg.name), *sorted(extra)])


def threads_for_this_job(requested: int | None) -> int | None:
    """Under a parallel launcher, jobs x threads must not exceed the cores (oversubscription is 3-10x slower)."""
    try:
        hydra_cfg = HydraConfig.get()
    except ValueError:
        return requested
    n_jobs = OmegaConf.select(hydra_cfg, "launcher.n_jobs", default=None)
    if hydra_cfg.mode != RunMode.MULTIRUN or not isinstance(n_jobs, int) or requested is None:
        return requested
    cores = os.cpu_count() or 1
    # joblib: -1 means all cores, -2 all but one, ...
    parallel = cores + 1 + n_jobs if n_jobs < 0 else n_jobs
    cap = max(1, cores // max(1, parallel))
    if requested > cap:
        log.info(f"device.num_threads={requested} lowered to {cap}: {parallel} parallel jobs on {cores} cores")
    return min(int(requested), cap)


def _run_dir() -> Path:
    return Path(HydraConfig.get().runtime.output_dir)


def _resolve_ckpt(ckpt_path: str | None, run_dir: Path) -> str | None:
    if not ckpt_path:
        return None
    if ckpt_path == "last":
        path = run_dir / "checkpoints" / "last.ckpt"
        if not path.is_file():
            log.info(f"ckpt_path=last: no checkpoint at {path} yet, starting from scratch")
            return None
        return str(path)
    if not Path(ckpt_path).is_file():
        raise config_checks.ConfigError(f"ckpt_path={ckpt_path}: no such checkpoint file; pass a .ckpt path or `last`")
    return str(ckpt_path)


def one_line(exc: BaseException) -> str:
    # Hydra wraps errors raised in a constructor; the user needs the original message.
    while type(exc).__name__ == "InstantiationException" and exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def make_trainer(cfg: DictConfig, accelerator: str, run_dir: Path, loggers, callbacks, checkpoints: bool = True) -> L.Trainer:
    trainer_cfg = OmegaConf.to_container(cfg.trainer, resolve=True)
    trainer_cfg = {k: v for k, v in trainer_cfg.items() if v is not None}
    return L.Trainer(
        accelerator=accelerator,
        devices=1,
        precision=cfg.device.precision,
        logger=loggers,
        callbacks=callbacks,
        default_root_dir=str(run_dir),
        deterministic=bool(cfg.seeding.deterministic),
        enable_model_summary=False,
        num_sanity_val_steps=0,
        enable_checkpointing=checkpoints,
        **trainer_cfg,
    )


def new_record(cfg: DictConfig, run_dir: Path, seed: int, group: str) -> dict:
    """The skeleton of result.json; until the run ends it says the run did not finish."""
    return {
        "experiment": str(cfg.name),
        "group": group,
        "task": str(cfg.task._target_).rsplit(".", 1)[-1],
        "seed": seed,
        "status": "failed",
        "error": "run did not finish (killed, or still running)",
        "primary_metric": None,
        "primary_curve": None,
        "higher_is_better": True,
        "metrics": {},
        "wall_time_s": None,
        "time_breakdown_s": {},
        "device": None,
        "versions": versions(),
        "git_commit": git_commit(),
        "run_dir": str(run_dir),
    }


def _task_fields(task) -> dict:
    return {
        "task": type(task).__name__,
        "primary_metric": task.primary_metric,
        "primary_curve": task.primary_curve,
        "higher_is_better": task.higher_is_better,
    }


def run(cfg: DictConfig, run_dir: Path | None = None) -> dict:
    """Run one experiment and write its record into `run_dir`. Never raises: failures are recorded."""
    run_dir = Path(run_dir) if run_dir is not None else _run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    if int(cfg.get("seeds_per_process") or 1) > 1:
        return run_batched(cfg, run_dir)
    if cfg.get("resume"):
        previous = read_result(run_dir)
        if previous and previous.get("status") == "ok":
            log.info(f"resume: {run_dir} already finished ok, skipping")
            return previous

    t_start = time.perf_counter()
    group = group_name(cfg)
    record = new_record(cfg, run_dir, int(cfg.seed), group)
    write_json(run_dir / RESULT, record)  # a killed run leaves a record that says so
    (run_dir / "error.log").unlink(missing_ok=True)

    loggers: list = []
    task = None
    try:
        config_checks.check_missing(cfg)
        config_checks.check_types(cfg, _choices())
        seed_everything(cfg.seed, deterministic=bool(cfg.seeding.deterministic))
        device = setup_device(cfg.device.accelerator, threads_for_this_job(cfg.device.num_threads))
        record["device"] = str(device)

        t0 = time.perf_counter()
        datamodule = None if _is_empty(cfg.data) else instantiate(cfg.data)
        if datamodule is not None:
            datamodule.prepare_data()
            datamodule.setup("fit")
        task = build_task(cfg, datamodule, device, run_dir)
        record.update(_task_fields(task))
        setup_s = time.perf_counter() - t0

        resolved = OmegaConf.to_container(cfg, resolve=True)
        loggers = build_loggers(
            cfg.logger, run_dir, run_name=f"{cfg.name}-seed{cfg.seed}", group=group,
            job_type=record["task"], seed=int(cfg.seed), config=resolved,
        )
        val_timer = ValidationTimer()
        checkpoint = ModelCheckpoint(dirpath=str(run_dir / "checkpoints"), save_last=True, save_top_k=1, enable_version_counter=False)
        trainer = make_trainer(cfg, device.type, run_dir, loggers, [checkpoint, val_timer])

        metrics = task.fit_and_evaluate(trainer, datamodule, _resolve_ckpt(cfg.get("ckpt_path"), run_dir))
        torch.save(task.export_state_dict(), run_dir / "model.pt")
        record.update(status="ok", error=None, metrics=metrics)
        if record["primary_metric"] not in metrics:
            raise RuntimeError(f"task did not report its primary metric {record['primary_metric']!r}")
        breakdown = {"setup": setup_s, **task.time_breakdown_s}
        if "fit" in breakdown and val_timer.seconds:
            breakdown["fit"] -= val_timer.seconds
            breakdown = {("train" if k == "fit" else k): v for k, v in breakdown.items()}
            breakdown["val"] = val_timer.seconds
        record["time_breakdown_s"] = {k: round(v, 4) for k, v in breakdown.items()}
        record.update(task.record_extras())
    except Exception as exc:  # every failure becomes a record; the traceback goes to error.log
        record.update(status="failed", error=one_line(exc))
        (run_dir / "error.log").write_text(traceback.format_exc())
        if task is not None:
            record["time_breakdown_s"] = {k: round(v, 4) for k, v in task.time_breakdown_s.items()}
            try:
                record.update(task.record_extras())
            except Exception:
                pass
    finally:
        finish_loggers(loggers, record["status"])
        record["wall_time_s"] = round(time.perf_counter() - t_start, 3)
        write_json(run_dir / RESULT, record)
    return record


def _choices() -> dict:
    try:
        return dict(HydraConfig.get().runtime.choices)
    except ValueError:
        return {}


def agent_dir(run_dir: Path, seed: int) -> Path:
    return run_dir / f"seed{seed}"


def run_batched(cfg: DictConfig, run_dir: Path) -> dict:
    """K seeds trained together in one process; each agent gets an ordinary run record of its own.

    Agent i is seed `seed + i` and writes `<run_dir>/seed<seed+i>/` (result.json, metrics.csv,
    model.pt), so reports and sweeps see K ordinary seeds. `<run_dir>/batch.json` describes the batch
    (it is not a run record: a report over `run_dir` counts the K agents, not K + 1 runs).
    """
    k = int(cfg.seeds_per_process)
    seeds = [int(cfg.seed) + i for i in range(k)]
    group = group_name(cfg)
    dirs = [agent_dir(run_dir, s) for s in seeds]
    records = []
    for d, s in zip(dirs, seeds):
        d.mkdir(parents=True, exist_ok=True)
        records.append(new_record(cfg, d, s, group))
        write_json(d / RESULT, records[-1])
    t_start = time.perf_counter()
    loggers: list = []
    task = None
    status, error = "failed", None
    try:
        config_checks.check_missing(cfg)
        config_checks.check_types(cfg, _choices())
        seed_everything(cfg.seed, deterministic=bool(cfg.seeding.deterministic))
        device = setup_device(cfg.device.accelerator, threads_for_this_job(cfg.device.num_threads))
        datamodule = None if _is_empty(cfg.data) else instantiate(cfg.data)
        if datamodule is not None:
            datamodule.prepare_data()
            datamodule.setup("fit")
        task = build_task(cfg, datamodule, device, run_dir, n_agents=k)
        if not hasattr(task, "agent_state_dict"):
            raise config_checks.ConfigError(
                f"task {type(task).__name__} trains one seed per process; for seeds_per_process={k} "
                "use a seed-batched preset, e.g. experiment=dqn_cartpole_batched"
            )
        resolved = OmegaConf.to_container(cfg, resolve=True)
        loggers = build_loggers({}, run_dir, run_name=f"{cfg.name}-batch", group=group, job_type="batch", seed=int(cfg.seed), config=resolved)
        # Agents leave the batch as they stop, so a mid-run checkpoint could not be resumed anyway.
        trainer = make_trainer(cfg, device.type, run_dir, loggers, [], checkpoints=False)
        per_agent = task.fit_and_evaluate(trainer, datamodule, _resolve_ckpt(cfg.get("ckpt_path"), run_dir))
        wall = round(time.perf_counter() - t_start, 3)
        for i, (record, d) in enumerate(zip(records, dirs)):
            task.write_agent_curves(i, d / "metrics.csv")
            torch.save(task.agent_state_dict(i), d / "model.pt")
            record.update(_task_fields(task), status="ok", error=None, metrics=per_agent[i], device=str(device), wall_time_s=wall)
            record.update(task.agent_extras(i))
            record["seeds_per_process"] = k
            if record["primary_metric"] not in per_agent[i]:
                raise RuntimeError(f"task did not report its primary metric {record['primary_metric']!r} for agent {i}")
        status = "ok"
    except Exception as exc:
        error = one_line(exc)
        (run_dir / "error.log").write_text(traceback.format_exc())
        for record in records:
            record.update(status="failed", error=error, wall_time_s=round(time.perf_counter() - t_start, 3))
    finally:
        finish_loggers(loggers, status)
        for record, d in zip(records, dirs):
            write_json(d / RESULT, record)
        wandb_cfg = (cfg.get("logger") or {}).get("wandb")
        if wandb_cfg is not None and status == "ok":
            from pipeline.loggers import log_records_to_wandb

            log_records_to_wandb(records, dirs, dict(wandb_cfg), OmegaConf.to_container(cfg, resolve=True))
    summary = {
        "experiment": str(cfg.name), "group": group, "seeds": seeds, "seeds_per_process": k, "status": status,
        "error": error, "wall_time_s": round(time.perf_counter() - t_start, 3),
        "agents": [{"seed": r["seed"], "status": r["status"], "run_dir": r["run_dir"],
                    "primary": (r.get("metrics") or {}).get(r.get("primary_metric") or "")} for r in records],
        "time_breakdown_s": {k2: round(v, 4) for k2, v in getattr(task, "time_breakdown_s", {}).items()},
    }
    write_json(run_dir / "batch.json", summary)
    # What the CLI prints and a sweep callback sees: the batch, shaped like one record.
    values = [a["primary"] for a in summary["agents"] if isinstance(a["primary"], int | float)]
    metric = f"mean over {k} seeds of {records[0].get('primary_metric')}"
    return {
        **records[0], "seed": f"{seeds[0]}-{seeds[-1]}", "run_dir": str(run_dir), "status": status, "error": error,
        "primary_metric": metric, "metrics": {metric: sum(values) / len(values)} if values else {},
        "wall_time_s": summary["wall_time_s"],
    }

"""Scoring a saved model.pt of a run that has no environment (supervised, GAN): the engine of `python -m pipeline.eval`
for tasks that declare `eval_splits`. What it does and writes: see `pipeline/eval.py`, its command line.

The task is built as the run built it (`run.build_task`: its config, one agent, the run's seed), its data module from
the run's `data:` node with the command line's `data.<key>=` overrides; then the task's own `load_agent_state_dict`
and `evaluate_model` (its metric code, no Trainer). Lightning is imported here because the tasks and data modules
are LightningModules; nothing is fitted.
"""

from __future__ import annotations

import time
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf

from pipeline.runtime.replay import EvalError, Options
from pipeline.store.layout import model_path


def _one_line(exc: BaseException) -> str:
    """The first line of what went wrong; of the cause, where Hydra's instantiate wrapped it ("Error in call to ...")."""
    from pipeline.config.checks import root_cause

    exc = root_cause(exc)
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def with_data_overrides(cfg: DictConfig, overrides: dict[str, str]) -> DictConfig:
    """A copy of `cfg` with `data.<key>=<value>` applied (values read as YAML); a key the run's data lacks is one line."""
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    data = OmegaConf.select(cfg, "data", default=None)
    for key, value in overrides.items():
        if not data or key.split(".")[0] not in data or key == "_target_":
            target = OmegaConf.select(cfg, "data._target_", default=None)
            keys = ", ".join(k for k in (data or {}) if k != "_target_")
            raise EvalError(f"data.{key}: the run's data ({target or 'none'}) has no such key"
                            + (f"; it has {keys}" if keys else ""))
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            parsed = value
        OmegaConf.update(cfg, f"data.{key}", parsed, merge=False)
    return cfg


def task_of(cfg: DictConfig):
    """The run's task class; one that cannot be scored without its env is one line naming what eval can do."""
    from pipeline.config.errors import ConfigError
    from pipeline.config.startup import import_task_class

    try:
        cls = import_task_class(str(OmegaConf.select(cfg, "task._target_", default="")))
    except ConfigError as exc:
        raise EvalError(str(exc)) from None
    if not cls.eval_splits:
        raise EvalError(f"this run ({cls.__name__}) has no environment and its task declares no eval_splits: pipeline.eval "
                        "replays reinforcement-learning agents and scores supervised and GAN runs")
    return cls


def check_options(options: Options, cls) -> str:
    """The split to score (the task's default when none was given); options that do not apply are one line."""
    rl_only = sorted(options.given & {"episodes", "video"})
    if rl_only:
        raise EvalError(f"{'= and '.join(rl_only)}= replay RL agents; a {cls.__name__} run takes split= and data.<key>=")
    split = options.split or cls.eval_splits[0]
    if split not in cls.eval_splits:
        raise EvalError(f"split={split}: a {cls.__name__} run is scored on {', '.join(cls.eval_splits)}; choose "
                        + " or ".join(f"split={s}" for s in cls.eval_splits))
    return split


def score_run(options: Options, cfg: DictConfig, run_seed: int) -> dict:
    """Build the run's task with model.pt's weights and score it on the split; the result eval.json holds."""
    import torch
    from hydra.utils import instantiate

    from pipeline.runtime.run import build_task
    from pipeline.store.checkpoint import CheckpointError, load_model

    cls = task_of(cfg)
    split = check_options(options, cls)
    cfg = with_data_overrides(cfg, options.data)
    cfg.seed = run_seed
    try:
        state = load_model(options.run_dir)
    except CheckpointError as exc:
        raise EvalError(str(exc)) from None
    t0 = time.perf_counter()
    try:
        datamodule = instantiate(cfg.data)
        task = build_task(cfg, datamodule, n_agents=1, device=torch.device(options.device))
    except Exception as exc:  # noqa: BLE001 - a bad data.<key>= fails inside the data module, wrapped by Hydra
        raise EvalError(f"cannot build the run's task and data: {_one_line(exc)}") from None
    try:
        task.load_agent_state_dict(state)
    except (KeyError, ValueError, RuntimeError) as exc:
        raise EvalError(f"{model_path(options.run_dir)} does not fit the run's model config ({cfg.model._target_}): "
                        f"{_one_line(exc)}") from None
    try:
        metrics = task.to(options.device).evaluate_model(datamodule, split, options.seed)
    except ValueError as exc:  # what the task refuses (a seed= where its score draws nothing, data that does not fit)
        raise EvalError(_one_line(exc)) from None
    return {
        "run_dir": str(options.run_dir), "task": cls.__name__, "run_seed": run_seed, "split": split,
        "data": dict(options.data), "seed": options.seed, "device": options.device,
        "primary_metric": task.primary_metric, "metrics": metrics, "seconds": round(time.perf_counter() - t0, 3),
    }


def summary(result: dict, path: Path) -> str:
    """One line: the split, the primary metric first, then up to three more (all of them are in eval.json)."""
    metrics = result["metrics"]
    names = sorted(metrics, key=lambda k: k != result["primary_metric"])
    shown = " ".join(f"{k}={metrics[k]:.4g}" for k in names[:4])
    more = f" (+{len(names) - 4} more)" if len(names) > 4 else ""
    data = "".join(f" data.{k}={v}" for k, v in result["data"].items())
    return f"{result['task']} seed {result['run_seed']}, {result['split']} split{data}: {shown}{more} -> {path}"

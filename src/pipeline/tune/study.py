"""Optuna objects from plain settings: samplers, pruners, the study in its database."""

from __future__ import annotations

import logging
import zlib
from collections.abc import Sequence

import numpy as np

from pipeline.tune.space import Param, TuneError

SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("median", "none")


def quiet_optuna() -> None:
    import warnings

    import optuna

    optuna.logging.set_verbosity(logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    # The tuner asks and tells itself and records heartbeats in its own thread (hydra_plugins' _Heartbeat).
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")


def make_pruner(name: str, n_startup_trials: int = 5, n_warmup_steps: int = 0):
    import optuna

    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=n_startup_trials, n_warmup_steps=n_warmup_steps)
    if name == "none":
        return optuna.pruners.NopPruner()
    raise TuneError(f"hydra.sweeper.pruner={name}: unknown pruner; choose one of: {', '.join(PRUNERS)}")


def sampler_seed(seed: int, tried: int, worker: tuple[str, int] | None = None) -> int:
    """The sampler's seed for a search that starts with `tried` trials in its study. It moves on with the
    history, so a resumed study does not redraw what it tried. On a shared study each `worker`
    (host, pid) gets its own stream: a sum such as seed + tried + pid collides (a worker that saw one
    trial, pid p, and one that saw none, pid p + 1, drew the same parameters), so the parts are hashed
    together by numpy's SeedSequence."""
    if worker is None:
        return seed + tried
    host, pid = worker
    entropy = [seed, tried, pid, zlib.crc32(host.encode())]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])


def make_sampler(name: str, seed: int | None, space: Sequence[Param]):
    import optuna

    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return optuna.samplers.GridSampler({p.name: p.grid_values() for p in space}, seed=seed)
    raise TuneError(f"hydra.sweeper.sampler={name}: unknown sampler; choose one of: {', '.join(SAMPLERS)}")


def open_storage(url: str, attempts: int = 4, **heartbeat):
    """Optuna's RDBStorage at `url`; `heartbeat`: heartbeat_interval, grace_period, heartbeat_stale_trial_callback."""
    import time

    import optuna

    if "://" not in url:
        raise TuneError(f"hydra.sweeper.storage={url}: not a database URL; give e.g. sqlite:///path/optuna.db "
                        "or postgresql://user:pass@host/db")
    for attempt in range(attempts):
        try:
            return optuna.storages.RDBStorage(url, **heartbeat, engine_kwargs=_engine_kwargs(url))
        except Exception as exc:  # SQLAlchemy's errors differ per database; the user needs the URL and the cause
            # Workers that start together race to create the schema of a new database: the loser retries.
            if attempt < attempts - 1:
                time.sleep(0.25 * 2**attempt)
                continue
            cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise TuneError(
                f"hydra.sweeper.storage={url}: cannot open it ({cause}); give a SQLAlchemy URL that this machine can "
                "reach, e.g. sqlite:///path/optuna.db or postgresql://user:pass@host/db"
            ) from None


def _engine_kwargs(url: str) -> dict:
    # An unreachable server fails in seconds, not after the OS's TCP timeout.
    return {"connect_args": {"connect_timeout": 10}} if url.startswith("postgresql") else {}


def load_trial(storage_url: str, study_name: str, number: int, pruner_name: str, n_startup_trials: int, n_warmup_steps: int):
    """The running trial `number` of a study, as a job process sees it (reports go to the database)."""
    import optuna

    quiet_optuna()
    study = optuna.load_study(study_name=study_name, storage=open_storage(storage_url),
                              pruner=make_pruner(pruner_name, n_startup_trials, n_warmup_steps))
    trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
    return optuna.trial.Trial(study, trial_id)


def tell(study, trial, *args, **kwargs) -> None:
    """`study.tell`, outside `study.optimize`: the grid sampler calls `study.stop()` once the grid is done,
    which raises there after the trial's result is already stored (the sweeper stops on its own count)."""
    try:
        study.tell(trial, *args, **kwargs)
    except RuntimeError as exc:
        if "Study.stop" not in str(exc):
            raise

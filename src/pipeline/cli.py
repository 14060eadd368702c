"""Command line: `python -m pipeline [experiment=<preset>] [group=option ...] [key=value ...] [-m ...]`."""

from __future__ import annotations

import difflib
import logging
import os
import re
import sys
import tempfile
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict

from pipeline.config import checks as config_checks
from pipeline.config.checks import ConfigError, check_group_overrides
from pipeline.config.grouping import start_sweep_id
from pipeline.runtime import quiet
from pipeline.runtime.context import exit_status
from pipeline.runtime.rundir import honour_stop_signals_from_now
from pipeline.store.atomic import cause_of
from pipeline.store.layout import error_log_path, result_path
from pipeline.store.record import summary_line

log = logging.getLogger("pipeline")


if not OmegaConf.has_resolver("pipeline_uid"):
    # The default sweep dir's name carries the sweep's id (config.grouping.start_sweep_id).
    OmegaConf.register_new_resolver("pipeline_uid", start_sweep_id, use_cache=True)


@hydra.main(version_base="1.3", config_path="pkg://pipeline.conf", config_name="config")
def hydra_entry(cfg: DictConfig) -> list[dict]:
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    if not multirun:
        _check_before_running(cfg)
    # pipeline.runtime.job is light: Lightning is imported by the process that trains (a sweep's child, or this one).
    from pipeline.runtime.job import hydra_job

    try:
        records = hydra_job(cfg)
    except Exception as exc:
        if type(exc).__name__ not in ("RunRefused", "StoreWriteError") and not isinstance(exc, ConfigError):
            raise
        print(f"error: {exc}", file=sys.stderr, flush=True)  # as the start-up checks print theirs
        exit_status.set(2 if isinstance(exc, ConfigError) else 1)
        if multirun:
            raise
        return []
    if multirun:
        return records  # the sweep callback prints one line per finished job
    for record in records:
        if record.get("status") == "ok":
            log.info(summary_line(record))
        elif record.get("status") == "interrupted":
            exit_status.set(int((record.get("interrupted") or {}).get("exit_code") or 130))
        else:
            where = record.get("run_dir")
            log.error(f"run failed: {record.get('error')}  (record kept in {result_path(where)}, traceback in {error_log_path(where)})")
            exit_status.set(1)
    if len(records) > 1:
        values = [(r.get("metrics") or {}).get(r.get("primary_metric") or "") for r in records]
        values = [v for v in values if isinstance(v, int | float)]
        if values:
            log.info(f"{len(records)} seeds: mean {records[0].get('primary_metric')} = {sum(values) / len(values):.4g}")
    return records


def _check_before_running(cfg: DictConfig, choices: dict | None = None) -> None:
    """A bad value is one line and exit 2 before Lightning loads (seconds) and before any record is written.

    Single runs only: in a sweep each job checks in its own process and its record says what was wrong.
    """
    try:
        config_checks.check_missing(cfg)
        choices = config_checks.runtime_choices(cfg) if choices is None else choices
        config_checks.check_types(cfg, choices)
        config_checks.check_values(cfg, choices)
        config_checks.check_monitors(cfg)  # imports the task (and Lightning) only when a callback monitors a metric
        _check_device(cfg)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


def _check_device(cfg: DictConfig) -> None:
    """device=cuda (or mps) on a machine without one: one line now, not after Lightning has loaded."""
    requested = str(OmegaConf.select(cfg, "device.accelerator", default="auto") or "auto").lower()
    if requested in ("auto", "cpu"):
        return  # always satisfiable: no need to load torch here
    from pipeline.runtime.devices import DeviceError, resolve_accelerator

    try:
        resolve_accelerator(requested)
    except DeviceError as exc:
        raise ConfigError(str(exc)) from None


def _check_single_run_first(argv: list[str]) -> None:
    """A single run's config and run dir are checked before Hydra creates the dir or writes its .hydra/: a bad
    value (exit 2) or a refused run dir (busy, finished, resumed with another config: exit 1) changes nothing
    on disk and answers before Lightning is imported. Sweeps check each job in its own process."""
    if any(a.startswith("-") for a in argv):  # -m, --cfg, --help, --info, ...: Hydra's own business
        return
    from hydra import compose, initialize_config_module

    from pipeline.runtime.preflight import RunRefused, preflight

    try:
        with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
            cfg = compose(config_name="config", overrides=argv, return_hydra_config=True)
    except Exception as exc:  # noqa: BLE001 - Hydra reports its other errors (with its hints) when it composes for real
        line = _unknown_key_line(str(exc), argv)
        if line is None:
            return
        print(f"error: {line}", file=sys.stderr)
        sys.exit(2)
    choices = config_checks.runtime_choices(cfg)
    run_dir = Path(str(cfg.hydra.run.dir))
    with open_dict(cfg):
        del cfg["hydra"]  # the job's config, as the run gets it (Hydra's node still has sweep-only values unset)
    _check_before_running(cfg, choices)
    _check_writable(run_dir)
    if any(a.startswith("hydra.run.dir=") for a in argv):
        try:
            preflight(cfg, run_dir)
        except RunRefused as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(1)


def _check_writable(run_dir: Path) -> None:
    """A run dir that cannot be made (a read-only or immutable parent, a full disk): one line now, before Hydra's
    own traceback from its mkdir. Probed with a temporary file in the nearest existing parent, removed at once."""
    parent = run_dir.absolute()
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    try:
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as exc:
        print(f"error: cannot create the run dir {run_dir}: {cause_of(exc)} in {parent}; choose a writable dir with "
              "hydra.run.dir=<dir>", file=sys.stderr)
        sys.exit(1)


def _unknown_key_line(message: str, argv: list[str]) -> str | None:
    """Hydra's five lines for `optimizer.lrr=0.1` as one: the key, the closest real one, how to add a new key."""
    match = re.match(r"Could not override '([^']+)'", message)
    if match is None:
        return None
    key = match.group(1)
    typed = next((a for a in argv if a.split("=", 1)[0].lstrip("+~") == key), key)
    parent, _, leaf = key.rpartition(".")
    rest = [a for a in argv if a is not typed]
    try:
        from hydra import compose, initialize_config_module

        with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
            node = OmegaConf.select(compose(config_name="config", overrides=rest), parent) if parent else None
        known = [str(k) for k in node.keys()] if isinstance(node, DictConfig) else []
    except Exception:  # noqa: BLE001 - the hint is a bonus; the line stands without it
        known = []
    close = difflib.get_close_matches(leaf, known, n=1)
    hint = f"did you mean {parent + '.' if parent else ''}{close[0]}? " if close else ""
    return f"{typed}: {parent or 'the config'} has no key {leaf!r}; {hint}to add a new key: +{typed.lstrip('+')}"


def _user_config_dirs(argv: list[str]) -> bool:
    """Whether the user adds config folders (`--config-dir DIR` or `--config-dir=DIR`, `-cd`, `--config-path`,
    `-cp`, hydra.searchpath): then a group option may live there, and the packaged groups cannot judge it."""
    return any(a.split("=", 1)[0] in ("--config-dir", "-cd", "--config-path", "-cp") or "searchpath" in a for a in argv)


def main(argv: list[str] | None = None) -> None:
    honour_stop_signals_from_now()
    _main(argv)


def _main(argv: list[str] | None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    quiet.install()
    # The `pipeline` console script imports the user's modules (a model or callback named by _target_)
    # from the current folder, as `python -m pipeline` does.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    # W&B never waits for a server unless the user chose a mode.
    os.environ.setdefault("WANDB_MODE", "offline")
    if not _user_config_dirs(argv):
        try:
            check_group_overrides(argv)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
    if not _user_config_dirs(argv):
        _check_single_run_first(argv)
    sys.argv = [sys.argv[0], *argv]
    hydra_entry()
    sys.exit(exit_status.code)

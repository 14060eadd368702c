"""Command line: `python -m pipeline [experiment=<preset>] [group=option ...] [key=value ...] [-m ...]`.

The command line wraps the Python API's front door (`pipeline.runtime.start`, which `pipeline.run` uses too): a
single run is composed, checked once (`pipeline.config.startup.check_run`) and its run dir claimed before Hydra
writes anything; this module prints a refusal's one line and exits 2 (a config) or 1 (a run dir).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from pipeline.config.checks import check_group_overrides
from pipeline.config.errors import ConfigError
from pipeline.config.grouping import start_sweep_id
from pipeline.config.startup import model_contracts_help
from pipeline.runtime import quiet
from pipeline.runtime.context import exit_status, launcher_failure_handler
from pipeline.runtime.preflight import RunRefused
from pipeline.runtime.rundir import honour_stop_signals_from_now
from pipeline.runtime.start import (
    ComposeFailed,
    Start,
    adds_config_dirs,
    check_device,
    check_dirs_given,
    check_override_grammar,
    compose_and_check,
    compose_overrides,
    start_single_run,
    typed_lengths_win,
)
from pipeline.store.layout import error_log_path, result_path
from pipeline.store.record import summary_line

log = logging.getLogger("pipeline")


if not OmegaConf.has_resolver("pipeline_uid"):
    # The default sweep dir's name carries the sweep's id (config.grouping.start_sweep_id).
    OmegaConf.register_new_resolver("pipeline_uid", start_sweep_id, use_cache=True)


# The single run `_main` checked and whose run dir it claimed before Hydra composed: what `hydra_entry` runs.
_PREPARED: list[Start] = []


@hydra.main(version_base="1.3", config_path="pkg://pipeline.conf", config_name="config")
def hydra_entry(cfg: DictConfig) -> list[dict]:
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    # pipeline.runtime.job is light: Lightning is imported by the process that trains (a sweep's child, or this one).
    from pipeline.runtime.job import hydra_job

    start = _PREPARED.pop() if _PREPARED and not multirun else None
    try:
        records = hydra_job(cfg, start)
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
            trace = f", traceback in {error_log_path(where)}" if error_log_path(where).is_file() else ""
            log.error(f"run failed: {record.get('error')}  (record kept in {result_path(where)}{trace})")
            exit_status.set(1)
    if len(records) > 1:
        values = [(r.get("metrics") or {}).get(r.get("primary_metric") or "") for r in records]
        values = [v for v in values if isinstance(v, int | float)]
        if values:
            log.info(f"{len(records)} seeds: mean {records[0].get('primary_metric')} = {sum(values) / len(values):.4g}")
    return records


def _refuse(exc: BaseException, code: int) -> NoReturn:
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(code)


def _check_sweep_first(argv: list[str]) -> None:
    """A sweep's config is checked once before anything is launched, as a single run's is: its first job's
    overrides (the first value of each swept key), then each other value of a swept key in turn (up to 32
    variants). A bad value or a typo is one line and exit 2, with the same "did you mean" as a single run, instead
    of a traceback per job and a `resume=true` that cannot help. The tuner's search spaces (interval, tag) are
    left to it."""
    flags = [a for a in argv if a.startswith("-")]
    if not flags or any(f not in ("-m", "--multirun") for f in flags):
        return
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, RangeSweep

    given = [a for a in argv if not a.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(given)
    except Exception:  # noqa: BLE001 - check_override_grammar has said what it can; Hydra says the rest
        return
    first, swept = [], []
    for arg, override in zip(given, parsed):
        if not override.is_sweep_override():
            first.append(arg)
            continue
        if not isinstance(override.value(), ChoiceSweep | RangeSweep):
            continue  # the tuner's interval(...) / tag(...): a search space, not values
        prefix = arg.split("=", 1)[0]
        values = list(override.sweep_string_iterator())
        if values:
            first.append(f"{prefix}={values[0]}")
            swept.append((prefix, values[1:]))
    variants = [first] + [[f"{prefix}={v}" if a.split("=", 1)[0] == prefix else a for a in first]
                          for prefix, values in swept for v in values][:32]
    for overrides in variants:
        try:
            cfg, checked = compose_and_check(overrides)
            # A cluster launcher runs the jobs on its nodes: their devices are checked there (the SLURM launcher
            # names a partition without GPUs itself), not against this machine's.
            if "slurm" not in str(OmegaConf.select(cfg, "hydra.launcher._target_", default="")).lower():
                check_device(checked.device.accelerator)
        except ComposeFailed:
            return  # Hydra reports its other errors when it composes for real
        except ConfigError as exc:
            _refuse(exc, 2)


def _check_single_run_first(argv: list[str]) -> Start | None:
    """A single run's config and run dir are checked before Hydra creates the dir or writes its .hydra/ (the front
    door `pipeline.run` goes through too): a bad value (exit 2) or a refused run dir (a user's folder, busy,
    finished, resumed with another config: exit 1) changes nothing on disk and answers before Lightning is imported.
    The run dir stays locked for the run (the caller releases it). None for a sweep or Hydra's own flags."""
    overrides = compose_overrides(argv)
    if overrides is None:  # -m, --cfg, --help, --config-path, ...: Hydra's own business
        return None
    try:
        return start_single_run(argv, overrides)
    except ComposeFailed:
        return None  # Hydra reports its other errors (with its hints) when it composes for real
    except ConfigError as exc:
        _refuse(exc, 2)
    except RunRefused as exc:
        _refuse(exc, 1)


def _end_sweeps_whatever_the_launcher_does() -> None:
    """A launcher that fails under a sweep (a killed joblib worker, a killed submitit controller) raised past
    Hydra's callbacks: a 36-48 line traceback, no report, no resume command, processes left behind. Hydra's
    multirun is wrapped so the sweep ends as any other (pipeline.sweep.end_after_launcher_failure); a sweep stopped
    by a signal (SystemExit 129/130/143) ends the same way, then exits with its code."""
    from hydra._internal.hydra import Hydra

    if getattr(Hydra.multirun, "_pipeline_guard", False):
        return
    original = Hydra.multirun

    def ended(exc: BaseException, stopped: bool = False) -> bool:
        return bool(launcher_failure_handler) and launcher_failure_handler[0](exc, stopped=stopped)

    def multirun(self, *args, **kwargs):
        try:
            return original(self, *args, **kwargs)
        except SystemExit as exc:
            if exc.code in (129, 130, 143):
                ended(exc, stopped=True)
            raise
        except Exception as exc:
            if type(exc).__name__ in ("ConfigError", "RunRefused") or not ended(exc):
                raise
            return None

    multirun._pipeline_guard = True
    Hydra.multirun = multirun


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
    try:
        check_dirs_given(argv)
        check_override_grammar(argv)
        argv = typed_lengths_win(argv)
        if not adds_config_dirs(argv):  # an option may live in the user's own folder: the packaged groups cannot judge
            check_group_overrides(argv)
    except ConfigError as exc:
        _refuse(exc, 2)
    start = _check_single_run_first(argv)
    _check_sweep_first(argv)
    if any(a in ("-m", "--multirun") for a in argv):
        _end_sweeps_whatever_the_launcher_does()
    sys.argv = [sys.argv[0], *argv]
    if start is not None:
        _PREPARED.append(start)
    try:
        hydra_entry()
    except SystemExit as exc:
        if exc.code in (0, None) and any(a in ("--help", "-h") for a in argv):
            print(model_contracts_help())  # after Hydra's own help: what a model of the user's own must take and return
        raise
    finally:
        _PREPARED.clear()
        if start is not None:  # refused before any record (e.g. more DDP processes than batches): what Hydra wrote goes
            start.release(refused=exit_status.code == 2)
    sys.exit(exit_status.code)

"""Command line: `python -m pipeline [experiment=<preset>] [group=option ...] [key=value ...] [-m ...]`."""

from __future__ import annotations

import difflib
import errno
import logging
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict

from pipeline.config import checks as config_checks
from pipeline.config.checks import ConfigError, check_group_overrides, one_line
from pipeline.config.grouping import start_sweep_id
from pipeline.runtime import quiet
from pipeline.runtime.context import exit_status, hydra_quoted, launcher_failure_handler, path_override
from pipeline.runtime.rundir import RunDirBusy, RunDirLock, honour_stop_signals_from_now
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
            trace = f", traceback in {error_log_path(where)}" if error_log_path(where).is_file() else ""
            log.error(f"run failed: {record.get('error')}  (record kept in {result_path(where)}{trace})")
            exit_status.set(1)
    if len(records) > 1:
        values = [(r.get("metrics") or {}).get(r.get("primary_metric") or "") for r in records]
        values = [v for v in values if isinstance(v, int | float)]
        if values:
            log.info(f"{len(records)} seeds: mean {records[0].get('primary_metric')} = {sum(values) / len(values):.4g}")
    return records


def _check_before_running(cfg: DictConfig, choices: dict | None = None, device: bool = True) -> None:
    """A bad value is one line and exit 2 before Lightning loads (seconds) and before any record is written.

    `device`: also whether this machine has the device asked for (not for jobs a cluster runs elsewhere).
    """
    try:
        config_checks.check_missing(cfg)
        choices = config_checks.runtime_choices(cfg) if choices is None else choices
        config_checks.check_types(cfg, choices)
        config_checks.check_values(cfg, choices)
        config_checks.check_monitors(cfg)  # imports the task (and Lightning) only when a callback monitors a metric
        if device:
            _check_device(cfg)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except OSError as exc:  # a native library that does not load (MuJoCo without its GL library): one line, not 38
        print(f"error: {_unloadable_line(cfg, exc)}", file=sys.stderr)
        sys.exit(2)


def _unloadable_line(cfg: DictConfig, exc: OSError) -> str:
    """What failed to load while the config was checked (the package of the innermost frame), and for which env."""
    import traceback

    frames = [frame for frame, _ in traceback.walk_tb(exc.__traceback__)]
    package = str(frames[-1].f_globals.get("__name__", "")).split(".")[0] if frames else ""
    env_id = OmegaConf.select(cfg, "env.id", default=None)
    where = f"env.id={env_id}" if env_id else "the config's check"
    what = f"the {package} package is installed but cannot be loaded" if package else "a library cannot be loaded"
    return f"{where}: {what} ({one_line(exc)[:200]}); repair its installation, or choose another env"


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


def _check_sweep_first(argv: list[str]) -> None:
    """A sweep's config is checked once before anything is launched, as a single run's is: its first job's
    overrides (the first value of each swept key), then each other value of a swept key in turn (up to 32
    variants). A bad value or a typo is one line and exit 2, with the same "did you mean" as a single run, instead
    of a traceback per job and a `resume=true` that cannot help. The tuner's search spaces (interval, tag) are
    left to it."""
    flags = [a for a in argv if a.startswith("-")]
    if not flags or any(f not in ("-m", "--multirun") for f in flags):
        return
    from hydra import compose, initialize_config_module
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, RangeSweep

    given = [a for a in argv if not a.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(given)
    except Exception:  # noqa: BLE001 - _check_override_grammar has said what it can; Hydra says the rest
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
            with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
                cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
        except Exception as exc:  # noqa: BLE001 - Hydra reports its other errors when it composes for real
            line = _unknown_key_line(str(exc), overrides)
            if line is None:
                return
            print(f"error: {line}", file=sys.stderr)
            sys.exit(2)
        choices = config_checks.runtime_choices(cfg)
        # A cluster launcher runs the jobs on its nodes: their devices are checked there (the SLURM launcher names
        # a partition without GPUs itself), not against this machine's.
        elsewhere = "slurm" in str(OmegaConf.select(cfg, "hydra.launcher._target_", default="")).lower()
        with open_dict(cfg):
            del cfg["hydra"]
        _check_before_running(cfg, choices, device=not elsewhere)


def _check_single_run_first(argv: list[str]) -> tuple[RunDirLock, Path | None] | None:
    """A single run's config and run dir are checked before Hydra creates the dir or writes its .hydra/: a bad
    value (exit 2) or a refused run dir (a user's folder, busy, finished, resumed with another config: exit 1)
    changes nothing on disk and answers before Lightning is imported. Then the run dir's lock is taken, before
    Hydra writes anything there, and returned with the topmost folder it created (the caller releases it; the
    run's own lifecycle shares it). Sweeps check each job in its own process."""
    if any(a.startswith("-") for a in argv):  # -m, --cfg, --help, --info, ...: Hydra's own business
        return None
    from hydra import compose, initialize_config_module

    from pipeline.runtime.preflight import RunRefused, preflight

    try:
        with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
            cfg = compose(config_name="config", overrides=argv, return_hydra_config=True)
    except Exception as exc:  # noqa: BLE001 - Hydra reports its other errors (with its hints) when it composes for real
        line = _unknown_key_line(str(exc), argv)
        if line is None:
            return None
        print(f"error: {line}", file=sys.stderr)
        sys.exit(2)
    choices = config_checks.runtime_choices(cfg)
    run_dir = Path(str(cfg.hydra.run.dir))
    with open_dict(cfg):
        del cfg["hydra"]  # the job's config, as the run gets it (Hydra's node still has sweep-only values unset)
    _check_before_running(cfg, choices)
    _check_name_lengths(run_dir, "hydra.run.dir")
    _check_writable(run_dir)
    created = _first_missing(run_dir)
    empty_before = created is not None or not any(run_dir.iterdir())
    lock = RunDirLock(run_dir)
    try:
        preflight(cfg, run_dir)
        lock.acquire()
        preflight(cfg, run_dir)  # again, now that no other process can start in it
    except (RunRefused, RunDirBusy, OSError) as exc:
        lock.release()
        _remove_if_empty(run_dir, created)
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    if not any(a.split("=", 1)[0].lstrip("+") == "hydra.run.dir" for a in argv):
        # The dir Hydra composes again from `${now:...}` could be a second later: it runs in the one locked.
        argv.append(f"hydra.run.dir={hydra_quoted(str(run_dir))}")
    return lock, created, empty_before


def _first_missing(run_dir: Path) -> Path | None:
    """The topmost folder of `run_dir` that does not exist yet (what taking its lock creates), or None."""
    missing = None
    for path in (run_dir.absolute(), *run_dir.absolute().parents):
        if path.exists():
            return missing
        missing = path
    return missing


def _remove_if_empty(run_dir: Path, created: Path | None) -> None:
    """Remove the folders taking the lock created, from `run_dir` up to `created`, where nothing else was put."""
    if created is None:
        return
    for path in (run_dir.absolute(), *run_dir.absolute().parents):
        try:
            path.rmdir()
        except OSError:
            return
        if path == created:
            return


def _remove_hydra_files(run_dir: Path) -> None:
    """A run refused before its record leaves no run dir: what Hydra wrote into a dir that was new or empty
    (`.hydra/`, `run.log`) goes, and only when nothing else is there."""
    if not run_dir.is_dir():
        return
    hydra_files = {".hydra", "run.log"}
    if not {p.name for p in run_dir.iterdir()} <= hydra_files:
        return
    shutil.rmtree(run_dir / ".hydra", ignore_errors=True)
    (run_dir / "run.log").unlink(missing_ok=True)


def _check_writable(run_dir: Path) -> None:
    """A run dir that cannot be made (a read-only or immutable parent, a full disk): one line now, before Hydra's
    own traceback from its mkdir. Probed with a temporary file in the nearest existing parent holding a few
    blocks of data (an empty file fits on a full disk), removed at once."""
    parent = run_dir.absolute()
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    try:
        with tempfile.TemporaryFile(dir=parent) as probe:
            probe.write(b"\0" * (64 << 10))
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as exc:
        print(f"error: cannot create the run dir {run_dir}: {cause_of(exc)} in {parent}; "
              f"{'free some space or ' if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ''}choose a writable dir with "
              "hydra.run.dir=<dir>", file=sys.stderr)
        sys.exit(1)


def _name_max(path: Path) -> int:
    """The longest file name the file system under `path` takes (255 on Linux file systems)."""
    for parent in path.absolute().parents:
        try:
            return int(os.pathconf(parent, "PC_NAME_MAX"))
        except (OSError, ValueError):
            continue
    return 255


def _check_name_lengths(path: Path, key: str) -> None:
    """A dir name longer than the file system takes (a 300-character `name` or run dir): one line, not Hydra's
    `File name too long` traceback after it composed."""
    limit = _name_max(path)
    for part in Path(path).parts:
        if len(part.encode()) > limit:
            print(f"error: {key}: the folder name {part[:40]}... is {len(part.encode())} bytes, more than the {limit} "
                  f"a file name may have here; choose a shorter {'name=' if key == 'name' else key + '=<dir>'}",
                  file=sys.stderr)
            sys.exit(2)


def _check_override_grammar(argv: list[str]) -> None:
    """An override Hydra's grammar cannot read (a dir holding `=`, `,`, spaces or brackets; a number of thousands
    of digits): one line with the quoted form of the user's own value, instead of Hydra's context-free
    "mismatched input" or a traceback."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue
        key, _, value = arg.partition("=")
        try:
            (override,) = parser.parse_overrides([arg])
            if override.key_or_group in ("hydra.run.dir", "hydra.sweep.dir") and override.is_sweep_override():
                reason = "a comma makes it a list of dirs"
            else:
                continue
        except ValueError as exc:  # Python's cap on digits in an int (4300)
            print(f"error: {key}={value[:20]}...: a number of {len(value)} digits is more than any setting takes; "
                  f"give {key} a smaller value ({one_line(exc)[:60]}...)", file=sys.stderr)
            sys.exit(2)
        except Exception as exc:  # noqa: BLE001 - Hydra's OverrideParseException and its lexer's errors
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"error: {arg}: Hydra's override grammar cannot read this value ({reason}); quote it: "
              f"{key}={hydra_quoted(value)}, typed in a shell as {path_override(key, value)}", file=sys.stderr)
        sys.exit(2)


def _check_dirs_given(argv: list[str]) -> None:
    """`hydra.run.dir=` or `hydra.sweep.dir=` with nothing after it (an unset shell variable) names the current
    folder: refused in one line, before anything is written there."""
    for arg in argv:
        key, eq, value = arg.partition("=")
        if eq and key.lstrip("+") in ("hydra.run.dir", "hydra.sweep.dir") and value.strip("'\" ") == "":
            print(f"error: {key}= is empty (an unset shell variable?): it would write into the current folder; give a "
                  f"dir ({key}=outputs/my_run) or leave it out for a new dated dir", file=sys.stderr)
            sys.exit(2)
        if eq and key.lstrip("+") == "name" and len(value.encode()) > 200:
            _check_name_lengths(Path(value), "name")
        if eq and key.lstrip("+") == "hydra.sweep.dir":
            _check_name_lengths(Path(value.strip("'\"")), "hydra.sweep.dir")


# trainer=debug's caps (conf/debug/debug.yaml) that would cut a typed length short: an RL task's iterations are its
# train batches, so trainer.limit_train_batches=3 ended a typed task.total_steps=1000 at 192 env steps; a typed
# trainer.max_steps ran into debug's trainer.max_epochs=1. The key typed -> the cap that yields to it.
DEBUG_CAPS = {"task.total_steps": ("trainer.limit_train_batches", "null"),
              "task.max_iterations": ("trainer.limit_train_batches", "null"),
              "trainer.max_steps": ("trainer.max_epochs", "-1")}


def typed_lengths_win(argv: list[str]) -> list[str]:
    """With trainer=debug, a length typed on the command line wins over debug's caps: the cap it would run into is
    lifted (an override added to `argv`, so the saved config, the record and the resume command say so), in one
    line each. A cap the user typed too stays."""
    if "trainer=debug" not in argv:
        return argv
    typed = {a.split("=", 1)[0].lstrip("+~") for a in argv if "=" in a and not a.startswith("-")}
    added = []
    for key, (cap, lifted) in DEBUG_CAPS.items():
        if key in typed and cap not in typed and f"{cap}={lifted}" not in added:
            added.append(f"{cap}={lifted}")
            log.warning(f"trainer=debug: {key} was typed, so debug's {cap} cap is lifted ({cap}={lifted})")
    return [*argv, *added]


def _missing_option_line(message: str) -> str | None:
    """Hydra's fourteen lines for `hydra/launcher=jobib` (a group the project's own check leaves to Hydra: its options
    come from Hydra's plugins) as the one line the project's groups answer with."""
    match = re.search(r"Could not find '([^']+)/([^'/]+)'", message)
    if match is None:
        return None
    group, option = match.groups()
    listed = re.search(r"Available options in '[^']+':\n((?:\t.*\n?)+)", message)
    options = [o.strip() for o in listed.group(1).splitlines() if o.strip()] if listed else []
    close = difflib.get_close_matches(option, options, n=1)
    hint = f"did you mean {group}={close[0]}? " if close else ""
    return f"unknown option {option!r} for config group {group!r}; {hint}choose one of: {', '.join(options) or '(none found)'}"


def _unknown_key_line(message: str, argv: list[str]) -> str | None:
    """Hydra's five lines for `optimizer.lrr=0.1` as one: the key, the closest real one, how to add a new key; or
    Hydra's report of a group option it cannot find (`_missing_option_line`)."""
    match = re.match(r"Could not override '([^']+)'", message)
    if match is None:
        return _missing_option_line(message)
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
    _check_dirs_given(argv)
    _check_override_grammar(argv)
    argv = typed_lengths_win(argv)
    if not _user_config_dirs(argv):
        try:
            check_group_overrides(argv)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
    held = None if _user_config_dirs(argv) else _check_single_run_first(argv)
    if not _user_config_dirs(argv):
        _check_sweep_first(argv)
    if any(a in ("-m", "--multirun") for a in argv):
        _end_sweeps_whatever_the_launcher_does()
    sys.argv = [sys.argv[0], *argv]
    try:
        hydra_entry()
    finally:
        if held is not None:
            lock, created, empty_before = held
            lock.release()
            if exit_status.code == 2 and empty_before:  # refused before any record (e.g. more DDP processes than batches)
                _remove_hydra_files(Path(lock.path.parent))
            _remove_if_empty(Path(lock.path.parent), created)
    sys.exit(exit_status.code)

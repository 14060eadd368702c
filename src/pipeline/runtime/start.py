"""A single run's front door, shared by `python -m pipeline` and `pipeline.run`: the command line's overrides ->
the composed config -> `check_run` -> the run dir checked and locked, before Hydra writes anything.

Light on purpose (no torch, no Lightning unless a device other than cpu/auto is asked for). Everything here raises:
`ConfigError` for what the user fixes in the config (the CLI exits 2), `RunRefused` for a run dir that cannot take
the run (exit 1). The CLI prints the line; `pipeline.run` raises it.
"""

from __future__ import annotations

import difflib
import errno
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from pipeline.config.checks import one_line
from pipeline.config.errors import ConfigError
from pipeline.config.startup import CheckedRun, check_run
from pipeline.runtime.context import hydra_quoted, path_override
from pipeline.runtime.preflight import RunRefused, StartPlan, plan_start, preflight
from pipeline.runtime.rundir import RunDirBusy, RunDirLock
from pipeline.store.atomic import cause_of
from pipeline.store.layout import agent_dirs, checkpoint_path, record_dirs_of_run, result_path

log = logging.getLogger("pipeline")

CONFIG_MODULE = "pipeline.conf"


# ---- the command line, before anything is composed --------------------------------------------------------------
def check_override_grammar(argv: list[str]) -> None:
    """An override Hydra's grammar cannot read (a dir holding `=`, `,`, spaces or brackets; a number of thousands of
    digits): one line with the quoted form of the user's own value, instead of Hydra's context-free "mismatched
    input" or a traceback."""
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
            raise ConfigError(f"{key}={value[:20]}...: a number of {len(value)} digits is more than any setting takes; "
                              f"give {key} a smaller value ({one_line(exc)[:60]}...)") from None
        except Exception as exc:  # noqa: BLE001 - Hydra's OverrideParseException and its lexer's errors
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{arg}: Hydra's override grammar cannot read this value ({reason}); quote it: "
                          f"{key}={hydra_quoted(value)}, typed in a shell as {path_override(key, value)}")


def check_dirs_given(argv: list[str]) -> None:
    """`hydra.run.dir=` or `hydra.sweep.dir=` with nothing after it (an unset shell variable) names the current
    folder: refused in one line, before anything is written there; so is a folder name longer than the file system
    takes."""
    for arg in argv:
        key, eq, value = arg.partition("=")
        if eq and key.lstrip("+") in ("hydra.run.dir", "hydra.sweep.dir") and value.strip("'\" ") == "":
            raise ConfigError(f"{key}= is empty (an unset shell variable?): it would write into the current folder; give a "
                              f"dir ({key}=outputs/my_run) or leave it out for a new dated dir")
        if eq and key.lstrip("+") == "name" and len(value.encode()) > 200:
            check_name_lengths(Path(value), "name")
        if eq and key.lstrip("+") == "hydra.sweep.dir":
            check_name_lengths(Path(value.strip("'\"")), "hydra.sweep.dir")


def name_max(path: Path) -> int:
    """The longest file name the file system under `path` takes (255 on Linux file systems)."""
    for parent in path.absolute().parents:
        try:
            return int(os.pathconf(parent, "PC_NAME_MAX"))
        except (OSError, ValueError):
            continue
    return 255


def check_name_lengths(path: Path, key: str) -> None:
    """A dir name longer than the file system takes (a 300-character `name` or run dir): one line, not Hydra's
    `File name too long` traceback after it composed."""
    limit = name_max(path)
    for part in Path(path).parts:
        if len(part.encode()) > limit:
            raise ConfigError(f"{key}: the folder name {part[:40]}... is {len(part.encode())} bytes, more than the {limit} "
                              f"a file name may have here; choose a shorter {'name=' if key == 'name' else key + '=<dir>'}")


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


# ---- composing ----------------------------------------------------------------------------------------------------
CONFIG_DIR_FLAGS = ("--config-dir", "-cd")


def adds_config_dirs(argv: list[str]) -> bool:
    """Whether the user adds config folders (`--config-dir DIR` or `--config-dir=DIR`, `-cd`, `--config-path`,
    `-cp`, hydra.searchpath): then a group option may live there, and the packaged groups cannot judge it."""
    return any(a.split("=", 1)[0] in ("--config-dir", "-cd", "--config-path", "-cp") or "searchpath" in a for a in argv)


def compose_overrides(argv: list[str]) -> list[str] | None:
    """The overrides that compose what `argv` runs, a config folder of the user's (`--config-dir DIR`, `-cd DIR`) as
    a search path; None when `argv` holds another flag (-m, --cfg, --help, --config-path, ...: Hydra's own business)."""
    out, dirs, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        flag, eq, value = arg.partition("=")
        if flag in CONFIG_DIR_FLAGS:
            if not eq:
                if i + 1 >= len(argv):
                    return None
                i, value = i + 1, argv[i + 1]
            dirs.append(value)
        elif arg.startswith("-"):
            return None
        else:
            out.append(arg)
        i += 1
    if not dirs:
        return out
    if any(a.split("=", 1)[0].lstrip("+") == "hydra.searchpath" for a in out):
        return None  # both spellings at once: Hydra merges them its way
    return [*out, "hydra.searchpath=[" + ",".join(f"file://{Path(d).absolute()}" for d in dirs) + "]"]


def missing_option_line(message: str) -> str | None:
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


def unknown_key_line(message: str, argv: list[str]) -> str | None:
    """Hydra's five lines for `optimizer.lrr=0.1` as one: the key, the closest real one, how to add a new key; or
    Hydra's report of a group option it cannot find (`missing_option_line`)."""
    match = re.match(r"Could not override '([^']+)'", message)
    if match is None:
        return missing_option_line(message)
    key = match.group(1)
    typed = next((a for a in argv if a.split("=", 1)[0].lstrip("+~") == key), key)
    parent, _, leaf = key.rpartition(".")
    rest = [a for a in argv if a is not typed]
    try:
        from hydra import compose, initialize_config_module

        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            node = OmegaConf.select(compose(config_name="config", overrides=rest), parent) if parent else None
        known = [str(k) for k in node.keys()] if isinstance(node, DictConfig) else []
    except Exception:  # noqa: BLE001 - the hint is a bonus; the line stands without it
        known = []
    close = difflib.get_close_matches(leaf, known, n=1)
    hint = f"did you mean {parent + '.' if parent else ''}{close[0]}? " if close else ""
    return f"{typed}: {parent or 'the config'} has no key {leaf!r}; {hint}to add a new key: +{typed.lstrip('+')}"


class ComposeFailed(Exception):
    """Hydra could not compose the overrides, for a reason without a one-line form here: Hydra says it best."""


def compose_and_check(overrides: list[str]) -> tuple[DictConfig, CheckedRun]:
    """The config `overrides` compose (with its `hydra` node) and the run it checks to. Hydra's refusal of an unknown
    key or option is a ConfigError of one line; another composing error is ComposeFailed."""
    from hydra import compose, initialize_config_module

    failed = None
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        try:
            cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
        except Exception as exc:  # noqa: BLE001 - Hydra's errors: its unknown keys and options become one line
            failed = exc
        else:
            return cfg, check_run(cfg)  # inside: a user's model option is composed alone there (startup.own_model_node)
    line = unknown_key_line(str(failed), overrides)  # composes again for its hint: after the first has let go
    if line is None:
        raise ComposeFailed(str(failed).strip().splitlines()[0] if str(failed).strip() else type(failed).__name__) from failed
    raise ConfigError(line) from None


# ---- the machine and the run dir ------------------------------------------------------------------------------------
def check_device(accelerator: str | None) -> None:
    """device=cuda (or mps) on a machine without one: one line now, not after Lightning has loaded."""
    requested = str(accelerator or "auto").lower()
    if requested in ("auto", "cpu"):
        return  # always satisfiable: no need to load torch here
    from pipeline.runtime.devices import DeviceError, resolve_accelerator

    try:
        resolve_accelerator(requested)
    except DeviceError as exc:
        raise ConfigError(str(exc)) from None


def check_writable(run_dir: Path) -> None:
    """A run dir that cannot be made (a read-only or immutable parent, a full disk): one line now, before Hydra's
    own traceback from its mkdir. Probed with a temporary file in the nearest existing parent holding a few blocks
    of data (an empty file fits on a full disk), removed at once."""
    parent = run_dir.absolute()
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    try:
        with tempfile.TemporaryFile(dir=parent) as probe:
            probe.write(b"\0" * (64 << 10))
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as exc:
        raise RunRefused(f"cannot create the run dir {run_dir}: {cause_of(exc)} in {parent}; "
                         f"{'free some space or ' if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ''}choose a writable dir "
                         "with hydra.run.dir=<dir>") from None


def first_missing(run_dir: Path) -> Path | None:
    """The topmost folder of `run_dir` that does not exist yet (what taking its lock creates), or None."""
    missing = None
    for path in (run_dir.absolute(), *run_dir.absolute().parents):
        if path.exists():
            return missing
        missing = path
    return missing


def remove_if_empty(run_dir: Path, created: Path | None) -> None:
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


def remove_hydra_files(run_dir: Path) -> None:
    """A run refused before its record leaves no run dir: what Hydra wrote into a dir that was new or empty
    (`.hydra/`, `run.log`) goes, and only when nothing else is there."""
    if not run_dir.is_dir():
        return
    hydra_files = {".hydra", "run.log"}
    if not {p.name for p in run_dir.iterdir()} <= hydra_files:
        return
    shutil.rmtree(run_dir / ".hydra", ignore_errors=True)
    (run_dir / "run.log").unlink(missing_ok=True)


@dataclass
class Start:
    """A single run checked and its run dir claimed: what the lifecycle continues from (`plan`), under `lock`."""

    checked: CheckedRun
    run_dir: Path
    plan: StartPlan
    lock: RunDirLock
    created: Path | None  # the topmost folder taking the lock created (removed again if the run is refused)
    empty_before: bool  # the run dir was new or empty: a refusal before any record removes what Hydra wrote there

    def release(self, refused: bool = False) -> None:
        """Let go of the run dir; `refused` (before any record): what Hydra wrote into a new dir goes too."""
        self.lock.release()
        if refused and self.empty_before:
            remove_hydra_files(self.run_dir)
        remove_if_empty(self.run_dir, self.created)


def _written_state(run_dir: Path) -> list[tuple[str, int, int]]:
    """What a run writes that a plan reads (its records, its checkpoint), as (path, mtime, size)."""
    paths = [result_path(d) for d in record_dirs_of_run(run_dir)] + [checkpoint_path(run_dir)]
    return [(str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in paths if p.is_file()]


def claim_run_dir(checked: CheckedRun, run_dir: Path) -> Start:
    """The run dir, checked and locked before Hydra creates it or writes its .hydra/: a user's folder, a dir in use,
    a finished run, or a resume with another config is refused (RunRefused) and changes nothing on disk (a dead
    owner's lock file included). The plan (what the run continues from) is made once, before the lock is taken, and
    again under it only if another process wrote the dir in between; the lifecycle takes it from here."""
    check_name_lengths(run_dir, "hydra.run.dir")
    check_writable(run_dir)
    written = _written_state(run_dir)
    plan = preflight(checked.cfg, run_dir)
    created = first_missing(run_dir)
    empty_before = created is not None or not any(run_dir.iterdir())
    lock = RunDirLock(run_dir)
    try:
        lock.acquire()
        if _written_state(run_dir) != written:  # a run that ended while this one took its lock: its records decide
            plan = plan_start(checked.cfg, run_dir, agent_dirs(run_dir, checked.seeds))
    except (RunRefused, RunDirBusy, OSError) as exc:
        lock.release()
        remove_if_empty(run_dir, created)
        raise exc if isinstance(exc, RunRefused) else RunRefused(str(exc)) from None
    return Start(checked, run_dir, plan, lock, created, empty_before)


def start_single_run(argv: list[str], overrides: list[str] | None = None) -> Start:
    """Compose `argv` (`overrides`: what composes it, when `argv` holds a config folder flag), check it once, check
    the machine's device, and claim the run dir before anything is written. `hydra.run.dir=<the locked dir>` is
    appended to `argv` (Hydra's `${now:...}` could name another a second later)."""
    cfg, checked = compose_and_check(argv if overrides is None else overrides)
    check_device(checked.device.accelerator)
    run_dir = Path(str(cfg.hydra.run.dir))
    start = claim_run_dir(checked, run_dir)
    if not any(a.split("=", 1)[0].lstrip("+") == "hydra.run.dir" for a in argv):
        argv.append(f"hydra.run.dir={hydra_quoted(str(run_dir))}")
    return start

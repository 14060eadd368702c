"""The run record: result.json, written atomically, the contract between runs, reports and tests.

`RunRecord` is the one typed, versioned definition of result.json: the lifecycle writes it (one per agent,
K = 1 included); reports, the tuner, sweeps and replays read it through `read_record` / `read_records`.
Reading never invents provenance: a record written without a git commit or package versions says null,
it does not borrow today's. A record of a newer schema than this code knows is refused in one line.
Task-specific fields (e.g. the counterfactual task's coverage) live in `extras` and are written at
the top level of the JSON, next to the typed fields.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from pipeline.store.atomic import StoreWriteError, write_atomically
from pipeline.store.layout import RECORD_STATUSES, RESULT, record_dirs, result_path

SCHEMA_VERSION = 2
# Every status a record can hold: `running` is a record written at the start and not closed yet (the run is
# training, or was killed before it could say so); `pruned` is a tuning trial the pruner stopped.
STATUSES = RECORD_STATUSES


class RecordError(ValueError):
    """A result.json that cannot be read as a run record; the message is one line naming the file."""

_VERSIONED = ("torch", "lightning", "hydra-core", "gymnasium", "numpy", "ale-py", "wandb", "scikit-learn")


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in _VERSIONED:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def git_commit() -> str | None:
    """The commit of the checkout the package runs from, when it runs from one."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _clean(value: Any) -> Any:
    """Strict JSON: floats that are NaN or infinite become null; tensors and numpy scalars become numbers."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json(path: Path, data: dict) -> None:
    """Write via a temporary file and rename, so a reader never sees half a record. On a full disk (no room for
    the temp file) the record is rewritten in place within the blocks it already has, so it still says how the
    run ended rather than "still running"."""
    text = (json.dumps(_clean(data), indent=2, allow_nan=False) + "\n").encode()
    try:
        write_atomically(Path(path), lambda f: f.write(text), fsync=False)
    except StoreWriteError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not _overwrite_in_place(Path(path), _clean(data)):
            raise


def _overwrite_in_place(path: Path, data: dict) -> bool:
    """Rewrite `path` in place, padded with spaces to its present size (JSON allows trailing white space): no new
    block is needed. False when the record does not fit there even without indentation."""
    try:
        size = path.stat().st_size
    except OSError:
        return False
    for indent in (2, None):
        text = (json.dumps(data, indent=indent, allow_nan=False) + "\n").encode()
        if len(text) <= size:
            try:
                with path.open("r+b") as f:
                    f.write(text + b" " * (size - len(text)))
                return True
            except OSError:
                return False
    return False


def read_result(run_dir: Path) -> dict | None:
    """The raw JSON of `<run_dir>/result.json`, or None when there is none or it is not JSON (half-written by
    something else: ours are written atomically). A `running` record whose process is gone reads as `failed`
    (store.owner.settled)."""
    from pipeline.store.owner import settled

    path = result_path(run_dir)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return settled(data, Path(run_dir)) if isinstance(data, dict) else None


@dataclasses.dataclass
class RunRecord:
    """One run of one seed (one agent of a K-seed run is an ordinary run of its seed)."""

    experiment: str
    group: str
    task: str
    seed: int
    run_dir: str
    status: str = "failed"
    error: str | None = "run did not finish (killed, or still running)"
    primary_metric: str | None = None
    primary_curve: str | None = None
    higher_is_better: bool = True
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    wall_time_s: float | None = None
    # One entry per process that worked on the run: {started, wall_time_s, end, from_step, to_step}.
    segments: list[dict] = dataclasses.field(default_factory=list)
    time_breakdown_s: dict[str, float] = dataclasses.field(default_factory=dict)
    device: str | None = None
    versions: dict[str, str] | None = dataclasses.field(default_factory=versions)
    git_commit: str | None = dataclasses.field(default_factory=git_commit)
    # The resolved config minus the keys that do not change results (what reports group by).
    config: dict | None = None
    seeds_per_process: int = 1
    agent: int = 0
    pid: int | None = None
    # Set when SIGINT/SIGTERM stopped the run: {signal, step, resume}.
    interrupted: dict | None = None
    checkpoint: dict | None = None
    # RL runs (None elsewhere): the report tells RL runs by `env_steps` being set.
    env_id: str | None = None
    env_steps: int | None = None
    env_steps_per_s: float | None = None
    threshold: float | None = None
    time_to_threshold_s: float | None = None
    # When and why training stopped before its budget (null: it did not): a configured EarlyStopping
    # ({epoch, step, reason, monitor, best, ...}), the tuner's pruning, RL's task.stop_at_return.
    early_stop: dict | None = None
    evaluations: list[dict] | None = None
    metric_bounds: dict[str, list[float]] | None = None
    replay_bytes_per_transition: int | None = None
    extras: dict = dataclasses.field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    @property
    def is_rl(self) -> bool:
        return self.env_steps is not None

    def update(self, **fields) -> RunRecord:
        """Set typed fields; anything else goes to `extras` (written at the top level)."""
        names = {f.name for f in dataclasses.fields(self)}
        for key, value in fields.items():
            if key in names:
                setattr(self, key, value)
            else:
                self.extras[key] = value
        return self

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extras"}
        return {**data, **{k: v for k, v in self.extras.items() if k not in data}}

    @classmethod
    def from_dict(cls, data: dict) -> RunRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        typed = {k: v for k, v in data.items() if k in names and k != "extras"}
        extras = {k: v for k, v in data.items() if k not in names}
        # What an old or partial record lacks (keys it has are in `typed` already).
        typed.setdefault("experiment", "")
        typed.setdefault("group", typed["experiment"])
        typed.setdefault("task", "")
        typed.setdefault("seed", None)
        typed.setdefault("run_dir", "")
        typed.setdefault("schema_version", 1)
        # Provenance is what the record says, never today's: an old record without them says null.
        typed.setdefault("versions", None)
        typed.setdefault("git_commit", None)
        version = typed["schema_version"]
        if not isinstance(version, int) or isinstance(version, bool) or version > SCHEMA_VERSION:
            raise RecordError(
                f"schema_version {version!r} is not one this pipeline reads (1..{SCHEMA_VERSION}); "
                "read it with the pipeline version that wrote it (its `versions`), or upgrade"
            )
        return cls(**typed, extras=extras)

    def write(self, run_dir: Path | None = None) -> None:
        # `file`: result.json, or (while a finished run is being extended) a side file, so result.json
        # keeps the finished record until the extension has finished too.
        write_json(Path(run_dir or self.run_dir) / getattr(self, "file", RESULT), self.to_dict())


def read_record(run_dir: Path) -> RunRecord | None:
    """The record in `run_dir`, or None when it has none; a RecordError when it is of an unknown schema."""
    data = read_result(run_dir)
    if data is None:
        return None
    try:
        return RunRecord.from_dict(data)
    except RecordError as exc:
        raise RecordError(f"{result_path(run_dir)}: {exc}") from None
    except TypeError as exc:  # a field of the wrong shape: say which file
        raise RecordError(f"{result_path(run_dir)}: not a run record ({exc})") from None


def read_records(root: Path) -> list[RunRecord]:
    """Every run record under `root` (a run, a K-seed batch or a sweep dir), in path order; unreadable ones are
    skipped (a report or a sweep's end must not fail on one bad file: see report/collect.py for the warning)."""
    out = []
    for d in record_dirs(root):
        try:
            record = read_record(d)
        except RecordError:
            continue
        if record is not None:
            out.append(record)
    return out


def summary_line(record: dict) -> str:
    """One line for a finished run: seed, status, primary metric, wall time and where it is."""
    metric = record.get("primary_metric")
    value = (record.get("metrics") or {}).get(metric)
    shown = f"{metric}={value:.4g}" if isinstance(value, int | float) else "no metric"
    return f"seed={record.get('seed')} {record.get('status')} {shown} in {record.get('wall_time_s')} s -> {record.get('run_dir')}"

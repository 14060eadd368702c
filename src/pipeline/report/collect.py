"""Find and load run records under run or sweep dirs, through the store (pipeline.store): the report's view of a run."""

from __future__ import annotations

import csv
import functools
import math
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.store.curves import read_run_curve
from pipeline.store.layout import RESULT, read_owner, record_dirs, result_path
from pipeline.store.owner import owner_alive
from pipeline.store.record import STATUSES, RecordError, RunRecord, read_result

REQUIRED_KEYS = ("seed", "status")
# Every status a report counts and shows, in this order. `running` and `pruned` are read from records that
# say so, and from today's records: an unfinished record (status failed, its last segment never closed)
# whose owner process is alive is running; an ok record stopped by the tuner's pruner is pruned.
NOT_OK = STATUSES[1:]  # shown in every summary, even at zero
PRUNED_REASON = "pruned by the tuner"


class ReportInputError(ValueError):
    """Bad report input (missing dir, no run records). The message is one line and says the fix."""


class RunRecordWarning(UserWarning):
    """A result.json that could not be used and was skipped."""


@dataclass
class ReportedRun:
    """One run as the report sees it: the parsed result.json plus where it lives.

    `record` is the same result.json read through the typed definition run.py writes
    (`pipeline.store.record.RunRecord`): what kind of run it is comes from there, not from guesses here.
    """

    dir: Path
    input_root: Path
    result: dict[str, Any] = field(repr=False)
    # Set by the report's grouping (report/groups.py), which can split or merge the records' own `group`.
    report_group: str | None = None

    @property
    def group(self) -> str:
        if self.report_group is not None:
            return self.report_group
        return str(self.result.get("group") or self.result.get("experiment") or self.result.get("task") or "run")

    @property
    def seed(self) -> Any:
        return self.result.get("seed")

    @functools.cached_property
    def status(self) -> str:
        """One of STATUSES (or whatever else the record says, shown as it is)."""
        recorded = str(self.result.get("status"))
        if recorded == "ok" and (self.result.get("early_stop") or {}).get("reason") == PRUNED_REASON:
            return "pruned"
        if recorded == "failed" and self.unfinished and self.owner is not None:
            alive = owner_alive(self.owner)
            return "running" if alive or alive is None else "failed"
        return recorded

    @property
    def unfinished(self) -> bool:
        """The record was written at the start (or at a checkpoint) and never closed: killed, or still running."""
        segments = self.result.get("segments")
        if self.result.get("ended_by"):  # a sweep's job recorded how its training process died
            return False
        return isinstance(segments, list) and bool(segments) and isinstance(segments[-1], dict) and "end" not in segments[-1]

    @functools.cached_property
    def owner(self) -> dict[str, Any] | None:
        """The run's owner ({pid, host, since}) as its record names it, else as its run dir's lock file does, or None."""
        owner = self.result.get("owner")
        return owner if isinstance(owner, dict) and isinstance(owner.get("pid"), int) else read_owner(self.dir)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def error(self) -> str | None:
        """Why the run is not ok, in one message (None for an ok run)."""
        status = self.status
        if status == "running":
            if self.owner is None:  # the record itself says so
                return str(self.result.get("error") or "still running: the report is partial")
            where = f"process {self.owner['pid']} on {self.owner.get('host')}"
            if owner_alive(self.owner) is None:
                return f"unfinished, owned by {where}, which this host cannot check (still running, or killed without a word)"
            return f"still running ({where}): the report is partial"
        if status == "pruned":
            step = (self.result.get("early_stop") or {}).get("env_step", (self.result.get("early_stop") or {}).get("epoch"))
            return f"pruned by the tuner at step {step}: its value is from a shortened run"
        error = self.result.get("error")
        if status == "interrupted":
            stop = self.result.get("interrupted") or {}
            resume = f"; resume: {stop['resume']}" if stop.get("resume") else ""
            return str(error) if error else f"interrupted by {stop.get('signal', 'a signal')} at step {stop.get('step')}{resume}"
        if error:
            return str(error)
        return None if self.ok else f"status={status!r} and no error message"

    @property
    def primary_metric(self) -> str | None:
        metric = self.result.get("primary_metric")
        return str(metric) if metric else None

    @property
    def primary_value(self) -> float | None:
        """The final primary metric, or None when missing or not a finite number."""
        metrics = self.result.get("metrics") or {}
        value = metrics.get(self.primary_metric) if self.primary_metric else None
        return finite_or_none(value)

    @property
    def higher_is_better(self) -> bool:
        value = self.result.get("higher_is_better")
        return True if value is None else bool(value)

    @property
    def primary_curve(self) -> str | None:
        curve = self.result.get("primary_curve")
        return str(curve) if curve else None

    @property
    def record(self) -> RunRecord:
        return RunRecord.from_dict(self.result)

    @property
    def is_rl(self) -> bool:
        return self.record.is_rl

    @property
    def relative_dir(self) -> str:
        rel = os.path.relpath(self.dir, self.input_root)
        return self.input_root.name if rel == "." else rel

    @property
    def counts_env_steps(self) -> bool:
        return self.record.env_steps is not None

    def metric_bounds(self, metric: str | None) -> tuple[float | None, float | None]:
        """What ``metric`` can take, from the record's optional ``metric_bounds`` (e.g. CartPole's [0, 500])."""
        bounds = (self.result.get("metric_bounds") or {}).get(metric) if metric else None
        if not isinstance(bounds, (list, tuple)) or len(bounds) != 2:
            return None, None
        return finite_or_none(bounds[0]), finite_or_none(bounds[1])

    @property
    def seeds_per_process(self) -> int:
        k = self.result.get("seeds_per_process")
        return k if isinstance(k, int) and not isinstance(k, bool) and k > 0 else 1

    @property
    def seed_cost_s(self) -> float | None:
        """What one seed cost: the process's wall time shared among the K seeds it trained (K = 1: the wall time).
        A K-seed run's record holds the whole batch's wall time."""
        wall = self.get_float("wall_time_s")
        return None if wall is None else wall / self.seeds_per_process

    @property
    def batch_dir(self) -> Path:
        """The dir of the process that trained this seed: a K-seed batch keeps each seed in `<job dir>/seed<n>/`."""
        return self.dir.parent if self.seeds_per_process > 1 else self.dir

    def get_float(self, key: str) -> float | None:
        return finite_or_none(self.result.get(key))

    def load_curve(self) -> tuple[str, np.ndarray, np.ndarray] | None:
        """``(x_column, steps, values)`` of ``primary_curve`` from the run's curves (pipeline.store.curves), or None
        if unavailable. Rows are sparse (train and eval rows share steps): the steps where the curve has a finite
        value, in order."""
        curve = self.primary_curve
        if curve is None:
            return None
        try:
            rows = read_run_curve(self.dir)
        except (OSError, UnicodeDecodeError, csv.Error, ValueError):
            return None
        points = sorted((step, row[curve]) for step, row in rows.items() if curve in row and math.isfinite(row[curve]))
        if not points:
            return None
        steps, values = zip(*points)
        return ("env_step" if self.counts_env_steps else "step"), np.asarray(steps, dtype=float), np.asarray(values, dtype=float)


def finite_or_none(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _load_result(run_dir: Path) -> dict[str, Any] | None:
    """The record in `run_dir` as the report reads it (its raw JSON, checked against the store's RunRecord), or
    None with a RunRecordWarning saying why it is skipped."""
    path = result_path(run_dir)
    result = read_result(run_dir)
    if result is None:
        warnings.warn(f"skipping unreadable run record {path}: not a JSON object", RunRecordWarning, stacklevel=3)
        return None
    missing = [key for key in REQUIRED_KEYS if key not in result]
    if missing:
        warnings.warn(
            f"skipping run record {path}: missing key(s) {', '.join(missing)}", RunRecordWarning, stacklevel=3
        )
        return None
    try:
        RunRecord.from_dict(result)
    except (RecordError, TypeError) as exc:
        warnings.warn(f"skipping run record {path}: {exc}", RunRecordWarning, stacklevel=3)
        return None
    return result


def collect_runs(inputs: Iterable[str | os.PathLike[str]]) -> list[ReportedRun]:
    """Load every run record found (recursively) under ``inputs``, each run dir once.

    Raises ReportInputError for a missing input or when nothing usable is found; a corrupt
    result.json is skipped with a RunRecordWarning.
    """
    inputs = list(inputs)
    if not inputs:
        raise ReportInputError("no input dirs given; pass one or more run or sweep dirs")
    runs: list[ReportedRun] = []
    seen: set[Path] = set()
    for raw in inputs:
        root = Path(raw).expanduser()
        if not root.exists():
            raise ReportInputError(f"input dir {root} does not exist; pass a run dir or a sweep dir")
        if not root.is_dir():
            raise ReportInputError(f"input {root} is not a directory; pass the run or sweep dir that holds it")
        root = root.resolve()
        found_any = False
        for found in record_dirs(root):
            found_any = True
            run_dir = found.resolve()
            if run_dir in seen:
                continue
            seen.add(run_dir)
            result = _load_result(run_dir)
            if result is not None:
                runs.append(ReportedRun(dir=run_dir, input_root=root, result=result))
        if not found_any:
            raise ReportInputError(
                f"no run records ({RESULT}) found under {root}; pass a run dir or a sweep dir "
                "written by `python -m pipeline`"
            )
    if not runs:
        raise ReportInputError(
            f"every {RESULT} under {', '.join(str(i) for i in inputs)} was unreadable; see the warnings above"
        )
    note_process_counts(runs)
    return runs


class GroupingNote(RunRecordWarning):
    """How records were grouped, said with the report's warnings (nothing was skipped)."""


def note_process_counts(runs: list[ReportedRun]) -> None:
    """A group holding runs on different numbers of processes (trainer=ddp) says so: the records' config puts such
    runs together only when their effective batch sizes (processes x data.batch_size) agree (config.grouping)."""
    by_group: dict[str, list[ReportedRun]] = {}
    for run in runs:
        by_group.setdefault(run.group, []).append(run)
    for group, members in sorted(by_group.items()):
        counts = sorted({int(r.result.get("processes") or 1) for r in members})
        if len(counts) < 2:
            continue
        batch = next((r.result.get("effective_batch_size") for r in members if r.result.get("effective_batch_size")), None)
        warnings.warn(f"group {group}: runs on {' and '.join(map(str, counts))} processes are one group, as their effective "
                      f"batch size agrees ({batch} samples a step)", GroupingNote, stacklevel=3)

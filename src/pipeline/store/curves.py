"""metrics.csv, the run's curves: one row per logged step, a step column, one column per metric.

Written by us rather than Lightning's CSVLogger, because a run record must survive what happens to
runs: Lightning's logger deletes an existing metrics.csv when a run restarts in its dir, so a resumed
run kept only its last segment. Here

- a resumed run keeps every row up to the step its checkpoint holds (rows after it are redone, so
  steps stay monotone and none is duplicated);
- a fresh run into a dir that already has a curve moves the old file aside (`metrics.prev<N>.csv`);
- the file is rewritten atomically (temp file + rename) on each flush: a kill never leaves half a file.

`pipeline.runtime.loggers.CurveLogger` is the Lightning face of a `CurveLog`, for tasks that log with `self.log`.
"""

from __future__ import annotations

import csv
import io
import math
import time
from collections.abc import Mapping
from pathlib import Path

from pipeline.store.atomic import write_atomically
from pipeline.store.layout import metrics_path


def _number(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def read_curve(path: Path, step_key: str = "step") -> dict[int, dict[str, float]]:
    """The rows of a metrics.csv as {step: {metric: value}} (empty cells left out)."""
    rows: dict[int, dict[str, float]] = {}
    with Path(path).open(newline="") as f:
        for row in csv.DictReader(f):
            step = _number(row.get(step_key, ""))
            if step is None:
                continue
            values = {k: v for k, v in ((k, _number(v)) for k, v in row.items() if k != step_key) if v is not None}
            rows.setdefault(int(step), {}).update(values)
    return rows


class CurveLog:
    """The curves of one run (one agent), kept in memory and flushed to `path` atomically."""

    def __init__(self, path: Path, step_key: str = "step", resume_step: int | None = None, flush_every_s: float = 5.0):
        self.path = Path(path)
        self.step_key = step_key
        self.rows: dict[int, dict[str, float]] = {}
        self.columns: list[str] = []
        # How many values of each metric this process logged (the lifecycle notes a new evaluation by it).
        self.counts: dict[str, int] = {}
        self.flush_every_s = float(flush_every_s)
        self._last_flush = time.monotonic()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_file():
            if resume_step is not None:
                self.rows = {s: r for s, r in read_curve(self.path, step_key).items() if s <= resume_step}
                for values in self.rows.values():
                    self._add_columns(values)
            else:
                self.path.replace(self._aside_name())

    def _aside_name(self) -> Path:
        n = 1
        while (aside := self.path.with_name(f"{self.path.stem}.prev{n}{self.path.suffix}")).exists():
            n += 1
        return aside

    def _add_columns(self, values: Mapping[str, float]) -> None:
        self.columns += [k for k in values if k not in self.columns and k != self.step_key]

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        values = {str(k): float(v) for k, v in metrics.items() if k != self.step_key and v is not None}
        self.rows.setdefault(int(step), {}).update(values)
        self._add_columns(values)
        for key in values:
            self.counts[key] = self.counts.get(key, 0) + 1
        if time.monotonic() - self._last_flush >= self.flush_every_s:
            self.flush()

    def last_step(self) -> int | None:
        return max(self.rows) if self.rows else None

    def flush(self) -> None:
        text = io.StringIO(newline="")
        writer = csv.writer(text)
        writer.writerow([self.step_key, *self.columns])
        for step in sorted(self.rows):
            row = self.rows[step]
            writer.writerow([step, *(_cell(row.get(c)) for c in self.columns)])
        data = text.getvalue().encode()
        write_atomically(self.path, lambda f: f.write(data), fsync=False)
        self._last_flush = time.monotonic()


def _cell(value: float | None) -> str:
    if value is None:
        return ""
    return repr(value) if math.isfinite(value) else str(value)


STEP_KEYS = ("step", "env_step")


def read_run_curve(run_dir: Path) -> dict[int, dict[str, float]]:
    """The curves of the run in `run_dir` as {step: {metric: value}}, whichever step column it has (`step`, or
    `env_step` for RL); {} when it has none yet."""
    path = metrics_path(run_dir)
    if not path.is_file():
        return {}
    with path.open(newline="") as f:
        header = next(csv.reader(f), [])
    step_key = next((k for k in STEP_KEYS if k in header), STEP_KEYS[0])
    return {s: {k: v for k, v in row.items() if k not in STEP_KEYS} for s, row in read_curve(path, step_key).items()}

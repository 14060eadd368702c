"""The training progress bar: Lightning's, counting a task's own budget where it declares one (`Task.progress`).

A DQN run reads `env steps:  40%|####  | 20.0k/50.0k [00:10<00:15, 2.00kstep/s, return=120.5, eval=300.2]`
(env steps against task.total_steps, the last 10 episodes' mean return, the last greedy evaluation) instead of
Lightning's `Epoch 0` over rounds; other tasks keep Lightning's epoch and batch bar.

Off a terminal (a log file, a pipe, a sweep's job, a terminal whose bottom line a sweep's status holds) the bar
is one line at most every `every_s` seconds and its last state at the end (runtime.progress_lines), with no
validation bars and no empty `Training: 0/?` state.

The bar's rate and time left leave out the seconds the task booked as compiling (`time_breakdown_s["compile"]`,
device.compile=true): a compile-bound first iteration made a 38 s run read 9 hours left. A run whose time left
reads over an hour says so once, in the log, with the rate it was measured at.
"""

from __future__ import annotations

import logging
import sys

from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

from pipeline.runtime.progress_lines import EVERY_S, ThrottledLines, bar_on_terminal
from pipeline.tasks.base import Progress, Task

log = logging.getLogger(__name__)
# A run expected to take longer than this says so once, with its measured rate (how to stop or shorten it).
LONG_RUN_S = 3600.0
# The rate is read for that line once the run has worked this long (compile time left out): a first round's rate
# alone is noise.
MEASURE_S = 5.0


class BudgetTqdm(Tqdm):
    """Lightning's bar whose rate, and so its time left, leaves out `excluded_s` seconds of the time elapsed."""

    excluded_s = 0.0

    @property
    def format_dict(self):
        d = super().format_dict
        working, done = d["elapsed"] - self.excluded_s, d["n"] - d["initial"]
        if self.excluded_s > 0 and d.get("rate") is None and working > 0 and done > 0:
            d["rate"] = done / working
        return d

    def working_rate(self) -> tuple[float, float] | None:
        """(units per second, seconds worked) since the bar started, compile time left out; None before any."""
        d = self.format_dict
        working, done = d["elapsed"] - self.excluded_s, d["n"] - d["initial"]
        return (done / working, working) if working > 0 and done > 0 else None


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


class BudgetProgressBar(TQDMProgressBar):
    def __init__(self, *args, every_s: float = EVERY_S, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.every_s = every_s
        self._lines: ThrottledLines | None = None
        self._decided = False
        self._compile_at_start = 0.0
        self._expected_said = False

    def _progress(self, pl_module) -> Progress | None:
        return pl_module.progress() if isinstance(pl_module, Task) else None

    def lines(self) -> ThrottledLines | None:
        """The line writer when the bar may not redraw in place (decided once, when the first bar is made)."""
        if not self._decided:
            self._decided = True
            self._lines = None if bar_on_terminal() else ThrottledLines(every_s=self.every_s)
        return self._lines

    def init_train_tqdm(self) -> Tqdm:
        lines = self.lines()
        return BudgetTqdm(desc=self.train_description, position=2 * self.process_position, disable=self.is_disabled, leave=True,
                    dynamic_ncols=lines is None, ncols=None if lines is None else 100, file=lines or sys.stdout,
                    smoothing=0, bar_format=self.BAR_FORMAT)

    def init_validation_tqdm(self) -> Tqdm:
        if self.lines() is None:
            return super().init_validation_tqdm()
        return Tqdm(disable=True)  # off a terminal the training line says enough; nested bars were most of the flood

    def init_sanity_tqdm(self) -> Tqdm:
        return super().init_sanity_tqdm() if self.lines() is None else Tqdm(disable=True)

    def init_test_tqdm(self) -> Tqdm:
        return super().init_test_tqdm() if self.lines() is None else Tqdm(disable=True)

    def init_predict_tqdm(self) -> Tqdm:
        return super().init_predict_tqdm() if self.lines() is None else Tqdm(disable=True)

    def on_train_end(self, trainer, pl_module) -> None:
        super().on_train_end(trainer, pl_module)
        if self._lines is not None:
            self._lines.finish()

    def print(self, *args, sep: str = " ", **kwargs) -> None:
        if self.lines() is None:
            super().print(*args, sep=sep, **kwargs)
        else:
            print(*args, sep=sep, **kwargs)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        progress = self._progress(pl_module)
        if progress is None:
            super().on_train_epoch_start(trainer, pl_module)
            return
        if self._leave:
            self.train_progress_bar = self.init_train_tqdm()
        bar = self.train_progress_bar
        bar.set_description(progress.unit, refresh=False)
        bar.unit, bar.unit_scale = "step", True
        bar.reset(total=progress.total)
        bar.initial = bar.n = progress.done  # a resumed run starts where its checkpoint is
        self._compile_at_start = self._compiled_s(pl_module)  # a resumed run's record carries earlier segments'
        bar.refresh()

    @staticmethod
    def _compiled_s(pl_module) -> float:
        return float(getattr(pl_module, "time_breakdown_s", {}).get("compile", 0.0))

    def _show(self, progress: Progress, pl_module=None) -> None:
        bar = self.train_progress_bar
        bar.n = min(progress.done, progress.total)
        if isinstance(bar, BudgetTqdm) and pl_module is not None:
            bar.excluded_s = self._compiled_s(pl_module) - self._compile_at_start
            self._say_expected_time(bar, progress)
        bar.set_postfix({k: f"{v:.1f}" for k, v in progress.shown.items()}, refresh=False)
        bar.refresh()

    def _say_expected_time(self, bar: BudgetTqdm, progress: Progress) -> None:
        """Once, when the rate has been measured: a run with over an hour left says how long, and how to stop."""
        measured = None if self._expected_said else bar.working_rate()
        if measured is None or measured[1] < MEASURE_S:
            return
        self._expected_said = True
        rate, left = measured[0], progress.total - progress.done
        if left / rate >= LONG_RUN_S:
            log.info(f"expected time: about {hours(left / rate)} more for {left:,} {progress.unit} at {rate:,.0f} per "
                     "second (compile time left out); Ctrl-C stops it with a checkpoint to resume from")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        progress = self._progress(pl_module)
        if progress is None:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        elif self.is_enabled and ((batch_idx + 1) % self.refresh_rate == 0 or progress.done >= progress.total):
            self._show(progress, pl_module)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        progress = self._progress(pl_module)
        if progress is None or not self.is_enabled:
            super().on_train_epoch_end(trainer, pl_module)
            return
        self._show(progress, pl_module)
        if self._leave:
            self.train_progress_bar.close()

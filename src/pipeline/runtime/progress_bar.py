"""The training progress bar: Lightning's, counting a task's own budget where it declares one (`Task.progress`).

A DQN run reads `env steps:  40%|####  | 20.0k/50.0k [00:10<00:15, 2.00kstep/s, return=120.5, eval=300.2]`
(env steps against task.total_steps, the last 10 episodes' mean return, the last greedy evaluation) instead of
Lightning's `Epoch 0` over rounds; other tasks keep Lightning's epoch and batch bar.

Off a terminal (a log file, a pipe, a sweep's job, a terminal whose bottom line a sweep's status holds) the bar
is one line at most every `every_s` seconds and its last state at the end (runtime.progress_lines), with no
validation bars and no empty `Training: 0/?` state.
"""

from __future__ import annotations

import sys

from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

from pipeline.runtime.progress_lines import EVERY_S, ThrottledLines, bar_on_terminal
from pipeline.tasks.base import Progress, Task


class BudgetProgressBar(TQDMProgressBar):
    def __init__(self, *args, every_s: float = EVERY_S, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.every_s = every_s
        self._lines: ThrottledLines | None = None
        self._decided = False

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
        return Tqdm(desc=self.train_description, position=2 * self.process_position, disable=self.is_disabled, leave=True,
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
        bar.refresh()

    def _show(self, progress: Progress) -> None:
        bar = self.train_progress_bar
        bar.n = min(progress.done, progress.total)
        bar.set_postfix({k: f"{v:.1f}" for k, v in progress.shown.items()}, refresh=False)
        bar.refresh()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        progress = self._progress(pl_module)
        if progress is None:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        elif self.is_enabled and ((batch_idx + 1) % self.refresh_rate == 0 or progress.done >= progress.total):
            self._show(progress)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        progress = self._progress(pl_module)
        if progress is None or not self.is_enabled:
            super().on_train_epoch_end(trainer, pl_module)
            return
        self._show(progress)
        if self._leave:
            self.train_progress_bar.close()

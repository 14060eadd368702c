"""The training progress bar: Lightning's, counting a task's own budget where it declares one (`Task.progress`).

A DQN run reads `env steps:  40%|####  | 20.0k/50.0k [00:10<00:15, 2.00kstep/s, return=120.5, eval=300.2]`
(env steps against task.total_steps, the last 10 episodes' mean return, the last greedy evaluation) instead of
Lightning's `Epoch 0` over rounds; other tasks keep Lightning's epoch and batch bar.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import TQDMProgressBar

from pipeline.tasks.base import Progress, Task


class BudgetProgressBar(TQDMProgressBar):
    def _progress(self, pl_module) -> Progress | None:
        return pl_module.progress() if isinstance(pl_module, Task) else None

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

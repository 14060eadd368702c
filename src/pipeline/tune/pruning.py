"""Pruning from inside a trial's job: intermediate values (IQM over the trial's agents) go to the pruner.

The sweeper passes the trial to the job as the top-level config key `trial`
({storage, study_name, number, pruner, n_startup_trials, n_warmup_steps}); the job reports through the
study's database, so this works whether the job runs in the sweeper's process, a joblib worker or a
SLURM node that can reach the database.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from lightning.pytorch.callbacks import Callback

from pipeline.report.collect import (
    PRUNED_REASON,  # what a pruned run's early_stop says; the report counts it as pruned
)

__all__ = ["PRUNED_REASON", "PruningCallback", "TrialReporter"]


class TrialReporter:
    def __init__(self, trial) -> None:
        self.trial = trial
        self.last_step: int | None = None

    @classmethod
    def from_config(cls, trial_cfg: Mapping[str, Any] | None) -> TrialReporter | None:
        if trial_cfg is None:
            return None
        from pipeline.tune.study import load_trial

        trial = load_trial(
            str(trial_cfg["storage"]), str(trial_cfg["study_name"]), int(trial_cfg["number"]),
            str(trial_cfg.get("pruner", "median")), int(trial_cfg.get("n_startup_trials", 5)),
            int(trial_cfg.get("n_warmup_steps", 0)),
        )
        return cls(trial)

    def report(self, step: int, agent_values: Sequence[float], higher_is_better: bool = True) -> bool:
        """Report the IQM of the agents' values at `step`; True when the pruner says stop this trial.

        `agent_values` holds every agent of the trial, those that stopped early at their last evaluation
        (the caller keeps them: dropping them would leave only the slow seeds). The pruner compares
        intermediate values in the study's direction, which need not be the reported metric's: a study
        minimizing time_to_threshold is told evaluation returns (higher is better). Such a value is
        reported negated, so the pruner stops the trials that are behind, never the ones ahead.
        """
        from optuna.study import StudyDirection

        from pipeline.report.stats import fast_iqm

        finite = [float(v) for v in agent_values if v is not None and math.isfinite(float(v))]
        if not finite:
            return False
        value = fast_iqm(finite)
        if higher_is_better != (self.trial.study.direction == StudyDirection.MAXIMIZE):
            value = -value
        self.trial.report(value, int(step))
        self.last_step = int(step)
        return bool(self.trial.should_prune())


class PruningCallback(Callback):
    """Supervised runs: after each validation, report `monitor` (one value per agent) and stop when pruned.

    `monitor` is a key of `trainer.callback_metrics`; a seed-batched task logs `<monitor>/agent<i>`
    keys, which are reported together.
    """

    def __init__(self, reporter: TrialReporter, monitor: str) -> None:
        self.reporter = reporter
        self.monitor = monitor
        self.pruned_at_step: int | None = None

    def _values(self, metrics: Mapping[str, Any]) -> list[float]:
        if self.monitor in metrics:
            return [float(metrics[self.monitor])]
        prefix = f"{self.monitor}/agent"
        return [float(v) for k, v in sorted(metrics.items()) if k.startswith(prefix)]

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        values = self._values(trainer.callback_metrics)
        if values and self.reporter.report(trainer.current_epoch, values):
            self.pruned_at_step = trainer.current_epoch
            trainer.should_stop = True

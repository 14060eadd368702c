"""What every task gives the composition root (run.py): a way to train and evaluate, and the numbers for the record.

A task is a LightningModule (or behaves like one where Lightning has nothing to add) with:

- `primary_metric`: the key of the final metrics that sweeps and reports compare (e.g. `test/acc`),
- `primary_curve`: the metrics.csv column to draw as the learning curve,
- `higher_is_better`,
- `fit_and_evaluate(trainer, datamodule, ckpt_path) -> dict[str, float]`: train, then the final metrics,
- `record_extras() -> dict`: extra top-level fields for result.json (RL: env_steps, time_to_threshold_s, ...),
- `time_breakdown_s`: where the time went, filled in while running,
- `export_state_dict()`: the trained weights written to model.pt.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

import lightning as L
import torch


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN or infinite loss; the run stops and is recorded as failed."""


def check_finite(loss: torch.Tensor, step: int, hint: str = "lower the learning rate or clip gradients") -> None:
    if not torch.isfinite(loss).all():
        value = loss.detach().float().mean().item()
        raise NonFiniteLossError(f"loss became {value} at step {step}; {hint}")


class Task(L.LightningModule):
    primary_metric: str = ""
    primary_curve: str | None = None
    higher_is_better: bool = True

    def __init__(self) -> None:
        super().__init__()
        self.time_breakdown_s: dict[str, float] = {}

    def add_time(self, phase: str, seconds: float) -> None:
        self.time_breakdown_s[phase] = self.time_breakdown_s.get(phase, 0.0) + float(seconds)

    def fit_and_evaluate(self, trainer: L.Trainer, datamodule, ckpt_path: str | None) -> dict[str, float]:
        """Default for supervised-style tasks: fit with validation, then test; final metrics are the test ones."""
        t0 = time.perf_counter()
        trainer.fit(self, datamodule=datamodule, ckpt_path=ckpt_path)
        self.add_time("fit", time.perf_counter() - t0)
        t0 = time.perf_counter()
        results = trainer.test(self, datamodule=datamodule, verbose=False)
        self.add_time("test", time.perf_counter() - t0)
        return scalar_metrics(results[0] if results else {})

    def record_extras(self) -> dict:
        return {}

    def export_state_dict(self) -> dict[str, torch.Tensor]:
        net = getattr(self, "net", self)
        return {k: v.detach().cpu() for k, v in net.state_dict().items()}


def scalar_metrics(values: Mapping) -> dict[str, float]:
    out = {}
    for key, value in values.items():
        value = value.item() if hasattr(value, "item") else value
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[str(key)] = float(value) if math.isfinite(float(value)) else float("nan")
    return out

"""Supervised learning on a LightningDataModule: classification, one-vs-all, or regression, chosen by the loss."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from pipeline.tasks.base import Task, check_finite


def target_kind(loss: nn.Module) -> str:
    """cross-entropy -> class labels; BCE -> one-vs-all over the classes; anything else -> regress the label value."""
    if isinstance(loss, nn.CrossEntropyLoss | nn.NLLLoss):
        return "classification"
    if isinstance(loss, nn.BCEWithLogitsLoss | nn.BCELoss):
        return "one_vs_all"
    return "regression"


class SupervisedTask(Task):
    primary_metric = "test/acc"
    primary_curve = "val/acc"
    # What `seeds_per_process=K` trains instead: the same recipe for K seeds in one process.
    batched_variant = "pipeline.tasks.supervised_batched.BatchedSupervisedTask"

    def __init__(
        self,
        net: Callable[..., nn.Module],
        loss: nn.Module,
        optimizer: Callable[..., torch.optim.Optimizer],
        in_features: int,
        n_classes: int,
        scheduler: Callable | None = None,
        scheduler_interval: str = "epoch",
    ):
        super().__init__()
        self.loss_fn = loss
        self.kind = target_kind(loss)
        self.n_classes = int(n_classes)
        out_features = 1 if self.kind == "regression" else self.n_classes
        self.net = net(in_features=int(in_features), out_features=out_features)
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.scheduler_interval = scheduler_interval

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def predict_classes(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        if self.kind == "regression":
            return out.squeeze(-1).round().clamp(0, self.n_classes - 1).long()
        return out.argmax(dim=-1)

    def _step(self, batch, split: str) -> torch.Tensor:
        x, y = batch
        out = self.net(x)
        if self.kind == "classification":
            loss = self.loss_fn(out, y)
            pred = out.argmax(dim=-1)
        elif self.kind == "one_vs_all":
            loss = self.loss_fn(out, nn.functional.one_hot(y, self.n_classes).to(out.dtype))
            pred = out.argmax(dim=-1)
        else:
            value = out.squeeze(-1)
            loss = self.loss_fn(value, y.to(value.dtype))
            pred = value.detach().round().clamp(0, self.n_classes - 1).long()
            self.log(f"{split}/mae", (value.detach() - y).abs().mean(), on_step=False, on_epoch=True)
        if split == "train":
            check_finite(loss, self.global_step)
        acc = (pred == y).float().mean()
        self.log(f"{split}/loss", loss.detach(), on_step=False, on_epoch=True, prog_bar=split != "test")
        self.log(f"{split}/acc", acc, on_step=False, on_epoch=True, prog_bar=split != "train")
        return loss

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train")

    def validation_step(self, batch, batch_idx):
        self._step(batch, "val")

    def test_step(self, batch, batch_idx):
        self._step(batch, "test")

    def configure_optimizers(self):
        optimizer = self.optimizer_factory(self.net.parameters())
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": self.scheduler_interval}}

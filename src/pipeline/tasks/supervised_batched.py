"""Seed-batched supervised learning: K independent MLPs trained side by side in one process.

The same training as `tasks/supervised.py` for K seeds at once: member i of an `EnsembleMLP` starts
from the weights of the single-seed run with seed `seed + i`, sees the training set in its own
order (a permutation per epoch from its own generator) and gets exactly its own gradient (the loss
is the sum over members of each member's mean loss, so one optimizer over the stacked weights is K
independent optimizers; Lightning's gradient-norm clipping is replaced by a per-member one). Nothing
here is specific to reinforcement learning: the seed-batching pattern of `tasks/dqn_batched.py`
applied to a datamodule.

One Lightning step is one minibatch for every member; validation and test evaluate each member
on the whole split in one batched forward.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader

from pipeline.nets.ensemble import EnsembleMLP, clip_grad_norm_per_member_
from pipeline.tasks.base import Task, check_finite
from pipeline.tasks.dqn_batched import elementwise, write_curves
from pipeline.tasks.supervised import target_kind


def split_tensors(loader: DataLoader) -> tuple[torch.Tensor, torch.Tensor]:
    """A whole split as (inputs, targets), in its dataset's order.

    Read through a sequential loader over the loader's dataset: the training loader shuffles with the
    global RNG, and the base order must not depend on it (each member draws its own order).
    """
    xs, ys = zip(*(tuple(batch) for batch in DataLoader(loader.dataset, batch_size=1024, shuffle=False)))
    return torch.cat(xs), torch.cat(ys)


class BatchedSupervisedTask(Task):
    primary_metric = "test/acc"
    primary_curve = "val/acc"

    def __init__(
        self,
        net: Callable[..., nn.Module],
        loss: nn.Module,
        optimizer: Callable[..., torch.optim.Optimizer],
        in_features: int,
        n_classes: int,
        n_agents: int = 8,
        seed: int = 0,
        scheduler: Callable | None = None,
        scheduler_interval: str = "epoch",
    ):
        super().__init__()
        if n_agents <= 0:
            raise ValueError(f"n_agents must be positive, got {n_agents}")
        self.n_agents = int(n_agents)
        self.seed = int(seed)
        self.agent_seeds = [self.seed + i for i in range(self.n_agents)]
        self.kind = target_kind(loss)
        self.loss_fn = elementwise(loss)
        self.n_classes = int(n_classes)
        out_features = 1 if self.kind == "regression" else self.n_classes
        self.net = EnsembleMLP.from_factory(net, self.agent_seeds, int(in_features), out_features)
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.scheduler_interval = scheduler_interval
        self.curves: list[dict[int, dict[str, float]]] = [{} for _ in range(self.n_agents)]
        self.final_metrics: list[dict[str, float]] = []
        self.splits: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.batch_size = 64
        self._epoch_sums: dict[str, torch.Tensor] = {}

    # ---- data --------------------------------------------------------------------------------
    def attach_data(self, datamodule) -> None:
        """Take each split as tensors from the datamodule's loaders, and its batch size."""
        datamodule.setup("fit")
        datamodule.setup("test")
        loaders = {"train": datamodule.train_dataloader(), "val": datamodule.val_dataloader(), "test": datamodule.test_dataloader()}
        self.splits = {name: split_tensors(loader) for name, loader in loaders.items()}
        self.batch_size = int(getattr(datamodule, "batch_size", None) or loaders["train"].batch_size)

    def n_batches(self) -> int:
        return math.ceil(len(self.splits["train"][1]) / self.batch_size)

    def train_dataloader(self) -> DataLoader:
        # Items are minibatch numbers; the members' own orders of the samples are drawn per epoch.
        return DataLoader(range(self.n_batches()), batch_size=None, shuffle=False)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(range(1), batch_size=None)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(range(1), batch_size=None)

    def on_fit_start(self) -> None:
        self.splits = {k: (x.to(self.device), y.to(self.device)) for k, (x, y) in self.splits.items()}
        self.generators = [torch.Generator().manual_seed(s) for s in self.agent_seeds]

    def on_test_start(self) -> None:
        self.splits = {k: (x.to(self.device), y.to(self.device)) for k, (x, y) in self.splits.items()}

    # ---- the loss, per member --------------------------------------------------------------
    def per_member(self, out: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """out [K, N, C], y [K, N] -> (each member's mean loss [K], its accuracy [K])."""
        K, N = y.shape
        if self.kind == "classification":
            loss = self.loss_fn(out.reshape(K * N, -1), y.reshape(-1)).view(K, N).mean(1)
            pred = out.argmax(-1)
        elif self.kind == "one_vs_all":
            target = nn.functional.one_hot(y, self.n_classes).to(out.dtype)
            loss = self.loss_fn(out, target).flatten(1).mean(1)
            pred = out.argmax(-1)
        else:
            value = out.squeeze(-1)
            loss = self.loss_fn(value, y.to(value.dtype)).mean(1)
            pred = value.detach().round().clamp(0, self.n_classes - 1).long()
        return loss, (pred == y).float().mean(1)

    # ---- training ----------------------------------------------------------------------------
    def on_train_epoch_start(self) -> None:
        n = len(self.splits["train"][1])
        self.order = torch.stack([torch.randperm(n, generator=g) for g in self.generators]).to(self.device)
        self._epoch_sums = {}

    def training_step(self, batch, batch_idx):
        x_all, y_all = self.splits["train"]
        idx = self.order[:, batch_idx * self.batch_size : (batch_idx + 1) * self.batch_size]
        K, n = idx.shape
        x = x_all.index_select(0, idx.reshape(-1)).view(K, n, *x_all.shape[1:])
        y = y_all.index_select(0, idx.reshape(-1)).view(K, n)
        loss, acc = self.per_member(self.net(x), y)
        # Mean within each member, SUM across members: each gets exactly its own gradient.
        total = loss.sum()
        check_finite(total, self.global_step)
        self._accumulate("train", loss.detach(), acc, n)
        self.log("batch/train_loss", total.detach() / K, prog_bar=True, on_step=False, on_epoch=True, batch_size=n)
        return total

    def _accumulate(self, split: str, loss: torch.Tensor, acc: torch.Tensor, n: int) -> None:
        # Sample-weighted epoch means, as Lightning's on_epoch logging computes them.
        sums = torch.stack([loss * n, acc * n, torch.full_like(loss, n)])
        self._epoch_sums[split] = self._epoch_sums.get(split, 0) + sums

    def on_train_epoch_end(self) -> None:
        self._write_epoch("train", self.current_epoch)

    def _write_epoch(self, split: str, step: int) -> None:
        sums = self._epoch_sums.pop(split, None)
        if sums is None:
            return
        loss, acc = (sums[0] / sums[2]).tolist(), (sums[1] / sums[2]).tolist()
        for i in range(self.n_agents):
            self.curves[i].setdefault(step, {}).update({f"{split}/loss": loss[i], f"{split}/acc": acc[i]})

    def evaluate_split(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Every member on the whole split in one forward: (loss [K], acc [K])."""
        x, y = self.splits[split]
        K = self.n_agents
        out = self.net(x.unsqueeze(0).expand(K, *x.shape))
        return self.per_member(out, y.unsqueeze(0).expand(K, -1))

    def validation_step(self, batch, batch_idx):
        loss, acc = self.evaluate_split("val")
        self._accumulate("val", loss, acc, 1)
        self.log("batch/val_acc", acc.mean(), prog_bar=True, on_step=False, on_epoch=True, batch_size=1)

    def on_validation_epoch_end(self) -> None:
        self._write_epoch("val", self.current_epoch)

    def test_step(self, batch, batch_idx):
        loss, acc = self.evaluate_split("test")
        self.final_metrics = [{"test/acc": a, "test/loss": v} for v, a in zip(loss.tolist(), acc.tolist())]
        self.log("batch/test_acc", acc.mean(), on_step=False, on_epoch=True, batch_size=1)

    def configure_optimizers(self):
        optimizer = self.optimizer_factory(self.net.parameters())
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": self.scheduler_interval}}

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        # A norm over the whole stack would let one member's gradient shrink every other member's
        # step: clip each member's norm. Value clipping is elementwise, hence per member already.
        if gradient_clip_val is None:
            return
        if gradient_clip_algorithm in (None, "norm"):
            clip_grad_norm_per_member_(list(self.net.parameters()), float(gradient_clip_val))
        else:
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    # ---- the contract with run.py ------------------------------------------------------------
    def fit_and_evaluate(self, trainer, datamodule, ckpt_path) -> list[dict[str, float]]:
        self.attach_data(datamodule)
        t0 = time.perf_counter()
        trainer.fit(self, ckpt_path=ckpt_path)
        self.add_time("fit", time.perf_counter() - t0)
        t0 = time.perf_counter()
        trainer.test(self, verbose=False)
        self.add_time("test", time.perf_counter() - t0)
        for i, metrics in enumerate(self.final_metrics):
            self.curves[i].setdefault(self.current_epoch, {}).update(metrics)
        return self.final_metrics

    def agent_extras(self, i: int) -> dict:
        return {
            "time_breakdown_s": {k: round(v, 4) for k, v in self.time_breakdown_s.items()},
            "seeds_per_process": self.n_agents,
            "agent": i,
        }

    def agent_state_dict(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v.cpu() for k, v in self.net.member_state_dict(i).items()}

    def write_agent_curves(self, i: int, path: Path) -> None:
        write_curves(self.curves[i], path)

    def export_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu() for k, v in self.net.state_dict().items()}

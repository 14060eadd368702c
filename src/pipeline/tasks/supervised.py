"""Supervised learning on a LightningDataModule for K seeds at once (K = 1 is an ordinary run).

Classification, one-vs-all or regression, chosen by the loss. The model is any module built as
`model(in_features=..., out_features=...)` (`pipeline.nets.contracts.SUPERVISED`). Agent i is seed `seed + i`: member i of
an ensemble (`nets.ensemble.make_ensemble`: ours by hand, any other module stacked generically) starts from the weights the network gets under
`torch.manual_seed(seed + i)`, sees the training set in its own order (a permutation per epoch from
its own generator) and gets exactly its own gradient: the loss is the SUM over members of each
member's MEAN loss, so one optimizer over the stacked weights is K independent optimizers, and
Lightning's gradient-norm clipping is replaced by a per-member one.

One Lightning step is one minibatch for every member; validation and test evaluate each member on
the whole split in one batched forward. Curves are per epoch (metrics.csv's `step` is the epoch).
Checkpoints are Lightning's (`checkpoints/last.ckpt`, written at epoch ends by run.py's policy), with
the members' data-order generators and the global RNG added, so a resumed run continues its curve.
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from pipeline.nets import contracts
from pipeline.nets.ensemble import clip_grad_norm_per_member_, make_ensemble
from pipeline.nets.stacked import check_outputs
from pipeline.store.checkpoint import rng_state, set_rng_state
from pipeline.tasks.base import Task, TaskParts, check_finite
from pipeline.tasks.configs import SupervisedConfig
from pipeline.tasks.dqn import elementwise


def target_kind(loss: nn.Module) -> str:
    """cross-entropy -> class labels; BCE -> one-vs-all over the classes; anything else -> regress the label value."""
    if isinstance(loss, nn.CrossEntropyLoss | nn.NLLLoss):
        return "classification"
    if isinstance(loss, nn.BCEWithLogitsLoss | nn.BCELoss):
        return "one_vs_all"
    return "regression"


def split_tensors(loader: DataLoader) -> tuple[torch.Tensor, torch.Tensor]:
    """A whole split as (inputs, targets), in its dataset's order.

    Read through a sequential loader over the loader's dataset: the training loader shuffles with the
    global RNG, and the base order must not depend on it (each member draws its own order).
    """
    xs, ys = zip(*(tuple(batch) for batch in DataLoader(loader.dataset, batch_size=1024, shuffle=False)))
    return torch.cat(xs), torch.cat(ys)


class SupervisedTask(Task):
    Config = SupervisedConfig
    primary_metric = "test/acc"
    primary_curve = "val/acc"
    writes_curves = True
    # Lightning owns the loop state here: run.py resumes through trainer.fit(ckpt_path=...).
    checkpointing = "lightning"
    eval_splits = ("test", "val", "train")

    def __init__(self, config: SupervisedConfig, parts: TaskParts):
        super().__init__(config, parts)
        if self.n_agents <= 0:
            raise ValueError(f"seeds_per_process must be positive, got {self.n_agents}")
        if config.scheduler_interval not in ("epoch", "step"):
            raise ValueError(f"task.scheduler_interval={config.scheduler_interval!r}; choose epoch or step")
        net = parts.require("net", "supervised", "choose a network with model=mlp")
        loss = parts.require("loss", "supervised", "use loss=cross_entropy|bce|mse|huber")
        data = parts.require("datamodule", "supervised", "choose a dataset with data=digits")
        self.kind = target_kind(loss)
        self.loss_fn = elementwise(loss)
        # The sizes come from the data: its flat input size and number of classes.
        self.n_classes = int(data.n_classes)
        out_features = 1 if self.kind == "regression" else self.n_classes
        # Our MLP as a hand-written ensemble; any other module stacked generically (nets/stacked.py).
        self.net = make_ensemble(net, self.agent_seeds, (int(data.in_features),), out_features)
        check_outputs(self.net, "supervised", f"model=mlp or a model of your own: {contracts.SUPERVISED.describe()}",
                      (int(data.in_features),), ("N", out_features))
        self.optimizer_factory = parts.require("optimizer", "supervised", "choose one with optimizer=adam|sgd|...")
        self.scheduler_factory = parts.scheduler
        self.scheduler_interval = config.scheduler_interval
        self.final_metrics: list[dict[str, float]] = []
        self.splits: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.batch_size = 64
        self._epoch_sums: dict[str, torch.Tensor] = {}
        self._resume_extra: dict | None = None
        self.pruned_at: int | None = None

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
        # Items are minibatch numbers; the members' own orders of the samples are drawn per epoch. With several
        # processes rank r takes numbers r, r + W, ... in order (Lightning's sampler would shuffle them).
        numbers = range(self.n_batches())
        world = self.trainer.world_size if self._trainer is not None else 1
        if world == 1:
            return DataLoader(numbers, batch_size=None, shuffle=False)
        return DataLoader(numbers, batch_size=None, sampler=DistributedSampler(numbers, world, self.global_rank, shuffle=False))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(range(1), batch_size=None)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(range(1), batch_size=None)

    def on_fit_start(self) -> None:
        self.splits = {k: (x.to(self.device), y.to(self.device)) for k, (x, y) in self.splits.items()}
        self.generators = [torch.Generator().manual_seed(s) for s in self.agent_seeds]
        if self._resume_extra is not None:
            # Here, not in on_train_start: a resumed fit creates its first data iterator (which draws a base seed
            # from the global RNG, as the straight run does at each epoch start) between the two, and dropout
            # draws from the same RNG. (The sanity check in between runs under Lightning's isolate_rng.)
            for g, s in zip(self.generators, self._resume_extra["generators"]):
                g.set_state(s)
            set_rng_state(self._resume_extra["rng"])
            self._resume_extra = None

    def on_test_start(self) -> None:
        self.splits = {k: (x.to(self.device), y.to(self.device)) for k, (x, y) in self.splits.items()}

    # ---- checkpoints (Lightning's, plus what Lightning does not know about) -------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["pipeline"] = {"generators": [g.get_state() for g in self.generators], "rng": rng_state(),
                                  "agent_seeds": list(self.agent_seeds), "time_breakdown_s": dict(self.time_breakdown_s)}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        extra = checkpoint.get("pipeline")
        if extra is None:
            return
        if list(extra["agent_seeds"]) != self.agent_seeds:
            raise ValueError(
                f"checkpoint holds seeds {extra['agent_seeds']}, this run has {self.agent_seeds}; "
                "resume with the same seed and seeds_per_process"
            )
        self.time_breakdown_s = dict(extra.get("time_breakdown_s") or {})
        self._resume_extra = extra

    # ---- the loss, per member --------------------------------------------------------------
    def per_member(self, out: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """out [K, N, C], y [K, N] -> (each member's mean loss [K], its accuracy [K], its MAE [K] for regression)."""
        K, N = y.shape
        mae = None
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
            mae = (value.detach() - y).abs().mean(1)
        return loss, (pred == y).float().mean(1), mae

    # ---- training ----------------------------------------------------------------------------
    def on_train_epoch_start(self) -> None:
        n = len(self.splits["train"][1])
        self.order = torch.stack([torch.randperm(n, generator=g) for g in self.generators]).to(self.device)
        self._epoch_sums = {}
        # The curve's train/lr at epoch e is the rate epoch e started with (as Lightning's LearningRateMonitor
        # logs it per epoch): read here, since an epoch scheduler has already stepped by the epoch-end hook.
        self._epoch_lr = float(self.trainer.optimizers[0].param_groups[0]["lr"])  # configure_optimizers always gives one

    def training_step(self, batch, batch_idx):
        # `batch` is the minibatch's number in the epoch's order: with several processes (trainer=ddp) Lightning's
        # DistributedSampler hands rank r the numbers r, r + W, ..., so one step of W ranks covers W consecutive
        # minibatches, as one process with a W times larger batch does.
        x_all, y_all = self.splits["train"]
        number = int(batch)
        idx = self.order[:, number * self.batch_size : (number + 1) * self.batch_size]
        K, n = idx.shape
        x = x_all.index_select(0, idx.reshape(-1)).view(K, n, *x_all.shape[1:])
        y = y_all.index_select(0, idx.reshape(-1)).view(K, n)
        loss, acc, mae = self.per_member(self.net(x), y)
        objective = loss
        world = self.trainer.world_size
        if world > 1:
            # DDP averages the ranks' gradients: each rank's mean is reweighted by its share of the step's samples,
            # so the average is the mean over all of them (the sampler's padding repeats a minibatch: weight 0).
            first = batch_idx * world
            n = n if first + self.global_rank < self.n_batches() else 0
            in_step = min(len(y_all), (first + world) * self.batch_size) - first * self.batch_size
            objective = loss * (n * world / in_step)
        # Mean within each member, SUM across members: each gets exactly its own gradient.
        total = objective.sum()
        check_finite(total, self.global_step)
        self._accumulate("train", loss.detach(), acc, mae, n)
        self.log("train/loss", total.detach() / K, prog_bar=True, logger=False, on_step=False, on_epoch=True,
                 batch_size=max(n, 1), sync_dist=True)
        return total

    def _accumulate(self, split: str, loss: torch.Tensor, acc: torch.Tensor, mae: torch.Tensor | None, n: int) -> None:
        # Sample-weighted epoch means, as Lightning's on_epoch logging computes them.
        parts = [loss * n, acc * n, torch.full_like(loss, n)] + ([mae * n] if mae is not None else [])
        self._epoch_sums[split] = self._epoch_sums.get(split, 0) + torch.stack(parts)

    def on_train_epoch_end(self) -> None:
        self._write_epoch("train", self.current_epoch)
        for i in range(self.n_agents):
            self._agent_row(i, self.current_epoch, {"train/lr": self._epoch_lr})

    def _write_epoch(self, split: str, step: int) -> None:
        sums = self._epoch_sums.pop(split, None)
        if sums is None:
            return
        if self.trainer.world_size > 1:  # every rank's samples (each rank scores the whole val split: means unchanged)
            sums = self.trainer.strategy.reduce(sums, reduce_op="sum")
        means = (sums / sums[2]).tolist()
        for i in range(self.n_agents):
            row = {f"{split}/loss": means[0][i], f"{split}/acc": means[1][i]}
            if len(means) > 3:
                row[f"{split}/mae"] = means[3][i]
            self._agent_row(i, step, row)
        if split != "val":
            return
        pruned = self.trial_reporter is not None and self.trial_reporter.report(step, means[1])
        if self.trainer.strategy.reduce_boolean_decision(pruned, all=False):  # rank 0 reports: every rank stops
            self.trainer.should_stop = True
            self.pruned_at = step

    def _agent_row(self, agent: int, step: int, row: dict[str, float]) -> None:
        if self.curves:
            self.curves[agent].log(step, row)
        # The agent's own TensorBoard / W&B runs (its seed's; with one agent, the trainer's), as they happen.
        own = self.agent_loggers[agent] if self.agent_loggers else (self.loggers if self.n_agents == 1 else [])
        for logger in own:
            logger.log_metrics({"epoch": float(step), **row}, step=step)

    def evaluate_split(self, split: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Every member on the whole split in one forward: (loss [K], acc [K], mae [K] or None)."""
        x, y = self.splits[split]
        K = self.n_agents
        out = self.net(x.unsqueeze(0).expand(K, *x.shape))
        return self.per_member(out, y.unsqueeze(0).expand(K, -1))

    def validation_step(self, batch, batch_idx):
        loss, acc, mae = self.evaluate_split("val")
        self._accumulate("val", loss, acc, mae, 1)
        self.log("val/acc", acc.mean(), prog_bar=True, logger=False, on_step=False, on_epoch=True, batch_size=1, sync_dist=True)
        self.log("val/loss", loss.mean(), logger=False, on_step=False, on_epoch=True, batch_size=1, sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        self._write_epoch("val", self.current_epoch)

    def split_metrics(self, split: str) -> list[dict[str, float]]:
        """Each member's `<split>/acc`, `<split>/loss` (and `<split>/mae` for regression) on the whole split."""
        loss, acc, mae = self.evaluate_split(split)
        metrics = [{f"{split}/acc": a, f"{split}/loss": v} for v, a in zip(loss.tolist(), acc.tolist())]
        if mae is not None:
            for row, m in zip(metrics, mae.tolist()):
                row[f"{split}/mae"] = m
        return metrics

    def test_step(self, batch, batch_idx):
        self.final_metrics = self.split_metrics("test")

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
        trainer.fit(self, ckpt_path=ckpt_path, weights_only=True if ckpt_path else None)
        self.add_time("fit", time.perf_counter() - t0)
        t0 = time.perf_counter()
        trainer.test(self, verbose=False)
        self.add_time("test", time.perf_counter() - t0)
        for i, metrics in enumerate(self.final_metrics):
            self._agent_row(i, self.current_epoch, metrics)
        return self.final_metrics

    def agent_record(self, i: int) -> dict:
        extras = {"metric_bounds": {"test/acc": [0.0, 1.0], "val/acc": [0.0, 1.0]}}
        if self.pruned_at is not None:
            extras["early_stop"] = {"epoch": self.pruned_at, "reason": "pruned by the tuner"}
        return extras

    def agent_state_dict(self, i: int) -> dict[str, torch.Tensor]:
        """Member i as the plain network's state_dict (what model.pt holds)."""
        return {k: v.detach().cpu() for k, v in self.net.member_state_dict(i).items()}

    def load_agent_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.net.load_member_state_dict(0, state_dict)

    def evaluate_model(self, datamodule, split: str, seed: int | None = None) -> dict[str, float]:
        """Member 0 on the whole split, as `trainer.test` scores the test split (eval mode, no gradients)."""
        if seed is not None:
            raise ValueError(f"seed={seed}: a supervised score draws nothing at random; drop seed=")
        self.attach_data(datamodule)
        self.on_test_start()
        self.eval()
        with torch.inference_mode():
            return self.split_metrics(split)[0]

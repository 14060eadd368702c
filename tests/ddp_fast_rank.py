"""One process of tests/test_ddp_fast.py's runs: `python -m ddp_fast_rank N BATCH WORLD RANK PORT OUT` trains
SupervisedTask (2 seeds, SGD) on N samples of a tiny problem in minibatches of BATCH for EPOCHS epochs, as rank RANK of
WORLD processes (Lightning's DDP over gloo, the lifecycle's `ddp_strategy`; WORLD 1: an ordinary run), and saves its
weights and (rank 0) its curves to OUT (torch.save). Started by the suite's fork server (tests/forkserver.py), whose
children import nothing again."""

from __future__ import annotations

import functools
import os
import sys

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from pipeline.nets.mlp import MLP
from pipeline.runtime.devices import ddp_strategy
from pipeline.store.curves import CurveLog
from pipeline.tasks.supervised import SupervisedTask

FEATURES, CLASSES, BATCH, EPOCHS = 4, 3, 2, 2


class TinyData(L.LightningDataModule):
    """`n` training samples (and 6 for validation and test) of a fixed random classification problem."""

    in_features, n_classes = FEATURES, CLASSES

    def __init__(self, n: int, batch_size: int):
        super().__init__()
        self.n, self.batch_size = n, batch_size

    def setup(self, stage: str | None = None) -> None:
        g = torch.Generator().manual_seed(7)
        x = torch.randn(self.n + 12, FEATURES, generator=g)
        y = torch.randint(0, CLASSES, (self.n + 12,), generator=g)
        self.parts = {"train": (x[: self.n], y[: self.n]), "val": (x[self.n : self.n + 6], y[self.n : self.n + 6]),
                      "test": (x[self.n + 6 :], y[self.n + 6 :])}

    def _loader(self, split: str) -> DataLoader:
        return DataLoader(TensorDataset(*self.parts[split]), batch_size=self.batch_size)

    def train_dataloader(self):
        return self._loader("train")

    def val_dataloader(self):
        return self._loader("val")

    def test_dataloader(self):
        return self._loader("test")


def train(n: int, batch_size: int, world: int, rank: int, port: int, out: str) -> None:
    """One process of the run: SupervisedTask (2 seeds) fitted for EPOCHS epochs; its weights and curves to `out`."""
    torch.manual_seed(0)
    data = TinyData(n, batch_size)
    task = SupervisedTask.create(net=functools.partial(MLP, hidden=(8,)), loss=torch.nn.CrossEntropyLoss(),
                                 optimizer=functools.partial(torch.optim.SGD, lr=0.5), datamodule=data, n_agents=2, seed=3)
    task.curves = [CurveLog(os.path.join(out + ".curves", f"agent{i}", "metrics.csv"), flush_every_s=1e9) for i in range(2)]
    kwargs = {}
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), NODE_RANK="0",
                          LOCAL_RANK=str(rank))
        kwargs = {"strategy": ddp_strategy(None, 60.0), "devices": world}
    trainer = L.Trainer(accelerator="cpu", max_epochs=EPOCHS, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, **kwargs)
    task.fit_and_evaluate(trainer, data, None)
    torch.save({"weights": {k: v.detach().clone() for k, v in task.net.state_dict().items()},
                "curves": [c.rows for c in task.curves]}, out)


if __name__ == "__main__":
    n, batch_size, world, rank, port = (int(a) for a in sys.argv[1:6])
    train(n, batch_size, world, rank, port, sys.argv[6])

"""scikit-learn's 8x8 digits as images for generative models: (1, 8, 8) float32 in [-1, 1], with labels.

The split is the one the supervised digits experiment uses (same function, same seed), so a classifier
trained on the supervised train split has never seen the test images a GAN is scored against.
"""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from pipeline.data.digits import digits_arrays, split_indices


def to_unit_range(images: torch.Tensor) -> torch.Tensor:
    """[-1, 1] images -> [0, 1] (the scale the supervised digits data uses)."""
    return (images + 1.0) / 2.0


class DigitImagesDataModule(L.LightningDataModule):
    image_shape = (1, 8, 8)
    n_classes = 10

    def __init__(self, batch_size: int = 64, val_fraction: float = 0.15, test_fraction: float = 0.2, split_seed: int = 0):
        super().__init__()
        if not 0 < val_fraction < 1 or not 0 < test_fraction < 1 or val_fraction + test_fraction >= 1:
            raise ValueError(
                f"data.val_fraction={val_fraction} and data.test_fraction={test_fraction} must be in (0, 1) and sum below 1"
            )
        self.batch_size = int(batch_size)
        self.val_fraction, self.test_fraction, self.split_seed = val_fraction, test_fraction, int(split_seed)
        self.splits: dict[str, TensorDataset] = {}

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        x, y = digits_arrays()
        images = torch.from_numpy(x).view(-1, *self.image_shape) * 2.0 - 1.0
        labels = torch.from_numpy(y)
        for name, idx in zip(("train", "val", "test"), split_indices(y, self.val_fraction, self.test_fraction, self.split_seed)):
            idx = torch.from_numpy(idx)
            self.splits[name] = TensorDataset(images[idx], labels[idx])

    def real_images(self, split: str) -> torch.Tensor:
        self.setup()
        return self.splits[split].tensors[0]

    def real_labels(self, split: str) -> torch.Tensor:
        self.setup()
        return self.splits[split].tensors[1]

    def train_dataloader(self) -> DataLoader:
        # drop_last: a last batch of one image would break the generator's BatchNorm.
        return DataLoader(self.splits["train"], batch_size=self.batch_size, shuffle=True, drop_last=True, num_workers=0)

"""scikit-learn's 8x8 digits as images for generative models: (1, 8, 8) float32 in [-1, 1], with labels.

The split is the one the supervised digits experiment uses (same function, same seed), so a classifier
trained on the supervised train split has never seen the test images a GAN is scored against.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from pipeline.data.digits import DigitsDataModule, digits_arrays, split_indices


def to_unit_range(images: torch.Tensor) -> torch.Tensor:
    """[-1, 1] images -> [0, 1] (the scale the supervised digits data uses)."""
    return (images + 1.0) / 2.0


class DigitImagesDataModule(DigitsDataModule):
    """The supervised digits module (same arguments, same split), serving (1, 8, 8) images in [-1, 1]."""

    image_shape = (1, 8, 8)
    n_classes = 10

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

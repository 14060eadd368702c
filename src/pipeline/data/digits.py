"""scikit-learn's bundled 8x8 digits as a LightningDataModule, with a fixed, seeded train/val/test split."""

from __future__ import annotations

import lightning as L
import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """Images scaled to [0, 1] as float32 (N, 64), labels int64 (N,)."""
    data = load_digits()
    return (data.data / 16.0).astype(np.float32), data.target.astype(np.int64)


def split_indices(labels: np.ndarray, val_fraction: float, test_fraction: float, seed: int):
    """Stratified split; the same seed gives the same split on every machine."""
    idx = np.arange(len(labels))
    train_val, test = train_test_split(idx, test_size=test_fraction, random_state=seed, stratify=labels)
    rel_val = val_fraction / (1.0 - test_fraction)
    train, val = train_test_split(train_val, test_size=rel_val, random_state=seed, stratify=labels[train_val])
    return np.sort(train), np.sort(val), np.sort(test)


class DigitsDataModule(L.LightningDataModule):
    in_features = 64
    n_classes = 10
    image_shape = (8, 8)

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
        parts = split_indices(y, self.val_fraction, self.test_fraction, self.split_seed)
        for name, idx in zip(("train", "val", "test"), parts):
            self.splits[name] = TensorDataset(torch.from_numpy(x[idx]), torch.from_numpy(y[idx]))

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        return DataLoader(self.splits[split], batch_size=self.batch_size, shuffle=shuffle, num_workers=0)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)

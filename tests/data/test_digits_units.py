"""The 8x8 digits data (pipeline.data.digits, pipeline.data.digit_images): scale, split, loaders, refusals."""

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from torch.utils.data import RandomSampler, SequentialSampler

from pipeline.data.digit_images import DigitImagesDataModule, to_unit_range
from pipeline.data.digits import DigitsDataModule, digits_arrays, split_indices


@pytest.fixture(scope="module")
def raw():
    d = load_digits()
    return d.data, d.target


def test_digits_arrays_are_the_pixels_over_16_as_float32_and_int64_labels(raw):
    x, y = digits_arrays()
    assert x.dtype == np.float32 and y.dtype == np.int64
    assert x.shape == (1797, 64) and y.shape == (1797,)
    assert x.min() == 0.0 and x.max() == 1.0
    np.testing.assert_array_equal(x * 16, raw[0].astype(np.float32))
    np.testing.assert_array_equal(y, raw[1])


def test_split_sizes_disjoint_sorted_stratified_and_seeded(raw):
    y = raw[1]
    train, val, test = split_indices(y, 0.15, 0.2, seed=3)
    # 1797 * 0.2 = 359.4 -> 360 test; 1437 * 0.15 / 0.8 = 269.4 -> 270 val
    assert (len(train), len(val), len(test)) == (1167, 270, 360)
    assert sorted(np.concatenate([train, val, test]).tolist()) == list(range(1797))
    for part in (train, val, test):
        assert np.all(np.diff(part) > 0)
    counts = np.bincount(y, minlength=10)
    for part, frac in ((test, 0.2), (val, 0.15)):
        assert np.all(np.abs(np.bincount(y[part], minlength=10) - frac * counts) <= 1.5)
    again = split_indices(y, 0.15, 0.2, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip((train, val, test), again))
    other = split_indices(y, 0.15, 0.2, seed=4)
    assert not np.array_equal(test, other[2]) and not np.array_equal(val, other[1])


def test_val_fraction_is_of_the_whole_not_of_the_rest(raw):
    train, val, test = split_indices(raw[1], 0.4, 0.5, seed=0)
    # 1797 * 0.5 = 898.5 -> 899 test; 898 * 0.4 / 0.5 = 718.4 -> 719 val
    assert (len(train), len(val), len(test)) == (179, 719, 899)


@pytest.mark.parametrize(
    "val, test",
    [(0.0, 0.2), (1.0, 0.2), (0.15, 0.0), (0.15, 1.0), (0.5, 0.5), (0.6, 0.5), (-0.1, 0.2), (0.1, -0.2)],
)
def test_bad_fractions_are_refused_with_both_values_named(val, test):
    msg = (
        f"data.val_fraction={val} and data.test_fraction={test} must be in (0, 1) and sum below 1"
    )
    with pytest.raises(ValueError) as err:
        DigitsDataModule(val_fraction=val, test_fraction=test)
    assert str(err.value) == msg
    with pytest.raises(ValueError):
        DigitImagesDataModule(val_fraction=val, test_fraction=test)


def test_fractions_just_inside_the_bounds_are_accepted():
    DigitsDataModule(val_fraction=0.49, test_fraction=0.5)
    DigitsDataModule(val_fraction=0.01, test_fraction=0.01)


def test_digits_module_defaults_splits_and_loaders(raw):
    dm = DigitsDataModule(batch_size="32", split_seed="5")
    assert dm.batch_size == 32 and dm.split_seed == 5 and isinstance(dm.split_seed, int)
    assert (dm.val_fraction, dm.test_fraction) == (0.15, 0.2)
    assert (dm.in_features, dm.n_classes, dm.image_shape) == (64, 10, (8, 8))
    dm.setup()
    first = dm.splits["test"]
    dm.setup("fit")
    assert dm.splits["test"] is first
    _, _, test = split_indices(raw[1], 0.15, 0.2, 5)
    x, y = first.tensors
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    np.testing.assert_array_equal(x.numpy() * 16, raw[0][test].astype(np.float32))
    np.testing.assert_array_equal(y.numpy(), raw[1][test])
    assert [len(dm.splits[s]) for s in ("train", "val", "test")] == [1167, 270, 360]
    for name, loader, shuffled in (
        ("train", dm.train_dataloader(), True),
        ("val", dm.val_dataloader(), False),
        ("test", dm.test_dataloader(), False),
    ):
        assert loader.dataset is dm.splits[name]
        assert loader.batch_size == 32 and loader.num_workers == 0 and not loader.drop_last
        assert isinstance(loader.sampler, RandomSampler if shuffled else SequentialSampler)


def test_digits_module_default_batch_size_and_seed():
    dm = DigitsDataModule()
    assert dm.batch_size == 64 and dm.split_seed == 0 and dm.splits == {}


def test_to_unit_range_by_hand():
    assert torch.equal(to_unit_range(torch.tensor([-1.0, 0.0, 0.5, 1.0])), torch.tensor([0.0, 0.5, 0.75, 1.0]))


def test_digit_images_are_the_supervised_split_as_images_in_minus_one_to_one(raw):
    dm = DigitImagesDataModule(batch_size=16, split_seed=2)
    assert (dm.image_shape, dm.n_classes) == ((1, 8, 8), 10)
    images = dm.real_images("test")  # sets up on its own
    first = dm.splits["test"]
    dm.setup()
    assert dm.splits["test"] is first
    sup = DigitsDataModule(batch_size=16, split_seed=2)
    sup.setup()
    for split in ("train", "val", "test"):
        imgs, labels = dm.real_images(split), dm.real_labels(split)
        assert imgs.shape == (len(sup.splits[split]), 1, 8, 8) and imgs.dtype == torch.float32
        assert torch.equal(labels, sup.splits[split].tensors[1])
        assert torch.equal((imgs.reshape(-1, 64) + 1) / 2, sup.splits[split].tensors[0])
    assert images.min() == -1.0 and images.max() == 1.0
    _, _, test = split_indices(raw[1], 0.15, 0.2, 2)
    np.testing.assert_array_equal(((images[:, 0] + 1) * 8).numpy(), raw[0][test].reshape(-1, 8, 8))


def test_real_labels_sets_up_on_its_own():
    dm = DigitImagesDataModule()
    assert dm.real_labels("val").shape == (270,)


def test_digit_images_loaders():
    dm = DigitImagesDataModule(batch_size=7)
    dm.setup()
    train = dm.train_dataloader()
    assert train.dataset is dm.splits["train"] and train.batch_size == 7 and train.num_workers == 0
    assert train.drop_last and isinstance(train.sampler, RandomSampler)
    assert len(train) == 1167 // 7
    val = dm.val_dataloader()
    assert val.dataset is dm.splits["val"] and not val.drop_last and isinstance(val.sampler, SequentialSampler)
    assert dm.test_dataloader().dataset is dm.splits["test"]

"""seed_everything by known answers: the first draws of python, numpy and torch after seeding 0 (published values
of those generators), the environment it leaves for Lightning's workers, and what `deterministic` switches on."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from pipeline.runtime.seeding import seed_everything

# The first draw of each generator seeded with 0 (the generators' own known answers).
PY_0 = 0.8444218515250481
NP_0 = 0.5488135039273248
NP_1 = 0.417022004702574  # numpy seeded with 1
TORCH_0 = 0.49625658988952637


@pytest.fixture(autouse=True)
def restore(monkeypatch):
    """Leave the process as it was: environment (monkeypatch undoes it), generators and torch's switches."""
    for key in ("PYTHONHASHSEED", "PL_GLOBAL_SEED", "CUBLAS_WORKSPACE_CONFIG"):
        monkeypatch.delenv(key, raising=False)
    py, np_state, torch_state = random.getstate(), np.random.get_state(), torch.get_rng_state()
    det, warn, bench = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.benchmark,
    )
    yield
    random.setstate(py)
    np.random.set_state(np_state)
    torch.set_rng_state(torch_state)
    torch.use_deterministic_algorithms(det, warn_only=warn)
    torch.backends.cudnn.benchmark = bench


def test_seed_0_gives_each_generators_known_first_draw():
    random.random(), np.random.rand(), torch.rand(1)  # move them all away from any seeded state
    seed_everything(0)
    assert random.random() == PY_0
    assert np.random.rand() == NP_0
    assert torch.rand(1).item() == TORCH_0
    assert torch.initial_seed() == 0


def test_the_seed_is_left_in_the_environment_for_worker_processes():
    seed_everything(1234)
    assert os.environ["PYTHONHASHSEED"] == "1234"
    assert os.environ["PL_GLOBAL_SEED"] == "1234"
    assert torch.initial_seed() == 1234


def test_a_seed_given_as_text_is_read_as_a_number():
    seed_everything("0")
    assert random.random() == PY_0  # random.seed("0") would seed from the string: another stream
    assert os.environ["PL_GLOBAL_SEED"] == "0" and torch.initial_seed() == 0


def test_numpy_takes_the_seed_modulo_2_to_the_32():
    seed_everything(2**32)  # numpy refuses seeds >= 2**32; its seed is then 0
    assert np.random.rand() == NP_0
    assert torch.initial_seed() == 2**32
    seed_everything(2**32 + 1)
    assert np.random.rand() == NP_1
    seed_everything(1)
    assert np.random.rand() == NP_1


def test_every_cuda_device_is_seeded_when_there_is_one(monkeypatch):
    seeded = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "manual_seed_all", seeded.append)
    seed_everything(5)
    # torch.manual_seed seeds every CUDA device too (one call); seed_everything's own call must agree with it.
    assert seeded and set(seeded) == {5}, seeded


def test_deterministic_asks_for_deterministic_kernels_with_warnings_only(monkeypatch):
    torch.backends.cudnn.benchmark = True
    torch.use_deterministic_algorithms(False)
    seed_everything(0, deterministic=True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert torch.are_deterministic_algorithms_enabled() is True
    assert torch.is_deterministic_algorithms_warn_only_enabled() is True
    assert torch.backends.cudnn.benchmark is False


def test_deterministic_keeps_a_cublas_workspace_the_user_set(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    seed_everything(0, deterministic=True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


def test_by_default_nothing_about_kernels_changes():
    torch.backends.cudnn.benchmark = True
    torch.use_deterministic_algorithms(False)
    seed_everything(0)
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    assert torch.are_deterministic_algorithms_enabled() is False
    assert torch.backends.cudnn.benchmark is True

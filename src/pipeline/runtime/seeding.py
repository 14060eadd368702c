"""One function that seeds everything a run draws random numbers from."""

from __future__ import annotations

import os
import random

import numpy as np
import torch


def seed_everything(seed: int, deterministic: bool = False) -> None:
    """Seed python, numpy and torch (CPU and CUDA); environments are seeded from the same value by the tasks.

    `deterministic` additionally asks torch for deterministic kernels (needed for bitwise
    reproducibility on GPU; on one CPU thread runs are reproducible without it).
    """
    seed = int(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    # Lightning's data-loader worker seeding reads this.
    os.environ["PL_GLOBAL_SEED"] = str(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False

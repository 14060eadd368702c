import os

import pytest
import torch
from hydra import compose, initialize_config_module

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
torch.set_num_threads(1)


@pytest.fixture
def make_cfg():
    """Compose a config exactly as the CLI does, from the packaged conf/."""

    def _make(*overrides: str):
        with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
            return compose(config_name="config", overrides=list(overrides))

    return _make

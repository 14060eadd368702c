import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def make_cfg():
    """Compose a config exactly as the CLI does, from the packaged conf/."""

    def _make(*overrides: str):
        with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
            return compose(config_name="config", overrides=list(overrides))

    return _make


def run_cli(*args: str, cwd: Path | None = None, timeout: int = 600, env: dict | None = None):
    """`python -m pipeline ...` as a user types it."""
    full_env = {**os.environ, "WANDB_MODE": "offline", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True, text=True, timeout=timeout, cwd=cwd or ROOT, env=full_env,
    )


def read_result(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "result.json").read_text())

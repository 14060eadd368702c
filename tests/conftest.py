import os
import signal

import pytest
import torch
from hydra import compose, initialize_config_module
from hypothesis import HealthCheck, settings

import pipeline_testing  # noqa: F401  (first: it keeps the import-time environment the suite was started with)

# The suite's runs get a terminal's SIGHUP (a stop request) even when the suite itself was started under nohup or
# by a runner that ignores it: a child inherits an ignored SIGHUP, and a run keeps an inherited SIG_IGN (the nohup
# case, which its own test sets up). The forkserver and every subprocess start after this line.
signal.signal(signal.SIGHUP, signal.SIG_DFL)
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
torch.set_num_threads(1)

# Property tests draw the same examples on every run (derandomize): a failure in CI reproduces
# locally. `--hypothesis-profile=dev` (or HYPOTHESIS_PROFILE=dev) searches more, with fresh draws.
settings.register_profile(
    "ci", deadline=None, derandomize=True, database=None, max_examples=40,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=300)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def make_cfg():
    """Compose a config exactly as the CLI does, from the packaged conf/."""

    def _make(*overrides: str):
        with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
            return compose(config_name="config", overrides=list(overrides))

    return _make


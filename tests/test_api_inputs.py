"""pipeline.run and pipeline.load on inputs a user can get wrong: one line each, before anything is read or written."""

import pytest
import torch

import pipeline
from pipeline.config.checks import ConfigError
from pipeline.runtime.replay import EvalError


def test_overrides_given_as_one_string_are_refused_showing_the_list_meant(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        pipeline.run("dqn_cartpole", overrides="trainer=debug seed=3")
    assert str(err.value) == "overrides='trainer=debug seed=3': a list of overrides, e.g. overrides=['trainer=debug', 'seed=3']"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_load_on_a_device_this_machine_lacks_is_one_line(tmp_path):
    with pytest.raises(EvalError) as err:
        pipeline.load(tmp_path, device="cuda")
    assert str(err.value) == "device='cuda': torch sees no CUDA device on this machine; load with device='cpu'"


@pytest.mark.parametrize("device", ["gpu", "cuda:x", 3.5])
def test_load_on_something_that_is_no_device_is_one_line(tmp_path, device):
    with pytest.raises(EvalError) as err:
        pipeline.load(tmp_path, device=device)
    assert str(err.value).startswith(f"device={device!r} is not a torch device (") and str(err.value).endswith("e.g. device='cpu'")
    assert "\n" not in str(err.value)

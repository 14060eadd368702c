"""The device group: accelerator resolution, CPU threads and denormal flushing, as a run applies them."""

import logging
import platform
import types

import pytest
import torch

from pipeline.runtime import devices
from pipeline.runtime.devices import DeviceError, flushes_denormals, resolve_accelerator, setup_device


@pytest.fixture(autouse=True)
def restore_torch_state():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
    torch.set_flush_denormal(False)


def test_flush_denormal_turns_tiny_floats_into_zero_and_can_be_turned_off():
    tiny = torch.tensor([1e-39, -3e-40, 1e-30])
    setup_device("cpu", 1, flush_denormal=True)
    assert (tiny * 1.0).tolist()[:2] == [0.0, 0.0] and (tiny * 1.0)[2] > 0
    setup_device("cpu", 1, flush_denormal=False)
    assert (tiny * 1.0)[0].item() == pytest.approx(1e-39, rel=1e-3)


def test_threads_are_applied_and_the_choice_is_a_cpu_device():
    assert setup_device("cpu", 1) == torch.device("cpu") and torch.get_num_threads() == 1


def test_unknown_accelerator_is_one_line_with_the_choices():
    with pytest.raises(DeviceError, match="choose auto, cpu, cuda or mps"):
        resolve_accelerator("tpu")


def test_the_packaged_device_options_flush_denormals(make_cfg):
    for option in ("auto", "cpu", "cuda", "mps"):
        assert make_cfg(f"device={option}").device.flush_denormal is True


def test_flushes_denormals_reads_the_current_setting():
    torch.set_flush_denormal(True)
    assert flushes_denormals() is True
    torch.set_flush_denormal(False)
    assert flushes_denormals() is False


@pytest.mark.slow
def test_a_run_gives_the_caller_its_denormal_setting_back(make_cfg, tmp_path):
    from pipeline.runtime.run import run

    torch.set_flush_denormal(False)
    records = run(make_cfg("experiment=supervised_digits", "trainer=debug", "trainer.enable_progress_bar=false"), tmp_path)
    assert records[0]["status"] == "ok"
    assert flushes_denormals() is False


# ---------------------------------------------------------------------------------------------------
# On any machine: CUDA and MPS stood in for, each answer and message written out by hand.


def machine(monkeypatch, cuda: bool, mps: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: f"Stand-in GPU {index}")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)


@pytest.mark.parametrize(
    "cuda, mps, picked", [(True, True, "cuda"), (True, False, "cuda"), (False, True, "mps"), (False, False, "cpu")]
)
def test_auto_prefers_cuda_then_mps_then_cpu(monkeypatch, cuda, mps, picked):
    machine(monkeypatch, cuda, mps)
    assert resolve_accelerator("auto") == picked
    assert resolve_accelerator("AUTO") == picked


@pytest.mark.parametrize("requested", ["cuda", "gpu", "CUDA", "Gpu"])
def test_cuda_when_there_is_one(monkeypatch, requested):
    machine(monkeypatch, cuda=True, mps=False)
    assert resolve_accelerator(requested) == "cuda"


@pytest.mark.parametrize("requested", ["cuda", "gpu"])
def test_cuda_without_one_is_refused(monkeypatch, requested):
    machine(monkeypatch, cuda=False, mps=True)
    with pytest.raises(DeviceError) as err:
        resolve_accelerator(requested)
    assert str(err.value) == "device=cuda was requested but torch sees no CUDA GPU; use device=cpu or device=auto"


def test_mps_when_there_is_one(monkeypatch):
    machine(monkeypatch, cuda=True, mps=True)
    assert resolve_accelerator("mps") == "mps"
    assert resolve_accelerator("MPS") == "mps"


def test_mps_without_it_is_refused(monkeypatch):
    machine(monkeypatch, cuda=True, mps=False)
    with pytest.raises(DeviceError) as err:
        resolve_accelerator("mps")
    assert str(err.value) == "device=mps was requested but MPS is not available; use device=cpu or device=auto"


def test_a_torch_without_an_mps_backend_has_no_mps(monkeypatch):
    machine(monkeypatch, cuda=False, mps=True)
    monkeypatch.setattr(torch.backends, "mps", None)
    assert resolve_accelerator("auto") == "cpu"
    with pytest.raises(DeviceError):
        resolve_accelerator("mps")


@pytest.mark.parametrize("requested", ["cpu", "CPU"])
def test_cpu_is_always_there(monkeypatch, requested):
    machine(monkeypatch, cuda=True, mps=True)
    assert resolve_accelerator(requested) == "cpu"


@pytest.mark.parametrize("requested", ["tpu", "", "cuda:0"])
def test_unknown_accelerator(requested):
    with pytest.raises(DeviceError) as err:
        resolve_accelerator(requested)
    assert str(err.value) == f"unknown device.accelerator {requested!r}; choose auto, cpu, cuda or mps"


def test_a_non_string_request_is_read_as_text():
    with pytest.raises(DeviceError) as err:
        resolve_accelerator(None)
    assert str(err.value) == "unknown device.accelerator 'none'; choose auto, cpu, cuda or mps"


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_thread_count_is_applied(threads):
    torch.set_num_threads(4 if threads != 4 else 1)
    assert setup_device("cpu", threads) == torch.device("cpu")
    assert torch.get_num_threads() == threads


def test_a_thread_count_given_as_text_is_applied():
    torch.set_num_threads(1)
    setup_device("cpu", "2")
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("threads", [None, 0, -1])
def test_no_thread_count_leaves_torchs_own(threads):
    torch.set_num_threads(3)
    setup_device("cpu", threads)
    assert torch.get_num_threads() == 3


def test_denormals_are_flushed_by_default_and_on_request():
    torch.set_flush_denormal(False)
    setup_device("cpu", None)
    assert flushes_denormals() is True
    setup_device("cpu", None, flush_denormal=0)
    assert flushes_denormals() is False
    setup_device("cpu", None, flush_denormal=1)
    assert flushes_denormals() is True


def test_the_choice_is_logged_with_the_threads(caplog):
    torch.set_num_threads(2)
    with caplog.at_level(logging.INFO, logger="pipeline.runtime.devices"):
        setup_device("cpu", None)
    assert caplog.record_tuples == [("pipeline.runtime.devices", logging.INFO, "device: cpu (2 CPU thread(s))")]


def test_a_cuda_choice_is_logged_with_the_first_gpus_name(monkeypatch, caplog):
    machine(monkeypatch, cuda=True, mps=False)
    with caplog.at_level(logging.INFO, logger="pipeline.runtime.devices"):
        assert setup_device("auto", None) == torch.device("cuda")
    assert caplog.record_tuples == [("pipeline.runtime.devices", logging.INFO, "device: cuda (Stand-in GPU 0)")]


def test_an_mps_choice_is_logged_with_the_threads(monkeypatch, caplog):
    machine(monkeypatch, cuda=False, mps=True)
    torch.set_num_threads(1)
    with caplog.at_level(logging.INFO, logger="pipeline.runtime.devices"):
        assert setup_device("mps", None) == torch.device("mps")
    assert caplog.record_tuples == [("pipeline.runtime.devices", logging.INFO, "device: mps (1 CPU thread(s))")]


def test_the_logger_is_the_modules():
    assert devices.log.name == "pipeline.runtime.devices"


def test_a_torch_without_the_mps_attribute_has_no_mps(monkeypatch):
    """An older torch: torch.backends has no mps at all."""
    machine(monkeypatch, cuda=False, mps=True)
    monkeypatch.setattr(torch, "backends", types.SimpleNamespace())
    assert resolve_accelerator("auto") == "cpu"


def test_flushes_denormals_reads_float32_under_a_float64_default(monkeypatch):
    """1e-39 is denormal in float32 only: under a float64 default dtype the probe must still be float32."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.set_flush_denormal(True)
        assert flushes_denormals() is True
    finally:
        torch.set_default_dtype(default)


_FAULTS = """
import resource, sys, torch
from pipeline.runtime.devices import setup_device
setup_device("cpu", 1, cpu_heap_mb=int(sys.argv[1]))
x = torch.randn(16, 256, 64)  # 1 MiB, as a K = 16 PPO minibatch activation
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(100):  # a forward pass keeps its activations for the backward, then drops them
    kept_for_backward = [torch.sigmoid(x * 2) * x for _ in range(6)]
    del kept_for_backward
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 100)
"""


def _faults_per_step(mb: int) -> float:
    import subprocess
    import sys

    return float(subprocess.run([sys.executable, "-c", _FAULTS, str(mb)], capture_output=True, text=True, check=True).stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's thresholds are glibc's")
def test_the_kept_cpu_heap_spares_the_page_faults_of_tensors_made_every_step():
    """Each step makes six 1 MiB tensors (1,536 pages) and drops them: glibc maps fresh ones (a fault per page touched),
    a kept heap reuses its own. Measured here: 258-2,534 faults per step with glibc's own thresholds, 31 kept."""
    assert _faults_per_step(32) < 100


def test_cpu_heap_unset_or_zero_changes_nothing():
    assert devices.keep_cpu_heap(None) is False and devices.keep_cpu_heap(0) is False


def test_the_packaged_device_options_keep_a_cpu_heap(make_cfg):
    for option in ("auto", "cpu", "cuda", "mps"):
        assert make_cfg(f"device={option}").device.cpu_heap_mb == 32

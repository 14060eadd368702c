"""The device group: accelerator resolution, CPU threads and denormal flushing, as a run applies them."""

import pytest
import torch

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

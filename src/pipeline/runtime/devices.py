"""Pick the accelerator, the CPU thread count and the CPU heap from the `device` config group."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

import torch

log = logging.getLogger(__name__)


class DeviceError(RuntimeError):
    pass


def _mps_available() -> bool:
    return bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()


def resolve_accelerator(requested: str) -> str:
    """Map `auto` to cuda, then mps, then cpu; check that an explicit request can be met."""
    requested = str(requested).lower()
    if requested == "auto":
        if torch.cuda.is_available():
            return "cuda"
        return "mps" if _mps_available() else "cpu"
    if requested in ("cuda", "gpu"):
        if not torch.cuda.is_available():
            raise DeviceError("device=cuda was requested but torch sees no CUDA GPU; use device=cpu or device=auto")
        return "cuda"
    if requested == "mps":
        if not _mps_available():
            raise DeviceError("device=mps was requested but MPS is not available; use device=cpu or device=auto")
        return "mps"
    if requested == "cpu":
        return "cpu"
    raise DeviceError(f"unknown device.accelerator {requested!r}; choose auto, cpu, cuda or mps")


def flushes_denormals() -> bool:
    """Whether CPU arithmetic flushes denormal floats to zero right now (torch has a setter, no getter)."""
    return torch.tensor([1e-39], dtype=torch.float32).mul(1.0).item() == 0.0


# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_cpu_heap(mb: int | None) -> bool:
    """Serve CPU allocations below `mb` MiB from glibc's heap and keep up to 4x that freed at its top.

    glibc serves blocks above its (adaptive, 128 KiB-based) threshold with a fresh mmap and unmaps them on free,
    so a tensor of a few MiB made and dropped every step costs a page fault per 4 KiB each time: in a K = 16 PPO
    update ([16, 256, 64] activations, 1 MiB each; tests/test_devices.py's pattern: 258-2,534 faults a step, 31
    with the kept heap), and the run learned ~8% faster (at K = 1, whose tensors are small, ~3%). The cost: up to 4 x `mb`
    MiB of freed memory stays mapped. Returns whether it was applied (False: `mb` unset, or not glibc).
    """
    if mb is None or int(mb) <= 0:
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        log.debug("device.cpu_heap_mb: this C library has no mallopt; left as it is")
        return False
    size = int(mb) << 20
    applied = bool(mallopt(_M_MMAP_THRESHOLD, size)) and bool(mallopt(_M_TRIM_THRESHOLD, 4 * size))
    if not applied:
        log.warning(f"device.cpu_heap_mb={mb}: the C library refused it; glibc's own thresholds stay")
    return applied


def setup_device(
    accelerator: str, num_threads: int | None, flush_denormal: bool = True, cpu_heap_mb: int | None = None
) -> torch.device:
    """Resolve the accelerator, apply the CPU thread count, denormal flushing and the CPU heap, and say what was picked."""
    name = resolve_accelerator(accelerator)
    if num_threads is not None and int(num_threads) > 0:
        # With more threads than free cores a tiny network steps several times slower.
        torch.set_num_threads(int(num_threads))
    # Denormal floats (|x| < 1.2e-38) take a slow path in CPU arithmetic. Adam's second moments of
    # gradients that are zero or tiny decay into that range: in a K = 64 DQN run the fused Adam step
    # took 3.7 ms instead of 0.5 ms, and flushing them to zero cut the run's learning time by 39%.
    torch.set_flush_denormal(bool(flush_denormal))
    keep_cpu_heap(cpu_heap_mb)
    detail = torch.cuda.get_device_name(0) if name == "cuda" else f"{torch.get_num_threads()} CPU thread(s)"
    log.info(f"device: {name} ({detail})")
    return torch.device(name)

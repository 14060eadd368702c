"""Multi-layer perceptron: the plain building block of most of our networks."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence

import torch
from torch import nn

# Where torch.tanh is slow (below), tensors at least this large take tanh's sigmoid form on CPU (measured crossover
# ~16k-65k values with autograd, where the Function's overhead counts); without autograd (rollouts, evaluation) the
# form is three plain ops and wins from ~4k values. Where torch.tanh is fast (Intel AVX-512) it is taken at any size.
FAST_TANH_MIN_NUMEL = 32768
FAST_TANH_NOGRAD_MIN_NUMEL = 8192

# MKL_CBWR / MKL_ENABLE_INSTRUCTIONS values (before any ",STRICT"; MKL reads them case-sensitively) that keep MKL
# below its AVX-512 code path.
_MKL_BELOW_AVX512 = frozenset({"COMPATIBLE", "SSE2", "SSSE3", "SSE4_1", "SSE4_2", "AVX"})
_MKL_BELOW_AVX512_PREFIXES = ("AVX2", "AVX512_MIC")
_AVX512_FLAGS = frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})


def mkl_tanh_is_vectorised(cpuinfo: str, has_mkl: bool, environ: Mapping[str, str]) -> bool:
    """Whether torch's float32 CPU tanh runs MKL's AVX-512 kernel (VML `vsTanh`), from the machine and the build.

    torch's CPU tanh calls MKL's vsTanh where torch is built with MKL. MKL picks its code path itself: the AVX-512
    one only for a CPU whose CPUID vendor is "GenuineIntel" (MKL's own check) with AVX-512 (F, CD, BW, DQ, VL), and
    only if MKL_CBWR / MKL_ENABLE_INSTRUCTIONS do not cap it lower; any other path (MKL's AVX2 one on Intel, its
    generic one on AMD) is the slow tanh. `cpuinfo` is /proc/cpuinfo's text ("" where there is none).
    """
    if not has_mkl:
        return False
    for name in ("MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS"):
        isa = environ.get(name, "").split(",")[0]
        if isa in _MKL_BELOW_AVX512 or isa.startswith(_MKL_BELOW_AVX512_PREFIXES):
            return False
    vendor = flags = None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "vendor_id" and vendor is None:
            vendor = value.strip()
        elif key == "flags" and flags is None:
            flags = set(value.split())
        if vendor is not None and flags is not None:
            break
    return vendor == "GenuineIntel" and flags is not None and _AVX512_FLAGS <= flags


@functools.cache
def eager_tanh_form() -> str:
    """The form Tanh takes for large float32 CPU tensors outside torch.compile, decided once per process:
    "tanh" (torch.tanh) where torch's tanh is MKL's AVX-512 kernel, "sigmoid" (2 sigmoid(2x) - 1) elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            cpuinfo = f.read()
    except OSError:
        cpuinfo = ""
    return "tanh" if mkl_tanh_is_vectorised(cpuinfo, torch.backends.mkl.is_available(), os.environ) else "sigmoid"


class _SigmoidTanh(torch.autograd.Function):
    """tanh(x) as 2 sigmoid(2x) - 1, with tanh's own backward (grad * (1 - y^2)) from the saved output."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        y = torch.sigmoid(x * 2).mul_(2).sub_(1)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


class Tanh(nn.Tanh):
    """nn.Tanh, computed as 2 sigmoid(2x) - 1 for large float32 CPU tensors where torch's tanh is slow.

    Where torch's float32 tanh is not MKL's AVX-512 kernel (`eager_tanh_form`; AMD, AVX2-only CPUs, builds without
    MKL) it is several times slower than sigmoid: one thread, 65,536 values, 343 us against 105 us for the form on
    an AMD EPYC. On Intel AVX-512 it is the faster one at every size (20 us against 52 us, 4,096 values 2.4 us
    against 12 us on a Sapphire Rapids Xeon) and is taken. Under torch.compile the form is traced as elsewhere (the compiler
    fuses it). The two forms differ by at most ~2e-7 (float32 rounding of 2 sigmoid - 1 near 0); smaller tensors,
    other dtypes and other devices keep torch.tanh. Measured with `benchmarks/bench_tanh.py` (docs/speed.md).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu" or x.numel() < FAST_TANH_NOGRAD_MIN_NUMEL:
            return torch.tanh(x)
        # Not under torch.compile: the compiled graph keeps the size rule below whatever this machine's tanh is.
        if not torch.compiler.is_compiling() and eager_tanh_form() == "tanh":
            return torch.tanh(x)
        if torch.is_grad_enabled() and x.requires_grad:
            return _SigmoidTanh.apply(x) if x.numel() >= FAST_TANH_MIN_NUMEL else torch.tanh(x)
        if torch.is_grad_enabled():
            # Out of place: under torch.func.vmap (a generically stacked module) x says requires_grad=False while
            # autograd records it, and the in-place form would break the backward.
            return torch.sigmoid(x * 2) * 2 - 1
        return torch.sigmoid(x * 2).mul_(2).sub_(1)


_ACTIVATIONS = {"relu": nn.ReLU, "tanh": Tanh, "leaky_relu": nn.LeakyReLU, "gelu": nn.GELU, "elu": nn.ELU}


def activation(name: str) -> type[nn.Module]:
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; choose one of {sorted(_ACTIVATIONS)}") from None


class MLP(nn.Module):
    """in_features -> hidden[0] -> ... -> hidden[-1] -> out_features, with an activation between layers."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        hidden: Sequence[int] = (64, 64),
        act: str = "relu",
        dropout: float = 0.0,
    ):
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        layers: list[nn.Module] = []
        width = self.in_features
        for h in hidden:
            layers += [nn.Linear(width, int(h)), activation(act)()]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width = int(h)
        layers.append(nn.Linear(width, self.out_features))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1) if x.dim() > 2 else x)

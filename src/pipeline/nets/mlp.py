"""Multi-layer perceptron: the plain building block of most of our networks."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

# Tensors at least this large take tanh's sigmoid form on CPU (measured crossover ~16k-65k values, see Tanh);
# without autograd (rollouts, evaluation) the form has no Function overhead and wins from ~4k values.
FAST_TANH_MIN_NUMEL = 32768
FAST_TANH_NOGRAD_MIN_NUMEL = 8192


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
    """nn.Tanh, computed as 2 sigmoid(2x) - 1 for large float32 CPU tensors.

    This torch CPU build's float32 tanh is several times slower than its sigmoid (one thread, AVX-512; us per
    call, forward [+ backward]: 65,536 values tanh 343 [552], sigmoid form 105 [189]; 4,096 values tanh 22 [63],
    sigmoid form 20 [128]: the autograd Function's overhead wins below ~16k values). In K-seed PPO the
    minibatch activations ([16, 128, 64] at K = 16) are where torch.tanh took ~27% of the update. Without
    autograd the form is three plain ops (us per call, 4,096 values: tanh 12.1, form 12.0; 8,192: 22.4 / 14.2;
    the rollout's [16, 8, 64] at K = 16). The two forms differ by at most ~2e-7 (float32 rounding of
    2 sigmoid - 1 near 0); smaller tensors, other dtypes and other devices keep torch.tanh.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu" or x.numel() < FAST_TANH_NOGRAD_MIN_NUMEL:
            return torch.tanh(x)
        if torch.is_grad_enabled() and x.requires_grad:
            return _SigmoidTanh.apply(x) if x.numel() >= FAST_TANH_MIN_NUMEL else torch.tanh(x)
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

"""Q-network heads: dueling streams and noisy-net exploration."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from pipeline.nets.mlp import activation


def _trunk(in_features: int, hidden: Sequence[int], act: str) -> tuple[nn.Sequential, int]:
    layers: list[nn.Module] = []
    width = int(in_features)
    for h in hidden:
        layers += [nn.Linear(width, int(h)), activation(act)()]
        width = int(h)
    return nn.Sequential(*layers), width


class DuelingQNet(nn.Module):
    """Dueling architecture (Wang et al. 2016): Q(s, a) = V(s) + A(s, a) - mean_a A(s, a).

    Subtracting the mean advantage makes V and A identifiable: the mean of Q
    over actions equals V, so the value stream learns from every action.
    """

    def __init__(
        self, in_features: int, out_features: int, hidden: Sequence[int] = (256, 256), act: str = "relu"
    ):
        super().__init__()
        self.trunk, width = _trunk(in_features, hidden, act)
        self.value = nn.Linear(width, 1)
        self.advantage = nn.Linear(width, int(out_features))  # one output per action

    def value_and_advantage(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(x.flatten(1) if x.dim() > 2 else x)
        return self.value(h), self.advantage(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v, a = self.value_and_advantage(x)
        return v + a - a.mean(dim=-1, keepdim=True)


def _scaled_noise(n: int, device: torch.device, generator: torch.Generator | None) -> torch.Tensor:
    x = torch.randn(n, device=device, generator=generator)
    return x.sign() * x.abs().sqrt()


class NoisyLinear(nn.Module):
    """Linear layer with learned factorised Gaussian weight noise (Fortunato et al. 2017).

    Factorised noise needs in + out random numbers per reset instead of
    in * out. In eval() mode the layer uses its mean weights, so greedy
    evaluation is deterministic.
    """

    def __init__(self, in_features: int, out_features: int, sigma0: float = 0.5):
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.sigma0 = float(sigma0)
        self.weight_mu = nn.Parameter(torch.empty(self.out_features, self.in_features))
        self.weight_sigma = nn.Parameter(torch.empty(self.out_features, self.in_features))
        self.bias_mu = nn.Parameter(torch.empty(self.out_features))
        self.bias_sigma = nn.Parameter(torch.empty(self.out_features))
        # Buffers, not parameters: they travel with .to() and state_dict and
        # are copied by hard_update, but are never optimised.
        self.register_buffer("eps_in", torch.zeros(self.in_features))
        self.register_buffer("eps_out", torch.zeros(self.out_features))
        self.reset_parameters()
        self.reset_noise()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.in_features)
        nn.init.uniform_(self.weight_mu, -bound, bound)
        nn.init.uniform_(self.bias_mu, -bound, bound)
        nn.init.constant_(self.weight_sigma, self.sigma0 / math.sqrt(self.in_features))
        nn.init.constant_(self.bias_sigma, self.sigma0 / math.sqrt(self.in_features))

    @torch.no_grad()
    def reset_noise(self, generator: torch.Generator | None = None) -> None:
        self.eps_in.copy_(_scaled_noise(self.in_features, self.eps_in.device, generator))
        self.eps_out.copy_(_scaled_noise(self.out_features, self.eps_out.device, generator))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return F.linear(x, self.weight_mu, self.bias_mu)
        weight = self.weight_mu + self.weight_sigma * torch.outer(self.eps_out, self.eps_in)
        bias = self.bias_mu + self.bias_sigma * self.eps_out
        return F.linear(x, weight, bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, sigma0={self.sigma0}"


class NoisyQNet(nn.Module):
    """An MLP Q-network whose layers are all NoisyLinear: exploration comes from the weights, not epsilon."""

    def __init__(
        self, in_features: int, out_features: int, hidden: Sequence[int] = (256, 256), sigma0: float = 0.5
    ):
        super().__init__()
        widths = [int(in_features), *(int(h) for h in hidden), int(out_features)]
        self.layers = nn.ModuleList(NoisyLinear(a, b, sigma0=sigma0) for a, b in zip(widths[:-1], widths[1:]))

    def reset_noise(self, generator: torch.Generator | None = None) -> None:
        for layer in self.layers:
            layer.reset_noise(generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1) if x.dim() > 2 else x
        for layer in self.layers[:-1]:
            x = F.relu(layer(x))
        return self.layers[-1](x)

"""Multi-layer perceptron: the plain building block of most of our networks."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "leaky_relu": nn.LeakyReLU, "gelu": nn.GELU, "elu": nn.ELU}


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

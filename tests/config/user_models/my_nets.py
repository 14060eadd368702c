"""A user's own networks, as a user writes them next to their config folder (tests/config: the front door)."""

from torch import nn


class ResMLP(nn.Module):
    """A residual MLP: a skip connection, a LayerNorm and a Dropout; sizes from the task, `width` from its YAML."""

    def __init__(self, in_features: int, out_features: int, width: int = 64, dropout: float = 0.0):
        super().__init__()
        self.inp = nn.Linear(in_features, width)
        self.block = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.ReLU(), nn.Dropout(dropout))
        self.out = nn.Linear(width, out_features)

    def forward(self, x):
        h = self.inp(x.flatten(1).float())
        return self.out(h + self.block(h))


class SizedOtherwise(nn.Module):
    """Takes its sizes under names of its own: no task can build it."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.net = nn.Linear(n_in, n_out)


class NotAModule:
    """A plain class: no parameters, no forward."""

    def __init__(self, in_features: int, out_features: int):
        self.sizes = (in_features, out_features)


def resmlp(in_features: int, out_features: int, width: int = 32) -> nn.Module:
    """A factory function instead of a class: checked by its signature."""
    return ResMLP(in_features, out_features, width)

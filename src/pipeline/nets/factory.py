"""Build a plain network from a config's model factory with the sizes only the task knows."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn


def make_net(factory: Callable[..., nn.Module], in_features: int, out_features: int) -> nn.Module:
    """`factory(in_features=..., out_features=...)`: every model of conf/model/ takes its sizes under these names.

    (The flat observation or input size, and the number of outputs: actions for a Q-network, classes for a classifier.)
    """
    return factory(in_features=int(in_features), out_features=int(out_features))

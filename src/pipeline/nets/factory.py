"""Build a network from a config partial whatever it calls its output size."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

from torch import nn


def make_net(factory: Callable[..., nn.Module], in_features: int | None, out_features: int) -> nn.Module:
    """Call `factory` with the sizes it asks for: MLP takes out_features, Q-heads take n_actions."""
    target = factory.func if isinstance(factory, functools.partial) else factory
    params = inspect.signature(target).parameters
    kwargs = {}
    if "in_features" in params and in_features is not None:
        kwargs["in_features"] = int(in_features)
    kwargs["n_actions" if "n_actions" in params else "out_features"] = int(out_features)
    return factory(**kwargs)

"""Target-network updates for value-based RL."""

from __future__ import annotations

import torch
from torch import nn


def _float_tensors(module: nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    params = list(module.parameters())
    buffers = [b for b in module.buffers() if b.is_floating_point()]
    return params, buffers


# `with torch.no_grad()` inside rather than a decorator: mutmut skips decorated functions.
def hard_update(target: nn.Module, online: nn.Module) -> None:
    """Copy every parameter and buffer of `online` into `target`, in place."""
    # In-place copies keep the target's tensors (and anything holding a
    # reference to them) valid, unlike load_state_dict on a new dict.
    with torch.no_grad():
        for t, o in zip(target.parameters(), online.parameters(), strict=True):
            t.copy_(o)
        for t, o in zip(target.buffers(), online.buffers(), strict=True):
            t.copy_(o)


def soft_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """Polyak averaging: target <- tau * online + (1 - tau) * target, in place."""
    if not 0.0 <= tau <= 1.0:
        raise ValueError(f"tau must be in [0, 1], got {tau}")
    t_params, t_buffers = _float_tensors(target)
    o_params, o_buffers = _float_tensors(online)
    if len(t_params) != len(o_params) or len(t_buffers) != len(o_buffers):
        raise ValueError("target and online modules have different structures")
    with torch.no_grad():
        # One fused multi-tensor kernel instead of a Python loop of lerps.
        torch._foreach_lerp_(t_params + t_buffers, o_params + o_buffers, tau)
        # Integer buffers (e.g. BatchNorm's num_batches_tracked) cannot be averaged.
        for t, o in zip(target.buffers(), online.buffers(), strict=True):
            if not t.is_floating_point():
                t.copy_(o)


def freeze(module: nn.Module) -> nn.Module:
    """Stop gradients into every parameter of `module` (the target network's contract)."""
    for p in module.parameters():
        p.requires_grad_(False)
    return module

"""SAC's policy distribution: a diagonal Gaussian squashed by tanh into (-1, 1), over any leading axes.

An action is a = tanh(u) with u ~ N(mean, exp(log_std)^2) per dimension. Its log-density is the
Gaussian's minus the log-determinant of the squashing (Haarnoja et al. 2018, appendix C):

    log pi(a) = sum_d [ log N(u_d) - log(1 - tanh(u_d)^2) ]

`tanh_log_det` computes log(1 - tanh(u)^2) as 2 (log 2 - u - softplus(-2u)), exact for every u, where
CleanRL's and SB3's log(1 - a^2 + 1e-6) is biased by the epsilon and loses precision once |a| rounds to
1 (torch.distributions.TanhTransform uses the same stable form; tests/rl/test_sac_pieces.py checks
against it). Scaling the action to an env's bounds is the caller's (an affine map: a constant shift
of log pi that cancels in every SAC loss except the temperature's target, as in CleanRL and SB3).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch.nn import functional as F

_LOG_2 = math.log(2.0)
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def tanh_log_det(u: torch.Tensor) -> torch.Tensor:
    """log |d tanh(u) / du| = log(1 - tanh(u)^2), elementwise, without cancellation for large |u|."""
    return 2.0 * (_LOG_2 - u - F.softplus(-2.0 * u))


def per_agent_normal(shape: Sequence[int], generators: Sequence[torch.Generator] | None, device, dtype=torch.float32) -> torch.Tensor:
    """Standard normal noise [K, ...]: row k drawn from generators[k] (None: from the global generator)."""
    if generators is None:
        return torch.randn(tuple(shape), device=device, dtype=dtype)
    if len(generators) != shape[0]:
        raise ValueError(f"need one generator per agent ({shape[0]}), got {len(generators)}")
    return torch.stack([torch.randn(tuple(shape[1:]), generator=g, device=device, dtype=dtype) for g in generators])


def squashed_gaussian_log_prob(mean: torch.Tensor, log_std: torch.Tensor, u: torch.Tensor, epsilon: float = 0.0) -> torch.Tensor:
    """log pi(tanh(u)) [...] for pre-squash samples u [..., D]: the Gaussian's log-density minus the tanh log-det, exact
    (`epsilon` = 0) or CleanRL's and SB3's log(1 - tanh(u)^2 + epsilon)."""
    z = (u - mean) * torch.exp(-log_std)
    log_det = tanh_log_det(u) if epsilon == 0 else torch.log(1.0 - torch.tanh(u) ** 2 + epsilon)
    return (-0.5 * z**2 - log_std - _HALF_LOG_2PI - log_det).sum(-1)


def squashed_gaussian_sample(
    mean: torch.Tensor, log_std: torch.Tensor, generators: Sequence[torch.Generator] | None = None, epsilon: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """A reparameterised draw: (actions in (-1, 1) [K, ..., D], their log-probabilities [K, ...]).

    Gradients flow to `mean` and `log_std` through the sample (SAC's actor loss needs them); agent k's
    noise comes from generators[k].
    """
    return squashed_gaussian_from_noise(mean, log_std, per_agent_normal(mean.shape, generators, mean.device, mean.dtype), epsilon)


def squashed_gaussian_from_noise(mean: torch.Tensor, log_std: torch.Tensor, noise: torch.Tensor,
                                 epsilon: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """`squashed_gaussian_sample` on standard normal `noise` drawn beforehand (so a compiled step can take the draws as
    an input and eager code keeps the generators' order)."""
    u = mean + torch.exp(log_std) * noise
    return torch.tanh(u), squashed_gaussian_log_prob(mean, log_std, u, epsilon)


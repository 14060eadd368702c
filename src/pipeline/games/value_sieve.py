"""The value distribution of alike bidders as a global sieve, fitted by maximum likelihood of the logged bids.

The point estimate's first choice for symmetric, unrounded logs (`pipeline.games.rmac.point_value_curve`); the
local inversion (`pipeline.games.rmac.inverted_value_curve`) is the fallback. Why: the local inversion reads each
value off the bid density near that bid (v = b + G / ((n - 1) g)), so near the top of the values, where few
bids lie and the density has a cusp when the value density vanishes there, its error is several times the
sampling error of the values themselves. A sieve borrows strength from the whole sample instead.

The model. On x in [0, 1] the value CDF is a Bernstein polynomial, F(x) = sum_k w_k I_x(k, M - k + 1) (a mixture
of Beta(k, M - k + 1) CDFs, weights on the simplex); values are L + (T - L) x. Its symmetric equilibrium bid is
beta(x) = x - int_0^x F^(n-1) / F(x)^(n-1) (trapezoid on `POINTS` points), so bids lie in
[L, L + (T - L) beta(1)]. The highest bid is the top bid (its MLE), which fixes T given the shape and L; L is a
parameter in [0, lowest bid]. The weights and L maximise the likelihood of the bids binned into `BINS` cells of
[0, highest bid] (L-BFGS on a softmax), and the degree M is chosen by AIC over `DEGREES`.

The check. The sieve holds a distribution only as well as a polynomial does: one whose density is infinite at
the bottom (F = sqrt(v)) it fits badly everywhere, and since the top bid is T - E[shading], a misfit anywhere
moves the top. So the fit is used only when the bid CDF it implies is within `KS_GATE` / sqrt(bids) of the
empirical one everywhere (the 1% Kolmogorov-Smirnov critical value of a fully specified CDF; the fitted model
sits closer than that on correct models). Measured (`benchmarks/auction_sieve.py`, 6 seeds, N = 5,000, 2, 3 and 5
bidders): sqrt(v)'s fits miss by 4.2-6.1 and fall back; uniform, v^2, Beta(2, 2), Beta(3, 1.5) and a truncated
normal miss by 0.3-0.9 (rounded logs included).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from scipy import special
from torch import Tensor

DEGREES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 19, 24, 30)
PATIENCE = 3  # degrees in a row without a better AIC before the search stops
BINS = 1000  # cells of [0, highest bid] the likelihood bins the bids into (its cost does not grow with N)
POINTS = 4001  # points of [0, 1] where F and the equilibrium bid are computed
KS_GATE = 1.63  # sqrt(bids) x the largest distance of the fitted bid CDF from the empirical one
MIN_BIDS = 100
RESTARTS = 8  # L-BFGS runs at most per degree
RESTART_GAIN = 1e-3  # log-likelihood a restart must add to be followed by another


@dataclass
class ValueSieve:
    """A fitted value distribution: at ``POINTS`` values, their CDF and their equilibrium bids, all (POINTS,)."""

    values: Tensor
    cdf: Tensor
    bids: Tensor
    degree: int
    misfit: float  # sqrt(bids) x the largest distance of the fitted bid CDF from the empirical one (`KS_GATE`)


def equilibrium_shape(weights: Tensor, components: Tensor, x: Tensor, opponents: int) -> tuple[Tensor, Tensor]:
    """F = weights @ components on ``x`` and the symmetric equilibrium bid beta(x) = x - int_0^x F^(n-1) / F(x)^(n-1)
    (trapezoid), each (X,). Where F^(n-1) underflows (the bottom), beta = x (n - 1) / n, its value for F ~ x."""
    f = (weights @ components).clamp(0.0, 1.0)
    power = f**opponents
    integral = torch.cat([power.new_zeros(1), torch.cumsum((power[1:] + power[:-1]) / 2 * (x[1:] - x[:-1]), 0)])
    small = power < 1e-200
    beta = x - integral / torch.where(small, torch.ones_like(power), power)
    return f, torch.where(small, x * opponents / (opponents + 1), beta)


def _interp(x: Tensor, xp: Tensor, fp: Tensor) -> Tensor:
    """Linear interpolation of (xp, fp) at x, xp increasing; differentiable in xp and fp."""
    i = torch.searchsorted(xp.detach().contiguous(), x.contiguous()).clamp(1, xp.numel() - 1)
    x0, x1, y0, y1 = xp[i - 1], xp[i], fp[i - 1], fp[i]
    t = ((x - x0) / (x1 - x0).clamp_min(1e-300)).clamp(0.0, 1.0)
    return y0 + t * (y1 - y0)


def _ends(params: Tensor, floor: float, top_low: float) -> tuple[Tensor, Tensor]:
    """(lowest, highest) equilibrium bid, units of ``high`` (`fit_value_sieve`): L = floor * sigmoid(params[-2]) and
    top_low + (1 - top_low) * sigmoid(params[-1]) (1 when the highest bid is known, ``top_low`` = 1)."""
    top = params.new_tensor(1.0) if top_low >= 1 else top_low + (1 - top_low) * torch.sigmoid(params[-1])
    return floor * torch.sigmoid(params[-2]), top


def _bid_cdf(params: Tensor, components: Tensor, x: Tensor, opponents: int, floor: float, top_low: float,
             edges: Tensor) -> Tensor:
    """The bid CDF at ``edges`` (units of ``high``) under the sieve's parameters: softmax weights (params[:-2]) and
    the ends of the bids (`_ends`)."""
    start, top = _ends(params, floor, top_low)
    f, beta = equilibrium_shape(torch.softmax(params[:-2], 0), components, x, opponents)
    scaled = start + (top - start) * beta / beta[-1]  # the bids of the points x
    cdf = _interp(edges, scaled, f)
    return torch.where(edges < start, torch.zeros_like(cdf), cdf)


def _log_likelihood(params: Tensor, problem: tuple, counts: Tensor) -> Tensor:
    cdf = _bid_cdf(params, *problem)
    return (counts * torch.log((cdf[1:] - cdf[:-1]).clamp_min(1e-300))).sum()


def _maximise(params: Tensor, problem: tuple, counts: Tensor) -> float:
    """Maximise the log-likelihood over ``params`` in place (L-BFGS, restarted while a restart gains more than
    `RESTART_GAIN`: one run stopped 0.2 short on a ridge of Beta(2, 2) bids, which moved the top by 0.01); returns
    it."""
    total = float(counts.sum())

    def closure():
        optimiser.zero_grad()
        loss = -_log_likelihood(params, problem, counts) / total
        loss.backward()
        return loss

    best = -math.inf
    for _ in range(RESTARTS):
        optimiser = torch.optim.LBFGS([params], lr=1, max_iter=500, tolerance_grad=1e-9, tolerance_change=1e-12,
                                      history_size=20, line_search_fn="strong_wolfe")
        optimiser.step(closure)
        with torch.no_grad():
            found = float(_log_likelihood(params, problem, counts))
        if found - best < RESTART_GAIN:
            return max(found, best)
        best = found
    return best


def fit_value_sieve(bids: Tensor, n_bidders: int, lattice: float | None = None) -> ValueSieve:
    """The value distribution of ``n_bidders`` alike bidders whose first-price equilibrium bids are ``bids`` (any
    positive scale; at least `MIN_BIDS`, not all equal), by the Bernstein sieve of the module docstring.

    ``lattice``: the bids are rounded to this step (`pipeline.games.bid_checks.bid_lattice`), each read as censored
    to its rounding cell: the likelihood's bins are the cells, and the highest bid is a parameter inside the top
    cell (interval-censored maximum likelihood)."""
    bids = torch.as_tensor(bids, dtype=torch.float64).flatten().cpu()
    if bids.numel() < MIN_BIDS or float(bids.max()) <= float(bids.min()) or float(bids.min()) < 0:
        raise ValueError(f"the value sieve needs at least {MIN_BIDS} nonnegative bids, not all equal "
                         f"({bids.numel()} given)")
    if lattice is None:
        high, top_low, floor = float(bids.max()), 1.0, float(bids.min()) / float(bids.max())
        cell = torch.clamp((bids / high * BINS).long(), max=BINS - 1)
        counts = torch.zeros(BINS, dtype=torch.float64).index_add_(0, cell, torch.ones_like(bids))
        edges = torch.linspace(0.0, 1.0, BINS + 1, dtype=torch.float64)
    else:  # one bin per rounding cell [(k - 1/2) step, (k + 1/2) step), k = lowest .. highest bid / step
        index = torch.round(bids / lattice).long()
        lo, hi = int(index.min()), int(index.max())
        high = (hi + 0.5) * lattice
        counts = torch.zeros(hi - lo + 1, dtype=torch.float64).index_add_(0, index - lo, torch.ones_like(bids))
        edges = ((torch.arange(lo, hi + 2, dtype=torch.float64) - 0.5) * lattice / high).clamp_min(0.0)
        top_low, floor = float(edges[-2]), float(edges[1])
    x = torch.linspace(0.0, 1.0, POINTS, dtype=torch.float64)
    best, since_best = None, 0
    with torch.enable_grad():
        for degree in DEGREES:
            k = torch.arange(1, degree + 1, dtype=torch.float64)
            components = torch.from_numpy(special.betainc(k[:, None].numpy(), (degree - k + 1)[:, None].numpy(),
                                                          x[None, :].numpy()))
            problem = (components, x, n_bidders - 1, floor, top_low, edges)
            params = torch.zeros(degree + 2, dtype=torch.float64, requires_grad=True)
            aic = -2 * _maximise(params, problem, counts) + 2 * (degree + 1)
            if best is None or aic < best[0]:
                best, since_best = (aic, params.detach(), degree, problem), 0
            else:
                since_best += 1
                if since_best >= PATIENCE:
                    break
    _, params, degree, problem = best
    components, x, opponents, floor, top_low, edges = problem
    with torch.no_grad():
        f, beta = equilibrium_shape(torch.softmax(params[:-2], 0), components, x, opponents)
        start, top = (float(end) for end in _ends(params, floor, top_low))
        fitted = _bid_cdf(params, *problem)
    empirical = torch.cat([counts.new_zeros(1), counts.cumsum(0)]) / counts.sum()
    misfit = float((fitted - empirical).abs().max()) * math.sqrt(bids.numel())
    values = (start + (top - start) / float(beta[-1]) * x) * high
    return ValueSieve(values, f, (start + (top - start) * beta / beta[-1]) * high, degree, misfit)

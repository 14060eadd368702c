"""Bidders' value distributions as sieves fitted by maximum likelihood of the logged first-price bids.

The point estimate's first choice (`pipeline.games.rmac.point_value_curve` for alike bidders,
`pipeline.games.asymmetric` for unlike ones); the local inversion is the fallback. Why a sieve: the local inversion
reads each value off the bid density near that bid (v = b + G / ((n - 1) g)), so near the top of the values, where
few bids lie, its error is several times the sampling error of the bids; a sieve borrows strength from the whole
sample.

Three families of models, each an equilibrium of the first-price auction by construction, so any parameter gives a
bid distribution and the values behind it. Bids lie in [start, top]; both ends are parameters (start in
[0, lowest bid], top in [highest bid, (1 + `TOP_SPAN`) highest bid]: the highest bid is below the top bid by a gap
that is large when few values lie near the top).

- ``cdf``: the value CDF is a Bernstein polynomial on [0, 1], F(x) = sum_k w_k I_x(k, M - k + 1) (a mixture of
  Beta(k, M - k + 1) CDFs, weights on the simplex), its symmetric equilibrium bid beta(x) = x - int_0^x F^(n-1) /
  F(x)^(n-1). Holds densities that vanish at an end (Beta(2, 2), Kumaraswamy); alike bidders only.
- ``quantile``: the value quantile function is such a polynomial, Q(u) = sum_k w_k I_u(k, M - k + 1); the bid at
  quantile u is linear in Q, B(u) = (n - 1) u^-(n-1) int_0^u Q(s) s^(n-2) ds (closed form per component). Holds
  densities that are infinite at an end (F = sqrt(v), Beta(0.6, 0.6)); alike bidders only.
- ``inverse``: the inverse bid function of each bidder, phi_i(b) = b + (b - start) psi_i(b), log psi_i a polynomial
  (Bernstein coefficients, free). The first-order conditions then give the bid CDFs in closed form: with
  a_j = 1 / (phi_j(b) - b), d log G_i / db = sum_j a_j / (n - 1) - a_i (n bidders), so log G_i is an integral (its
  1 / (b - start) singularity at the bottom integrated exactly). One model for alike bidders (one psi) and unlike
  ones (one psi each), with no equilibrium to solve per candidate.

The likelihood bins the bids into `BINS` cells of [0, highest bid] (its cost does not grow with N; bids on a
rounding lattice: one cell per rounding cell, exact under rounding). Each family's degree grows while BIC improves
(`PATIENCE`; the degree the data support grows with N), each degree warm-started from the one below (degree
elevation: the likelihood never falls), and the model is chosen across families and degrees by BIC. Why BIC, not
AIC: on the benchmark's logs (`benchmarks/auction_accuracy.py`; 16 cells of family x bidders x N, 3 seeds) the
median worst error was 1.66x the bids-only oracle with BIC against 2.46x with AIC (7 and 2 cells within 1.5x):
AIC's larger models fit the bids as well and read the top of the values worse; within a log both criteria rank
the candidates by their realised error (Spearman 0.73 / 0.78). Its uncertainty: the observed information of its
parameters (delta method) for the model's own sampling SD, and (Buckland, Burnham & Augustin 1997) the spread of
the candidates with their BIC weights for the choice between them.

A known hard reserve R in the logs (bids under it absent: non-bids logged as 0, or only the auctions where
everybody bid): the ``cdf`` family with bids starting at R, b_R(x) = x - int_R^x F^(n-1) / F(x)^(n-1), and
F(R) = p a parameter, read off the zeros (P(no bid) = p) or, with only complete auctions, off the bids' shape
near R (their density is infinite there).

The check (`misfit`): sqrt(bids) x the largest distance of the fitted bid CDF from the empirical one (1.63 is the
1% Kolmogorov-Smirnov value of a fully specified CDF).
"""

from __future__ import annotations

import hashlib
import math
from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy import special
from torch import Tensor

DEGREES = {"cdf": (1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 19, 24, 30), "quantile": (1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 19, 24, 30),
           "inverse": (0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 15)}
FAMILIES = ("cdf", "quantile", "inverse")
PATIENCE = 3  # degrees in a row without a better BIC before a family's search stops
BINS = 1000  # cells of [0, highest bid] the likelihood bins the bids into (its cost does not grow with N)
POINTS = 2001  # points where each model's CDF and bids are computed
TOP_SPAN = 0.3  # the top bid lies in [highest bid, (1 + TOP_SPAN) highest bid]
KS_GATE = 1.63  # sqrt(bids) x the largest distance of the fitted bid CDF from the empirical one: 1% KS value
MIN_BIDS = 100
RESTARTS = 8  # L-BFGS runs at most per degree
RESTART_GAIN = 1e-3  # log-likelihood a restart must add to be followed by another
PENALTY = 1e4  # weight (per bid) of the inverse family's constraints (densities and values increasing)
CACHE = 8  # fits kept (a log is fitted once for its value grid and once for its point)


# ---------------------------------------------------------------------------------------------------------------
# The data as the likelihood sees them


@dataclass
class Binned:
    """Bid counts per row (alike bidders: one row, the pooled bids; unlike: one row per bidder) in cells of
    [0, 1] (units of ``high``)."""

    counts: Tensor  # (rows, cells)
    edges: Tensor  # (cells + 1,)
    high: float  # data units of 1
    floor: float  # the lowest bid: the bids' bottom lies in [0, floor]
    top_low: float  # the highest bid (the lower edge of its cell on a lattice): the top bid lies above
    zeros: Tensor | None = None  # (rows,) non-bids (values under the known reserve), when logged as 0
    reserve: float | None = None  # a known hard reserve (units of high)
    complete_only: bool = False  # only auctions where everybody bid: the positive bids are conditional on bidding

    @property
    def n_bids(self) -> float:
        return float(self.counts.sum())

    def empirical(self) -> Tensor:
        """(rows, cells + 1) the empirical CDF of each row's positive bids at the edges."""
        total = self.counts.sum(1, keepdim=True)
        return torch.cat([self.counts.new_zeros(self.counts.shape[0], 1), self.counts.cumsum(1)], 1) / total


def bin_bids(rows: list[Tensor], lattice: float | None = None, reserve: float | None = None,
             zeros: list[int] | None = None, complete_only: bool = False) -> Binned:
    """The likelihood's data from each row's positive bids (data units). ``lattice``: bids rounded to this step,
    each read as censored to its rounding cell (one cell per rounding cell, the top bid a parameter above the lower
    edge of the top cell). ``reserve``: a known hard reserve (data units) with ``zeros`` non-bids per row (None:
    only complete auctions logged, ``complete_only``)."""
    every = torch.cat([r.flatten() for r in rows])
    if lattice is None:
        high = float(every.max())
        edges = torch.linspace(0.0, 1.0, BINS + 1, dtype=torch.float64)
        counts = torch.stack([torch.zeros(BINS, dtype=torch.float64).index_add_(
            0, torch.clamp((r.flatten() / high * BINS).long(), max=BINS - 1), torch.ones_like(r.flatten()))
            for r in rows])
        top_low, floor = 1.0, float(every.min()) / high
    else:  # one cell per rounding cell [(k - 1/2) step, (k + 1/2) step), k = lowest .. highest bid / step
        index = [torch.round(r.flatten() / lattice).long() for r in rows]
        lo, hi = int(min(int(i.min()) for i in index)), int(max(int(i.max()) for i in index))
        high = (hi + 0.5) * lattice
        counts = torch.stack([torch.zeros(hi - lo + 1, dtype=torch.float64).index_add_(
            0, i - lo, torch.ones(i.numel(), dtype=torch.float64)) for i in index])
        edges = ((torch.arange(lo, hi + 2, dtype=torch.float64) - 0.5) * lattice / high).clamp_min(0.0)
        top_low, floor = float(edges[-2]), float(edges[1])
    if reserve is not None:
        floor = reserve / high
    zero_counts = None if zeros is None else torch.tensor(zeros, dtype=torch.float64)
    return Binned(counts, edges, high, floor, top_low, zero_counts, None if reserve is None else reserve / high,
                  complete_only)


# ---------------------------------------------------------------------------------------------------------------
# The families


def _interp(x: Tensor, xp: Tensor, fp: Tensor) -> Tensor:
    """Linear interpolation of (xp, fp) at x, xp increasing, constant beyond the ends; differentiable in xp, fp."""
    i = torch.searchsorted(xp.detach().contiguous(), x.contiguous()).clamp(1, xp.numel() - 1)
    x0, x1, y0, y1 = xp[i - 1], xp[i], fp[i - 1], fp[i]
    t = ((x - x0) / (x1 - x0).clamp_min(1e-300)).clamp(0.0, 1.0)
    return y0 + t * (y1 - y0)


def _beta_cdfs(degree: int, at: np.ndarray) -> Tensor:
    """(degree, len(at)): I_at(k, degree - k + 1), k = 1..degree (the Bernstein CDF basis)."""
    k = np.arange(1, degree + 1, dtype=np.float64)[:, None]
    return torch.from_numpy(special.betainc(k, degree - k + 1, at[None, :]))


def _elevate(coefficients: Tensor, degree: int) -> Tensor:
    """Bernstein coefficients (..., degree + 1) of a polynomial as coefficients of degree + 1 (same polynomial)."""
    j = torch.arange(degree + 2, dtype=torch.float64) / (degree + 1)
    padded_low = torch.cat([coefficients[..., :1], coefficients], -1)
    padded_high = torch.cat([coefficients, coefficients[..., -1:]], -1)
    return j * padded_low + (1 - j) * padded_high


class Family(ABC):
    """One model of the bids: ``curves(shape, start, top)`` gives, per row, (bids, values, CDF) at `POINTS`
    points in units of ``high``; ``shape`` is the unconstrained parameter vector of degree ``degree``."""

    name = ""

    def __init__(self, degree: int, rows: int, n_bidders: int, reserve: float | None = None):
        self.degree, self.rows, self.n_bidders, self.reserve = degree, rows, n_bidders, reserve

    @abstractmethod
    def n_params(self) -> int:
        ...

    @abstractmethod
    def start_shape(self) -> Tensor:
        ...

    @abstractmethod
    def elevated(self, shape: Tensor, degree: int) -> Tensor:
        ...

    @abstractmethod
    def curves(self, shape: Tensor, start: Tensor, top: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        ...

    def penalty(self, shape: Tensor) -> Tensor:
        return shape.new_zeros(())

    def label(self) -> str:
        return f"{self.name} degree {self.degree}"


class _Weights(Family):
    """Bernstein CDF weights on the simplex (softmax of ``degree`` logits; one more, p = F(reserve), with a
    reserve)."""

    def n_params(self) -> int:
        return self.degree - 1 + (self.reserve is not None)

    def start_shape(self) -> Tensor:
        return torch.zeros(self.degree + (self.reserve is not None), dtype=torch.float64)

    def elevated(self, shape: Tensor, degree: int) -> Tensor:
        weights = torch.softmax(shape[:self.degree], 0)
        cumulative = torch.cat([weights.new_zeros(1), weights.cumsum(0)])
        for m in range(self.degree, degree):
            cumulative = _elevate(cumulative, m)
        logits = torch.log(torch.diff(cumulative).clamp_min(1e-12))
        return torch.cat([logits, shape[self.degree:]])

    def weights(self, shape: Tensor) -> Tensor:
        return torch.softmax(shape[:self.degree], 0)


class CdfFamily(_Weights):
    name = "cdf"

    def __init__(self, degree, rows, n_bidders, reserve=None):
        super().__init__(degree, rows, n_bidders, reserve)
        self.x = torch.linspace(0.0, 1.0, 2 * POINTS - 1, dtype=torch.float64)
        self.components = _beta_cdfs(degree, self.x.numpy())

    def curves(self, shape, start, top):
        f = (self.weights(shape) @ self.components).clamp(0.0, 1.0)
        if self.reserve is not None:
            p = torch.sigmoid(shape[-1])
            f = p + (1 - p) * f
        power = f ** (self.n_bidders - 1)
        x = self.x
        integral = torch.cat([power.new_zeros(1), torch.cumsum((power[1:] + power[:-1]) / 2 * (x[1:] - x[:-1]), 0)])
        small = power < 1e-200
        beta = x - integral / torch.where(small, torch.ones_like(power), power)
        # where F^(n-1) underflows (the bottom, no reserve) beta = x (n - 1) / n, its value for F ~ x
        beta = torch.where(small, x * (self.n_bidders - 1) / self.n_bidders, beta)
        scale = (top - start) / beta[-1]
        return (start + scale * beta)[None], (start + scale * x)[None], f[None]


class QuantileFamily(_Weights):
    name = "quantile"

    def __init__(self, degree, rows, n_bidders, reserve=None):
        super().__init__(degree, rows, n_bidders, reserve)
        u = np.linspace(0.0, 1.0, POINTS)
        self.u = torch.from_numpy(u)
        self.components = _beta_cdfs(degree, u)
        # B_k(u) = (n - 1) u^-(n-1) int_0^u I_s(k, M-k+1) s^(n-2) ds, by parts:
        # I_u(k, M-k+1) - u^-(n-1) B(k+n-1, M-k+1) / B(k, M-k+1) I_u(k+n-1, M-k+1)
        k = np.arange(1, degree + 1, dtype=np.float64)[:, None]
        m = n_bidders - 1
        ratio = np.exp(special.betaln(k + m, degree - k + 1) - special.betaln(k, degree - k + 1))
        with np.errstate(divide="ignore", invalid="ignore"):
            bid = special.betainc(k, degree - k + 1, u) - ratio * special.betainc(k + m, degree - k + 1, u) / u**m
        bid[:, 0] = 0.0
        self.bid_components = torch.from_numpy(bid)

    def curves(self, shape, start, top):
        weights = self.weights(shape)
        q, b = weights @ self.components, weights @ self.bid_components
        scale = (top - start) / b[-1]
        return (start + scale * b)[None], (start + scale * q)[None], self.u[None]


class InverseFamily(Family):
    name = "inverse"

    def __init__(self, degree, rows, n_bidders, reserve=None):
        super().__init__(degree, rows, n_bidders, reserve)
        t = np.linspace(0.0, 1.0, POINTS)
        self.t = torch.from_numpy(t)
        j = np.arange(degree + 1, dtype=np.float64)[:, None]
        self.basis = torch.from_numpy(np.exp(special.gammaln(degree + 1) - special.gammaln(j + 1)
                                             - special.gammaln(degree - j + 1)) * t**j * (1 - t) ** (degree - j))
        self.opponents = n_bidders - 1

    def n_params(self) -> int:
        return self.rows * (self.degree + 1)

    def start_shape(self) -> Tensor:
        psi = 1.0 / self.opponents if self.rows == 1 else 1.0  # uniform values' psi
        return torch.full((self.rows * (self.degree + 1),), math.log(psi), dtype=torch.float64)

    def elevated(self, shape, degree):
        coefficients = shape.reshape(self.rows, self.degree + 1)
        for m in range(self.degree, degree):
            coefficients = _elevate(coefficients, m)
        return coefficients.flatten()

    def _rates(self, shape: Tensor) -> tuple[Tensor, Tensor]:
        """(psi (rows, P), m (rows, P)): d log G_i / dt = m_i(t) / t."""
        psi = torch.exp(shape.reshape(self.rows, self.degree + 1) @ self.basis)
        a = 1.0 / psi
        m = a / self.opponents if self.rows == 1 else a.sum(0, keepdim=True) / self.opponents - a
        return psi, m

    def curves(self, shape, start, top):
        psi, m = self._rates(shape)
        t = self.t
        # log G(t) = m(0) log t - int_t^1 (m(s) - m(0)) / s ds: the singular part integrated exactly
        regular = (m[:, 1:] - m[:, :1]) / t[1:]
        regular = torch.cat([regular[:, :1], regular], 1)
        pieces = (regular[:, 1:] + regular[:, :-1]) / 2 * (t[1:] - t[:-1])
        above = torch.cat([pieces.flip(1).cumsum(1).flip(1), pieces.new_zeros(self.rows, 1)], 1)
        log_t = torch.log(t.clamp_min(1e-300))
        cdf = torch.exp(m[:, :1] * log_t - above)
        cdf = torch.cat([torch.zeros_like(cdf[:, :1]), cdf[:, 1:]], 1)
        width = top - start
        bids = (start + width * t).expand(self.rows, -1)
        return bids, bids + width * t * psi, cdf

    def penalty(self, shape):
        psi, m = self._rates(shape)
        slope = torch.diff(self.t * (1 + psi), dim=1)  # values increase with bids
        return (torch.relu(-m) ** 2).sum() + (torch.relu(-slope) ** 2).sum()


FAMILY_TYPES = {"cdf": CdfFamily, "quantile": QuantileFamily, "inverse": InverseFamily}


# ---------------------------------------------------------------------------------------------------------------
# Fitting


def _ends(params: Tensor, data: Binned) -> tuple[Tensor, Tensor]:
    """(start, top): the bottom and the top of the bids, units of high (`Binned`)."""
    start = params.new_tensor(data.reserve) if data.reserve is not None else data.floor * torch.sigmoid(params[-2])
    return start, data.top_low * (1 + TOP_SPAN * torch.sigmoid(params[-1]))


def _bid_cdfs(family: Family, params: Tensor, data: Binned) -> Tensor:
    """(rows, cells + 1) each row's bid CDF at the edges (with a reserve: including the non-bids' mass p)."""
    start, top = _ends(params, data)
    bids, _, cdf = family.curves(params[:-2], start, top)
    return torch.stack([_interp(data.edges, bids[i], cdf[i]) for i in range(bids.shape[0])])


def log_likelihood(family: Family, params: Tensor, data: Binned) -> Tensor:
    cdf = _bid_cdfs(family, params, data)
    total = (data.counts * torch.log((cdf[:, 1:] - cdf[:, :-1]).clamp_min(1e-300))).sum()
    if data.reserve is not None:
        p = cdf[:, 0].clamp(1e-300, 1 - 1e-15)  # F(R): the mass of the non-bids
        if data.complete_only:
            total = total - (data.counts.sum(1) * torch.log1p(-p)).sum()
        elif data.zeros is not None:
            total = total + (data.zeros * torch.log(p)).sum()
    return total


def maximise_likelihood(family: Family, params: Tensor, data: Binned) -> float:
    """Maximise the log-likelihood over ``params`` in place (L-BFGS, restarted while a restart gains more than
    `RESTART_GAIN`: one run stopped 0.2 short on a ridge of Beta(2, 2) bids, which moved the top by 0.01)."""
    total = data.n_bids + (0.0 if data.zeros is None else float(data.zeros.sum()))

    def closure():
        optimiser.zero_grad()
        loss = -(log_likelihood(family, params, data) - PENALTY * total * family.penalty(params[:-2])) / total
        loss.backward()
        return loss

    best = -math.inf
    for _ in range(RESTARTS):
        optimiser = torch.optim.LBFGS([params], lr=1, max_iter=500, tolerance_grad=1e-7, tolerance_change=1e-10,
                                      history_size=20, line_search_fn="strong_wolfe")
        optimiser.step(closure)
        with torch.no_grad():
            found = float(log_likelihood(family, params, data))
        if found - best < RESTART_GAIN:
            return max(found, best)
        best = found
    return best


@dataclass
class Candidate:
    """One fitted model: its family, parameters (shape, then the two ends), log-likelihood and BIC."""

    family: Family
    params: Tensor
    log_likelihood: float
    bic: float

    def curves(self, data: Binned, params: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Per row (bids, values, CDF), data units."""
        params = self.params if params is None else params
        start, top = _ends(params, data)
        bids, values, cdf = self.family.curves(params[:-2], start, top)
        return bids * data.high, values * data.high, cdf


def fit_family(name: str, data: Binned, n_bidders: int, degrees=None, penalty: float | None = None) -> list[Candidate]:
    """Every degree of one family tried (warm-started from the one below), until `PATIENCE` degrees in a row
    without a better BIC (``penalty``: another price per parameter for the search and the candidates' score, e.g.
    2 for AIC; `benchmarks/auction_sieve.py --criteria` compares them)."""
    rows = data.counts.shape[0]
    out: list[Candidate] = []
    best_bic, since_best, previous = math.inf, 0, None
    per_parameter = penalty if penalty is not None else math.log(
        data.n_bids + (0.0 if data.zeros is None else float(data.zeros.sum())))
    with torch.enable_grad():
        for degree in degrees or DEGREES[name]:
            family = FAMILY_TYPES[name](degree, rows, n_bidders, data.reserve)
            if previous is None:
                ends = [0.0, -6.0]  # start at the lowest bid's half, top 0.07% above the highest bid
                shape = family.start_shape()
                if data.reserve is not None:  # p = F(reserve): the share of non-bids when they are logged
                    share = 0.2 if data.zeros is None else float(data.zeros.sum()) / (data.n_bids + float(data.zeros.sum()))
                    shape[-1] = math.log(max(share, 1e-3) / max(1 - share, 1e-3))
            else:
                shape = previous.family.elevated(previous.params[:-2], degree)
                ends = previous.params[-2:].tolist()
            params = torch.cat([shape, torch.tensor(ends, dtype=torch.float64)]).requires_grad_(True)
            found = maximise_likelihood(family, params, data)
            candidate = Candidate(family, params.detach(), found, -2 * found + per_parameter * (family.n_params() + 2))
            out.append(candidate)
            previous = candidate
            if candidate.bic < best_bic - 1e-9:
                best_bic, since_best = candidate.bic, 0
            else:
                since_best += 1
                if since_best >= PATIENCE:
                    break
    return out


# ---------------------------------------------------------------------------------------------------------------
# Statistics of a fit (differentiable in the parameters)


def _rows_at(values: Tensor, cdf: Tensor, x: Tensor) -> Tensor:
    """(rows, len(x)): each row's value CDF at x, linear between its points and 1 beyond its last."""
    return torch.stack([torch.where(x > values[i, -1], torch.ones_like(x), _interp(x, values[i], cdf[i]))
                        for i in range(values.shape[0])])


def order_cdfs(f: Tensor, counts: list[int]) -> tuple[Tensor, Tensor]:
    """(P(highest <= x), P(second highest <= x)) for independent bidders: row i of ``f`` (rows, K) the value CDF
    of ``counts[i]`` alike bidders. P(second <= x) = P(all <= x) + sum_i c_i (1 - F_i) F_i^(c_i - 1) prod_j!=i F_j^c_j."""
    first = torch.ones_like(f[0])
    for i, c in enumerate(counts):
        first = first * f[i] ** c
    second = first.clone()
    for i, c in enumerate(counts):
        others = torch.ones_like(f[0])
        for j, d in enumerate(counts):
            others = others * f[j] ** (d - (i == j))
        second = second + c * (1 - f[i]) * others
    return first, second


def second_price(curves: tuple[Tensor, Tensor, Tensor], counts: list[int], reserves: Tensor,
                 welfare: bool = False) -> Tensor:
    """Second-price revenue (or welfare) at each reserve for independent bidders: row i of ``curves`` (values,
    CDF) is the value CDF of ``counts[i]`` alike bidders, linear between its points and 1 beyond its last.

    revenue = r (F2(r) - F1(r)) + T - r F2(r) - int_r^T F2, welfare = T - r F1(r) - int_r^T F1, F1 and F2 the
    CDFs of the highest and second-highest value, T the largest value; Simpson's rule between the union of the
    rows' points. Differentiable in the curves."""
    _, values, cdf = curves
    top = values[:, -1].max()
    knots = torch.sort(torch.cat([values.flatten(), reserves.to(values)])).values
    knots = torch.minimum(knots, top)
    middle = (knots[1:] + knots[:-1]) / 2

    def order(x: Tensor) -> tuple[Tensor, Tensor]:
        return order_cdfs(_rows_at(values, cdf, x), counts)

    pick = 0 if welfare else 1
    at_knots, at_middle = order(knots)[pick], order(middle)[pick]
    pieces = (knots[1:] - knots[:-1]) * (at_knots[1:] + 4 * at_middle + at_knots[:-1]) / 6
    cumulative = torch.cat([pieces.new_zeros(1), pieces.cumsum(0)])
    reserves = reserves.to(values)
    where = torch.searchsorted(knots.detach().contiguous(), reserves.contiguous()).clamp(0, knots.numel() - 1)
    # the reserves are knots themselves: int_r^T = C(T) - C(r)
    integral = cumulative[-1] - cumulative[where]
    first_r, second_r = order(torch.minimum(reserves, top))
    if welfare:
        out = top - reserves * first_r - integral
    else:
        out = reserves * (second_r - first_r) + top - reserves * second_r - integral
    return torch.where(reserves >= top, torch.zeros_like(out), out)


def _observed_covariance(candidate: Candidate, data: Binned) -> Tensor:
    """The inverse observed information of the candidate's parameters (pseudo-inverse: softmax logits have one
    flat direction)."""
    params = candidate.params.clone()

    def negative(p):
        return -log_likelihood(candidate.family, p, data)

    with torch.enable_grad():
        hessian = torch.autograd.functional.hessian(negative, params)
    hessian = (hessian + hessian.T) / 2
    return torch.linalg.pinv(hessian, rtol=1e-10, hermitian=True)


# ---------------------------------------------------------------------------------------------------------------
# The fit


@dataclass
class SieveFit:
    """The chosen model and its rivals. Curves per row (alike bidders: one), data units."""

    candidates: list[Candidate]
    best: int
    data: Binned
    counts: list[int]  # bidders per row
    misfit: float
    _covariances: dict = field(default_factory=dict)

    @property
    def chosen(self) -> Candidate:
        return self.candidates[self.best]

    @property
    def degree(self) -> int:
        return self.chosen.family.degree

    @property
    def family(self) -> str:
        return self.chosen.family.name

    def curves(self) -> tuple[Tensor, Tensor, Tensor]:
        bids, values, cdf = self.chosen.curves(self.data)
        # values rise with bids (a model's values can dip where its constraints are loose)
        return bids, values.flip(1).cummin(1).values.flip(1), cdf

    @property
    def bids(self) -> Tensor:
        return self.curves()[0][0]

    @property
    def values(self) -> Tensor:
        return self.curves()[1][0]

    @property
    def cdf(self) -> Tensor:
        return self.curves()[2][0]

    def weights(self) -> Tensor:
        """The candidates' BIC weights, exp(-BIC / 2) normalised (their approximate posterior probabilities)."""
        bic = torch.tensor([c.bic for c in self.candidates], dtype=torch.float64)
        weights = torch.exp(-(bic - bic.min()) / 2)
        return weights / weights.sum()

    def describe(self) -> str:
        weights = self.weights()
        rivals = ", ".join(f"{self.candidates[i].family.label()} {float(weights[i]):.2f}"
                           for i in torch.argsort(weights, descending=True)[:3].tolist())
        return f"{self.chosen.family.label()}, misfit {self.misfit:.2f} (BIC weights: {rivals})"

    def statistic_sd(self, statistic) -> tuple[Tensor, Tensor]:
        """(value, SD) of ``statistic(curves) -> (K,)`` under the chosen model: the delta method through its
        observed information, and the weighted spread of the rivals (BIC weight >= 0.01) around the average
        (Buckland et al. 1997: SD = sum_m w_m sqrt(var_m + (s_m - s_avg)^2))."""
        weights = self.weights()
        keep = [i for i in range(len(self.candidates)) if float(weights[i]) >= 0.01 or i == self.best]
        values, variances = [], []
        for i in keep:
            candidate = self.candidates[i]
            if i not in self._covariances:
                self._covariances[i] = _observed_covariance(candidate, self.data)
            params = candidate.params.clone().requires_grad_(True)
            with torch.enable_grad():
                out = statistic(candidate.curves(self.data, params))
                jacobian = torch.stack([torch.autograd.grad(out[k], params, retain_graph=True)[0]
                                        for k in range(out.numel())])
            values.append(out.detach())
            variances.append(((jacobian @ self._covariances[i]) * jacobian).sum(1).clamp_min(0.0))
        w = weights[keep] / weights[keep].sum()
        stacked, variance = torch.stack(values), torch.stack(variances)
        average = (w[:, None] * stacked).sum(0)
        spread = (w[:, None] * torch.sqrt(variance + (stacked - average) ** 2)).sum(0)
        return values[keep.index(self.best)], spread

    def rivals(self) -> list[Candidate]:
        """Each other family's best model (by BIC) among those whose bid CDF passes the Kolmogorov-Smirnov check (`KS_GATE`):
        models that fit the bids about as well as the chosen one, whose points are compared with its own
        (`untrusted_reserves`)."""
        best: dict[str, Candidate] = {}
        for candidate in sorted(self.candidates, key=lambda c: c.bic):
            name = candidate.family.name
            if name != self.family and name not in best and misfit(candidate, self.data) <= KS_GATE:
                best[name] = candidate
        return list(best.values())

    def rival_revenues(self, reserves: list[float], welfare: bool = False) -> dict[str, list[float]]:
        """Second-price revenue (welfare) at each reserve under each rival (`rivals`), by its label."""
        at = torch.tensor(reserves, dtype=torch.float64)
        with torch.no_grad():
            return {c.family.label(): second_price(c.curves(self.data), self.counts, at, welfare).tolist()
                    for c in self.rivals()}

    def revenue_sd(self, reserves: list[float], welfare: bool = False) -> tuple[Tensor, Tensor]:
        """Second-price revenue (welfare) at each reserve (data units) under the chosen model, and its SD."""
        at = torch.tensor(reserves, dtype=torch.float64)
        return self.statistic_sd(lambda curves: second_price(curves, self.counts, at, welfare))

    def top_sd(self) -> tuple[float, float]:
        """(the largest value, its SD)."""
        value, sd = self.statistic_sd(lambda curves: curves[1][:, -1].max()[None])
        return float(value[0]), float(sd[0])


_FITS: OrderedDict = OrderedDict()


def _key(rows: list[Tensor], *extra) -> str:
    digest = hashlib.sha1()
    high = max(float(r.max()) for r in rows)
    for r in rows:
        digest.update((r.flatten() / high).cpu().numpy().tobytes())
    digest.update(repr(extra).encode())
    return digest.hexdigest()


def fit_sieve(rows: list[Tensor], n_bidders: int, lattice: float | None = None, families=FAMILIES,
              reserve: float | None = None, zeros: list[int] | None = None, complete_only: bool = False) -> SieveFit:
    """Fit every family (alike bidders: ``rows`` holds one tensor, the pooled bids; unlike: one per bidder, the
    ``inverse`` family alone) and choose by BIC. The fit is scale-free: a log fitted once is not fitted again
    (`CACHE` fits kept), in any units."""
    rows = [torch.as_tensor(r, dtype=torch.float64).flatten().cpu() for r in rows]
    every = torch.cat(rows)
    if every.numel() < MIN_BIDS or float(every.max()) <= float(every.min()) or float(every.min()) < 0:
        raise ValueError(f"the value sieve needs at least {MIN_BIDS} nonnegative bids, not all equal "
                         f"({every.numel()} given)")
    if len(rows) > 1 or reserve is not None:
        families = tuple(f for f in families if f == ("inverse" if len(rows) > 1 else "cdf"))
    high = float(every.max())
    key = _key(rows, n_bidders, None if lattice is None else lattice / high, families,
               None if reserve is None else reserve / high, zeros, complete_only)
    if key in _FITS:
        found, fitted_high = _FITS[key]
        _FITS.move_to_end(key)
        return _rescaled(found, high / fitted_high)
    data = bin_bids(rows, lattice, reserve, zeros, complete_only)
    candidates = [c for name in families for c in fit_family(name, data, n_bidders)]
    best = min(range(len(candidates)), key=lambda i: candidates[i].bic)
    counts = [n_bidders] if len(rows) == 1 else [1] * len(rows)
    fit = SieveFit(candidates, best, data, counts, misfit(candidates[best], data))
    _FITS[key] = (fit, high)
    if len(_FITS) > CACHE:
        _FITS.popitem(last=False)
    return fit


def misfit(candidate: Candidate, data: Binned) -> float:
    """sqrt(bids) x the largest distance of the candidate's bid CDF from the empirical one (worst row)."""
    with torch.no_grad():
        fitted = _bid_cdfs(candidate.family, candidate.params, data)
        if data.reserve is not None:  # the positive bids' CDF
            fitted = (fitted - fitted[:, :1]) / (fitted[:, -1:] - fitted[:, :1]).clamp_min(1e-300)
    return float(((fitted - data.empirical()).abs().max(1).values * data.counts.sum(1).sqrt()).max())


def _rescaled(fit: SieveFit, ratio: float) -> SieveFit:
    """``fit`` for the same bids in other units (``ratio`` times the fitted ones)."""
    if ratio == 1.0:
        return fit
    data = fit.data
    rescaled = Binned(data.counts, data.edges, data.high * ratio, data.floor, data.top_low, data.zeros, data.reserve,
                      data.complete_only)
    return SieveFit(fit.candidates, fit.best, rescaled, fit.counts, fit.misfit, fit._covariances)


def fit_value_sieve(bids: Tensor, n_bidders: int, lattice: float | None = None, families=FAMILIES) -> SieveFit:
    """The value distribution of ``n_bidders`` alike bidders whose first-price equilibrium bids are ``bids`` (any
    positive scale; at least `MIN_BIDS`, not all equal): `fit_sieve` on the pooled bids."""
    return fit_sieve([torch.as_tensor(bids, dtype=torch.float64).flatten()], n_bidders, lattice, families)


# ---------------------------------------------------------------------------------------------------------------
# How much to trust a point


TRUST_RATIO = 2.0  # a point whose SD is over this many times the values' own sampling SD is not to be trusted
TOP_BAND = 2.0  # SDs of the estimated top: reserves this close to it (either side) rest on the top alone
DISAGREE = 3.0  # a rival estimate this many values' sampling SDs from the point makes it untrusted
TAIL_SHARE = 0.01  # reserves with this share of the estimated values above them rest on the top alone


def plug_in_sd(curves: tuple[Tensor, Tensor, Tensor], counts: list[int], reserves: Tensor, n_auctions: int,
               welfare: bool = False) -> Tensor:
    """The sampling SD of second-price revenue (welfare) at each reserve read off the empirical CDF of the VALUES of
    ``n_auctions`` auctions drawn from ``curves`` (the true-values oracle's noise under the fitted model): the
    delta method through the statistic's influence function.

    With D1_i, D2_i the derivatives of F1, F2 (the highest and second-highest value's CDFs) in row i's CDF, a value
    v of row i moves revenue by IF_i(v) = -r D1_i(r) (1{v <= r} - F_i(r)) - int_r^T D2_i(x) (1{v <= x} - F_i(x)) dx
    (welfare: D1 in the integral); Var = sum_i Var_{F_i}[IF_i] / (counts_i n_auctions)."""
    _, values, cdf = (c.detach() for c in curves)
    top = values[:, -1].max()
    x = torch.linspace(0.0, 1.0, 4001, dtype=torch.float64) * top
    f = _rows_at(values, cdf, x).requires_grad_(True)
    with torch.enable_grad():
        first, second = order_cdfs(f, counts)
        d1 = torch.autograd.grad(first.sum(), f, retain_graph=True)[0]
        d2 = torch.autograd.grad(second.sum(), f)[0]
    f = f.detach()
    inner = d1 if welfare else d2
    dx = x[1] - x[0]
    # A_i(y) = int_y^T inner_i (trapezoid on x), B_i(r) = int_r^T inner_i F_i
    pieces = (inner[:, 1:] + inner[:, :-1]) / 2 * dx
    above = torch.cat([pieces.flip(1).cumsum(1).flip(1), pieces.new_zeros(pieces.shape[0], 1)], 1)
    weighted = ((inner * f)[:, 1:] + (inner * f)[:, :-1]) / 2 * dx
    above_f = torch.cat([weighted.flip(1).cumsum(1).flip(1), weighted.new_zeros(weighted.shape[0], 1)], 1)
    variance = torch.zeros(reserves.numel(), dtype=torch.float64)
    for i, c in enumerate(counts):
        mass = torch.diff(cdf[i]).clamp_min(0.0)
        at = (values[i, 1:] + values[i, :-1]) / 2  # the row's values, as masses between its points
        for k, r in enumerate(reserves.tolist()):
            if r >= float(top):
                continue
            j = int(torch.searchsorted(x, torch.tensor(r, dtype=torch.float64)).clamp(0, x.numel() - 1))
            level = float(f[i, j])
            slope = float(d1[i, j])
            y = torch.searchsorted(x, torch.maximum(at, torch.tensor(r, dtype=torch.float64))).clamp(0, x.numel() - 1)
            influence = -r * slope * ((at <= r).double() - level) - above[i, y] + above_f[i, j]
            mean = (mass * influence).sum()
            variance[k] += float((mass * (influence - mean) ** 2).sum()) / (c * n_auctions)
    return variance.sqrt()


def point_shrink(point: float, sd: float) -> float:
    """The factor on a point that cannot be negative (a revenue, a welfare) with SD ``sd``: point / (`TOP_BAND` SD),
    from 0 at 0 to 1 at `TOP_BAND` SDs. Near the top of the values a plug-in is read off few bids and can overshoot
    but not undershoot 0; where it is within its own noise of 0 it is shrunk in proportion. Why the point's SD and
    not the top's: the value sieve reads a top whose density vanishes (Beta(2, 2)) with an SD of 0.02-0.05, while
    the revenue at r = 0.9 is read off the whole fit; shrinking within 2 top SDs cost -0.014 there (2 bidders)."""
    if not sd > 0:
        return 1.0
    return min(1.0, max(0.0, point / (TOP_BAND * sd)))


def untrusted_reserves(reserves: list[float], sd: list[float], floor: list[float], top: float, top_sd: float,
                       points: list[float] | None = None, rivals: dict[str, list[float]] | None = None,
                       tail: float = math.inf) -> dict[float, str]:
    """The reserves whose point is not to be trusted, each with why (one phrase): within `TOP_BAND` SDs of the
    estimated top (either side: whether any value lies above the reserve is within the top's noise); at or above
    ``tail``, the value with `TAIL_SHARE` of the estimated values above it (the point rests on the model's reading
    of the few highest bids, whose SD through the model understates a misspecified top); an SD over
    `TRUST_RATIO` times the values' own sampling SD there (`plug_in_sd`: the bids do not pin the revenue down); or a
    rival estimate that fits the bids as well (another family of the sieve, the local inversion) reading more than
    `DISAGREE` times that sampling SD away from the point."""
    out: dict[float, str] = {}
    # past the fitted top the values' sampling SD is 0: a tenth of the largest one stands for it there
    least = 0.1 * max([f for f in floor if f == f] or [0.0])
    for k, (r, s, f) in enumerate(zip(reserves, sd, floor)):
        f = max(f, least) if f == f else f
        if top_sd > 0 and abs(top - r) <= TOP_BAND * top_sd:
            out[r] = f"within {TOP_BAND:g} SDs of the estimated top {top:.4g} (SD {top_sd:.2g})"
        elif r >= tail:
            out[r] = f"at or above {tail:.4g}, with {TAIL_SHARE:.0%} of the estimated values above it"
        elif r < top and s > TRUST_RATIO * f:
            out[r] = f"SD {s:.2g}, {s / max(f, 1e-300):.1f}x the values' own sampling SD {f:.2g}"
        elif points is not None and rivals:
            name, value = max(((n, v[k]) for n, v in rivals.items()), key=lambda nv: abs(nv[1] - points[k]))
            if abs(value - points[k]) > DISAGREE * f:
                out[r] = (f"the {name} reads {value:.4g} against {points[k]:.4g}, {abs(value - points[k]) / f:.1f}x the "
                          f"values' own sampling SD {f:.2g} apart")
    return out

"""Robust multi-agent counterfactual prediction (RMAC, Peysakhovich, Kroer & Lerer, NeurIPS 2019) for auctions.

We observe bids from an ``n``-bidder first-price auction, not the values behind them, and ask what a
statistic (expected revenue or welfare) would be under new rules once the bidders re-optimise.

- Point estimate (epsilon = 0): the value distribution whose symmetric equilibrium bids best fit the logged
  ones, a sieve of equilibrium models chosen by BIC (`pipeline.games.value_sieve`), with its SD and the reserves
  not to be trusted; with a bandwidth given or few bids, the bids inverted through the symmetric
  first-order condition v = b + F(b) / ((n - 1) f(b)), F and f from a local quadratic fit to the
  bid CDF (`inverted_value_cdf`: no first-order bias at the top of the bids, off the grid) (`point_value_curve`).
  A hard reserve in the logs is read as a known truncation (`reserve_counterfactuals`). Second
  price, where bidding the value is dominant, is then read off that distribution directly
  (`second_price_point`); first price solves the new game's symmetric equilibrium over the
  discrete grid by fictitious play (`pipeline.games.solver.solve_equilibrium`, one population of n).
- Bounds (epsilon > 0): the lowest and highest statistic over every type assignment and
  counterfactual play that are epsilon-consistent: each data point's observed bid has regret
  <= epsilon for its type in the logged game, and its counterfactual bid has regret <= epsilon in
  the new game. Computed by a fictitious-play style Frank-Wolfe method
  (`pipeline.games.solver.solve_bounds`, shared with asymmetric bidders).

Bids live on a grid 0, step, ..., max(1, largest bid) (step 0.01 by default) and types at the
midpoints of its cells (`type_grid`); regret is in the units of the values. The logged opponents'
bids are smoothed before computing regrets (`fit_logged_auction`, `smoothing_kernel`,
`default_bandwidth`: the same local quadratic CDF fit as the point estimate's). All
arithmetic is float64 torch on ``device``, vectorised over data points, types and actions. Data
points with the same bid are exchangeable (same consistent types, same choices), so the per-point
work is done once per distinct bid and weighted by its count: an iteration costs the same for
1,000 bids as for 100,000. The only randomness is the type inversion's tie-breaking, drawn from a
CPU ``generator``.

Result keys (``counterfactual_table``, ``truth_table``)::

    <prefix>/<rule>/point          the point estimate
    <prefix>/<rule>/lower_eps<e>   lower bound at epsilon e
    <prefix>/<rule>/upper_eps<e>   upper bound at epsilon e
    <prefix>/<rule>/truth          the closed-form truth (simulated data only)

``prefix`` is ``cf`` for expected revenue and ``cfw`` for welfare (call the function once per
statistic). ``rule`` is the canonical rule name (`pipeline.games.auction.parse_rule(...).name`,
e.g. ``second_price_r0.5``, ``first_price_n3``). ``e`` is written in plain decimal with no
trailing zeros (`eps_label`): 0.001 -> ``eps0.001``, 0.02 -> ``eps0.02``, 0.1 -> ``eps0.1``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from pipeline.games.auction import truth
from pipeline.games.bid_checks import (
    LATTICE_CELLS,
    ZERO_WARN,
    bid_lattice,
    check_bids,
    excess_zeros,
    logged_reserve,
    without_mass_points,
)
from pipeline.games.rules import STATISTICS, Rule, eps_label, parse_rule, result_key
from pipeline.games.solver import (
    DEFAULT_ITERS,
    DEFAULT_POINT_ITERS,
    TIE_TOL,
    power_of_opponents,
    solve_bounds,
    solve_equilibrium,
    win_probability,
)
from pipeline.games.value_sieve import (
    MIN_BIDS,
    TAIL_SHARE,
    TOP_BAND,
    fit_sieve,
    fit_value_sieve,
    plug_in_sd,
    point_shrink,
    untrusted_reserves,
)

DEFAULT_EPSILONS = (0.001, 0.005, 0.02)
MAX_GRID_POINTS = 2001


# ---------------------------------------------------------------------------------------------------
# Auction primitives on a discrete bid grid


def bid_grid(top: float, step: float, device, dtype=torch.float64) -> Tensor:
    n_points = int(math.ceil(top / step - 1e-9)) + 1
    if n_points > MAX_GRID_POINTS:
        raise ValueError(
            f"a {step} grid up to {top:g} has {n_points} points (max {MAX_GRID_POINTS}); "
            "use a coarser grid, or let counterfactual_table choose the value scale"
        )
    return torch.arange(n_points, device=device, dtype=dtype) * step


def type_grid(actions: Tensor) -> Tensor:
    """Types at the midpoints of the bid grid's cells: 0.005, 0.015, ..., 0.995 for a 0.01 grid.

    A grid type stands for the values of its cell. On the bid grid itself a type equal to a
    reserve (or a bid) would have zero surplus and carry a whole cell's mass where the continuum
    has none: with types on the grid, exact uniform types already missed the r = 0.9 revenue by
    0.014, at midpoints by far less.
    """
    return (actions[:-1] + actions[1:]) / 2


# ---------------------------------------------------------------------------------------------------
# The logged game


def smoothing_kernel(
    n_actions: int, lo: int, hi: int, cells: float, device=None, ends: tuple[float, float] | None = None
) -> Tensor:
    """(A, A) matrix that smooths a bid histogram on the grid: ``smoothed = counts @ kernel``.

    The smoothed count of cell j is S(upper edge of j) - S(lower edge of j), where S is a local
    quadratic fit (`local_cdf_fit`: Gaussian weights of ``cells`` grid cells; 0: no smoothing) to
    the empirical CDF at the cell edges of the observed support, grid indices ``lo..hi``, held to
    the known 0 and N at the support's ends, ``ends`` (in cells: the smallest and largest bid /
    step; None: bids on the grid, so the end cells hold half a cell each).

    Why the CDF and not the density: a smoothed density is biased within a bandwidth of an end of
    the support (reflection, the rule before this one, keeps only a flat density flat: one with
    slope s at the top reads about 0.8 s h too low there), and since t - b = G / g the inverted
    values within a bandwidth of the highest bid moved by 2-10% on non-uniform values (second
    price at r = 0.9 off by 0.02-0.12, not falling with N). A local quadratic has no first-order
    bias at an end for the level or the slope, and an error in the CDF stays where it is. The end
    cells need no special case: a cell the data fill only in part (the largest of the continuous
    bids 2v/3 fills a sixth of the 0.67 cell) gets the CDF's rise between its lower edge and the
    largest bid. The smoothed counts can dip below 0 where the fit is not monotone; they are
    clipped where used.
    """
    eye = torch.eye(n_actions, dtype=torch.float64, device=device)
    if cells <= 0 or hi - lo < 3:
        return eye
    edge = cdf_points(lo, hi, ends, device)
    level, _ = local_cdf_fit(edge, cells)
    rise = level[1:] - level[:-1]  # (cell j - lo, CDF point)
    # A count in cell i adds to every CDF point from its own upper edge (point i - lo + 1) up.
    per_count = rise.flip(1).cumsum(1).flip(1)[:, 1:]  # (cell j - lo, cell i - lo)
    kernel = eye.clone()
    kernel[lo:hi + 1, lo:hi + 1] = per_count.T
    return kernel


def cdf_points(lo: int, hi: int, ends: tuple[float, float] | None = None, device=None) -> Tensor:
    """(hi - lo + 2,) where the bid CDF is read, in grid cells: the smallest bid, then each cell's upper
    edge, the last one at the largest bid (``ends``; None: bids on the grid, half a cell inside)."""
    lower, upper = (lo, hi) if ends is None else ends
    edge = torch.arange(lo - 1, hi + 1, dtype=torch.float64, device=device) + 0.5
    edge[0] = min(lower, lo + 0.5)
    edge[-1] = max(upper, hi - 0.5 + 1e-6)
    return edge


def local_cdf_fit(edge: Tensor, cells: float) -> tuple[Tensor, Tensor]:
    """(E, E) weights of a local quadratic fit at each point of ``edge``: (level, slope per cell).

    Row t applied to the empirical CDF at ``edge`` gives the fitted CDF at edge[t] and its slope
    there (Gaussian weights of ``cells``, cut at 5 of them). A quadratic has no first-order bias
    at the ends for either (Fan & Gijbels 1996, 3.2), unlike a kernel density there.
    """
    offset = edge[None, :] - edge[:, None]  # (target, source)
    weight = torch.exp(-0.5 * (offset / cells) ** 2) * (offset.abs() <= 5 * cells)
    weight[:, [0, -1]] *= 1000.0  # the CDF is known at the ends (0 and 1): the fit passes through them
    design = torch.stack([torch.ones_like(offset), offset, offset**2], -1)  # (E, E, 3)
    gram = torch.einsum("tsp,ts,tsq->tpq", design, weight, design)
    fit = torch.linalg.solve(gram, (design * weight[..., None]).transpose(1, 2))  # (target, coef, source)
    return fit[:, 0, :], fit[:, 1, :]


def inverted_value_cdf(
    bids: Tensor, n_bidders: int, grid: float, bandwidth: float | None = None, lattice: float | None = None
) -> tuple[Tensor, Tensor]:
    """The value CDF the logged bids imply, as points (values (E,), CDF (E,)) to interpolate between
    (`inverted_value_curve` without the bids the points invert)."""
    _, values, cdf, _ = inverted_value_curve(bids, n_bidders, grid, bandwidth, lattice)
    return values, cdf


def point_sieve(bids: Tensor, n_bidders: int, bandwidth: float | None = None, lattice: float | None = None):
    """The value sieve of the point estimate (`pipeline.games.value_sieve.fit_value_sieve`, cached per log), or None
    where the local inversion makes the point instead: a ``bandwidth`` given (its own parameter) or under
    `MIN_BIDS` bids."""
    if bandwidth is not None or bids.numel() < MIN_BIDS:
        return None
    return fit_value_sieve(bids, n_bidders, lattice)


def point_value_curve(
    bids: Tensor, n_bidders: int, grid: float, bandwidth: float | None = None, lattice: float | None = None
) -> tuple[Tensor, Tensor, Tensor, float, str]:
    """The point estimate's value curve, as `inverted_value_curve` returns it (bids, values, CDF, top SD), and which
    inversion made it (one line).

    With the default smoothing: the value sieve (`point_sieve`; bids on a ``lattice`` censored to their cells), the
    model chosen by BIC across its families and degrees, the top's SD through the fit and the choice
    (`pipeline.games.value_sieve.SieveFit.top_sd`); for a given ``bandwidth`` or under `MIN_BIDS` bids, the local
    inversion `inverted_value_curve`."""
    sieve = point_sieve(bids, n_bidders, bandwidth, lattice)
    if sieve is not None:
        device = bids.device
        _, top_sd = sieve.top_sd()
        bids_at, values, cdf = (x[0].to(device) for x in sieve.curves())
        return bids_at, values, cdf, top_sd, f"value sieve: {sieve.describe()}"
    why = "a bandwidth given" if bandwidth is not None else f"under {MIN_BIDS} bids"
    return *inverted_value_curve(bids, n_bidders, grid, bandwidth, lattice), f"local inversion ({why})"


def inverted_value_curve(
    bids: Tensor, n_bidders: int, grid: float, bandwidth: float | None = None, lattice: float | None = None
) -> tuple[Tensor, Tensor, Tensor, float]:
    """(bids (E,), values (E,), CDF (E,), top SD): at each CDF point b, the value it inverts to and P(V <= v(b)), and
    the sampling SD of the top value from the top model's density (`first_order_values`).

    At each CDF point b (`cdf_points`) the symmetric first-order condition gives the value
    v(b) = b + F(b) / ((n - 1) f(b)), with F and f the level and slope of a local quadratic fit to
    the empirical bid CDF (`local_cdf_fit`), and within a few bandwidths of the top the slope of a
    model of the CDF's top (`top_density`: no bias from the square-root cusp of values whose density
    vanishes there), and P(V <= v(b)) = F(b), read off the empirical CDF. The v's are kept
    increasing by a running minimum from the top (see the code for why). The top of the values is v
    at the largest bid: b_max + 1 / ((n - 1) f(b_max)).

    ``lattice`` (the bids' rounding step, `pipeline.games.bid_checks.bid_lattice`; None: bids not
    rounded coarser than the smoothing): each bid stands for its rounding cell. The CDF is read at the
    cells' edges only (the rounded and the true bids' CDFs agree there: 0 below the lowest cell, 1
    above the highest), and the fit spans at least `LATTICE_CELLS` steps.
    """
    bids = bids.flatten()
    cells = (default_bandwidth(bids) if bandwidth is None else bandwidth) / grid
    step = grid
    if lattice is not None:
        step = float(lattice)
        cells = max(cells * grid / step, LATTICE_CELLS)
    index = torch.round(bids / step).long()
    lo, hi = int(index.min()), int(index.max())
    counts = torch.zeros(hi - lo + 1, dtype=torch.float64, device=bids.device).index_add_(
        0, index - lo, torch.ones_like(bids))
    ends = (float(bids.min()) / step, float(bids.max()) / step)
    if lattice is not None and hi - lo >= 4:
        # The top cell is filled only up to the highest true bid: as far as its count reaches at the density of
        # the three cells below it (pinning the CDF at the cell's upper edge read a top 0.1 too high).
        below = float(counts[-4:-1].mean())
        ends = (lo - 0.5, hi - 0.5 + min(1.0, float(counts[-1]) / below) if below > 0 else hi + 0.5)
    edge = cdf_points(lo, hi, ends, bids.device)
    empirical = torch.cat([counts.new_zeros(1), counts.cumsum(0)]) / bids.numel()
    if lattice is not None and hi - lo < 3:
        raise ValueError(f"the bids take {hi - lo + 1} values on a lattice of step {step:g} (bids rounded to it): "
                         "too few to invert; log the bids unrounded")
    if cells <= 0 or hi - lo < 3:
        raise ValueError(f"the bids fill {hi - lo + 1} grid cells: too few to invert (use a finer grid)")
    if cells < 0.3:  # measured: 0.25 cells read a top of 5e5 on U[0, 0.5] bids, 0.1 is singular
        raise ValueError(f"bandwidth {cells * grid:g} is under 0.3 grid steps ({grid:g} each): the local fit to the bid "
                         f"CDF needs several grid cells; use a bandwidth >= {0.3 * grid:g} or a finer grid")
    spread = (float(bids.max()) - float(bids.min())) or 1.0
    values, sd = first_order_values(edge, empirical, cells, step, n_bidders - 1, spread, bids.numel(), lattice is None)
    # Values rise with bids. Where the fit says otherwise it is at the bottom, where F and f both
    # vanish (values with a density near 0 there, like F = v^2, read F / f = 0 / 0): the running
    # minimum from the top keeps each value at or below every value above it. At the top f never
    # vanishes in equilibrium (f(b_max) = 1 / ((n - 1) (v_top - b_max))).
    return edge * step, values.flip(0).cummin(0).values.flip(0), empirical, float(sd[-1])


def first_order_values(
    edge: Tensor, empirical: Tensor, cells: float, step: float, opponents: int, spread: float, n_samples: int,
    near: bool = True,
) -> tuple[Tensor, Tensor]:
    """v(b) = b + F(b) / (opponents * f(b)) at each b = edge * step, F and f the level (kept in [0, 1]) and the
    slope of `local_cdf_fit` (``cells`` wide, in units of ``step``) applied to the ``empirical`` CDF at ``edge``
    (of ``n_samples`` bids); within `TOP_WINDOW` bandwidths of the top, f comes from `top_density` instead.
    Returns (v, SD of v from the top model's density: (v - b) times the density's relative SD; 0 below its window).

    Symmetric bidders: F the pooled bids' CDF and ``opponents`` = n - 1; one bidder of an asymmetric log: F the
    CDF of its highest competing bid and ``opponents`` = 1. f is floored at 1e-6 / ``spread`` (the bids' range).
    """
    level_weights, slope_weights = local_cdf_fit(edge, cells)
    level = (level_weights @ empirical).clamp(0.0, 1.0)
    density = (slope_weights @ empirical) / step  # per bid unit
    top, width, variance = top_density(edge, empirical, cells, n_samples, near)
    relative = torch.zeros_like(density)
    if width > 0:  # full weight on the top model within half its window, then a linear hand-over to the local fit
        share = ((width - (edge[-1] - edge)) / (0.5 * width)).clamp(0.0, 1.0)
        density = share * top / step + (1 - share) * density
        relative = (share**2 * variance / step**2) / density.clamp_min(1e-6 / spread) ** 2
    # 1 / f is convex: an unbiased f with relative variance s^2 reads F / f about s^2 (F / f) too high. Second-order
    # (delta) correction with `top_density`'s variance, where it holds (s^2 <= 0.5; past that f is not told from 0 and
    # the top is left to the caller's cap). Measured on Beta(2, 2), 3 bidders, 20 seeds: the top 1.028 -> 1.021
    # (N = 5,000) and 1.016 -> 1.014 (20,000); most of what is left is the cusp model's truncation (exact quantiles:
    # 1.023 / 1.015).
    shading = level / (opponents * density.clamp_min(1e-6 / spread))
    correction = torch.where(relative <= 0.5, 1 - relative, 1.0)
    return edge * step + shading * correction, shading * relative.sqrt()


TOP_WINDOW = 8.0  # bandwidths: the window of the smooth top model (1 - F linear + quadratic in the distance to the top)
CUSP_WINDOW = 6.0  # bandwidths: the window of the cusp model (with the (b_top - b)^(3/2) term)
CUSP_TEST = 2.5  # largest standardised misfit of the smooth model before the cusp model takes over
CUSP_NEAR = 1.8  # ... or this much, when the cusp model's is under half of it
CUSP_POWERS = (1.0, 1.5, 2.0)


def top_density(
    edge: Tensor, empirical: Tensor, cells: float, n_samples: int, near: bool = True
) -> tuple[Tensor, float, Tensor]:
    """The bid density (per cell) at every point of ``edge`` from a model of the CDF's top, the model's window, and
    the density's sampling variance (per cell^2; the binomial covariance of the empirical CDF through the fit).

    With d = b_top - b, equilibrium bids have 1 - F(b) = a d + e d^2 + ... when the value density is positive at
    the top (uniform, F = v^2), and 1 - F = a d + c d^(3/2) + e d^2 + ... when it vanishes linearly there (Beta(2, 2):
    values near the top are ~sqrt(d), the square-root cusp). A local quadratic in b follows neither within a few
    bandwidths of the top: on Beta(2, 2) it read the value CDF 0.0055 low at v = 0.7-0.85 (bias growing relative to
    the sampling noise with N) and its top had a variance that cost reserves near the top 0.02. Least squares of
    1 - F on (d, d^2) over `TOP_WINDOW` bandwidths has no bias on the first kind and little variance (a, the top's
    density, is read off the whole window); when that model misses the empirical CDF by too many binomial SDs
    somewhere in the window (`CUSP_TEST`, `CUSP_NEAR`), (d, d^(3/2), d^2) over `CUSP_WINDOW` bandwidths is used
    instead (`docs/auctions.md`, measured choices). ``near=False`` (bids rounded to a lattice, whose cell steps
    add to the misfit: the `CUSP_NEAR` rule chose the cusp model on rounded uniform bids, misfits 2.08 / 0.99,
    top 0.88 for 1) takes the cusp model only past `CUSP_TEST` (rounded Beta(2, 2): 1.8-4.3).
    """
    distance = edge[-1] - edge
    # The models describe the top, not the whole range: a window reaching below the median bid (few bids, wide
    # bandwidths: 400 bids put 6 bandwidths over all of them) is cut there.
    upper_half = float(distance[empirical >= 0.5].max())
    fits, misfits = [], []
    for powers, window in (((1.0, 2.0), TOP_WINDOW), (CUSP_POWERS, CUSP_WINDOW)):
        window = min(window, upper_half / cells)
        inside = distance <= window * cells
        if int(inside.sum()) < 4 * len(powers):  # too few CDF points in the window for the model
            break
        design = torch.stack([distance[inside] ** p for p in powers], 1)
        solve = torch.linalg.solve(design.T @ design, design.T)  # least squares: coef = solve @ (1 - F)
        coef = solve @ (1 - empirical[inside])
        observed = empirical[inside]
        sd = torch.sqrt((observed * (1 - observed)).clamp_min(1.0 / n_samples) / n_samples)
        tail = (1 - observed).clamp(0.0, 1.0)  # Cov(F(b_i), F(b_j)) = (min(1 - F) - (1 - F_i)(1 - F_j)) / N
        covariance = (torch.minimum(tail[:, None], tail[None, :]) - tail[:, None] * tail[None, :]) / n_samples
        fits.append((powers, window, coef, solve @ covariance @ solve.T))
        misfits.append(float(((1 - design @ coef - observed).abs() / sd).max()))
    if not fits:
        return edge.new_zeros(edge.shape), 0.0, edge.new_zeros(edge.shape)
    # The cusp model when the smooth one misses by more than CUSP_TEST SDs, or by more than CUSP_NEAR SDs and
    # twice as much as the cusp model does (measured: smooth / cusp misfits 0.5-2.1 / 0.4-2.3, ratio <= 2.4 on
    # uniform and v^2 logs; 1.9-5.4 / 0.7-2.0, ratio 1-7 on Beta(2, 2); 2.45 / 0.35 on its exact quantiles).
    use_cusp = len(fits) == 2 and (
        misfits[0] > CUSP_TEST or (near and misfits[0] > CUSP_NEAR and misfits[0] > 2 * misfits[1]))
    powers, window, coef, coef_covariance = fits[1] if use_cusp else fits[0]
    slopes = torch.stack([p * distance.clamp_min(0.0) ** (p - 1) for p in powers], 1)  # d density / d coef
    density = slopes @ coef
    variance = ((slopes @ coef_covariance) * slopes).sum(1)
    return density, window * cells, variance


def default_bandwidth(bids: Tensor) -> float:
    """1.5 times Silverman's rule of thumb: 1.5 * 1.06 * std * N^(-1/5), in bid units (0.042 for 5,000 bids
    of U[0, 0.5]), the bandwidth of the local quadratic fit to the bid CDF (`local_cdf_fit`).

    Inside the support that fit's slope is a Gaussian kernel density estimate with this bandwidth,
    for which Silverman's rule is the normal-reference choice; the multiplier was chosen on the
    worst second-price point error over reserves 0-0.9 (`benchmarks/rmac_grid.py`, exact
    equilibrium bids, values F = u, v^2, sqrt(v), Beta(2,2), 2/3/5 bidders, 3 seeds each,
    N = 5,000 auctions): mean over the 12 cases 0.016 / 0.015 / 0.015 / 0.021 and worst 0.027 /
    0.028 / 0.031 / 0.049 at 1x / 1.5x / 2x / 3x. Wider is better where the bid density is flat
    (uniform: 0.021 at 3x against 0.024 at 1x) and worse where it bends (Beta(2,2), whose values
    have a square-root cusp at the top: 0.016 at 1x, 0.049 at 3x).
    """
    return float(1.5 * 1.06 * bids.std() * bids.numel() ** -0.2)


@dataclass
class LoggedAuction:
    """Logged first-price bids on the grid, grouped by distinct bid, with the logged game's regrets."""

    actions: Tensor  # (A,) the bid grid
    types: Tensor  # (T,) cell midpoints of the bid grid (see `type_grid`)
    step: float
    n_bidders: int
    class_bid: Tensor  # (C,) grid index of each distinct observed bid
    class_count: Tensor  # (C,) how many data points made it
    data_class: Tensor  # (N,) which distinct bid each data point made
    class_win: Tensor  # (C, A) P(win) of every grid bid against the other logged bids
    regret: Tensor  # (C, T) regret of the class's bid for each type, against the other logged bids

    @property
    def n_bids(self) -> int:
        return int(self.data_class.shape[0])

    @property
    def class_weight(self) -> Tensor:
        return self.class_count / self.class_count.sum()

    def consistent(self, eps: float) -> Tensor:
        """(C, T) mask of types whose regret for the class's bid is <= eps.

        A bid that no grid type rationalises within eps keeps its least-regret types, so no data
        point is left without a type (at eps = 0 this is exactly the best-response inversion).
        """
        floor = self.regret.min(1, keepdim=True).values.clamp_min(eps)
        return self.regret <= floor + TIE_TOL


def fit_logged_auction(
    bids: Tensor | Sequence[float],
    n_bidders: int,
    grid: float = 0.01,
    device=None,
    bandwidth: float | None = None,
    top: float | None = None,
    opponents: Tensor | None = None,
) -> LoggedAuction:
    """Snap ``bids`` (any shape, flattened) to the grid and compute every type's regret for each distinct bid.

    A data point's opponents are ``n_bidders - 1`` i.i.d. draws from the OTHER logged bids
    (leave-one-out), kernel-smoothed with ``bandwidth`` (bid units; None: `default_bandwidth`, 0:
    the raw empirical distribution). Why smooth: inverting a bid reads the opponents' local bid
    density (a best response balances (t - b) * density against the win probability), and a raw
    0.01 cell holds ~100 of 5,000 bids, +-10% noise; one thin cell made five neighbouring bids
    best responses for no grid type, piled 10% of the data on one type and moved the r = 0.9
    revenue by +0.11. The regret is the best grid bid's expected utility minus the observed bid's.
    ``top`` is the top of the bid and value grid (None: max(1, largest bid)); every bid must lie under it.
    ``opponents``: for one bidder of an asymmetric log, the highest competing bid of each of its auctions;
    the bid is then a best response against that one distribution (no leave-one-out: it is another sample).
    """
    if n_bidders < 2:
        raise ValueError(f"n_bidders={n_bidders}: a logged first-price auction needs at least 2 bidders")
    bids = torch.as_tensor(bids, dtype=torch.float64).flatten().to(device)
    if bids.numel() < 2:
        raise ValueError("need at least two logged bids (each one's opponents are the others)")
    top = max(1.0, float(bids.max())) if top is None else float(top)
    if float(bids.max()) > top + grid / 2:
        raise ValueError(f"the largest bid {float(bids.max()):g} lies above the grid's top {top:g}; raise top")
    actions = bid_grid(top, grid, bids.device)
    types = type_grid(actions)
    index = torch.round(bids / grid).long().clamp(0, actions.numel() - 1)
    class_bid, data_class, class_count = torch.unique(index, return_inverse=True, return_counts=True)
    n_actions, n_types = actions.numel(), types.numel()
    if opponents is None:
        counts, kernel = smoothed_counts(bids, grid, n_actions, bandwidth)
        # Smoothing is linear, so leaving one bid out subtracts that bid's own kernel row.
        others = (counts[None, :] - kernel[class_bid]).clamp_min(0.0)
        win = win_probability(others / others.sum(1, keepdim=True), n_bidders - 1)  # (C, A)
    else:
        opponents = torch.as_tensor(opponents, dtype=torch.float64).flatten().to(bids.device)
        if float(opponents.max()) > top + grid / 2:
            raise ValueError(f"a competing bid {float(opponents.max()):g} lies above the grid's top {top:g}; raise top")
        counts, _ = smoothed_counts(opponents, grid, n_actions, bandwidth)
        counts = counts.clamp_min(0.0)
        win = win_probability(counts / counts.sum(), 1).expand(class_bid.numel(), -1)
    regret = torch.empty(class_bid.numel(), n_types, dtype=torch.float64, device=bids.device)
    # (C, T, A) utilities in class chunks keep memory bounded on fine grids.
    chunk = max(1, (1 << 24) // (n_types * n_actions))
    for lo in range(0, class_bid.numel(), chunk):
        hi = min(lo + chunk, class_bid.numel())
        utility = (types[None, :, None] - actions[None, None, :]) * win[lo:hi, None, :]
        observed = utility.gather(2, class_bid[lo:hi, None, None].expand(-1, n_types, 1)).squeeze(2)
        regret[lo:hi] = (utility.max(2).values - observed).clamp_min(0.0)
    return LoggedAuction(
        actions, types, grid, n_bidders, class_bid, class_count.double(), data_class, win, regret
    )


def smoothed_counts(bids: Tensor, grid: float, n_actions: int, bandwidth: float | None) -> tuple[Tensor, Tensor]:
    """Smoothed bid counts on the grid (see `smoothing_kernel`) and the kernel itself."""
    index = torch.round(bids / grid).long().clamp(0, n_actions - 1)
    bandwidth = default_bandwidth(bids) if bandwidth is None else bandwidth
    ends = (float(bids.min()) / grid, float(bids.max()) / grid)
    kernel = smoothing_kernel(n_actions, int(index.min()), int(index.max()), bandwidth / grid, bids.device, ends)
    counts = torch.zeros(n_actions, dtype=torch.float64, device=bids.device).index_add_(
        0, index, torch.ones_like(bids))
    return counts @ kernel, kernel


def realised_regret(
    values: Tensor, bids: Tensor, n_bidders: int, grid: float = 0.01, bandwidth: float | None = None
) -> Tensor:
    """Each data point's regret for its logged bid at its TRUE value (continuous), in the logged game.

    The logged game is the one `fit_logged_auction` builds (same opponents, same smoothing), so an
    epsilon at least ``realised_regret(...).max()`` makes the true values epsilon-consistent with
    the logged play, up to the type grid's half cell. Evaluation only: needs simulated values.
    """
    logged = fit_logged_auction(bids, n_bidders, grid, torch.as_tensor(values).device, bandwidth)
    values = torch.as_tensor(values, dtype=torch.float64).flatten().to(logged.actions.device)
    regret = torch.empty_like(values)
    chunk = max(1, (1 << 22) // logged.actions.numel())  # (chunk, A) at a time: memory does not grow with N
    for lo in range(0, values.numel(), chunk):
        data_class = logged.data_class[lo:lo + chunk]
        utility = (values[lo:lo + chunk, None] - logged.actions[None, :]) * logged.class_win[data_class]
        observed = utility.gather(1, logged.class_bid[data_class][:, None]).squeeze(1)
        regret[lo:lo + chunk] = (utility.max(1).values - observed).clamp_min(0.0)
    return regret


def invert_types(logged: LoggedAuction, generator: torch.Generator | None = None) -> Tensor:
    """Per data point, a type index for which its bid is a best response (least regret).

    Several grid types are often exactly tied (every type between two bid thresholds best-responds
    with the same bid); each data point picks one of them uniformly at random, because taking the
    first index would bias every type down by up to a grid cell and the revenue with it.
    """
    ok = logged.consistent(0.0)  # (C, T); one (N, T) matrix would cost 800 MB at N = 1,000,000
    _, tied_type = ok.nonzero(as_tuple=True)  # row-major: each class's tied types are contiguous
    n_tied = ok.sum(1)
    first = n_tied.cumsum(0) - n_tied
    u = torch.rand(logged.n_bids, generator=generator, dtype=torch.float64).to(ok.device)
    n_point = n_tied[logged.data_class]
    pick = (u * n_point).long().clamp_max(n_point - 1)
    return tied_type[first[logged.data_class] + pick]


def point_types(logged: LoggedAuction, max_type: float | None = None) -> Tensor:
    """(C, T) mask of the types the point estimate gives each distinct bid: its tied best responses.

    Types above ``max_type`` are left out (`cap_types`): on a grid the highest bid is a best
    response for every type from its value up to b + step / P(tie at b), 1.5-4x the value on 5,000 bids.
    """
    return cap_types(logged.consistent(0.0), logged.types, max_type)


def cap_types(mask: Tensor, types: Tensor, max_type: float | None) -> Tensor:
    """(C, T) ``mask`` without the types above ``max_type``; a bid left with none gets the highest type below it."""
    if max_type is None:
        return mask
    below = types <= max_type
    highest_below = int(below.nonzero().max()) if below.any() else 0
    mask = mask & below
    mask[mask.sum(1) == 0, highest_below] = True
    return mask


def type_distribution(logged: LoggedAuction, max_type: float | None = None) -> Tensor:
    """(T,) inverted type distribution: each distinct bid's mass split evenly over its `point_types`.

    The expectation of `invert_types`' random tie-breaks, without their noise and without a
    per-data-point pass (memory does not grow with N).
    """
    ok = point_types(logged, max_type).double()
    return (logged.class_weight / ok.sum(1)) @ ok


def interp(x: Tensor, xp: Tensor, fp: Tensor) -> Tensor:
    """Piecewise-linear interpolation through (xp, fp), xp increasing; constant beyond the ends."""
    right = torch.searchsorted(xp, x, right=True).clamp(1, xp.numel() - 1)
    x0, x1, f0, f1 = xp[right - 1], xp[right], fp[right - 1], fp[right]
    share = ((x - x0) / (x1 - x0).clamp_min(1e-300)).clamp(0.0, 1.0)
    inside = f0 + share * (f1 - f0)
    return torch.where(x < xp[0], fp[0], torch.where(x >= xp[-1], fp[-1], inside))


def value_type_weights(values: Tensor, cdf: Tensor, actions: Tensor, max_type: float | None = None) -> Tensor:
    """(T,) mass of each type cell [a_k, a_(k+1)) under the value CDF through (values, cdf) (`inverted_value_cdf`).

    The CDF is linear between its points, so a cell that the values fill only in part gets only
    that part (the top cell above the largest value gets nothing). Mass above ``max_type`` goes
    to the last cell below it.
    """
    at_edges = interp(actions, values, cdf)
    at_edges[-1] = cdf[-1]  # values above the grid's top count in its last cell
    if max_type is not None:
        cells_below = max(1, int((actions[1:] <= max_type + 1e-9 * float(actions[-1])).sum()))
        at_edges[cells_below:] = cdf[-1]
    return (at_edges[1:] - at_edges[:-1]).clamp_min(0.0)


def value_point_mask(values: Tensor, logged: LoggedAuction, max_type: float | None = None) -> Tensor:
    """(C, T) the types the point estimate gives each distinct bid: those whose cells meet the
    values [v(lower edge), v(upper edge)] of the bid's grid cell (`inverted_value_cdf`)."""
    lo = int(logged.class_bid.min())
    v_low, v_high = values[logged.class_bid - lo], values[logged.class_bid - lo + 1]
    cell_low, cell_high = logged.actions[:-1], logged.actions[1:]
    mask = (cell_high[None, :] > v_low[:, None]) & (cell_low[None, :] <= v_high[:, None])
    return cap_types(mask, logged.types, max_type)


def curve_point_mask(logged: LoggedAuction, values: Tensor, points: Tensor, max_type: float | None = None) -> Tensor:
    """(C, T) `value_point_mask` for a value curve through (points, values) at any bids (internal units): the
    types whose cells meet [v(lower edge), v(upper edge)] of each distinct bid's grid cell, v interpolated."""
    edges = torch.stack([logged.class_bid - 0.5, logged.class_bid + 0.5]).double() * logged.step
    v_low, v_high = (interp(e, points, values) for e in edges)
    cell_low, cell_high = logged.actions[:-1], logged.actions[1:]
    mask = (cell_high[None, :] > v_low[:, None]) & (cell_low[None, :] <= v_high[:, None])
    return cap_types(mask, logged.types, max_type)


def cdfs_at(cdfs: Sequence[tuple[Tensor, Tensor]], x: Tensor) -> Tensor:
    """(bidders, len(x)): each bidder's value CDF at x, linear between its points and 1 beyond its last one.

    At the last point itself the curve's own value (its left limit): a curve cut at a value cap
    (`cap_curve`) ends below 1 there, and the integrals must stop at that jump, not read past it.
    """
    return torch.stack([torch.where(x > values[-1], 1.0, interp(x, values, cdf)) for values, cdf in cdfs])


def order_statistic_cdfs(f: Tensor) -> tuple[Tensor, Tensor]:
    """From (bidders, K) independent value CDFs: (P(highest <= x), P(second highest <= x)), each (K,).

    P(second <= x) = P(all <= x) + sum_i P(V_i > x) prod_{j != i} P(V_j <= x).
    """
    first = f.prod(0)
    return first, first + ((1 - f) * power_of_opponents(f, [1] * f.shape[0])).sum(0)


def second_price_from_cdfs(cdfs: Sequence[tuple[Tensor, Tensor]], reserve: float) -> tuple[float, float]:
    """(revenue, welfare) of second price with ``reserve`` for independent bidders with these value CDFs.

    ``cdfs``: per bidder, (values, cdf) points, the CDF linear between them (`cdfs_at`). Bidding the
    value is dominant, so there is no game to solve: with T the largest value, F1 and F2 the CDFs of
    the highest and second-highest value (`order_statistic_cdfs`),
    revenue = r P(V(1) >= r > V(2)) + E[V(2) 1{V(2) >= r}] = r (F2(r) - F1(r)) + T - r F2(r) - int_r^T F2,
    welfare = E[V(1) 1{V(1) >= r}] = T - r F1(r) - int_r^T F1, integrated by Simpson's rule between
    the union of all the bidders' points (there the integrands are polynomials of degree n: exact for n <= 3).
    Solving it on the grid instead (types at cell midpoints bidding grid points) moved every reserve's
    revenue by up to half a cell, 0.004 on F = v^2 or sqrt(v) with a 0.01 grid, whatever N.
    """
    top = max(float(values[-1]) for values, _ in cdfs)
    reserve = float(reserve)
    if reserve >= top:
        return 0.0, 0.0
    every = torch.cat([values for values, _ in cdfs])
    knots = torch.cat([every.new_tensor([reserve, top]), every[every > reserve]]).unique()
    middle = (knots[1:] + knots[:-1]) / 2
    width = knots[1:] - knots[:-1]
    integrals = []
    for pick in (0, 1):
        at = [order_statistic_cdfs(cdfs_at(cdfs, x))[pick] for x in (knots[:-1], middle, knots[1:])]
        integrals.append(float((width * (at[0] + 4 * at[1] + at[2]) / 6).sum()))
    first_r, second_r = (float(s[0]) for s in order_statistic_cdfs(cdfs_at(cdfs, knots[:1])))
    revenue = reserve * (second_r - first_r) + top - reserve * second_r - integrals[1]
    welfare = top - reserve * first_r - integrals[0]
    return revenue, welfare


def cap_curve(values: Tensor, cdf: Tensor, max_value: float) -> tuple[Tensor, Tensor]:
    """The value CDF through (values, cdf) with every value above ``max_value`` counted as ``max_value``.

    The curve ends at the cap with F's left limit there (the jump to 1 is `cdfs_at`'s "1 beyond the
    last point"). Clamping the points instead read F after the jump on the last piece: 4.2e-4 low on
    U[0, 2] capped at 1 with 2 bidders.
    """
    if float(values[-1]) <= max_value:
        return values, cdf
    below = values < max_value
    at_cap = interp(values.new_tensor([max_value]), values, cdf)
    return torch.cat([values[below], values.new_tensor([max_value])]), torch.cat([cdf[below], at_cap])


def second_price_point(
    values: Tensor, cdf: Tensor, n_bidders: int, reserve: float, statistic: str, max_value: float | None = None
) -> float:
    """Second price with ``reserve`` for ``n_bidders`` with the value CDF through (values, cdf)
    (`inverted_value_cdf`), off the grid: `second_price_from_cdfs` with every bidder alike. Values above
    ``max_value`` count as ``max_value`` (`cap_curve`)."""
    if max_value is not None:
        values, cdf = cap_curve(values, cdf, max_value)
    revenue, welfare = second_price_from_cdfs([(values, cdf)] * n_bidders, reserve)
    return revenue if statistic == "revenue" else welfare


# ---------------------------------------------------------------------------------------------------
# The new game: point estimate and bounds


@dataclass
class ValueScale:
    """Where the value grid sits, in the data's units: bid grid step ``grid * unit``, top ``top * unit``.

    Inside the solver every price is divided by ``unit``, so the 0.01 grid and the tolerances keep
    their meaning for bids in dollars as for bids on [0, 1].
    """

    unit: float
    top: float  # internal units (multiples of ``unit``)
    estimated_top_value: float  # data units: the rough top (b_max + 1 / g(b_max), g from a window), sets the unit


def nice_step(x: float) -> float:
    """The nearest (in log) of 1, 2, 5 times a power of ten: grid steps that keep round reserves round."""
    exponent = math.floor(math.log10(x))
    candidates = [m * 10.0**e for e in (exponent, exponent + 1) for m in (1, 2, 5)]
    return min(candidates, key=lambda c: abs(math.log(c / x)))


def choose_value_scale(
    bids: Tensor, n_bidders: int, grid: float = 0.01, device=None, bandwidth: float | None = None
) -> ValueScale:
    """The value grid the logged bids need, in their own units.

    The highest bid b is the best response of the highest type, t = b + G(b) / g(b) with G the
    highest competing bid's CDF (1 there) and g = (n - 1) f(b), f the bid density at the top. A
    rough t, with f read off the bids within a bandwidth of the top, sets the unit (the grid step).
    The top is then the largest value of the point's value curve (`point_value_curve`: the value sieve, or the
    local inversion), rounded up to the grid. Values above the top the fit implies are not cut: the grid
    reaches it, at least one cell above the highest bid.
    """
    bids = equilibrium_bids(bids.flatten().to(device))
    top_bid = float(bids.max())
    lattice = effective_lattice(bids, bandwidth)
    # Rounded bids: a window narrower than the rounding step would see one lattice point (a top of 5-7 for values
    # on [0, 1] with bids rounded to 0.05).
    h = max(1.06 * float(bids.std()) * bids.numel() ** -0.2, 1e-12 * top_bid, LATTICE_CELLS * (lattice or 0.0))
    density = float((bids >= top_bid - h).sum()) / (bids.numel() * h)
    top_value = top_bid + 1.0 / ((n_bidders - 1) * density)
    unit = nice_step(grid * top_value) / grid
    _, values, _, _, _ = point_value_curve(bids / unit, n_bidders, grid, None if bandwidth is None else bandwidth / unit,
                                        None if lattice is None else lattice / unit)
    # A fitted density near 0 at the top would put the top anywhere: at most twice the rough one.
    largest = min(float(values[-1]), 2 * top_value / unit)
    top = max(math.ceil(largest / grid - 1e-9), round(top_bid / unit / grid) + 1) * grid
    return ValueScale(unit, top, top_value)


def without_zero_bids(bids: Tensor) -> Tensor:
    """``bids`` (checked by `check_bids`) without the exact zeros rounding does not explain (`excess_zeros`) when
    they are more than `ZERO_WARN` of the bids.

    Continuous values bid 0 with probability 0 in equilibrium, so a pile of zeros is bids that were not made
    (logged as 0): measured on 2% zeros (U[0, 1], F = v^2, Beta(2, 2)), kept they raise every inverted value by
    0.02 / ((n - 1) f(b)) and cost 2-5x the sampling error at high reserves; dropped, the rest is the same
    equilibrium sample."""
    check_bids(bids)
    excess = excess_zeros(bids)
    if excess <= ZERO_WARN * bids.numel():
        return bids
    zero = (bids == 0).nonzero().flatten()[:excess]  # the zeros beyond what rounding explains (`excess_zeros`)
    keep = torch.ones_like(bids, dtype=torch.bool)
    keep[zero] = False
    return bids[keep]


def equilibrium_bids(bids: Tensor) -> Tensor:
    """``bids`` without what no equilibrium of continuous values bids: the excess zeros (`without_zero_bids`) and
    the excess of each mass point (`pipeline.games.bid_checks.without_mass_points`)."""
    return without_mass_points(without_zero_bids(bids))


def effective_lattice(bids: Tensor, bandwidth: float | None = None) -> float | None:
    """The bids' rounding step (`bid_lattice`, data units) when it is coarse enough to matter: at least 1/8 of the
    smoothing bandwidth (``bandwidth``, None: `default_bandwidth`). Finer rounding (continuous bids written to 4
    decimals) changes the fitted CDF by less than the fit's own noise; None then."""
    found = bid_lattice(bids)
    if found is None:
        return None
    width = default_bandwidth(torch.as_tensor(bids, dtype=torch.float64).flatten()) if bandwidth is None else bandwidth
    return found[0] if found[0] >= width / 8 else None


def known_value_scale(top_value: float, grid: float = 0.01) -> ValueScale:
    """The value grid for values known to lie in [0, top_value] (data units), instead of estimating it."""
    if top_value <= 0:
        raise ValueError(f"value_top={top_value}: the largest possible value must be > 0")
    unit = nice_step(grid * top_value) / grid
    return ValueScale(unit, top_value / unit, top_value)


@dataclass
class Counterfactuals:
    """What `predict_counterfactuals` found: the reported table, the raw bounds, and what was clamped."""

    table: dict[str, float]  # the reported keys (see the module docstring), in the data's units
    raw: dict[str, float]  # lower/upper bounds as the optimiser left them, before any clamp
    clamps: list[str]  # one line per reported bound that differs from its raw value
    scale: ValueScale
    value_top: float = math.nan  # the point estimate's largest value, data units
    tail_value: float = math.nan  # the value with `TAIL_SHARE` of the estimated values above it, data units
    lattice: float | None = None  # the bids' rounding step when it mattered (`effective_lattice`), data units
    value_top_sd: float = math.nan  # the sampling SD of ``value_top`` (`first_order_values`), data units
    plug_in: dict[str, float] = field(default_factory=dict)  # each point before `top_shrink` (the bounds hold these)
    inversion: str = ""  # which inversion gave the point's value curve, one line (`point_value_curve`)
    point_sd: dict[str, float] = field(default_factory=dict)  # second-price points' SDs (value sieve), data units
    floor_sd: dict[str, float] = field(default_factory=dict)  # the values' own sampling SD there (`plug_in_sd`)
    untrusted: dict[float, str] = field(default_factory=dict)  # second-price reserves not to be trusted, and why
    skipped: dict[str, str] = field(default_factory=dict)  # rules not estimated, and why (a reserve in the logs)
    logged_reserve: float | None = None  # the hard reserve the logged auctions had (`reserve_counterfactuals`)
    shrink: dict[float, float] = field(default_factory=dict)  # second-price reserve -> the factor on its plug-in
    share_under_reserve: tuple[float, float] | None = None  # F(logged reserve) and its SD (`reserve_counterfactuals`)

    def untrusted_reserves(self, reserves: Sequence[float]) -> list[float]:
        """The reserves among ``reserves`` whose second-price point is not to be trusted (`untrusted_reserves`)."""
        return [r for r in reserves if any(math.isclose(r, u, rel_tol=1e-9, abs_tol=1e-12) for u in self.untrusted)]

    def top_reserves(self, reserves: Sequence[float]) -> list[float]:
        """The reserves whose point rests on the estimated top alone: at or above `tail_value`, where fewer than
        `TAIL_SHARE` of the values lie, read off the few highest bids and the top model (`top_density`)."""
        return [r for r in reserves if r >= self.tail_value]

    def shrunk_reserves(self, reserves: Sequence[float]) -> list[float]:
        """The reserves whose second-price points are shrunk toward 0 (`point_shrink`, `top_shrink`)."""
        return [r for r in reserves if self.shrink.get(r, 1.0) < 1.0]




def top_shrink(reserve: float, top: float, top_sd: float) -> float:
    """The factor on a second-price point at ``reserve`` when the values' top is estimated as ``top`` with SD ``top_sd``.

    Within `TOP_BAND` SDs below the top, whether any value lies above the reserve is within the top's noise: the
    revenue there, n r f(top) (top - r) to first order, is linear in an overshoot of the top, so the plug-in reads
    +0.4 n r f SD where the true top is the reserve (and 0 can never be undershot). The factor (top - r) /
    (`TOP_BAND` SD) takes the plug-in down to what the data support: 0 at the top, in full from `TOP_BAND` SDs below.
    """
    if not top_sd > 0:
        return 1.0
    return min(1.0, max(0.0, (top - reserve) / (TOP_BAND * top_sd)))


def predict_counterfactuals(
    bids: Tensor | Sequence[float],
    n_bidders: int,
    rules: Sequence[str],
    epsilons: Sequence[float] = DEFAULT_EPSILONS,
    statistic: str = "revenue",
    n_iters: int = DEFAULT_ITERS,
    device=None,
    grid: float = 0.01,
    bandwidth: float | None = None,
    point_iters: int = DEFAULT_POINT_ITERS,
    scale: ValueScale | None = None,
    headroom: float = 1.5,
    reserve_in_logs: float | str | None = "detect",
) -> Counterfactuals:
    """Point estimate and epsilon bounds of ``statistic`` under each rule, from logged first-price bids.

    ``reserve_in_logs``: a hard reserve the logged auctions had (`reserve_counterfactuals`); "detect" reads it off the
    bids (`pipeline.games.bid_checks.logged_reserve`), None declares there was none.

    Bids, reserves, epsilons (regrets) and the results are in the data's own units; ``grid`` is
    the bid grid's step as a fraction of the value scale (`choose_value_scale`; pass ``scale`` to
    fix it). The point estimate's types stop at the scale's top; the bounds range over types up to
    ``headroom`` times it, so that bids shaded more than the equilibrium (values above what the
    equilibrium inversion implies) stay epsilon-consistent with their true values. ``bandwidth``
    smooths the logged bids, in the data's units (see `fit_logged_auction`, `inverted_value_cdf`).
    The point's value distribution is `inverted_value_cdf`'s: second price reads it directly
    (`second_price_point`), first price plays fictitious play with it binned into the type cells
    (`value_type_weights`), and the bounds start from that grid profile with the point's types
    (`value_point_mask`) added to every epsilon's consistent set. A second-price point within `TOP_BAND` SDs
    below the estimated top is shrunk toward 0 (`top_shrink`; ``plug_in`` keeps it before, the bounds hold that).
    ``n_iters`` is the bounds' iteration count, ``point_iters`` the point estimate's: that one is
    cheap (one profile, no gradient) and, on first price, its average still sat 0.004-0.006 below
    the equilibrium revenue after 200 iterations, 0.001 after 800 (the error shrinks like 1/k).

    The exact bounds contain the point (it is feasible; for second price up to the grid's
    discreteness, 0.001-0.004 on a 0.01 grid, since the bounds play on the grid) and widen with
    epsilon (the feasible sets grow). The reported ones are forced to: each is the min/max with the point and with the bounds
    of every smaller epsilon. A clamp that changes a number means the optimiser fell short; each
    one is listed in ``clamps`` and the unclamped numbers are in ``raw``. An epsilon of 0 gives
    bounds close to, not equal to, the point: they still range over types that are exactly tied
    best responses for a bid (about +-0.005-0.01 on 1,000-5,000 bids).
    """
    if statistic not in STATISTICS:
        raise ValueError(f"statistic={statistic!r}; choose one of {STATISTICS}")
    if any(e < 0 for e in epsilons):
        raise ValueError(f"epsilons={list(epsilons)}: every epsilon must be >= 0")
    epsilons = sorted(set(float(e) for e in epsilons))
    bids = torch.as_tensor(bids, dtype=torch.float64).flatten()
    check_bids(bids)
    reserve = logged_reserve(bids) if reserve_in_logs == "detect" else reserve_in_logs
    if reserve is not None:
        return reserve_counterfactuals(bids, n_bidders, rules, float(reserve), statistic, bandwidth)
    bids = equilibrium_bids(bids)
    if scale is None:
        scale = choose_value_scale(bids, n_bidders, grid, device, None if bandwidth is None else float(bandwidth))
    unit = scale.unit
    lattice = effective_lattice(bids, None if bandwidth is None else float(bandwidth))
    internal_lattice = None if lattice is None else lattice / unit
    # The point reads a bandwidth only when one is given (the local inversion widens it to the cells by itself).
    point_bandwidth = None if bandwidth is None else float(bandwidth) / unit
    if lattice is not None:  # the logged game's smoothing spans the rounding cells too
        bandwidth = max(default_bandwidth(bids) if bandwidth is None else float(bandwidth), LATTICE_CELLS * lattice)
    internal_bandwidth = None if bandwidth is None else bandwidth / unit
    if headroom < 1:
        raise ValueError(f"headroom={headroom}: the bounds' type space cannot be smaller than the point's (use >= 1)")
    top = math.ceil(scale.top * headroom / grid - 1e-9) * grid
    logged = fit_logged_auction(bids / unit, n_bidders, grid, device, internal_bandwidth, top=top)
    points, values, cdf, top_sd, inversion = point_value_curve(bids.to(logged.actions.device) / unit, n_bidders, grid,
                                                               point_bandwidth, internal_lattice)
    point_mask = curve_point_mask(logged, values, points, scale.top)
    type_weights = value_type_weights(values, cdf, logged.actions, scale.top)
    # The value sieve's SDs and the values' own sampling SD at the second-price reserves (`point_shrink`, trust).
    second_rules = [parse_rule(name) for name in rules if parse_rule(name).kind == "second_price"]
    sieve = point_sieve(bids / unit, n_bidders, point_bandwidth, internal_lattice)
    sd = floor = [math.nan] * len(second_rules)
    at = [rule.reserve / unit for rule in second_rules]
    sieve_points, rivals = None, None
    if sieve is not None and second_rules:
        welfare = statistic == "welfare"
        points_at, sd = sieve.revenue_sd(at, welfare)
        sieve_points, sd = (points_at * unit).tolist(), (sd * unit).tolist()
        floor = (plug_in_sd(sieve.curves(), sieve.counts, torch.tensor(at, dtype=torch.float64),
                            max(1, bids.numel() // n_bidders), welfare) * unit).tolist()
        rivals = {label: [v * unit for v in revenues] for label, revenues in sieve.rival_revenues(at, welfare).items()}
        _, local_values, local_cdf, _ = inverted_value_curve(bids / unit, n_bidders, grid, None, internal_lattice)
        rivals["local inversion"] = [second_price_point(local_values, local_cdf, n_bidders, r, statistic, scale.top) * unit
                                     for r in at]
    sd_at = {rule.name: s for rule, s in zip(second_rules, sd)}
    table: dict[str, float] = {}
    raw: dict[str, float] = {}
    clamps: list[str] = []
    plug_ins: dict[str, float] = {}
    factors: dict[float, float] = {}
    internal_eps = [e / unit for e in epsilons]
    for name in rules:
        rule = parse_rule(name)
        inside = Rule(rule.kind, reserve=rule.reserve / unit, n_bidders=rule.n_bidders)
        n_new = rule.bidders(n_bidders)
        second = rule.kind == "second_price"
        # Second price: truthful bidding, a functional of the value CDF (no grid); the grid equilibrium then only
        # starts the bounds.
        start = None if second and not epsilons else solve_equilibrium(
            type_weights, logged.types, inside, n_new, logged.actions, point_iters)
        if second:
            plug_in = second_price_point(values, cdf, n_new, inside.reserve, statistic, scale.top) * unit
            factor = (point_shrink(plug_in, sd_at[rule.name]) if sieve is not None else
                      top_shrink(inside.reserve, min(float(values[-1]), scale.top), top_sd))
            point = plug_in * factor
            factors[rule.reserve] = factor
        else:
            plug_in = point = start.value(statistic) * unit
        table[result_key(rule, "point", statistic)] = point
        plug_ins[result_key(rule, "point", statistic)] = plug_in
        if not epsilons:
            continue
        lower, upper = solve_bounds([logged], start, inside, n_new, logged.actions, logged.types, internal_eps,
                                    statistic, n_iters, [point_mask])
        # The bounds hold the plug-in (their own value curve's point; a clamp is the optimiser's shortfall); a point
        # shrunk toward 0 (`point_shrink`, `top_shrink`) takes the lower bounds down with it, not counted as a clamp.
        reported, raw_bounds, lines = reported_bounds(rule, statistic, epsilons, plug_in, lower * unit, upper * unit,
                                                      scale.top * unit)
        reported = {k: min(v, point) if "/lower_eps" in k else v for k, v in reported.items()}
        table |= reported
        raw |= raw_bounds
        clamps += lines
    tail = interp(cdf.new_tensor([1 - TAIL_SHARE]), cdf, values)
    found = Counterfactuals(table, raw, clamps, scale, float(values[-1]) * unit, float(tail) * unit, lattice,
                            top_sd * unit, plug_ins, inversion)
    found.shrink = factors
    if sieve is not None and second_rules:
        found.point_sd = {result_key(rule, "point", statistic): v for rule, v in zip(second_rules, sd)}
        found.floor_sd = {result_key(rule, "point", statistic): v for rule, v in zip(second_rules, floor)}
    found.untrusted = untrusted_reserves([rule.reserve for rule in second_rules], sd, floor, found.value_top,
                                         found.value_top_sd, sieve_points, rivals, found.tail_value)
    return found


NOT_IDENTIFIED = ("values under the logged reserve {reserve:g} never bid, so only their share is known: second price "
                  "with a lower reserve and first price are not estimated; robust bounds are not computed for such logs")


def reserve_counterfactuals(
    bids: Tensor, n_bidders: int, rules: Sequence[str], reserve: float, statistic: str = "revenue",
    bandwidth: float | None = None,
) -> Counterfactuals:
    """Second-price points from logs of auctions that had a hard ``reserve`` R (data units): the values under R did
    not bid, logged as bids of 0 (each a non-bid: P = F(R)) or not logged at all (no zeros: only the auctions where
    everybody bid; F(R) is then read off the bids' shape near R).

    The value sieve's ``cdf`` family with the bids starting at R (`pipeline.games.value_sieve`, known truncation).
    Only F above R and F(R) are identified, so second price with a reserve under R and first price (whose revenue
    depends on the values under R) are not estimated: ``skipped`` names them with the reason. No bounds."""
    if bandwidth is not None:
        raise ValueError(f"the bids start at a hard reserve {reserve:g} (values under it did not bid): a log with a "
                         "reserve is read by the value sieve, which takes no bandwidth; drop task.bandwidth")
    bids = torch.as_tensor(bids, dtype=torch.float64).flatten().cpu()
    zeros = int((bids == 0).sum())
    positive = without_mass_points(bids[bids > 0])
    if positive.numel() < MIN_BIDS:
        raise ValueError(f"the bids start at a hard reserve {reserve:g}, and only {positive.numel()} bids lie above it: "
                         f"the value sieve needs at least {MIN_BIDS}")
    lattice = effective_lattice(positive)
    sieve = fit_sieve([positive], n_bidders, lattice, ("cdf",), reserve=reserve, zeros=[zeros] if zeros else None,
                      complete_only=zeros == 0)
    second = [parse_rule(name) for name in rules if parse_rule(name).kind == "second_price"]
    kept = [rule for rule in second if rule.reserve >= reserve - 1e-12]
    why = NOT_IDENTIFIED.format(reserve=reserve)
    skipped = {parse_rule(name).name: why for name in rules if parse_rule(name) not in kept}
    welfare = statistic == "welfare"
    at = [rule.reserve for rule in kept]
    top, top_sd = sieve.top_sd()
    _, values, cdf = sieve.curves()
    tail = float(interp(cdf.new_tensor([1 - TAIL_SHARE]), cdf[0], values[0]))
    table, plug_ins, sd_table, floor_table, factors = {}, {}, {}, {}, {}
    sd, floor = [], []
    if kept:
        points, sd_tensor = sieve.revenue_sd(at, welfare)
        floor = plug_in_sd(sieve.curves(), sieve.counts, torch.tensor(at, dtype=torch.float64),
                           max(1, (positive.numel() + zeros) // n_bidders), welfare).tolist()
        sd = sd_tensor.tolist()
        for rule, point, s, f in zip(kept, points.tolist(), sd, floor):
            key = result_key(rule, "point", statistic)
            plug_ins[key] = point
            factors[rule.reserve] = point_shrink(point, s)
            table[key] = point * factors[rule.reserve]
            sd_table[key], floor_table[key] = s, f
        rivals = sieve.rival_revenues(at, welfare)
    found = Counterfactuals(table, {}, [], known_value_scale(top), top, tail, lattice, top_sd, plug_ins,
                            f"value sieve with the logged reserve {reserve:g} as a known truncation "
                            f"({'zeros as non-bids' if zeros else 'complete auctions only'}): {sieve.describe()}")
    found.point_sd, found.floor_sd = sd_table, floor_table
    found.untrusted = untrusted_reserves(at, sd, floor, top, top_sd, [plug_ins[k] for k in sd_table],
                                         rivals if kept else None, tail)
    found.skipped, found.logged_reserve, found.shrink = skipped, reserve, factors
    share, share_sd = sieve.statistic_sd(lambda curves: curves[2][:, 0])  # F(R), the CDF where the bids start
    found.share_under_reserve = (float(share[0]), float(share_sd[0]))
    return found


def clamp_bounds(point: float, lower: Tensor, upper: Tensor) -> tuple[Tensor, Tensor]:
    """Bounds (ordered by increasing epsilon) forced around the point and monotone in epsilon."""
    return torch.cummin(lower.clamp(max=point), 0).values, torch.cummax(upper.clamp(min=point), 0).values


def reported_bounds(
    rule: Rule, statistic: str, epsilons: Sequence[float], point: float, lower: Tensor, upper: Tensor, value_range: float
) -> tuple[dict[str, float], dict[str, float], list[str]]:
    """One rule's bounds as reported (`clamp_bounds`), as the optimiser left them, and one line per clamp
    (the move and its share of ``value_range``), all in the data's units: (reported, raw, clamp lines)."""
    reported_lower, reported_upper = clamp_bounds(point, lower, upper)
    reported: dict[str, float] = {}
    raw: dict[str, float] = {}
    lines: list[str] = []
    for i, eps in enumerate(epsilons):
        for side, raw_value, value in (("lower", lower, reported_lower), ("upper", upper, reported_upper)):
            key = result_key(rule, f"{side}_eps{eps_label(eps)}", statistic)
            raw[key], reported[key] = float(raw_value[i]), float(value[i])
            if reported[key] != raw[key]:
                move = reported[key] - raw[key]
                lines.append(f"{key}: raw {raw[key]:.8g} reported {reported[key]:.8g} (moved {move:+.2g}, "
                             f"{abs(move) / value_range:.1g} of the value range; point {point:.6g})")
    return reported, raw, lines


def counterfactual_table(bids, n_bidders: int, rules: Sequence[str], *args, **kwargs) -> dict[str, float]:
    """The reported table of `predict_counterfactuals` (same arguments)."""
    return predict_counterfactuals(bids, n_bidders, rules, *args, **kwargs).table


def truth_table(
    n_bidders: int, rules: Sequence[str], statistic: str = "revenue", value_scale: float = 1.0
) -> dict[str, float]:
    """``<prefix>/<rule>/truth`` for values U[0, value_scale]: the new game's equilibrium under the true values."""
    return {
        result_key(rule, "truth", statistic): truth(rule, n_bidders, statistic, value_scale) for rule in rules
    }

"""Counterfactual revenue and welfare from first-price logs of ASYMMETRIC bidders.

Inversion (`inverted_value_cdfs`, off the grid). By default every bidder's value distribution is the value
sieve's inverse-bid family (`asymmetric_sieve`, `pipeline.games.value_sieve`): one inverse bid function per
bidder, the bid CDFs from the first-order conditions in closed form, the degree by BIC, with SDs. With a
bandwidth given or few auctions, the local inversion: bidder i's bid b is a best response against the
distribution H_i of its own highest competing bid M_i = max_{j != i} b_j, so its value is
v_i(b) = b + H_i(b) / h_i(b) (the asymmetric first-order condition), H_i and h_i the level and slope
of a local quadratic fit to the empirical CDF of M_i (`pipeline.games.rmac.local_cdf_fit`: no
first-order bias at the top of the bids, where the strong bidder's top values are decided). Its
value CDF points are P(V_i <= v_i(b)) = G_i(b), G_i the empirical CDF of its own bids.

Second price (`pipeline.games.rmac.second_price_from_cdfs`, shared with symmetric bidders): bidding
the value is dominant, so revenue and welfare are integrals of the highest and second-highest
value's CDFs under the per-bidder value CDFs.

First price (`first_price_equilibrium`): no closed form for asymmetric bidders, so fictitious play
on a bid grid with one type distribution and one mixed strategy per bidder, each best-responding
to the product of the OTHER bidders' bid CDFs (ties split at random). Only rules with the logged
number of bidders are solved: with another number nobody says whose values the new bidders have.

Robust bounds (`asymmetric_bounds`): the RMAC bounds of `pipeline.games.solver.solve_bounds` with one
population per bidder: each logged bid of bidder i takes a type for which it has regret <= eps
against i's own highest competing bid, and a new-game bid with regret <= eps against the other
bidders' bid distributions (never the pooled, symmetric bounds).

Not estimated (the record says so, and no number is reported): first-price rules with a number of
bidders other than the logged one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from pipeline.games.bid_checks import spread_in_cells
from pipeline.games.rmac import (
    ValueScale,
    curve_point_mask,
    default_bandwidth,
    effective_lattice,
    first_order_values,
    fit_logged_auction,
    interp,
    nice_step,
    reported_bounds,
    result_key,
    second_price_from_cdfs,
    top_shrink,
    type_grid,
    value_type_weights,
)
from pipeline.games.rules import Rule, parse_rule
from pipeline.games.solver import DEFAULT_ITERS, Equilibrium, solve_bounds, solve_equilibrium
from pipeline.games.value_sieve import (
    MIN_BIDS,
    TAIL_SHARE,
    fit_sieve,
    plug_in_sd,
    point_shrink,
    untrusted_reserves,
)

NOT_ESTIMATED = (
    "first-price rules with another number of bidders than the logged one are not estimated for asymmetric "
    "bidders (which value distributions the added or missing bidders would have is unknown)"
)
ESTIMATED = (
    "point estimates and RMAC robust bounds (one population per bidder, each inverted against its own highest "
    "competing bid) of second price (any reserve) and of first price with the logged number of bidders"
)
CDF_POINTS = 400  # where each bidder's competing-bid CDF is fitted: this many steps over the bids' range
FIRST_PRICE_CELLS = 200  # the first-price grid: bids and type cells of top / this, top the largest value
FIRST_PRICE_ITERS = 1000


def asymmetric_uniform_equilibrium(
    n_auctions: int, tops: tuple[float, float] = (1.0, 2.0), seed: int = 0
) -> tuple[Tensor, Tensor]:
    """Two bidders with values U[0, w1], U[0, w2] (w1 < w2) in their first-price equilibrium: (bids, values).

    With k = 1/w1^2 - 1/w2^2 the inverse bid functions are v1(b) = 2b / (1 + k b^2) and
    v2(b) = 2b / (1 - k b^2), both bidding up to w1 w2 / (w1 + w2) (Krishna, Auction Theory, 4.3).
    """
    w1, w2 = tops
    generator = torch.Generator().manual_seed(seed)
    values = torch.rand(n_auctions, 2, generator=generator, dtype=torch.float64) * torch.tensor([w1, w2])
    k = 1 / w1**2 - 1 / w2**2
    weak = (1 - torch.sqrt(1 - k * values[:, 0] ** 2)) / (k * values[:, 0])
    strong = (-1 + torch.sqrt(1 + k * values[:, 1] ** 2)) / (k * values[:, 1])
    return torch.stack([weak, strong], 1), values


def highest_competing_bids(table: Tensor) -> Tensor:
    """(auctions, bidders): for each auction and bidder, the highest bid of the others."""
    n = table.shape[1]
    diagonal = torch.eye(n, dtype=torch.bool, device=table.device)
    others = table.unsqueeze(1).expand(-1, n, -1).masked_fill(diagonal, float("-inf"))
    return others.max(2).values


# ---------------------------------------------------------------------------------------------------
# Inversion


def _empirical_cdf(sample: Tensor, at: Tensor) -> Tensor:
    """P(X <= at) over ``sample``."""
    return torch.searchsorted(sample.sort().values.contiguous(), at.contiguous(), right=True).double() / sample.numel()


def inverted_value_cdf_of_bidder(
    bids: Tensor, competing: Tensor, bandwidth: float | None = None, n_points: int = CDF_POINTS
) -> tuple[Tensor, Tensor, Tensor, float]:
    """One bidder's value CDF as points (values (E,), CDF (E,)) to interpolate between, the bids (E,) they invert,
    and the sampling SD of its top value (`pipeline.games.rmac.first_order_values`).

    ``bids`` are its logged bids, ``competing`` the highest other bid of the same auctions. The
    CDF of the competing bids is read at ``n_points`` steps over the range of both (plus the
    bidder's own lowest and highest bid) and fitted there by `local_cdf_fit` (``bandwidth`` in bid
    units, None: `default_bandwidth` of the competing bids); it is known to be 0 at the bottom of
    that range and 1 at its top, where the fit is held. At each point b of the bidder's own bid
    range v(b) = b + H(b) / h(b) and P(V <= v(b)) = G(b), G its bids' empirical CDF (0 at its
    lowest bid, 1 at its highest). The v's are kept increasing by a running minimum from the top
    (as in `pipeline.games.rmac.inverted_value_cdf`).
    """
    bids, competing = bids.flatten().double(), competing.flatten().double()
    lo = min(float(bids.min()), float(competing.min()))
    hi = max(float(bids.max()), float(competing.max()))
    spread = hi - lo
    if spread <= 0:
        raise ValueError("every logged bid is the same: there is nothing to invert")
    step = spread / n_points
    regular = lo + step * torch.arange(n_points + 1, dtype=torch.float64, device=bids.device)
    regular[-1] = hi
    edge = torch.cat([regular, bids.min()[None], bids.max()[None]]).unique()  # sorted
    if float(competing.max()) - float(competing.min()) < 3 * step:
        raise ValueError(f"the highest competing bids span {float(competing.max()) - float(competing.min()):g}, "
                         f"under 3 / {n_points} of all bids' range: too little to invert against")
    cells = (default_bandwidth(competing) if bandwidth is None else float(bandwidth)) / step
    empirical = _empirical_cdf(competing, edge)
    empirical[0], empirical[-1] = 0.0, 1.0  # the CDF just below the lowest and at the highest bid
    own = (edge >= float(bids.min())) & (edge <= float(bids.max()))
    if int(own.sum()) < 4:
        raise ValueError(f"a bidder's bids span {float(bids.max()) - float(bids.min()):g}, under 3 / {n_points} of "
                         "all bids' range: too little to invert its values")
    values, sd = first_order_values(edge / step, empirical, cells, step, 1, spread, competing.numel())
    values, points = values[own], edge[own]
    cdf = _empirical_cdf(bids, points)
    cdf[0], cdf[-1] = 0.0, 1.0
    return values.flip(0).cummin(0).values.flip(0), cdf, points, float(sd[own][-1])


def _highest_top(inversions: list[tuple[Tensor, Tensor, Tensor, float]]) -> tuple[float, float]:
    """(top, its SD) of the bidder with the highest top value (`_inversions`)."""
    return max((float(values[-1]), sd) for values, _, _, sd in inversions)


def _rough_top(bids: Tensor, competing: Tensor) -> float:
    """b + H(b) / h(b) at the bidder's highest bid, H and h of its highest competing bid (window estimate)."""
    b = float(bids.max())
    width = max(1.06 * float(competing.std()) * competing.numel() ** -0.2, 1e-12)
    cdf = float((competing <= b).double().mean())
    density = float(((competing - b).abs() <= width / 2).double().mean()) / width
    if density <= 0:  # nobody competes near the top: the highest bid wins surely, its value is unbounded
        density = 1.0 / (competing.numel() * width)
    return b + cdf / density


def inverted_value_cdfs(
    table: Tensor, bandwidth: float | None = None, max_value: float | None = None
) -> list[tuple[Tensor, Tensor]]:
    """Per bidder (columns of the (auctions, bidders) ``table``), its value CDF points (`inverted_value_cdf_of_bidder`).

    Values above ``max_value`` (None: twice the bidder's rough top b_max + H(b_max) / h(b_max),
    h from a window; a fitted density near 0 at the top would put the top anywhere) count as it.
    """
    return [(values, cdf) for values, cdf, _, _ in _inversions(table, bandwidth, max_value)]


def asymmetric_sieve(table: Tensor, bandwidth: float | None = None):
    """Every bidder's value distribution by the value sieve's ``inverse`` family (`pipeline.games.value_sieve`: one
    inverse bid function per bidder, the bid CDFs from the first-order conditions; bids on a rounding lattice
    censored to their cells), or None where the local inversion is used instead: a ``bandwidth`` given, under
    `MIN_BIDS` auctions, or a bidder who always bids the same."""
    table = torch.as_tensor(table, dtype=torch.float64)
    if bandwidth is not None or table.shape[0] < MIN_BIDS or bool((table.amax(0) <= table.amin(0)).any()):
        return None  # (a bidder with one bid: the local inversion refuses it by name)
    lattice = effective_lattice(table.flatten(), bandwidth)
    return fit_sieve([table[:, i].cpu() for i in range(table.shape[1])], table.shape[1], lattice)


def _inversions(
    table: Tensor, bandwidth: float | None = None, max_value: float | None = None, local: bool = False
) -> list[tuple[Tensor, Tensor, Tensor, float]]:
    """`inverted_value_cdfs` with the bids each value point inverts and the top's SD: per bidder (values, cdf, bids,
    top SD). The value sieve (`asymmetric_sieve`; every bidder's top SD is that of the highest top) where it
    applies and ``local`` is not asked for, else the local inversion."""
    table = torch.as_tensor(table, dtype=torch.float64)
    sieve = None if local else asymmetric_sieve(table, bandwidth)
    if sieve is not None:
        bids, values, cdf = (x.to(table.device) for x in sieve.curves())
        _, top_sd = sieve.top_sd()
        cap = math.inf if max_value is None else float(max_value)
        return [(values[i].clamp_max(cap), cdf[i], bids[i], top_sd) for i in range(table.shape[1])]
    if (lattice := effective_lattice(table.flatten(), bandwidth)) is not None:
        table = spread_in_cells(table, lattice)  # rounded bids: censored to their cells (`spread_in_cells`)
    competing = highest_competing_bids(table)
    out = []
    for i in range(table.shape[1]):
        try:
            values, cdf, points, top_sd = inverted_value_cdf_of_bidder(table[:, i], competing[:, i], bandwidth)
        except ValueError as error:
            raise ValueError(f"bidder {i} (column {i} of the bids): {error}") from error
        cap = 2 * _rough_top(table[:, i], competing[:, i]) if max_value is None else float(max_value)
        out.append((values.clamp_max(cap), cdf, points, top_sd))
    return out


# ---------------------------------------------------------------------------------------------------
# First price (second price needs no game: `pipeline.games.rmac.second_price_from_cdfs`)


def first_price_equilibrium(
    type_weights: Tensor, types: Tensor, actions: Tensor, reserve: float = 0.0, n_iters: int = FIRST_PRICE_ITERS,
) -> Equilibrium:
    """First price with ``reserve`` for one bidder per row of ``type_weights`` (bidders, T): `solve_equilibrium`
    with every bidder its own population."""
    bidders = [1] * type_weights.shape[0]
    return solve_equilibrium(type_weights, types, Rule("first_price", reserve=reserve), bidders, actions, n_iters)


def first_price_grid(top: float, cells: int = FIRST_PRICE_CELLS, reserve: float = 0.0, device=None) -> tuple[Tensor, Tensor]:
    """(actions, types): bids 0, top / cells, ..., top and the reserve, types at the midpoints of the cells between them.

    The reserve is a grid point: otherwise the lowest allowed bid sits up to a cell above it and the
    cell around it is all in or all out (with 200 cells, revenue 0.0013 high on U[0, 1] x U[0, 1.5]
    at r = 0.25, 0.001 low at r = 0.5, against the backward-shooting solution).
    """
    actions = torch.arange(cells + 1, dtype=torch.float64, device=device) * (top / cells)
    if 0 < reserve < top:
        actions = torch.cat([actions, actions.new_tensor([float(reserve)])]).unique()
    return actions, type_grid(actions)


def first_price_from_cdfs(
    cdfs: Sequence[tuple[Tensor, Tensor]], reserve: float = 0.0, cells: int = FIRST_PRICE_CELLS,
    n_iters: int = FIRST_PRICE_ITERS,
) -> Equilibrium:
    """First price for bidders with these value CDFs ((values, cdf) points), their mass binned into the
    type cells of a grid up to the largest value (`first_price_grid`, `value_type_weights`)."""
    top = max(float(values[-1]) for values, _ in cdfs)
    actions, types = first_price_grid(top, cells, reserve, cdfs[0][0].device)
    weights = torch.stack([value_type_weights(values, cdf, actions) for values, cdf in cdfs])
    return first_price_equilibrium(weights / weights.sum(1, keepdim=True), types, actions, reserve, n_iters)


# ---------------------------------------------------------------------------------------------------
# Robust bounds


def asymmetric_bounds(
    table: Tensor,
    rules: Sequence[str],
    points: dict[str, float],
    epsilons: Sequence[float],
    statistics: Sequence[str] = ("revenue",),
    grid: float = 0.01,
    device=None,
    scale: ValueScale | None = None,
    n_iters: int = DEFAULT_ITERS,
    headroom: float = 1.5,
    plug_ins: dict[str, float] | None = None,
) -> tuple[dict[str, float], list[str]]:
    """``<prefix>/<rule>/lower_eps<e>`` and ``upper_eps<e>`` for every statistic and every rule that ``points``
    (`asymmetric_table`) has a point for, and the clamps (as `pipeline.games.rmac.predict_counterfactuals`' ``clamps``).
    ``plug_ins``: each point before its shrink toward 0 (`AsymmetricPoint.plug_in`; None: the points are undone by
    the local inversion's `top_shrink`).

    The grid: step ``grid`` of the value unit (`pipeline.games.rmac.nice_step` of the largest inverted
    value, or ``scale``'s), types up to ``headroom`` times that value, so that bids shaded more than
    the inversion implies stay epsilon-consistent with their true values. Each bidder's logged game is
    `pipeline.games.rmac.fit_logged_auction` against its own highest competing bids. The bounds start
    from the grid equilibrium (`pipeline.games.solver.solve_equilibrium`) of the point's per-bidder value distributions, whose
    types are added to every epsilon's consistent set; each reported bound is then forced around the
    point and monotone in epsilon (`pipeline.games.rmac.clamp_bounds`), every change listed.
    """
    table = torch.as_tensor(table, dtype=torch.float64).to(device)
    inversions = _inversions(table, max_value=None if scale is None else scale.top * scale.unit)
    top_value = max(float(values[-1]) for values, _, _, _ in inversions)
    unit = scale.unit if scale is not None else nice_step(grid * top_value) / grid
    top = math.ceil(top_value / unit * headroom / grid - 1e-9) * grid
    competing = highest_competing_bids(table)
    logged = [fit_logged_auction(table[:, j] / unit, 2, grid, device, top=top, opponents=competing[:, j] / unit)
              for j in range(table.shape[1])]
    actions, types = logged[0].actions, logged[0].types
    weights = torch.stack([value_type_weights(values / unit, cdf, actions, top_value / unit)
                           for values, cdf, _, _ in inversions])
    masks = [curve_point_mask(one, values / unit, bids / unit, top_value / unit)
             for one, (values, _, bids, _) in zip(logged, inversions)]
    epsilons = sorted(set(float(e) for e in epsilons))
    out: dict[str, float] = {}
    clamps: list[str] = []
    for name in rules:
        rule = parse_rule(name)
        todo = [s for s in statistics if result_key(rule, "point", s) in points]
        if not todo or not epsilons:
            continue
        inside = Rule(rule.kind, reserve=rule.reserve / unit)
        bidders = [1] * len(logged)  # every bidder its own population
        start = solve_equilibrium(weights, types, inside, bidders, actions, FIRST_PRICE_ITERS)
        shrink = top_shrink(rule.reserve, *_highest_top(inversions)) if rule.kind == "second_price" else 1.0
        for statistic in todo:
            point = points[result_key(rule, "point", statistic)]
            lower, upper = solve_bounds(logged, start, inside, bidders, actions, types, [e / unit for e in epsilons],
                                        statistic, n_iters, masks)
            # As for alike bidders: the bounds hold the plug-in, a point shrunk near the top takes the lower ones down.
            key = result_key(rule, "point", statistic)
            plug_in = plug_ins[key] if plug_ins is not None else point / shrink if shrink > 0 else point
            reported, _, lines = reported_bounds(rule, statistic, epsilons, plug_in, lower * unit, upper * unit,
                                                 top_value)
            out |= {k: min(v, point) if "/lower_eps" in k else v for k, v in reported.items()}
            clamps += lines
    return out, clamps


# ---------------------------------------------------------------------------------------------------
# The table


@dataclass
class AsymmetricPoint:
    """What `asymmetric_point` found: the points, the skipped rules, the second-price points' SDs and the reserves
    not to be trusted (as `pipeline.games.rmac.Counterfactuals`), and which inversion made them."""

    table: dict[str, float]
    skipped: list[str]
    inversion: str
    value_top: float
    value_top_sd: float
    plug_in: dict[str, float] = field(default_factory=dict)  # each point before its shrink toward 0 (bounds hold these)
    point_sd: dict[str, float] = field(default_factory=dict)
    floor_sd: dict[str, float] = field(default_factory=dict)
    untrusted: dict[float, str] = field(default_factory=dict)

    def untrusted_reserves(self, reserves: Sequence[float]) -> list[float]:
        return [r for r in reserves if any(math.isclose(r, u, rel_tol=1e-9, abs_tol=1e-12) for u in self.untrusted)]


def asymmetric_point(
    table: Tensor, rules: Sequence[str], grid: float = 0.01, device=None, scale: ValueScale | None = None,
    bandwidth: float | None = None,
) -> AsymmetricPoint:
    """``cf/<rule>/point`` and ``cfw/<rule>/point`` per rule; the skipped rules (first price with another
    number of bidders than the table's columns) listed. ``scale`` (a known value top) caps every
    bidder's values at its top; ``grid`` sets the first-price grid (1 / grid cells up to the largest value,
    at least `FIRST_PRICE_CELLS`). Second-price points within `TOP_BAND` SDs below the highest estimated top are
    shrunk toward 0 (`top_shrink`); with the value sieve each carries its SD and the untrusted reserves are named
    (`pipeline.games.value_sieve.untrusted_reserves`)."""
    table = torch.as_tensor(table, dtype=torch.float64).to(device)
    max_value = None if scale is None else scale.top * scale.unit
    inversions = _inversions(table, bandwidth, max_value)
    sieve = asymmetric_sieve(table, bandwidth)
    cdfs = [(values, cdf) for values, cdf, _, _ in inversions]
    top, top_sd = _highest_top(inversions)
    cells = max(FIRST_PRICE_CELLS, int(math.ceil(1 / grid - 1e-9)))
    second = [parse_rule(name) for name in rules if parse_rule(name).kind == "second_price"]
    at = [rule.reserve for rule in second]
    sd = floor = [math.nan] * len(second)
    points, rivals = None, None
    if sieve is not None and second:
        points_at, sd = sieve.revenue_sd(at)
        points, sd = points_at.tolist(), sd.tolist()
        floor = plug_in_sd(sieve.curves(), sieve.counts, torch.tensor(at, dtype=torch.float64), table.shape[0]).tolist()
        local = [(values, cdf) for values, cdf, _, _ in _inversions(table, None, max_value, local=True)]
        rivals = {"local inversion": [second_price_from_cdfs(local, r)[0] for r in at]}
    sd_at = {rule.name: s for rule, s in zip(second, sd)}
    out: dict[str, float] = {}
    plug_ins: dict[str, float] = {}
    skipped: list[str] = []
    first_price: Equilibrium | None = None
    for name in rules:
        rule: Rule = parse_rule(name)
        if rule.n_bidders not in (None, table.shape[1]):
            skipped.append(rule.name)
            continue
        if rule.kind == "second_price":
            revenue, welfare = second_price_from_cdfs(cdfs, rule.reserve)
            plug_ins[result_key(rule, "point", "revenue")], plug_ins[result_key(rule, "point", "welfare")] = revenue, welfare
            # points within their noise of 0 (the sieve's SD), or the local inversion's within the top's noise
            shrink = (point_shrink(revenue, sd_at[rule.name]) if sieve is not None else
                      top_shrink(rule.reserve, top, top_sd))
            revenue, welfare = revenue * shrink, welfare * shrink
        else:
            if first_price is None:  # every first-price rule solved here has the logged bidders and no reserve
                first_price = first_price_from_cdfs(cdfs, 0.0, cells)
            revenue, welfare = first_price.revenue, first_price.welfare
            plug_ins[result_key(rule, "point", "revenue")], plug_ins[result_key(rule, "point", "welfare")] = revenue, welfare
        out[result_key(rule, "point", "revenue")] = revenue
        out[result_key(rule, "point", "welfare")] = welfare
    method = (f"value sieve: {sieve.describe()}" if sieve is not None else
              f"local inversion ({'a bandwidth given' if bandwidth is not None else f'under {MIN_BIDS} auctions'})")
    found = AsymmetricPoint(out, skipped, method, top, top_sd, plug_ins)
    if sieve is not None and second:
        found.point_sd = {result_key(rule, "point", "revenue"): v for rule, v in zip(second, sd)}
        found.floor_sd = {result_key(rule, "point", "revenue"): v for rule, v in zip(second, floor)}
    # the highest bidder's tail: the value with 1% of its estimated values above it
    tail = max(float(interp(cdf.new_tensor([1 - TAIL_SHARE]), cdf, values)) for values, cdf in cdfs)
    found.untrusted = untrusted_reserves(at, sd, floor, top, top_sd, points, rivals, tail)
    return found


def asymmetric_table(
    table: Tensor, rules: Sequence[str], grid: float = 0.01, device=None, scale: ValueScale | None = None
) -> tuple[dict[str, float], list[str]]:
    """`asymmetric_point`'s points and skipped rules."""
    found = asymmetric_point(table, rules, grid, device, scale)
    return found.table, found.skipped

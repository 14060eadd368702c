"""The new game on a bid grid, for any mix of bidders: outcomes, the equilibrium and the RMAC bounds.

ONE implementation for symmetric and asymmetric auctions. Bidders come in populations: population p
has ``bidders[p]`` alike bidders, each drawing its type from ``type_weights[p]`` and bidding from
``pmfs[p]``. A symmetric auction of n bidders is one population of n (as K = 1 is an ordinary DQN
run); an asymmetric log of n bidders is n populations of one. Alike bidders are grouped rather than
repeated because a group costs one population's work (their tie-splitting polynomial is a binomial),
so the symmetric case runs exactly the arithmetic it ran before the two solvers were merged.

- `win_and_payment`: each bidder's probability of winning and expected payment at each grid bid,
  against everyone else's bid distributions (ties split at random).
- `statistic_value`: expected revenue or welfare of a profile.
- `solve_equilibrium`: the new game's equilibrium for fixed type distributions, by fictitious play
  (the point estimate of first price; the start of the bounds).
- `solve_bounds`: the lowest and highest statistic over epsilon-consistent types and
  epsilon-equilibrium play (RMAC, Peysakhovich, Kroer & Lerer 2019), by Frank-Wolfe.

Shapes: A grid bids (``actions``), T types (``types``, cell midpoints), P populations. Every
function that takes ``bidders`` accepts an int for one population of that many alike bidders: its
tensors then have no population axis ((..., A) instead of (..., P, A)).

The inputs (type distributions, logged games, grids) come from `pipeline.games.rmac` (pooled
bidders) and `pipeline.games.asymmetric` (one inversion per bidder); this module knows nothing of
logs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from pipeline.games.rules import Rule

DEFAULT_ITERS = 200
DEFAULT_POINT_ITERS = 1000
# Regrets are differences of float64 sums of at most a few hundred terms in [0, 1]; anything this
# small is a tie (an exact best response), not a real loss.
TIE_TOL = 1e-12
# A best response's utilities are sums and products of at most (bids + types + bidders) rounded terms,
# each at most the grid's largest bid or type: two utilities closer than this many units of rounding of
# that scale are tied (a different CPU's summation order may order them either way).
TIE_ROUNDINGS = 16


def _populations(bidders: int | Sequence[int]) -> tuple[tuple[int, ...], bool]:
    """(bidders per population, whether the caller's tensors lack the population axis)."""
    if isinstance(bidders, int):
        return (bidders,), True
    return tuple(int(n) for n in bidders), False


def _opponent_counts(counts: tuple[int, ...], p: int) -> list[int]:
    """How many bidders of each population a bidder of population ``p`` faces."""
    return [n - (q == p) for q, n in enumerate(counts)]


def power_of_opponents(x: Tensor, counts: Sequence[int]) -> Tensor:
    """(..., P, K) -> (..., P, K): for a bidder of each population, prod over its opponents j of x_j.

    With ``counts[q]`` alike bidders in population q, a bidder of p faces counts[q] - [q = p] of them:
    the product is prod_q x_q ** (its opponents in q). Used with CDFs: the CDF of the highest other bid.
    """
    counts = tuple(counts)
    out = []
    for p in range(len(counts)):
        product = None
        for q, c in enumerate(_opponent_counts(counts, p)):
            if c == 0:
                continue
            term = x[..., q, :] ** c
            product = term if product is None else product * term
        out.append(torch.ones_like(x[..., p, :]) if product is None else product)
    return out[0].unsqueeze(-2) if len(out) == 1 else torch.stack(out, -2)


def win_probabilities(pmfs: Tensor, bidders: int | Sequence[int]) -> Tensor:
    """P(a bidder of each population wins with each grid bid), the others bidding from their population's pmf.

    Ties split at random: with each opponent j below a (probability q_j) or tied at a (p_j), the bidder
    wins with probability sum_k c_k / (k + 1), c_k the coefficient of z^k in prod_j (q_j + p_j z): the
    chance that exactly k opponents tie. A population of c alike opponents contributes the binomial
    (q + p z)^c = sum_k C(c, k) p^k q^(c-k) z^k. The sum form stays accurate where p is tiny (the
    closed form (F^(m+1) - F_-^(m+1)) / ((m+1) p) of m alike opponents cancels catastrophically).
    """
    counts, alone = _populations(bidders)
    if alone:
        pmfs = pmfs.unsqueeze(-2)
    below = (pmfs.cumsum(-1) - pmfs).clamp_min(0.0)
    out = []
    for p in range(len(counts)):
        coefficients: list[Tensor] | None = None  # of z^0, z^1, ...
        for q, c in enumerate(_opponent_counts(counts, p)):
            if c == 0:
                continue
            pmf, low = pmfs[..., q, :], below[..., q, :]
            factor = [math.comb(c, k) * pmf**k * low ** (c - k) for k in range(c + 1)]
            if coefficients is None:
                coefficients = factor
                continue
            grown = [torch.zeros_like(pmf) for _ in range(len(coefficients) + c)]
            for i, a in enumerate(coefficients):
                for j, b in enumerate(factor):
                    grown[i + j] = grown[i + j] + a * b
            coefficients = grown
        if coefficients is None:  # no opponent: a lone bidder wins with any bid
            out.append(torch.ones_like(pmfs[..., p, :]))
            continue
        win = coefficients[0]
        for k in range(1, len(coefficients)):
            win = win + coefficients[k] / (k + 1)
        out.append(win)
    if alone:
        return out[0]
    return out[0].unsqueeze(-2) if len(out) == 1 else torch.stack(out, -2)


def win_probability(pmf: Tensor, n_opponents: int) -> Tensor:
    """P(win) of each grid bid against ``n_opponents`` i.i.d. bids with this pmf (last dim), ties split at random:
    `win_probabilities` for one population of n_opponents + 1."""
    return win_probabilities(pmf, n_opponents + 1)


def win_and_payment(
    pmfs: Tensor, rule: Rule, bidders: int | Sequence[int], actions: Tensor, reserve: float | None = None
) -> tuple[Tensor, Tensor]:
    """(win, pay): a bidder of each population's probability of winning and expected payment at each grid bid,
    the others bidding from their populations' ``pmfs``.

    First price pays the own bid. Second price with reserve r (``reserve``, in the actions' units;
    None: ``rule.reserve``) pays max(r, highest other bid), its bid on a tie. A bid below the reserve
    never wins; the reserve need not be a grid point (the lowest allowed bid is the first one at or above it).
    """
    counts, alone = _populations(bidders)
    if alone:
        pmfs = pmfs.unsqueeze(-2)
    reserve = rule.reserve if reserve is None else float(reserve)
    win = win_probabilities(pmfs, counts)
    if rule.kind == "first_price":
        pay = actions * win
    else:
        below = (pmfs.cumsum(-1) - pmfs).clamp_min(0.0)
        highest_below = power_of_opponents(below, counts)
        highest_pmf = power_of_opponents(pmfs.cumsum(-1).clamp(0.0, 1.0), counts) - highest_below
        price = actions.clamp_min(reserve)
        # Payment when beating a strictly lower highest bid x: max(r, x), summed over x < a.
        paid_below = torch.cumsum(highest_pmf * price, -1) - highest_pmf * price
        pay = paid_below + (win - highest_below).clamp_min(0.0) * actions
    if reserve > 0:  # (a reserve of 0 allows every bid)
        allowed = actions >= reserve - 1e-9 * float(actions[-1])
        win, pay = win * allowed, pay * allowed
    return (win.squeeze(-2), pay.squeeze(-2)) if alone else (win, pay)


def statistic_value(
    pmfs: Tensor, value_mass: Tensor | None, win: Tensor, pay: Tensor, bidders: int | Sequence[int], statistic: str
) -> Tensor:
    """Expected revenue (sum over bidders of E[payment]) or welfare (sum of E[value * 1{win}]) of a profile.

    ``pmfs`` are the populations' bid distributions, ``value_mass[..., a]`` each population's mass of
    (type * 1{bid = a}); a population of n alike bidders counts n times. Leading dimensions are a batch.
    """
    counts, alone = _populations(bidders)
    per_bidder = (pmfs * pay).sum(-1) if statistic == "revenue" else (value_mass * win).sum(-1)
    if alone:
        return counts[0] * per_bidder
    return (per_bidder * per_bidder.new_tensor(counts)).sum(-1)


@dataclass
class Equilibrium:
    """A fictitious-play solution of the new game for fixed type distributions (shapes with the population
    axis P, or without it when `solve_equilibrium` got an int number of bidders)."""

    strategy: Tensor  # (P, T, A) each type's average over its best responses
    pmf: Tensor  # (P, A) each population's bid distribution
    value_mass: Tensor  # (P, A) each population's mass of type * 1{bid = a}
    regret: float  # the largest expected regret of one bidder's average strategy (0 = exact)
    revenue: float
    welfare: float

    def value(self, statistic: str) -> float:
        return self.revenue if statistic == "revenue" else self.welfare


def equilibrium_guess(type_weights: Tensor, types: Tensor, rule: Rule, bidders: int | Sequence[int]) -> Tensor:
    """Each type's continuous-value equilibrium bid, per population: where fictitious play starts.

    Second price: the value. First price: E[highest other value | it is below t] =
    t - int_0^t G / G(t), G the CDF of the highest opponent value (the product of the opponents' type
    CDFs, each read as uniform within a cell): the continuous-type equilibrium of symmetric bidders,
    so fictitious play only has to repair the grid's discreteness (and, for unlike bidders, the
    asymmetry).
    """
    counts, alone = _populations(bidders)
    if rule.kind == "second_price":
        guess = types.expand(len(counts), -1).clone()
        return guess[0] if alone else guess
    weights = type_weights[None] if alone else type_weights
    half = (types[1] - types[0]) / 2 if types.numel() > 1 else types[0]
    cdf_mid = weights.cumsum(-1) - weights / 2  # F at each type (cell midpoint)
    cdf_top = weights.cumsum(-1)  # F at each cell's upper edge
    g_mid, g_top = power_of_opponents(cdf_mid, counts), power_of_opponents(cdf_top, counts)
    g_bottom = torch.cat([g_top.new_zeros(len(counts), 1), g_top[:, :-1]], -1)
    # Trapezoids over half cells: integral of G from 0 to each midpoint.
    below_mid = (g_bottom + g_mid) / 2 * half
    whole_cells = (g_bottom + 2 * g_mid + g_top) / 2 * half
    integral = torch.cat([whole_cells.new_zeros(len(counts), 1), whole_cells.cumsum(-1)[:, :-1]], -1) + below_mid
    shade = torch.where(g_mid > 0, integral / g_mid.clamp_min(1e-300), types)
    guess = (types - shade).clamp_min(0.0)
    return guess[0] if alone else guess


def nearest_grid_index(x: Tensor, actions: Tensor) -> Tensor:
    """Index of the grid bid nearest each x (``actions`` increasing from 0, not necessarily evenly spaced).

    On an evenly spaced grid, round(x / step): a second-price start (the value, a cell midpoint) sits on
    a half step, and rounding it as the symmetric solver always did keeps its results bit for bit.
    """
    step = actions[1] - actions[0]
    if torch.allclose(actions[1:] - actions[:-1], step, rtol=0.0, atol=1e-9 * float(actions[-1])):
        return torch.round(x / step).long().clamp(0, actions.numel() - 1)
    return torch.searchsorted((actions[1:] + actions[:-1]) / 2, x.contiguous())


def best_response_priority(types: Tensor, actions: Tensor) -> Tensor:
    """(T, A) int64: which of several tied bids a type takes, lowest first: the bid nearest the type (in second
    price a bid inside a gap of the opponents' bids is as good as the truthful one, and letting the first
    index win would drag the population's bids down for no reason); of two equally near (a type at a half
    step, as every cell midpoint is on its own grid), the even index (round half to even: half the types go
    up, half down, so the tie biases no statistic; the lower bid for all of them took about 1% off second
    price's revenue on a 0.01 grid); then the lowest. Distances closer than 1e-9 of the grid's scale count as
    equal, so the order does not depend on rounding either."""
    resolution = 1e-9 * float(max(actions.abs().max(), types.abs().max()))
    distance = torch.round((types[:, None] - actions[None, :]).abs() / resolution).long()
    index = torch.arange(actions.numel(), device=actions.device)
    return (distance * 2 + index % 2) * actions.numel() + index


def tie_tolerance(actions: Tensor, types: Tensor, counts: Sequence[int]) -> float:
    """How far apart two utilities computed on this grid may be and still be tied (`TIE_ROUNDINGS`)."""
    scale = float(max(actions.abs().max(), types.abs().max()))
    terms = actions.numel() + types.numel() + sum(counts)
    return TIE_ROUNDINGS * terms * torch.finfo(actions.dtype).eps * scale


def break_ties(u: Tensor, priority: Tensor, tol: float) -> Tensor:
    """Argmax of ``u`` over its last axis, where values within ``tol`` of the best are tied and the tied
    entry with the lowest ``priority`` (distinct along the last axis) wins: the same index on every CPU
    whatever the last bits of ``u``."""
    tied = u >= u.amax(-1, keepdim=True) - tol
    return priority.expand_as(u).masked_fill(~tied, torch.iinfo(priority.dtype).max).argmin(-1)


def _mix(weights: Tensor, strategy: Tensor) -> Tensor:
    """(P, T) x (P, T, A) -> (P, A): each population's mass on each bid. One population (every symmetric auction)
    takes a vector-matrix product: the batched product of one ran the fictitious-play loop 1.3x slower."""
    if weights.shape[0] == 1:
        return (weights[0] @ strategy[0])[None]
    return (weights[:, None, :] @ strategy).squeeze(1)


def solve_equilibrium(
    type_weights: Tensor,
    types: Tensor,
    rule: Rule,
    bidders: int | Sequence[int],
    actions: Tensor,
    n_iters: int = DEFAULT_POINT_ITERS,
    tolerance: float = 1e-7,
) -> Equilibrium:
    """The ``rule``'s equilibrium on the grid for these type distributions, by fictitious play.

    ``type_weights`` (P, T): each population's mass on the common ``types``; ``bidders`` (P,) how many
    alike bidders each population has (an int and (T,) weights for one population). Starts from
    `equilibrium_guess` (first price with a reserve: types below it bid 0, the others at least it),
    snapped to the nearest grid bid. Then at every iteration k each type of each population
    best-responds to everyone's current bid distributions and its strategy is the average of its k
    best responses so far (steps of 1/k). Bids whose utilities are within rounding of the best
    (`tie_tolerance`) are tied and go by `best_response_priority`, so the play is the same on every CPU.

    Why 1/k and not 1/(k + 1) (which also averages in the start; the asymmetric solver did that
    before the two were merged): fictitious play's average is the empirical distribution of PLAY,
    and every play is a best response to some past profile; the start is a belief that shapes the
    first best response, not a play. Averaged in, it is a strategy that is a best response to
    nothing, whose weight 1/(k + 1) must be worn down. Measured (0.01 grid, U[0, 1] types): second
    price at r = 0.5, where the best response is the dominant bid from the first iteration on, stops
    at iteration 25 with regret 7e-8 under 1/k and runs all 1,000 iterations (4x the time) under
    1/(k + 1); on first price the two are a wash after 1,000 iterations (regret 1.5e-4 / 1.1e-4 for
    two symmetric bidders; 2.3e-3 / 2.0e-3, 2.0e-3 / 2.2e-3 and 1.05e-3 / 1.17e-3 for U[0, 1] against
    U[0, 2] at r = 0 and 0.25 and against U[0, 1.5] at r = 0.5; every revenue within 5e-4 of its
    truth). The average is over the WHOLE
    history, never a window: the planning notes saw a sliding window of recent best responses bias a
    first-price case by 0.03. Stops early once every bidder's expected regret is below ``tolerance``
    (checked every 25 iterations). Revenue = the expected payments, welfare = sum_i E[v_i 1{i wins}].
    """
    counts, alone = _populations(bidders)
    weights = type_weights[None] if alone else type_weights
    n_populations, n_types, n_actions = len(counts), types.numel(), actions.numel()
    priority = best_response_priority(types, actions)
    tol = tie_tolerance(actions, types, counts)
    guess = equilibrium_guess(weights, types, rule, counts)
    if rule.kind == "first_price" and rule.reserve > 0:
        guess = torch.where(types >= rule.reserve, guess.clamp_min(rule.reserve), types.new_zeros(()))
    start = nearest_grid_index(guess, actions)  # (P, T)
    pmf = torch.zeros(n_populations, n_actions, dtype=actions.dtype, device=actions.device)
    pmf.scatter_add_(1, start, weights)
    strategy = torch.zeros(n_populations, n_types, n_actions, dtype=actions.dtype, device=actions.device)
    flat = strategy.view(n_populations * n_types, n_actions)  # (population, type) rows
    rows = torch.arange(n_populations * n_types, device=actions.device)

    def utility(win: Tensor, pay: Tensor) -> Tensor:  # (P, T, A)
        return types[None, :, None] * win[:, None, :] - pay[:, None, :]

    def expected_regret(u: Tensor) -> float:
        loss = u.max(2, keepdim=True).values - u
        return float((weights[:, :, None] * strategy * loss).sum((1, 2)).max())

    for k in range(1, n_iters + 1):
        u = utility(*win_and_payment(pmf, rule, counts, actions))
        if k % 25 == 0 and expected_regret(u) < tolerance:
            break
        best = break_ties(u, priority, tol)  # (P, T)
        strategy.mul_(1 - 1 / k)
        flat[rows, best.view(-1)] += 1 / k
        pmf = _mix(weights, strategy)
    win, pay = win_and_payment(pmf, rule, counts, actions)
    value_mass = _mix(weights * types, strategy)
    revenue = float(statistic_value(pmf, value_mass, win, pay, counts, "revenue"))
    welfare = float(statistic_value(pmf, value_mass, win, pay, counts, "welfare"))
    regret = expected_regret(utility(win, pay))
    if alone:
        strategy, pmf, value_mass = strategy[0], pmf[0], value_mass[0]
    return Equilibrium(strategy, pmf, value_mass, regret, revenue, welfare)


class ConsistentTypes(Protocol):
    """A logged game as `solve_bounds` reads it (`pipeline.games.rmac.LoggedAuction`): its distinct bids'
    weights and, per epsilon, which types each of them is consistent with."""

    @property
    def class_weight(self) -> Tensor: ...  # (C,)

    def consistent(self, eps: float) -> Tensor: ...  # (C, T) bool


def solve_bounds(
    logged: Sequence[ConsistentTypes],
    start: Equilibrium,
    rule: Rule,
    bidders: int | Sequence[int],
    actions: Tensor,
    types: Tensor,
    epsilons: Sequence[float],
    statistic: str = "revenue",
    n_iters: int = DEFAULT_ITERS,
    point_masks: Sequence[Tensor | None] | None = None,
) -> tuple[Tensor, Tensor]:
    """Lowest and highest statistic over epsilon-consistent types and epsilon-equilibrium play, per epsilon.

    ``logged[p]`` is population p's logged game (its distinct bids, each with the types whose regret
    for it is <= eps there), ``bidders`` as in `solve_equilibrium` (an int: one population, and
    ``logged`` holds its one game). Fictitious play as Frank-Wolfe: at iteration k, linearise the
    statistic around the current average profile (autograd gives its gradient with respect to each
    population's bid distribution and value-weighted bid mass); then every distinct logged bid jumps
    to the (type, bid) pair that moves the statistic most in the wanted direction among types
    consistent with it (eps) and bids with new-game regret <= eps for that type against everyone
    else's current bid distributions; the profile moves 1/(k + 1) of the way there (Frank-Wolfe's
    step from a feasible start, which ``start``, the point estimate's profile, is). The gradient, not
    each bidder's own payment, is what is pushed: a higher bid in second price raises what the OTHERS
    pay. All epsilons and both directions run as one batch. ``point_masks[p]`` (C_p, T) adds the point
    estimate's own types to every epsilon's consistent set, so that the point is always feasible.
    Returns ``(lower, upper)``, each of shape ``(len(epsilons),)``.
    """
    counts, alone = _populations(bidders)
    masks = list(point_masks) if point_masks is not None else [None] * len(counts)
    eps = actions.new_tensor([float(e) for e in epsilons for _ in (0, 1)])
    sign = actions.new_tensor([-1.0, 1.0] * len(epsilons))
    batch = eps.numel()
    old_ok = []  # per population (B, C_p, T)
    for one, mask in zip(logged, masks, strict=True):
        ok = torch.stack([one.consistent(float(e)) for e in eps.tolist()])
        old_ok.append(ok if mask is None else ok | mask)
    start_pmf = start.pmf[None] if alone else start.pmf
    start_value = start.value_mass[None] if alone else start.value_mass
    pmf = start_pmf.expand(batch, -1, -1).clone()
    value_mass = start_value.expand(batch, -1, -1).clone()
    # Ties (scores within rounding of the best) go to the lowest bid and the lowest type: a statistic's gradient
    # is at most (bidders) x the grid's scale.
    bid_order = torch.arange(actions.numel(), device=actions.device)
    type_order = torch.arange(types.numel(), device=actions.device)
    tol = sum(counts) * tie_tolerance(actions, types, counts)
    for k in range(1, n_iters + 1):
        p = pmf.detach().requires_grad_(True)
        v = value_mass.detach().requires_grad_(True)
        win, pay = win_and_payment(p, rule, counts, actions)
        objective = statistic_value(p, v, win, pay, counts, statistic).sum()
        grad_p, grad_v = torch.autograd.grad(objective, (p, v), allow_unused=True)
        with torch.no_grad():
            # None: the statistic does not depend on it (welfare of a lone bidder, who wins whatever it bids).
            grad_p = torch.zeros_like(p) if grad_p is None else grad_p
            grad_v = torch.zeros_like(v) if grad_v is None else grad_v
            utility = types[:, None] * win.detach()[:, :, None, :] - pay.detach()[:, :, None, :]  # (B, P, T, A)
            new_ok = utility.max(-1, keepdim=True).values - utility <= eps[:, None, None, None] + TIE_TOL
            score = sign[:, None, None, None] * (grad_p[:, :, None, :] + types[:, None] * grad_v[:, :, None, :])
            allowed_score = score.masked_fill(~new_ok, -math.inf)
            best_bid = break_ties(allowed_score, bid_order, tol)  # (B, P, T)
            best_score = allowed_score.gather(-1, best_bid[..., None]).squeeze(-1)
            target_pmf, target_value = torch.zeros_like(pmf), torch.zeros_like(pmf)
            for j, one in enumerate(logged):
                chosen_type = break_ties(best_score[:, j, None, :].masked_fill(~old_ok[j], -math.inf), type_order, tol)
                chosen_bid = best_bid[:, j].gather(1, chosen_type)
                weight = one.class_weight.expand(batch, -1)
                target_pmf[:, j].scatter_add_(1, chosen_bid, weight)
                target_value[:, j].scatter_add_(1, chosen_bid, weight * types[chosen_type])
            step = 1.0 / (k + 1)
            pmf = pmf + step * (target_pmf - pmf)
            value_mass = value_mass + step * (target_value - value_mass)
    with torch.no_grad():
        values = statistic_value(pmf, value_mass, *win_and_payment(pmf, rule, counts, actions), counts, statistic)
    return values[0::2], values[1::2]

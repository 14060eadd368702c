"""Counterfactual second-price revenue and welfare from first-price logs of ASYMMETRIC bidders.

Each bidder i is inverted against the distribution of its own highest competing bid: its bid b is a
best response for the values v with b = argmax (v - b) H_i(b), H_i the (smoothed) CDF of max_{j != i}
b_j over the logged auctions (the asymmetric first-order condition v = b + H_i(b) / h_i(b), solved on
the grid as in `pipeline.games.rmac.fit_logged_auction`). Second price is then played truthfully with
each bidder's own inverted value distribution, and expected revenue and welfare follow from the
distribution of the highest and second-highest of independent, non-identical values.

Not estimated yet (the record says so, and no number is reported): first-price counterfactuals
(an asymmetric first-price equilibrium has no fictitious-play solver here) and robust bounds.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from pipeline.games.auction import Rule, parse_rule
from pipeline.games.rmac import (
    ValueScale,
    choose_value_scale,
    fit_logged_auction,
    result_key,
    type_distribution,
)

NOT_ESTIMATED = "first-price rules and robust bounds are not estimated for asymmetric bidders"


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
    others = table.unsqueeze(1).expand(-1, n, -1).masked_fill(torch.eye(n, dtype=torch.bool), float("-inf"))
    return others.max(2).values


def inverted_values(
    table: Tensor, grid: float = 0.01, device=None, scale: ValueScale | None = None, headroom: float = 2.0
) -> tuple[Tensor, Tensor, ValueScale]:
    """Per bidder, the inverted value distribution on a common type grid: ((bidders, T) pmf, (T,) types, scale).

    Types are in the data's units. Each bidder's values are capped at its own rough top
    b_max + 1 / h_i(b_max) (the highest bid is a best response for every type above it, see
    `pipeline.games.rmac.choose_value_scale`).
    """
    table = torch.as_tensor(table, dtype=torch.float64)
    if scale is None:
        scale = choose_value_scale(table.flatten(), 2, grid, device)
    unit = scale.unit
    competing = highest_competing_bids(table) / unit
    tops = [_rough_top(table[:, i] / unit, competing[:, i]) for i in range(table.shape[1])]
    grid_top = headroom * max(tops)
    pmfs = []
    for i, top in enumerate(tops):
        logged = fit_logged_auction(table[:, i] / unit, 2, grid, device, top=grid_top, opponents=competing[:, i])
        pmfs.append(type_distribution(logged, top))
    return torch.stack(pmfs), logged.types * unit, scale


def _rough_top(bids: Tensor, competing: Tensor) -> float:
    """b + H(b) / h(b) at the bidder's highest bid, H and h of its highest competing bid (window estimate)."""
    b = float(bids.max())
    width = max(1.06 * float(competing.std()) * competing.numel() ** -0.2, 1e-12)
    cdf = float((competing <= b).double().mean())
    density = float(((competing - b).abs() <= width / 2).double().mean()) / width
    if density <= 0:  # nobody competes near the top: the highest bid wins surely, its value is unbounded
        density = 1.0 / (competing.numel() * width)
    return b + cdf / density


def second_price_statistics(pmfs: Tensor, types: Tensor, reserve: float) -> tuple[float, float]:
    """(revenue, welfare) of second price with ``reserve`` for independent bidders with these value pmfs.

    The price is max(reserve, second-highest value) when the highest value reaches the reserve.
    """
    cdf = pmfs.cumsum(1).clamp(max=1.0)  # (n, T): P(V_i <= t_k)
    first = cdf.prod(0)  # P(max <= t_k)
    # P(second highest <= t): all below, or exactly one above.
    second = first + sum((1 - cdf[i]) * torch.cat([cdf[:i], cdf[i + 1:]]).prod(0) for i in range(cdf.shape[0]))
    first_pmf = torch.diff(first, prepend=first.new_zeros(1))
    second_pmf = torch.diff(second, prepend=second.new_zeros(1))
    sold = types >= reserve
    below = ~sold
    first_below = float(first[below][-1]) if below.any() else 0.0
    second_below = float(second[below][-1]) if below.any() else 0.0
    revenue = reserve * (second_below - first_below) + float((types * second_pmf * sold).sum())
    welfare = float((types * first_pmf * sold).sum())
    return revenue, welfare


def asymmetric_table(
    table: Tensor, rules: Sequence[str], grid: float = 0.01, device=None, scale: ValueScale | None = None
) -> tuple[dict[str, float], list[str]]:
    """``cf/<rule>/point`` and ``cfw/<rule>/point`` for the second-price rules; the skipped rules listed."""
    pmfs, types, _ = inverted_values(table, grid, device, scale)
    out: dict[str, float] = {}
    skipped: list[str] = []
    for name in rules:
        rule: Rule = parse_rule(name)
        if rule.kind != "second_price" or (rule.n_bidders not in (None, table.shape[1])):
            skipped.append(rule.name)
            continue
        revenue, welfare = second_price_statistics(pmfs, types, rule.reserve)
        out[result_key(rule, "point", "revenue")] = revenue
        out[result_key(rule, "point", "welfare")] = welfare
    return out, skipped

"""Sealed-bid auctions: logged first-price bids, counterfactual rules and their closed-form truths.

Logged data. `simulate_first_price_bids` draws private values U[0, 1] and bids ``k * v`` rounded to
a grid; ``k = (n - 1) / n`` is the symmetric first-price equilibrium, any other ``k`` gives
misspecified (non-equilibrium) data. Values are i.i.d. across bidders, so the flat bid vector is the
whole data set: consecutive groups of ``n_bidders`` bids form the auctions when one is needed (CSV).
`load_bids_csv` (in `pipeline.games.bids_csv`) reads real logs and `save_bids_csv` writes them.

Rules. Each counterfactual rule has a name string:

- ``second_price_r<reserve>``: second price with reserve ``r`` and the logged number of bidders. The
  reserve is written with at least one decimal and no trailing zeros: ``second_price_r0.0``,
  ``second_price_r0.5``, ``second_price_r0.25``.
- ``first_price_n<k>``: first price with ``k`` bidders (``k = 1`` is a lone bidder, who bids 0).

Truth. With values U[0, 1] and ``n`` symmetric risk-neutral bidders in equilibrium:

- first price (``n`` bidders): bid ``(n - 1) / n * v``, revenue ``(n - 1) / (n + 1)`` (0 for a lone
  bidder), welfare ``n / (n + 1)``;
- second price, reserve ``r``: truthful bids, revenue ``(n-1)/(n+1) + r^n - 2n r^(n+1)/(n+1)``
  (``n = 2``: ``1/3 + r^2 - 4r^3/3``, largest, 5/12, at ``r = 0.5``), welfare
  ``n/(n+1) * (1 - r^(n+1))`` (the item stays unsold when every value is below ``r``).

For simulated misspecified data (``k`` not the equilibrium) the truth is still the closed form: the
question is what agents with the TRUE values would do under the new rules, where they re-optimise
and play the new game's equilibrium; the logged bidding rule ``k`` does not carry over.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

# The CSV loader lives in bids_csv, the rule names in rules; these names stay importable from here.
from pipeline.games.bids_csv import MIN_BIDS, BidData, BidDataError, load_bids_csv, save_bids_csv  # noqa: F401
from pipeline.games.rules import STATISTICS, Rule, default_rules, format_reserve, parse_rule  # noqa: F401


class SimulatedBids(NamedTuple):
    bids: Tensor  # (n_bids,) float64, on the grid
    values: Tensor  # (n_bids,) float64, the private values behind the bids


# ---------------------------------------------------------------------------------------------------
# Logged data


def equilibrium_shading(n_bidders: int) -> float:
    """The symmetric first-price equilibrium bids this fraction of the value (values U[0, 1])."""
    return (n_bidders - 1) / n_bidders


def simulate_first_price_bids(
    n_bids: int,
    n_bidders: int = 2,
    k: float | None = None,
    grid: float | None = 0.01,
    generator: torch.Generator | None = None,
    value_scale: float = 1.0,
) -> SimulatedBids:
    """Bids ``k * v`` (rounded to ``grid``; None keeps them exact) for ``n_bids`` values ``v ~ U[0, value_scale]``.

    ``k`` defaults to the equilibrium ``(n_bidders - 1) / n_bidders``. The values come back too, so
    a test can measure how far the logged play is from a best response (see
    `pipeline.games.rmac.realised_regret`).
    """
    if n_bidders < 2:
        raise ValueError(f"n_bidders={n_bidders}: a logged first-price auction needs at least 2 bidders")
    if n_bids < 1:
        raise ValueError(f"n_bids={n_bids}: need at least one bid")
    shade = equilibrium_shading(n_bidders) if k is None else float(k)
    values = value_scale * torch.rand(n_bids, generator=generator, dtype=torch.float64)
    bids = shade * values
    if grid:
        bids = torch.round(bids / grid) * grid
    return SimulatedBids(bids, values)


# ---------------------------------------------------------------------------------------------------
# Rules


def reserve_top(bids: Tensor, reserves: int = 11) -> float:
    """A round top for the default reserves over the observed bid range: (reserves - 1) round steps.

    The step is the largest bid / (reserves - 1) rounded up to two significant digits, so that
    reserve names stay short (bids up to 0.5 give 0, 0.05, ..., 0.5; up to 73.2 give 0, 7.4, ..., 74).
    """
    step = float(bids.max()) / (reserves - 1)
    if step <= 0:
        return 1.0
    digits = 10.0 ** (math.floor(math.log10(step)) - 1)
    return round(math.ceil(step / digits - 1e-9) * digits * (reserves - 1), 10)


# ---------------------------------------------------------------------------------------------------
# Closed-form truths (values U[0, value_scale], symmetric equilibrium of the new game)


def second_price_revenue(n_bidders: int, reserve: float = 0.0) -> float:
    n, r = n_bidders, reserve
    return (n - 1) / (n + 1) + r**n - 2 * n * r ** (n + 1) / (n + 1)


def first_price_revenue(n_bidders: int) -> float:
    # A lone bidder bids 0, and the formula gives exactly that.
    return (n_bidders - 1) / (n_bidders + 1)


def welfare(n_bidders: int, reserve: float = 0.0) -> float:
    """Expected value of the winner; nobody wins when every value is below the reserve."""
    n = n_bidders
    return n / (n + 1) * (1 - reserve ** (n + 1))


def truth(rule: str | Rule, n_bidders: int, statistic: str = "revenue", value_scale: float = 1.0) -> float:
    """The new game's equilibrium statistic under true values U[0, value_scale] (see the module docstring).

    Values s * U[0, 1] scale every price and value by s, and a reserve r acts like r / s on U[0, 1]
    (a reserve at or above the top value sells nothing).
    """
    if statistic not in STATISTICS:
        raise ValueError(f"statistic={statistic!r}; choose one of {STATISTICS}")
    rule = parse_rule(rule)
    n = rule.bidders(n_bidders)
    r = min(rule.reserve / value_scale, 1.0)
    if statistic == "welfare":
        return value_scale * welfare(n, r)
    if rule.kind == "second_price":
        return value_scale * second_price_revenue(n, r)
    return value_scale * first_price_revenue(n)

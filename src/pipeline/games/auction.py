"""Sealed-bid auctions: logged first-price bids, counterfactual rules and their closed-form truths.

Logged data. `simulate_first_price_bids` draws private values U[0, 1] and bids ``k * v`` rounded to
a grid; ``k = (n - 1) / n`` is the symmetric first-price equilibrium, any other ``k`` gives
misspecified (non-equilibrium) data. Values are i.i.d. across bidders, so the flat bid vector is the
whole data set: consecutive groups of ``n_bidders`` bids form the auctions when one is needed (CSV).
`load_bids_csv` reads real logs in either of two layouts (see its docstring) and
`save_bids_csv` writes the first one.

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

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor

MIN_BIDS = 50
STATISTICS = ("revenue", "welfare")


class BidDataError(ValueError):
    """Logged bids that cannot be used; the message names the file, the problem and the fix."""


class SimulatedBids(NamedTuple):
    bids: Tensor  # (n_bids,) float64, on the grid
    values: Tensor  # (n_bids,) float64, the private values behind the bids


class BidData(NamedTuple):
    bids: Tensor  # (n_bids,) float64
    n_bidders: int


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
) -> SimulatedBids:
    """Bids ``k * v`` (rounded to ``grid``; None keeps them exact) for ``n_bids`` values ``v ~ U[0, 1]``.

    ``k`` defaults to the equilibrium ``(n_bidders - 1) / n_bidders``. The values come back too, so
    a test can measure how far the logged play is from a best response (see
    `pipeline.games.rmac.realised_regret`).
    """
    if n_bidders < 2:
        raise ValueError(f"n_bidders={n_bidders}: a logged first-price auction needs at least 2 bidders")
    if n_bids < 1:
        raise ValueError(f"n_bids={n_bids}: need at least one bid")
    shade = equilibrium_shading(n_bidders) if k is None else float(k)
    values = torch.rand(n_bids, generator=generator, dtype=torch.float64)
    bids = shade * values
    if grid:
        bids = torch.round(bids / grid) * grid
    return SimulatedBids(bids, values)


def _parse_bid(path: Path, row: int, column: str, text: str | None) -> float:
    text = (text or "").strip()
    if text == "" or text.lower() in ("nan", "na", "null", "none"):
        raise BidDataError(
            f"{path}: row {row}, column {column!r} is empty/NaN; drop that row or fill in the bid"
        )
    try:
        bid = float(text)
    except ValueError:
        raise BidDataError(
            f"{path}: row {row}, column {column!r} holds {text!r}, not a number; "
            "write bids as plain decimals (e.g. 0.42)"
        ) from None
    if math.isnan(bid) or math.isinf(bid):
        raise BidDataError(f"{path}: row {row}, column {column!r} is {text!r}; every bid must be finite")
    if bid < 0:
        raise BidDataError(f"{path}: row {row}, column {column!r} is negative ({bid}); bids must be >= 0")
    return bid


def _wide_columns(columns: list[str]) -> list[str] | None:
    """``bid_0..bid_{n-1}`` or ``bid1..bidn``, in bidder order, or None when neither is there."""
    for pattern, start in ((r"bid_(\d+)", 0), (r"bid(\d+)", 1)):
        numbered = {int(m.group(1)): c for c in columns if (m := re.fullmatch(pattern, c))}
        if numbered and start in numbered:
            ordered = []
            i = start
            while i in numbered:
                ordered.append(numbered[i])
                i += 1
            return ordered
    return None


def load_bids_csv(path: str | Path, n_bidders: int | None = None) -> BidData:
    """Read logged first-price bids from a CSV file with a header row.

    Two layouts are accepted:

    - one bid per row: a column ``bid`` and, optionally, ``auction_id``. With ``auction_id`` every
      auction must have the same number of rows, which is the number of bidders; without it, pass
      ``n_bidders``.
    - one auction per row: columns ``bid_0, ..., bid_{n-1}`` or ``bid1, ..., bidn``; their count is
      the number of bidders.

    Other columns are ignored. Bids must be non-negative numbers, on the values' scale (the
    counterfactual solver discretises [0, max(1, largest bid)] on a 0.01 grid, so normalise money
    amounts first). Raises `BidDataError` (a ValueError) with a one-line message for a missing file,
    missing columns, an empty/NaN, non-numeric or negative bid, uneven auctions, a bidder count that
    contradicts ``n_bidders``, and fewer than ``MIN_BIDS`` bids.
    """
    path = Path(path)
    if not path.is_file():
        raise BidDataError(
            f"{path}: file not found; pass the path of a CSV of logged bids "
            "(a 'bid' column, or 'bid_0..bid_{n-1}' columns)"
        )
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        columns = [c.strip() for c in (reader.fieldnames or [])]
        rows = [{(k or "").strip(): v for k, v in row.items()} for row in reader]
    if not columns:
        raise BidDataError(f"{path}: empty file; the first line must be a header naming the bid column(s)")

    wide = None if "bid" in columns else _wide_columns(columns)
    if "bid" in columns:
        bids = [_parse_bid(path, i + 2, "bid", row.get("bid")) for i, row in enumerate(rows)]
        if "auction_id" in columns:
            sizes: dict[str, int] = {}
            for row in rows:
                key = (row.get("auction_id") or "").strip()
                sizes[key] = sizes.get(key, 0) + 1
            distinct = sorted(set(sizes.values()))
            if len(distinct) > 1:
                raise BidDataError(
                    f"{path}: auctions have different numbers of bids ({distinct}); "
                    "keep only auctions with the same number of bidders"
                )
            found = distinct[0] if distinct else 0
            if n_bidders is not None and found != n_bidders:
                raise BidDataError(
                    f"{path}: each auction_id has {found} bids but n_bidders={n_bidders}; "
                    "drop n_bidders or fix the file"
                )
            n_bidders = found
        elif n_bidders is None:
            raise BidDataError(
                f"{path}: one bid per row without an 'auction_id' column; pass n_bidders= or add auction_id"
            )
    elif wide is not None:
        if n_bidders is not None and n_bidders != len(wide):
            raise BidDataError(
                f"{path}: {len(wide)} bid columns ({wide[0]}..{wide[-1]}) but n_bidders={n_bidders}; "
                "drop n_bidders or fix the columns"
            )
        n_bidders = len(wide)
        bids = [_parse_bid(path, i + 2, c, row.get(c)) for i, row in enumerate(rows) for c in wide]
    else:
        raise BidDataError(
            f"{path}: no bid columns (found {columns}); name them 'bid' (+ optional 'auction_id'), "
            "'bid_0..bid_{n-1}' or 'bid1..bidn'"
        )
    if n_bidders < 2:
        raise BidDataError(f"{path}: {n_bidders} bidder(s) per auction; a first-price log needs at least 2")
    if len(bids) < MIN_BIDS:
        raise BidDataError(
            f"{path}: only {len(bids)} bids, need at least {MIN_BIDS} to estimate the opponents' "
            "bid distribution; log more auctions"
        )
    return BidData(torch.tensor(bids, dtype=torch.float64), int(n_bidders))


def save_bids_csv(path: str | Path, bids: Tensor, n_bidders: int) -> Path:
    """Write bids one per row with ``auction_id`` (consecutive groups of ``n_bidders``)."""
    path = Path(path)
    flat = torch.as_tensor(bids).flatten().tolist()
    if len(flat) % n_bidders:
        raise ValueError(f"{len(flat)} bids do not split into auctions of {n_bidders}")
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["auction_id", "bid"])
        writer.writerows((i // n_bidders, f"{b:.10g}") for i, b in enumerate(flat))
    return path


# ---------------------------------------------------------------------------------------------------
# Rules


def format_reserve(reserve: float) -> str:
    """At least one decimal, no trailing zeros: 0 -> '0.0', 0.5 -> '0.5', 0.25 -> '0.25'."""
    text = f"{reserve:.10f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


@dataclass(frozen=True)
class Rule:
    """A counterfactual auction format. ``n_bidders`` None means "as many as in the logged game"."""

    kind: str  # "first_price" | "second_price"
    reserve: float = 0.0
    n_bidders: int | None = None

    @property
    def name(self) -> str:
        if self.kind == "second_price":
            return f"second_price_r{format_reserve(self.reserve)}"
        return f"first_price_n{self.n_bidders}"

    def bidders(self, logged_n_bidders: int) -> int:
        return logged_n_bidders if self.n_bidders is None else self.n_bidders


_RULE_PATTERNS = (
    (re.compile(r"second_price_r(\d+(?:\.\d+)?)"), "second_price"),
    (re.compile(r"first_price_n(\d+)"), "first_price"),
)


def parse_rule(name: str | Rule) -> Rule:
    """``second_price_r0.5`` -> Rule("second_price", 0.5); ``first_price_n3`` -> Rule("first_price", 0, 3)."""
    if isinstance(name, Rule):
        return name
    for pattern, kind in _RULE_PATTERNS:
        m = pattern.fullmatch(name)
        if m is None:
            continue
        if kind == "second_price":
            reserve = float(m.group(1))
            if not 0.0 <= reserve <= 1.0:
                raise ValueError(f"rule {name!r}: the reserve must lie in [0, 1] (values are U[0, 1])")
            return Rule(kind, reserve=reserve)
        n = int(m.group(1))
        if n < 1:
            raise ValueError(f"rule {name!r}: a first-price auction needs at least 1 bidder")
        return Rule(kind, n_bidders=n)
    raise ValueError(
        f"unknown rule {name!r}; use 'second_price_r<reserve>' (e.g. second_price_r0.5) "
        "or 'first_price_n<bidders>' (e.g. first_price_n3)"
    )


def default_rules(reserves: int = 11, max_bidders: int = 5) -> list[str]:
    """Second price with reserves 0, 0.1, ..., 1.0 then first price with 1..5 bidders."""
    second = [Rule("second_price", reserve=round(i / (reserves - 1), 10)).name for i in range(reserves)]
    first = [Rule("first_price", n_bidders=n).name for n in range(1, max_bidders + 1)]
    return second + first


# ---------------------------------------------------------------------------------------------------
# Closed-form truths (values U[0, 1], symmetric equilibrium of the new game)


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


def truth(rule: str | Rule, n_bidders: int, statistic: str = "revenue") -> float:
    """The new game's equilibrium statistic under the true values (see the module docstring)."""
    if statistic not in STATISTICS:
        raise ValueError(f"statistic={statistic!r}; choose one of {STATISTICS}")
    rule = parse_rule(rule)
    n = rule.bidders(n_bidders)
    if statistic == "welfare":
        return welfare(n, rule.reserve)
    if rule.kind == "second_price":
        return second_price_revenue(n, rule.reserve)
    return first_price_revenue(n)

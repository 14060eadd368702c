"""What logged first-price bids look like before they are inverted: a rounding lattice, bids of 0, constant bidders.

Equilibrium bids of continuous values are continuous: no bid value repeats, none is exactly 0 (with no reserve
only a value of 0 bids 0). Real logs break this in three ways, each found here and named in one line:

- ``bid_lattice``: bids rounded to a currency step (a step shared by most bids). The estimator then treats each
  bid as censored to its rounding cell (`pipeline.games.rmac.inverted_value_cdf` reads the bid CDF only at the
  cells' edges, where the rounded and the true bids' CDFs agree, and smooths over at least `LATTICE_CELLS` steps).
- ``zero_share``: a share of bids that are exactly 0 (no-bids logged as 0, or bidders who did not take part).
- ``constant_bidder``: one bidder who bids the same amount in every auction (a reserve or a bot logged as a
  bidder): refused, in the ``bid_0, ...`` layout (a column with one value) and in the ``auction_id, bid`` layout
  alike (one value that appears once in nearly every auction), because no equilibrium of the others explains it.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

LATTICE_SHARE = 0.9  # a step is a lattice when at least this share of the nonzero bids lie on its multiples
LATTICE_CELLS = 2.0  # smoothing at least this many lattice steps once a lattice is found
ZERO_WARN = 0.005  # a share of exact-zero bids above this is reported
CONSTANT_SHARE = 0.95  # a value in at least this share of auctions (once each) is a constant bidder


def bid_lattice(bids: Tensor | np.ndarray) -> tuple[float, float] | None:
    """(step, share): the step whose multiples hold most of the nonzero bids, and that share; None when none does.

    The candidate is the most common gap between consecutive distinct bids (ties of rounding make it the step;
    continuous bids written to 4 decimals give 1e-4, a lattice far below any smoothing, which callers ignore by
    comparing the step with their bandwidth). It counts when at least `LATTICE_SHARE` of the nonzero bids are
    multiples of it (within 1e-6 of a step)."""
    x = np.asarray(torch.as_tensor(bids, dtype=torch.float64).flatten().cpu())
    x = x[x > 0]
    if x.size < 10:
        return None
    distinct = np.unique(x)
    if distinct.size < 2:
        return None
    gaps = np.diff(distinct)
    scale = float(distinct[-1])
    rounded = np.round(gaps / scale, 9)
    values, counts = np.unique(rounded, return_counts=True)
    step = float(values[counts.argmax()]) * scale
    if step <= 0:
        return None
    # The step as the data wrote it: the median of the gaps within 0.1% of the modal one.
    near = gaps[np.abs(gaps - step) <= 1e-3 * step]
    step = float(f"{float(np.median(near)) if near.size else step:.12g}")  # 0.05, not 0.04999999999999999
    ratio = x / step
    share = float((np.abs(ratio - np.round(ratio)) <= np.maximum(1e-6, 1e-12 * ratio)).mean())
    return (step, share) if share >= LATTICE_SHARE else None


def zero_share(bids: Tensor | np.ndarray) -> float:
    """The share of bids that are exactly 0."""
    x = torch.as_tensor(bids, dtype=torch.float64).flatten()
    return float((x == 0).double().mean()) if x.numel() else 0.0


def constant_bidder(table: Tensor | np.ndarray, by_bidder: bool) -> str | None:
    """A one-line description of a bidder who bids the same in every auction, or None.

    ``table`` is (auctions, bidders). ``by_bidder``: column i is bidder i (``bid_i`` columns or a ``bidder``
    column); otherwise the positions within an auction mean nothing, and a constant bidder shows as one value
    that appears exactly once in at least `CONSTANT_SHARE` of the auctions."""
    table = np.asarray(torch.as_tensor(table, dtype=torch.float64).cpu())
    if table.ndim != 2 or table.shape[0] < 2 or np.ptp(table) == 0:
        return None  # all-equal bids are refused on their own (`check_bids`)
    if by_bidder:
        for i in range(table.shape[1]):
            if np.ptp(table[:, i]) == 0:
                return f"bidder {i} (column {i}) bids {table[0, i]:g} in every one of the {table.shape[0]} auctions"
        return None
    values, counts = np.unique(table, return_counts=True)
    candidates = values[counts >= CONSTANT_SHARE * table.shape[0]]
    for value in candidates:
        once = int(((table == value).sum(1) == 1).sum())
        if once >= CONSTANT_SHARE * table.shape[0]:
            return (f"the bid {value:g} appears exactly once in {once} of the {table.shape[0]} auctions "
                    f"({once / table.shape[0]:.0%}): one bidder bids it every time")
    return None


def check_bids(bids: Tensor | np.ndarray) -> None:
    """ValueError (one line) for bids that carry nothing to invert: none positive, or all the same."""
    x = torch.as_tensor(bids, dtype=torch.float64).flatten()
    if x.numel() == 0:
        raise ValueError("no logged bids")
    if float(x.max()) <= 0:
        raise ValueError("every logged bid is 0: there is nothing to invert (check the bid column)")
    if float(x.max()) == float(x.min()):
        raise ValueError(f"every logged bid is {float(x.max()):g}: equal bids say nothing about the values behind "
                         "them (check that the bid column holds the bids, not a reserve or a fixed price)")


def spread_in_cells(bids: Tensor, step: float) -> Tensor:
    """Rounded ``bids`` (any shape, column by column when 2-D) spread evenly over their rounding cells.

    The m bids rounded to k * step take the places (k - 1/2 + (j + 1/2) / m) * step, j = 0..m-1 (in their order
    in the column): where the rounded bids are interval-censored, this is the CDF that is linear inside each cell.
    The top cell is filled only as far as its count reaches at the density of the three cells below it (the
    highest true bid is rarely at the cell's upper edge), and cell 0 only above 0.
    """
    x = torch.as_tensor(bids, dtype=torch.float64)
    columns = x.reshape(x.shape[0], -1) if x.dim() == 2 else x.reshape(-1, 1)
    out = torch.empty_like(columns)
    for c in range(columns.shape[1]):
        index = torch.round(columns[:, c] / step).long()
        order = torch.argsort(index, stable=True)
        counts = torch.bincount(index - index.min())
        starts = counts.cumsum(0) - counts
        rank = torch.empty_like(index)
        rank[order] = torch.arange(index.numel()) - starts[index[order] - index.min()]
        share = (rank.double() + 0.5) / counts[index - index.min()].double()
        low = (index.double() - 0.5).clamp_min(0.0)
        width = index.double() + 0.5 - low
        top = int(index.max())
        below = counts[-4:-1].double().mean() if counts.numel() >= 4 else counts[-1].double()
        fill = min(1.0, float(counts[-1]) / float(below)) if float(below) > 0 else 1.0
        width = torch.where(index == top, width * fill, width)
        out[:, c] = (low + share * width) * step
    return out.reshape(x.shape)


def excess_zeros(bids: Tensor | np.ndarray) -> int:
    """How many exact-zero bids are more than rounding explains: all of them, or on a lattice of step s (bids
    rounded), those beyond half the count at s (the cell at 0 is half a cell wide, [0, s/2))."""
    x = torch.as_tensor(bids, dtype=torch.float64).flatten()
    zeros = int((x == 0).sum())
    found = bid_lattice(x) if zeros else None
    if found is None:
        return zeros
    at_step = int((torch.round(x / found[0]) == 1).sum())
    return max(0, zeros - round(at_step / 2))

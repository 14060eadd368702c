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


MASS_SHARE = 0.01  # one nonzero bid value holding this share of the bids beyond its neighbours' is a mass point
MASS_SPIKE = 2.0  # ... and (on a lattice) at least this many times the larger of its two neighbours' counts
RESERVE_GAP = 0.02  # positive bids starting this share of their highest above 0 may start at a reserve ...
RESERVE_WINDOW = 0.02  # ... when the lowest window of this share of their range holds ...
RESERVE_PILE = 1.6  # ... at least this many times the bids of the window above it
RESERVE_PILE_ZEROS = 1.2  # ... or this many, with more than `ZERO_WARN` of the bids exactly 0 (the non-bids logged)


def mass_points(bids: Tensor | np.ndarray) -> list[tuple[float, float, int]]:
    """(value, share, excess) of each nonzero bid value that holds at least `MASS_SHARE` of the bids more than a
    continuous bid distribution puts there: one bid (continuous bids), or on a rounding lattice (`bid_lattice`) the
    larger count of its two neighbouring lattice points, and at least `MASS_SPIKE` times that (a density that is
    high at an end of the bids fills its end cell without a spike). Equilibrium bids of continuous values have no
    mass point (a default bid, a bot or a price cap logged as bids do); largest first."""
    x = np.asarray(torch.as_tensor(bids, dtype=torch.float64).flatten().cpu())
    x = x[x > 0]
    if x.size < 10:
        return []
    values, counts = np.unique(x, return_counts=True)
    lattice = bid_lattice(x)
    if lattice is None:
        expected = np.ones_like(counts, dtype=np.float64)
    else:
        index = np.round(values / lattice[0]).astype(np.int64)
        count_at = dict(zip(index.tolist(), counts.tolist()))
        expected = np.array([max(count_at.get(k - 1, 0), count_at.get(k + 1, 0)) for k in index.tolist()], dtype=float)
    excess = counts - expected
    found = np.flatnonzero((excess >= MASS_SHARE * x.size) & (counts >= MASS_SPIKE * expected))
    found = found[np.argsort(-excess[found])]
    return [(float(values[i]), float(counts[i] / x.size), int(excess[i])) for i in found]


def without_mass_points(bids: Tensor) -> Tensor:
    """``bids`` (1-D) without the excess bids of each mass point (`mass_points`): the rest is the equilibrium's."""
    bids = torch.as_tensor(bids, dtype=torch.float64).flatten()
    keep = torch.ones_like(bids, dtype=torch.bool)
    for value, _, excess in mass_points(bids):
        at = (bids == value).nonzero().flatten()[:excess]
        keep[at] = False
    return bids[keep]


def logged_reserve(bids: Tensor | np.ndarray) -> float | None:
    """The hard reserve the logged auctions had (the lowest positive bid), or None.

    With a reserve R the values under it do not bid (logged as 0, or their auctions not logged) and the others bid
    b_R(v) = v - int_R^v F^(n-1) / F(v)^(n-1), so b - R ~ (v - R)^2 near R: the positive bids start above 0 and their
    density is infinite at the lowest (their CDF rises like sqrt(b - R): the lowest window holds 2.4 times the
    next one). Read as a reserve: the lowest positive bid at least `RESERVE_GAP` of the highest, and the lowest
    `RESERVE_WINDOW` of their range holding `RESERVE_PILE` times the bids of the window above it (a value density
    that is finite at a positive lowest value holds about 1 time, one vanishing there less). Bids on a rounding
    lattice (`bid_lattice`, step s): the lowest positive bid at least 3 s (small bids round to 0 and s), each window
    at least 2 s (a reserve then shows only where its pile-up is wider than the rounding). With the non-bids logged
    as 0 (more than `ZERO_WARN` of the bids) a pile of `RESERVE_PILE_ZEROS` is enough: measured on 10 families x 2,
    4, 6 bidders x 3 seeds, R = 0.2, the weaker pile-up where F(R) is a few percent (F = v^2: 4%) was missed."""
    x = np.asarray(torch.as_tensor(bids, dtype=torch.float64).flatten().cpu())
    pile = RESERVE_PILE_ZEROS if float((x == 0).mean()) > ZERO_WARN else RESERVE_PILE
    x = x[x > 0]
    if x.size < 100:
        return None
    low, high = float(x.min()), float(x.max())
    step = (bid_lattice(x) or (0.0, 0.0))[0]
    if low < max(RESERVE_GAP * high, 3 * step) or high <= low:
        return None
    width = max(RESERVE_WINDOW * (high - low), 2 * step)
    if step:  # whole cells: bids within half a step of a window's edge belong to one side
        low -= step / 2
    first, second = int((x <= low + width).sum()), int(((x > low + width) & (x <= low + 2 * width)).sum())
    return float(x.min()) if first >= pile * max(second, 10) else None

"""Logged first-price auction bids: simulated (values known) or a user's own CSV (`data.path=bids.csv`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pipeline.games.auction import simulate_first_price_bids
from pipeline.games.bids_csv import (
    BAD_ROWS,
    BidData,
    RowCounts,
    check_bid_values,
    check_n_bidders,
    load_bids_csv,
)

log = logging.getLogger(__name__)


@dataclass
class LoggedBids:
    bids: torch.Tensor  # (n_bids,) flat, in the data's units
    n_bidders: int
    values: torch.Tensor | None  # known only for simulated data
    k: float | None
    value_scale: float | None = None  # simulated values are U[0, value_scale]
    by_bidder: torch.Tensor | None = None  # (auctions, bidders) when the file names bidders
    rows: RowCounts | None = None
    notes: dict = field(default_factory=dict)


class AuctionBidsData:
    """Where the logged bids come from. With `path` set, the CSV (`pipeline.games.bids_csv` describes its layouts,
    `on_bad_rows` what happens to bad rows); otherwise `n_bids` simulated bids `k * v`, v ~ U[0, value_scale]
    (k = null: the equilibrium (n-1)/n). `n_bidders` null means 2 for simulated data and "read it from the
    file" for a CSV (the one-column `bid` layout needs it). `symmetric`: null tests the file's bidders for
    symmetry (`symmetry_level`), true pools them without a test, false declares them asymmetric."""

    def __init__(self, path: str | None = None, n_bids: int = 5000, n_bidders: int | None = None,
                 k: float | None = None, grid: float | None = 0.01, value_scale: float = 1.0,
                 on_bad_rows: str = "error", symmetric: bool | None = None, symmetry_level: float = 0.01):
        self.path = None if path in (None, "") else Path(path).expanduser()
        self.n_bids, self.k, self.grid = int(n_bids), k, grid
        if n_bidders is not None:
            check_n_bidders(n_bidders)
        self.n_bidders = None if n_bidders is None else int(n_bidders)
        self.value_scale = float(value_scale)
        if self.value_scale <= 0:
            raise ValueError(f"data.value_scale={value_scale}; values are U[0, value_scale], so it must be > 0")
        if on_bad_rows not in BAD_ROWS:
            raise ValueError(f"data.on_bad_rows={on_bad_rows!r}; choose one of {list(BAD_ROWS)}")
        self.on_bad_rows, self.symmetric, self.symmetry_level = on_bad_rows, symmetric, float(symmetry_level)
        self._file: BidData | None = None

    def prepare_data(self) -> None:
        if self.path is not None:  # read once, at start-up: a bad file fails here with the loader's one line
            self._file = load_bids_csv(self.path, self.n_bidders, self.on_bad_rows)
            check_bid_values(self.path, self._file)
            log.info(self._file.rows.summary(self.path))

    def setup(self, stage: str | None = None) -> None:
        pass

    def load(self, generator: torch.Generator) -> LoggedBids:
        if self.path is not None:
            if self._file is None:
                self.prepare_data()
            data = self._file
            return LoggedBids(data.flat, data.n_bidders, None, None, None,
                              data.bids if data.by_bidder else None, data.rows)
        n = 2 if self.n_bidders is None else self.n_bidders
        sim = simulate_first_price_bids(self.n_bids, n, self.k, None if not self.grid else self.grid * self.value_scale,
                                        generator=generator, value_scale=self.value_scale)
        return LoggedBids(sim.bids, n, sim.values, self.k, self.value_scale)

"""Logged first-price auction bids: simulated (values known) or a user's own CSV (`data.path=bids.csv`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.games.auction import load_bids_csv, simulate_first_price_bids


@dataclass
class LoggedBids:
    bids: torch.Tensor
    n_bidders: int
    values: torch.Tensor | None  # known only for simulated data
    k: float | None


class AuctionBidsData:
    """Where the logged bids come from. With `path` set, the CSV (see `load_bids_csv` for its two layouts);
    otherwise `n_bids` simulated bids `k * v`, v ~ U[0, 1] (k = null: the equilibrium (n-1)/n)."""

    def __init__(self, path: str | None = None, n_bids: int = 5000, n_bidders: int = 2, k: float | None = None,
                 grid: float | None = 0.01):
        self.path = None if path in (None, "") else Path(path).expanduser()
        self.n_bids, self.n_bidders, self.k, self.grid = int(n_bids), int(n_bidders), k, grid

    def prepare_data(self) -> None:
        if self.path is not None:
            load_bids_csv(self.path, None)  # fail at start-up on a bad file, with the loader's one-line error

    def setup(self, stage: str | None = None) -> None:
        pass

    def load(self, generator: torch.Generator) -> LoggedBids:
        if self.path is not None:
            data = load_bids_csv(self.path, None)
            return LoggedBids(data.bids, int(data.n_bidders), None, None)
        sim = simulate_first_price_bids(self.n_bids, self.n_bidders, self.k, self.grid, generator=generator)
        return LoggedBids(sim.bids, self.n_bidders, sim.values, self.k)

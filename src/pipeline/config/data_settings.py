"""Typed settings of the shipped data modules whose values have a valid range: checked at start-up like a task's
(`pipeline.config.task_settings` finds a Config by the `_target_` it declares), before torch or Lightning loads.

The data modules live below the config layer (pipeline.data, pipeline.games), so their Configs are declared here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pipeline.config.ranges import count, number, one_of, positive

MAX_BIDDERS = 100  # pipeline.games.bids_csv.MAX_BIDDERS (tests/test_config_ranges.py keeps them equal)


@dataclass
class AuctionBidsDataConfig:
    """The keys of conf/data/auction_bids.yaml (`pipeline.data.auction.AuctionBidsData` says what each does)."""

    _target_: str = "pipeline.data.auction.AuctionBidsData"

    path: str | None = None
    n_bids: int = count(5000)
    n_bidders: int | None = count(None, low=2, high=MAX_BIDDERS, note=f"an auction has 2 to {MAX_BIDDERS} bidders here",
                                  example="2 or more, or null to read it from the file")
    k: float | None = number(None, low=0, example=0.5)
    grid: float | None = number(0.01, low=0, note="0 or null: no grid")
    value_scale: float = positive(1.0)
    on_bad_rows: str = one_of("error", "drop")
    symmetric: bool | None = None
    symmetry_level: float = number(0.01, low=0, high=1, low_open=True, high_open=True)

    def cross_checks(self) -> Iterator[tuple[str, str]]:
        if self.path not in (None, ""):
            # pipeline.games.bids_csv imports torch: only when there is a file to read.
            from pipeline.games.bids_csv import BidDataError, check_bids_file

            try:
                check_bids_file(Path(self.path).expanduser())
            except BidDataError as exc:
                yield "path", str(exc).split(": ", 1)[-1]

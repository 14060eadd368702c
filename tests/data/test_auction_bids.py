"""data=auction_bids: a bidder count that cannot be an auction is refused in one line when the data module is built."""

from __future__ import annotations

import pytest

from pipeline.data.auction import AuctionBidsData


@pytest.mark.parametrize("n_bidders", [0, -2, 1, 101, 100_000])
def test_absurd_bidder_counts_are_refused_at_once(tmp_path, n_bidders):
    path = tmp_path / "bids.csv"
    path.write_text("bid\n" + "\n".join(str(0.01 * i) for i in range(60)) + "\n")
    for source in ({"path": str(path)}, {}):  # the CSV path and simulated bids alike
        with pytest.raises(ValueError, match=rf"^data.n_bidders={n_bidders}: an auction has 2 to 100 bidders") as info:
            AuctionBidsData(n_bidders=n_bidders, **source)
        assert "\n" not in str(info.value)


def test_a_sane_bidder_count_is_taken():
    assert AuctionBidsData(n_bidders=3).n_bidders == 3

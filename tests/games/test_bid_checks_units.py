"""Rounded, zero and constant bids (`pipeline.games.bid_checks`) and what the estimator does with them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.data.auction import AuctionBidsData
from pipeline.games.bid_checks import (
    bid_lattice,
    check_bids,
    constant_bidder,
    logged_reserve,
    mass_points,
    without_mass_points,
    zero_share,
)
from pipeline.games.bids_csv import BidDataError
from pipeline.games.rmac import (
    effective_lattice,
    interp,
    inverted_value_cdf,
    predict_counterfactuals,
    second_price_point,
    without_zero_bids,
)

F64 = torch.float64


def _uniform_bids(n_auctions: int, n_bidders: int = 3, seed: int = 0) -> np.ndarray:
    """Equilibrium bids of U[0, 1] values: (n - 1) / n v, (auctions, bidders)."""
    return np.random.default_rng(seed).random((n_auctions, n_bidders)) * (n_bidders - 1) / n_bidders


@pytest.mark.parametrize("step", [0.01, 0.05, 0.25, 5.0])
def test_a_rounding_step_is_found_with_its_share(step):
    bids = np.round(_uniform_bids(2000) * 20 / step) * step  # values on [0, 20]
    bids[:40, 0] = 3.3333  # 2 in 300 bids off the lattice
    found = bid_lattice(bids)
    assert found is not None and found[0] == pytest.approx(step, rel=1e-9)
    assert found[1] == pytest.approx(1 - 40 / (bids > 0).sum(), abs=1e-9)  # the share of the nonzero bids


def test_continuous_bids_have_no_lattice_that_matters():
    bids = torch.from_numpy(_uniform_bids(5000))
    assert bid_lattice(bids) is None  # no gap is shared by 90% of the bids
    written = torch.round(bids * 1e4) / 1e4  # 4 decimals: a 1e-4 lattice, far below the smoothing
    assert bid_lattice(written)[0] == pytest.approx(1e-4)
    assert effective_lattice(written) is None
    assert effective_lattice(torch.round(bids * 20) / 20) == pytest.approx(0.05)


def test_zero_bids_are_counted_and_dropped_above_half_a_percent():
    bids = torch.from_numpy(_uniform_bids(1000)).flatten()
    few, many = bids.clone(), bids.clone()
    few[:10] = 0.0  # 0.33%
    many[:60] = 0.0  # 2%
    assert zero_share(many) == pytest.approx(0.02)
    assert without_zero_bids(few).numel() == 3000
    assert without_zero_bids(many).numel() == 2940 and bool((without_zero_bids(many) > 0).all())


def test_two_percent_zero_bids_leave_the_point_where_it_was():
    """U[0, 1], 3 bidders, 5,000 auctions: 2% of bids set to 0 (measured without dropping them: +0.009 at r = 0.9
    against the clean log's -0.0015, seed-mean over 10 seeds); dropped, the points are the clean log's up to the
    sampling of the dropped bids."""
    bids = torch.from_numpy(_uniform_bids(5000, seed=3)).flatten()
    dirty = bids.clone()
    dirty[torch.randperm(bids.numel(), generator=torch.Generator().manual_seed(0))[:300]] = 0.0
    rules = ["second_price_r0.5", "second_price_r0.9"]
    clean = predict_counterfactuals(bids, 3, rules, []).table
    dropped = predict_counterfactuals(dirty, 3, rules, []).table
    for key in clean:
        assert abs(dropped[key] - clean[key]) < 0.006, key


def test_a_constant_bidder_is_found_in_both_layouts():
    table = _uniform_bids(500)
    assert constant_bidder(table, True) is None and constant_bidder(table, False) is None
    table[:, 2] = 0.3
    assert constant_bidder(table, True).startswith("bidder 2 (column 2) bids 0.3 in every one of the 500")
    shuffled = np.random.default_rng(1).permuted(table, axis=1)  # positions mean nothing in the long layout
    assert "the bid 0.3 appears exactly once in 500 of the 500 auctions" in constant_bidder(shuffled, False)


@pytest.mark.parametrize("layout", ["wide", "long"])
def test_a_constant_bid_column_is_refused_at_start_up_in_either_layout(tmp_path, layout):
    table = _uniform_bids(300)
    table[:, 1] = 0.25
    path = tmp_path / "bids.csv"
    if layout == "wide":
        rows = ["bid_0,bid_1,bid_2"] + [",".join(f"{b:.6f}" for b in row) for row in table]
    else:
        rows = ["auction_id,bid"] + [f"{i // 3},{b:.6f}" for i, b in enumerate(table.ravel())]
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(BidDataError, match=r"\(a constant bid column\): no equilibrium of private values bids that; "
                                           r"drop that bidder's bids"):
        AuctionBidsData(path=str(path)).prepare_data()


def test_all_equal_bids_are_refused_without_grid_advice(tmp_path):
    path = tmp_path / "bids.csv"
    path.write_text("auction_id,bid\n" + "".join(f"{i // 2},0.4\n" for i in range(200)))
    with pytest.raises(BidDataError) as error:
        AuctionBidsData(path=str(path)).prepare_data()
    assert "every bid is 0.4: equal bids say nothing about the values behind them" in str(error.value)
    assert "grid" not in str(error.value)
    for bids in (torch.full((100,), 0.4, dtype=F64), torch.zeros(100, dtype=F64)):
        with pytest.raises(ValueError) as error:
            check_bids(bids)
        assert "grid" not in str(error.value) and "every logged bid is" in str(error.value)
        with pytest.raises(ValueError, match="every logged bid is"):
            predict_counterfactuals(bids, 2, ["second_price_r0.5"], [])


@pytest.mark.parametrize("step", [0.01, 0.05])
def test_bids_rounded_to_a_lattice_invert_like_the_unrounded_ones(step):
    """U[0, 1], 3 bidders, bids 2v/3 at 15,000 exact quantiles, rounded to ``step``: read as censored to their
    rounding cells the value CDF stays within 0.01 of the unrounded inversion at v = 0.1-0.9, and revenue at
    r = 0.5 within 0.005 (measured 0.002 / 0.003 at 0.01 / 0.05). Read as points (no lattice) the 0.05 log
    put the top at 1.07 and revenue at r = 0.9 0.03 off."""
    q = (torch.arange(15_000, dtype=F64) + 0.5) / 15_000
    bids = 2 * q / 3
    rounded = torch.round(bids / step) * step
    values, cdf = inverted_value_cdf(bids, 3, 0.01)
    lattice_values, lattice_cdf = inverted_value_cdf(rounded, 3, 0.01, lattice=step)
    x = torch.linspace(0.1, 0.9, 9, dtype=F64)
    assert float((interp(x, lattice_values, lattice_cdf) - interp(x, values, cdf)).abs().max()) < 0.01
    revenue = second_price_point(values, cdf, 3, 0.5, "revenue")
    assert abs(second_price_point(lattice_values, lattice_cdf, 3, 0.5, "revenue") - revenue) < 0.005


def test_spread_in_cells_by_hand():
    """Step 0.05: two bids at 0.05 take 1/4 and 3/4 of [0.025, 0.075]; a bid at 0 takes the middle of [0, 0.025];
    the top cell (0.15, one bid where the three cells below hold 1, 2 and 1, mean 4/3) is filled 3/4 of the way."""
    from pipeline.games.bid_checks import spread_in_cells

    column = torch.tensor([0.0, 0.05, 0.05, 0.1, 0.15], dtype=F64)
    spread = spread_in_cells(torch.stack([column, column], 1), 0.05)
    want = [0.0125, 0.0375, 0.0625, 0.1, 0.125 + 0.5 * 0.05 * 0.75]
    assert torch.allclose(spread[:, 0], torch.tensor(want, dtype=F64), atol=1e-12)
    assert torch.equal(spread[:, 0], spread[:, 1])


def test_zeros_that_rounding_explains_are_not_excess():
    """Bids on a 0.05 lattice: the cell at 0 is [0, 0.025), half as wide as the others, so it holds about half
    the count at 0.05; only zeros beyond that are bids not made."""
    from pipeline.games.bid_checks import excess_zeros

    rounded = torch.tensor([0.0] * 10 + [0.05] * 20 + [0.1] * 20 + [0.15] * 20, dtype=F64)
    assert excess_zeros(rounded) == 0
    assert excess_zeros(torch.cat([rounded, torch.zeros(7, dtype=F64)])) == 7
    assert excess_zeros(torch.tensor([0.0, 0.0, 0.013, 0.2771, 0.5], dtype=F64)) == 2  # no lattice: every zero


def _reserve_bids(n_auctions: int, reserve: float, n_bidders: int = 3, seed: int = 0) -> np.ndarray:
    """U[0, 1] values with a hard reserve: the values under it bid 0, the others (2 v^3 + R^3) / (3 v^2) (3 bidders)."""
    values = np.random.default_rng(seed).random((n_auctions, n_bidders))
    return np.where(values < reserve, 0.0, (2 * values**3 + reserve**3) / (3 * np.maximum(values, reserve) ** 2))


@pytest.mark.parametrize("complete_only", [False, True])
def test_a_hard_reserve_in_the_logs_is_found_at_the_lowest_positive_bid(complete_only):
    """The positive bids start at R and pile up there (b - R ~ (v - R)^2): found with the zeros logged and with only
    the auctions where everybody bid; not found in logs without a reserve, with values starting above 0 (U[0.2, 1],
    a density finite there), or with zeros that are not a reserve (2% of the bids set to 0 at random)."""
    bids = _reserve_bids(5000, 0.2)
    if complete_only:
        bids = bids[(bids > 0).all(1)]
    assert logged_reserve(bids) == pytest.approx(0.2, abs=1e-4)
    plain = _uniform_bids(5000)
    assert logged_reserve(plain) is None
    assert logged_reserve(0.2 * 2 / 3 + plain * 0.8) is None  # U[0.2, 1] values: bids from 0.2 * 2/3 up, linearly
    zeros = plain.copy()
    zeros[np.random.default_rng(1).random(zeros.shape) < 0.02] = 0.0
    assert logged_reserve(zeros) is None


def test_a_reserve_is_not_read_into_rounded_bids_whose_small_bids_round_to_0():
    """Bids rounded to 0.05: the lowest positive bid is the first lattice point, not a reserve (found there once,
    through the pile of the rounded small bids)."""
    assert logged_reserve(np.round(_uniform_bids(400, 2) / 0.05) * 0.05) is None


def test_a_mass_point_is_named_with_its_share_and_excess_and_left_out():
    """3% of the bids moved to one value (continuous bids, and bids rounded to 0.01): named with its share and the
    excess over its neighbours; rounded bids with a density high at an end, and continuous bids, have none."""
    bids = _uniform_bids(5000)
    moved = bids.copy()
    moved[np.random.default_rng(2).random(moved.shape) < 0.03] = 0.3
    ((value, share, excess),) = mass_points(moved)
    assert value == 0.3 and share == pytest.approx((moved == 0.3).mean()) and excess == (moved == 0.3).sum() - 1
    assert without_mass_points(torch.from_numpy(moved)).numel() == moved.size - excess
    rounded = np.round(moved / 0.01) * 0.01
    ((value, share, excess),) = mass_points(rounded)
    assert value == pytest.approx(0.3) and excess > 0.02 * rounded.size
    assert mass_points(bids) == [] and mass_points(np.round(bids / 0.01) * 0.01) == []
    assert mass_points(np.round(np.sqrt(bids) / 0.01) * 0.01) == []  # a density high at the bottom: no spike


def test_predict_counterfactuals_reads_a_logged_reserve_and_skips_what_it_cannot_estimate():
    """U[0, 1], 3 bidders, reserve 0.2 in the logs (zeros as non-bids): second price at r = 0.5 and 0.9 within 0.01
    of the truth r (1 - r^3) + int_r^1 (1 - 3 x^2 + 2 x^3) dx (measured within 0.003), the reserve under 0.2 and
    first price skipped with the reason, no bounds."""
    bids = torch.from_numpy(_reserve_bids(4000, 0.2)).flatten()
    rules = ["second_price_r0.1", "second_price_r0.5", "second_price_r0.9", "first_price_n3"]
    found = predict_counterfactuals(bids, 3, rules, [0.01])
    assert found.logged_reserve == pytest.approx(0.2, abs=1e-3)
    assert sorted(found.skipped) == ["first_price_n3", "second_price_r0.1"]
    assert "values under the logged reserve" in found.skipped["first_price_n3"]
    for r in (0.5, 0.9):
        truth = r * (1 - r**3) + (1 - r) - (1 - r**3) + (1 - r**4) / 2
        assert found.table[f"cf/second_price_r{r:g}/point"] == pytest.approx(truth, abs=0.01)
    assert not any("eps" in k for k in found.table)

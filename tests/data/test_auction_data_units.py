"""data=auction_bids (pipeline.data.auction): simulated bids by hand, CSV files read once, refusals in one line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from pipeline.data.auction import AuctionBidsData, LoggedBids


def _uniform(n, seed, scale=1.0):
    return scale * torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_defaults():
    d = AuctionBidsData()
    assert d.path is None and d.n_bids == 5000 and d.n_bidders is None and d.k is None
    assert d.grid == 0.01 and d.value_scale == 1.0 and d.on_bad_rows == "error"
    assert d.symmetric is None and d.symmetry_level == 0.01 and isinstance(d.symmetry_level, float)
    assert AuctionBidsData(path="").path is None
    assert AuctionBidsData(n_bids="7").n_bids == 7
    assert AuctionBidsData(n_bidders=3.0).n_bidders == 3 and isinstance(AuctionBidsData(n_bidders=3.0).n_bidders, int)
    assert AuctionBidsData(value_scale=2).value_scale == 2.0
    d = AuctionBidsData(on_bad_rows="drop", symmetric=True, symmetry_level="0.05")
    assert (d.on_bad_rows, d.symmetric, d.symmetry_level) == ("drop", True, 0.05)


def test_path_is_expanded(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert AuctionBidsData(path="~/bids.csv").path == Path(tmp_path) / "bids.csv"


@pytest.mark.parametrize("scale", [0, -1.5])
def test_value_scale_must_be_positive(scale):
    with pytest.raises(ValueError) as err:
        AuctionBidsData(value_scale=scale)
    assert str(err.value) == f"data.value_scale={scale}; values are U[0, value_scale], so it must be > 0"


def test_on_bad_rows_must_be_error_or_drop():
    with pytest.raises(ValueError) as err:
        AuctionBidsData(on_bad_rows="skip")
    assert str(err.value) == "data.on_bad_rows='skip'; choose one of ['error', 'drop']"


def test_simulated_bids_default_two_bidders_half_shading_on_a_cent_grid():
    out = AuctionBidsData(n_bids=200).load(torch.Generator().manual_seed(4))
    assert isinstance(out, LoggedBids)
    v = _uniform(200, 4)
    assert torch.equal(out.values, v)
    assert torch.allclose(out.bids, torch.round(v * 0.5 / 0.01) * 0.01)
    assert out.n_bidders == 2 and out.k is None and out.value_scale == 1.0
    assert out.by_bidder is None and out.rows is None and out.notes == {}


def test_simulated_bids_with_k_scale_grid_and_bidders():
    d = AuctionBidsData(n_bids=100, n_bidders=4, k=0.6, grid=0.05, value_scale=10.0)
    out = d.load(torch.Generator().manual_seed(1))
    v = _uniform(100, 1, 10.0)
    assert torch.allclose(out.values, v)
    # the grid is in units of the value scale: 0.05 * 10 = 0.5
    assert torch.allclose(out.bids, torch.round(0.6 * v / 0.5) * 0.5)
    assert (out.n_bidders, out.k, out.value_scale) == (4, 0.6, 10.0)


@pytest.mark.parametrize("grid", [None, 0, 0.0])
def test_no_grid_keeps_bids_exact(grid):
    out = AuctionBidsData(n_bids=50, n_bidders=3, grid=grid).load(torch.Generator().manual_seed(2))
    assert torch.allclose(out.bids, _uniform(50, 2) * 2 / 3, rtol=0, atol=1e-15)


def test_a_wide_csv_is_read_once_by_bidder(tmp_path, caplog):
    path = tmp_path / "bids.csv"
    rows = [(0.01 * i, 0.02 * i) for i in range(60)]
    path.write_text("bid_0,bid_1\n" + "".join(f"{a},{b}\n" for a, b in rows))
    d = AuctionBidsData(path=str(path))
    with caplog.at_level(logging.INFO, logger="pipeline.data.auction"):
        d.prepare_data()
    assert f"{path}: read 60 rows, used 60, rejected 0 (none), 0 blank line(s) skipped" in caplog.text
    path.write_text("garbage")  # read once: load() uses what prepare_data read
    out = d.load(torch.Generator())
    assert out.n_bidders == 2 and out.values is None and out.k is None and out.value_scale is None
    assert torch.allclose(out.by_bidder, torch.tensor(rows, dtype=torch.float64))
    assert torch.allclose(out.bids, torch.tensor(rows, dtype=torch.float64).flatten())
    assert (out.rows.read, out.rows.used) == (60, 60)


def test_a_pooled_csv_is_loaded_on_first_use_without_bidders(tmp_path):
    path = tmp_path / "bids.csv"
    path.write_text("bid\n" + "".join(f"{0.01 * i}\n" for i in range(60)) + "oops\n")
    d = AuctionBidsData(path=path, n_bidders=3, on_bad_rows="drop")
    out = d.load(torch.Generator())
    assert out.n_bidders == 3 and out.by_bidder is None and out.values is None
    assert torch.allclose(out.bids, torch.tensor([0.01 * i for i in range(60)], dtype=torch.float64))
    assert out.rows.used == 60 and sum(out.rows.rejected.values()) == 1


def test_a_bad_csv_fails_in_prepare_data_when_bad_rows_are_errors(tmp_path):
    path = tmp_path / "bids.csv"
    path.write_text("bid\n" + "".join(f"{0.01 * i}\n" for i in range(60)) + "oops\n")
    with pytest.raises(ValueError, match=str(path)):
        AuctionBidsData(path=path, n_bidders=3).prepare_data()


def test_prepare_data_without_a_path_does_nothing_and_setup_is_a_no_op():
    d = AuctionBidsData()
    d.prepare_data()
    d.setup("fit")
    assert d._file is None

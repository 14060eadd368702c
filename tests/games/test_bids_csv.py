"""The bids CSV loader: layouts, edge cases (BOM, gaps, binary files), bad rows counted and named."""

from __future__ import annotations

import pytest
import torch

from pipeline.games.bids_csv import MIN_BIDS, BidDataError, load_bids_csv, save_bids_csv


def _bids(n=60):
    return [round(0.005 * i, 3) for i in range(n)]


def _write(tmp_path, text, name="bids.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _one_line_error(path, match, **kwargs):
    with pytest.raises(BidDataError, match=match) as info:
        load_bids_csv(path, **kwargs)
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert str(path) in message and "\n" not in message
    return message


# ---------------------------------------------------------------------------------------------------
# Layouts


def test_one_bid_per_row_with_auction_id_round_trips(tmp_path):
    bids = torch.tensor(_bids(), dtype=torch.float64)
    loaded = load_bids_csv(save_bids_csv(tmp_path / "bids.csv", bids, n_bidders=3))
    assert loaded.n_bidders == 3 and loaded.bids.shape == (20, 3)
    assert sorted(loaded.flat.tolist()) == pytest.approx(sorted(bids.tolist()))
    assert loaded.rows.read == loaded.rows.used == 60 and loaded.rows.rejected == {}


def test_one_column_layout_loads_with_n_bidders(tmp_path):
    path = _write(tmp_path, "bid,extra\n" + "".join(f"{b},x\n" for b in _bids()))
    loaded = load_bids_csv(path, n_bidders=2)
    assert loaded.n_bidders == 2 and loaded.bids.shape == (30, 2)
    assert loaded.flat.tolist() == pytest.approx(_bids())
    assert not loaded.by_bidder
    _one_line_error(path, "n_bidders")


def test_one_column_layout_counts_a_trailing_incomplete_auction(tmp_path):
    path = _write(tmp_path, "bid\n" + "".join(f"{b}\n" for b in _bids(61)))
    _one_line_error(path, "1 auction_size", n_bidders=3)
    loaded = load_bids_csv(path, n_bidders=3, on_bad_rows="drop")
    assert loaded.bids.shape == (20, 3) and loaded.rows.rejected == {"auction_size": 1}


@pytest.mark.parametrize("columns", [["bid_0", "bid_1"], ["bid1", "bid2"]])
def test_one_auction_per_row(tmp_path, columns):
    bids = _bids()
    rows = [f"{bids[i]},{bids[i + 1]}" for i in range(0, len(bids), 2)]
    loaded = load_bids_csv(_write(tmp_path, ",".join(columns) + "\n" + "\n".join(rows) + "\n"))
    assert loaded.n_bidders == 2 and loaded.by_bidder
    assert loaded.bids[:, 0].tolist() == pytest.approx(bids[0::2])
    assert loaded.bids[:, 1].tolist() == pytest.approx(bids[1::2])


def test_bidder_column_puts_each_bidder_in_its_own_column(tmp_path):
    lines = [f"{a},{name},{0.1 if name == 'alice' else 0.7}" for a in range(40) for name in ("bob", "alice")]
    loaded = load_bids_csv(_write(tmp_path, "auction_id,bidder,bid\n" + "\n".join(lines)))
    assert loaded.by_bidder and loaded.bids.shape == (40, 2)
    # Bidders are ordered by name: alice is column 0.
    assert loaded.bids[:, 0].eq(0.1).all() and loaded.bids[:, 1].eq(0.7).all()


def test_bidder_named_twice_in_one_auction_is_a_bad_row(tmp_path):
    lines = [f"{a},{n},0.2" for a in range(40) for n in ("x", "y")] + ["99,x,0.1", "99,x,0.3"]
    path = _write(tmp_path, "auction_id,bidder,bid\n" + "\n".join(lines))
    _one_line_error(path, "2 auction_size")
    assert load_bids_csv(path, on_bad_rows="drop").bids.shape == (40, 2)


def test_bids_in_other_units_are_accepted_as_they_are(tmp_path):
    bids = [100 * b for b in _bids()]
    loaded = load_bids_csv(save_bids_csv(tmp_path / "dollars.csv", torch.tensor(bids), 2))
    assert loaded.flat.max().item() == pytest.approx(max(bids))


# ---------------------------------------------------------------------------------------------------
# Edge cases


def test_byte_order_mark_and_crlf_are_accepted(tmp_path):
    path = tmp_path / "excel.csv"
    path.write_bytes(b"\xef\xbb\xbfbid_0,bid_1\r\n" + b"".join(b"0.1,0.2\r\n" for _ in range(MIN_BIDS)))
    loaded = load_bids_csv(path)
    assert loaded.bids.shape == (MIN_BIDS, 2) and loaded.bids[:, 1].eq(0.2).all()


def test_quoted_fields_are_read(tmp_path):
    path = _write(tmp_path, '"bid_0","bid_1"\n' + '"0.1","0.25"\n' * MIN_BIDS)
    assert load_bids_csv(path).bids[:, 1].eq(0.25).all()


def test_gap_in_bid_columns_is_named_as_a_gap(tmp_path):
    message = _one_line_error(_write(tmp_path, "bid_0,bid_2\n" + "0.1,0.2\n" * MIN_BIDS), "gaps")
    assert "bid_1" in message


@pytest.mark.parametrize("content, match", [
    (bytes(range(256)) * 4, "binary"),
    ("bid_0,bid_1\n0.1,café\n".encode("latin-1"), "not UTF-8"),
    ("bid_0,bid_1\n0.1,0.2\n".encode("utf-16"), "UTF-16"),
])
def test_binary_or_non_utf8_file_is_one_line(tmp_path, content, match):
    path = tmp_path / "weird.csv"
    path.write_bytes(content)
    _one_line_error(path, match)


def test_missing_file_and_missing_columns(tmp_path):
    _one_line_error(tmp_path / "nope.csv", "file not found")
    assert "price" in _one_line_error(_write(tmp_path, "price,auction\n" + "0.1,1\n" * MIN_BIDS), "no bid columns")
    _one_line_error(_write(tmp_path, ""), "empty file")


def test_bidder_count_that_contradicts_the_file(tmp_path):
    _one_line_error(_write(tmp_path, "bid_0,bid_1\n" + "0.1,0.2\n" * MIN_BIDS), "n_bidders=3", n_bidders=3)


def test_too_few_bids(tmp_path):
    _one_line_error(_write(tmp_path, "bid_0,bid_1\n" + "0.1,0.2\n" * 10), f"only 20 usable bids, need at least {MIN_BIDS}")


# ---------------------------------------------------------------------------------------------------
# Bad rows: counted, the first five named with their line numbers, dropped only on request

BAD_LINES = ["0.3,abc", "0.1", "", "0.1,0.2,0.3", "0.2,-1", "nan,0.1", "0.1,inf", "0.4,"]


def _file_with_bad_rows(tmp_path):
    good = ["0.1,0.2"] * 60
    return _write(tmp_path, "bid_0,bid_1\n" + "\n".join(good[:30] + BAD_LINES + good[30:]) + "\n")


def test_bad_rows_stop_the_load_naming_the_first_five(tmp_path):
    message = _one_line_error(_file_with_bad_rows(tmp_path), "7 bad row")
    # The header is line 1, so the first bad row is line 32; the blank line 34 is not a row.
    for named in ["line 32: bid_1 'abc' is not a number", "line 33: 1 fields, expected 2",
                  "line 35: 3 fields, expected 2", "line 36: bid_1 '-1' is negative", "line 37: bid_0 'nan' is empty/NaN"]:
        assert named in message
    assert "line 38" not in message and "on_bad_rows=drop" in message


def test_dropped_bad_rows_are_counted_by_reason(tmp_path):
    loaded = load_bids_csv(_file_with_bad_rows(tmp_path), on_bad_rows="drop")
    assert loaded.bids.shape == (60, 2)
    rows = loaded.rows
    assert (rows.read, rows.used, rows.blank_lines) == (67, 60, 1)
    assert rows.rejected == {"wrong_field_count": 2, "empty_or_nan": 2, "not_a_number": 1, "not_finite": 1,
                             "negative": 1}
    metrics = rows.metrics()
    assert metrics["data/rows_rejected"] == 7 and metrics["data/rows_rejected/negative"] == 1
    assert "rejected 7" in rows.summary("f.csv")


def test_unknown_bad_row_policy_is_refused(tmp_path):
    with pytest.raises(BidDataError, match="on_bad_rows"):
        load_bids_csv(_file_with_bad_rows(tmp_path), on_bad_rows="ignore")


def test_save_rejects_incomplete_auctions(tmp_path):
    with pytest.raises(ValueError, match="auctions of 2"):
        save_bids_csv(tmp_path / "x.csv", torch.zeros(5), n_bidders=2)


# ---------------------------------------------------------------------------------------------------
# Unbounded inputs: an error quotes a bounded amount, absurd sizes are refused before any work


def test_a_huge_header_is_not_quoted_whole(tmp_path):
    """No bid column among 1,000 fields, or in one field of 1 MB: the error names the count and a few names, cut
    short; one line of 300,000 fields (a 200 MB one-line file has 30M) is refused before it is split into names."""
    path = tmp_path / "no_bid.csv"
    path.write_bytes(b",".join(b"x%d" % i for i in range(1000)) + b"\n0.5\n")
    message = _one_line_error(path, r"no bid columns")
    assert len(message) < 600 and "1000 columns" in message and "'x0'" in message
    path.write_bytes(b"y" * 1_000_000)
    message = _one_line_error(path, r"no bid columns")
    assert len(message) < 600 and "1000000 characters" in message
    path.write_bytes(b",".join(b"x%d" % i for i in range(300_000)))
    message = _one_line_error(path, r"the header has 300000 fields")
    assert len(message) < 600 and "'x0'" in message


def test_a_huge_field_is_not_quoted_whole(tmp_path):
    """A 1 MB token in a bid column: named by its line and cut to a few dozen characters in the message."""
    path = _write(tmp_path, "bid\n" + "\n".join(map(str, _bids())) + "\n" + "z" * 1_000_000 + "\n")
    message = _one_line_error(path, r"not a number", n_bidders=2)
    assert len(message) < 600 and "line 62" in message and "1000000 characters" in message


def test_absurd_bidder_counts_are_refused_with_the_limit(tmp_path):
    """100,000 bid columns (one auction per row): refused with the limit and the reason, before the rows are split."""
    header = ",".join(f"bid_{i}" for i in range(100_000))
    path = _write(tmp_path, header + "\n" + ",".join(["0.5"] * 100_000) + "\n")
    message = _one_line_error(path, r"the header has 100000 fields .*at most 100 bidders per auction")
    assert len(message) < 600
    wide = _write(tmp_path, ",".join(f"bid{i}" for i in range(1, 151)) + "\n" + ",".join(["0.5"] * 150) + "\n", "wide.csv")
    assert "cost grows" in _one_line_error(wide, r"150 bidders \(bid1..bid150\): at most 100 ")
    # The same limit for bidders named in a 'bidder' column, and for n_bidders.
    rows = "\n".join(f"0,b{i},0.5" for i in range(150))
    _one_line_error(_write(tmp_path, "auction_id,bidder,bid\n" + rows + "\n", "long.csv"), r"150 bidders .* at most 100 ")
    _one_line_error(_write(tmp_path, "bid\n0.5\n", "one.csv"), r"n_bidders=101: at most 100 ", n_bidders=101)


@pytest.mark.parametrize("n_bidders", [0, -2, 1])
def test_too_few_bidders_are_one_line(tmp_path, n_bidders):
    path = _write(tmp_path, "bid\n" + "\n".join(map(str, _bids())) + "\n")
    _one_line_error(path, rf"n_bidders={n_bidders}: .*at least 2 bidders", n_bidders=n_bidders)

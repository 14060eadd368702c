"""pipeline.games.bids_csv: every refusal's whole line, the row counts' metrics and summary, grouping by auction_id."""

from __future__ import annotations

import pytest
import torch

from pipeline.games.bids_csv import (
    BidDataError,
    RowCounts,
    check_n_bidders,
    load_bids_csv,
    looks_like_a_bid_column,
)

WIDE_BIDS = "".join(f"0.{i:02d},0.{i + 1:02d}\n" for i in range(10, 40))  # 30 auctions of two, 60 bids


def _write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


CASES = [
    ("u16le.csv", b"\xff\xfebid", {}, "UTF-16 text; save it as 'CSV UTF-8' (comma delimited)"),
    ("u16be.csv", b"\xfe\xffbid", {}, "UTF-16 text; save it as 'CSV UTF-8' (comma delimited)"),
    ("nul.csv", b"bid\n0.1\x00\n", {},
     "binary file (NUL bytes), not CSV text; export the bids as a comma-separated text file"),
    ("latin.csv", b"bid\n0.1\n\xe9\n", {}, "not UTF-8 text (byte 8 is 0xe9); save it as 'CSV UTF-8' (comma delimited)"),
    ("comma.csv", 'bid\n"1,5"\n', {"n_bidders": 2},
     "a quoted field holds a comma or a line break; remove commas and line breaks from the cells"),
    ("break.csv", 'bid\n"1\n5"\n', {"n_bidders": 2},
     "a quoted field holds a comma or a line break; remove commas and line breaks from the cells"),
    ("huge.csv", "a,b,c" + "," * 1098, {},
     "the header has 1101 fields (first ['a', 'b', 'c']), over 1100: not a bids header (at most 100 bidders per "
     "auction); the first line must be a header naming the bid column(s), one auction or one bid per row"),
    ("empty.csv", "", {}, "empty file; the first line must be a header naming the bid column(s)"),
    ("blank.csv", " \nbid\n", {}, "empty file; the first line must be a header naming the bid column(s)"),
    ("nocols.csv", "a,b\n1,2\n", {},
     "no bid columns (found ['a', 'b']); name them 'bid' (+ optional 'auction_id', 'bidder'), 'bid_0..bid_{n-1}' "
     "or 'bid1..bidn'"),
    ("cols9.csv", "a,b,c,d,e,f,g,h,i\n", {},
     "no bid columns (found ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', ...] (9 columns)); name them 'bid' (+ optional "
     "'auction_id', 'bidder'), 'bid_0..bid_{n-1}' or 'bid1..bidn'"),
    ("cols8.csv", "a,b,c,d,e,f,g,h\n", {},
     "no bid columns (found ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h']); name them 'bid' (+ optional 'auction_id', "
     "'bidder'), 'bid_0..bid_{n-1}' or 'bid1..bidn'"),
    ("dup.csv", "bid_0,bid_1,bid_0\n", {}, "column 'bid_0' appears twice; give each bidder one column"),
    ("gap.csv", "bid_0,bid_2\n", {},
     "bid columns have gaps: found ['bid_0', 'bid_2'], missing ['bid_1']; number the columns bid_0..bid_1 without gaps"),
    ("gap1.csv", "bid1,bid3,bid4\n", {},
     "bid columns have gaps: found ['bid1', 'bid3', 'bid4'], missing ['bid2']; number the columns bid1..bid3 "
     "without gaps"),
    ("gapstart.csv", "bid_1,bid_2\n", {},
     "bid columns have gaps: found ['bid_1', 'bid_2'], missing ['bid_0']; number the columns bid_0..bid_1 without gaps"),
    ("mismatch.csv", "x,bid_0,bid_1,bid_2\n", {"n_bidders": 2},
     "3 bid columns (bid_0..bid_2) but n_bidders=2; drop n_bidders or fix the columns"),
    ("bidder.csv", "bid,bidder\n", {}, "a 'bidder' column without 'auction_id'; add auction_id so bids can be grouped"),
    ("noauction.csv", "bid\n", {},
     "one bid per row without an 'auction_id' column; pass n_bidders (data.n_bidders=...) or add auction_id"),
    ("few.csv", "bid\n" + "0.1\n" * 49, {"n_bidders": 7},
     "only 49 usable bids, need at least 50 to estimate the opponents' bid distribution; log more auctions"),
    ("n1.csv", "bid\n", {"n_bidders": 1},
     "n_bidders=1: a first-price log needs at least 2 bidders per auction; pass the number of bidders per auction "
     "(data.n_bidders=2 or more)"),
    ("n101.csv", "bid\n", {"n_bidders": 101},
     "n_bidders=101: at most 100 bidders per auction are accepted (the estimator's cost grows with the bidder count, "
     "as n^3 for unlike bidders); check that each row is one auction (not a transposed table), or pool the bids in "
     "one 'bid' column"),
    ("w101.csv", ",".join(f"bid_{i}" for i in range(101)) + "\n", {},
     "101 bidders (bid_0..bid_100): at most 100 bidders per auction are accepted (the estimator's cost grows with the "
     "bidder count, as n^3 for unlike bidders); check that each row is one auction (not a transposed table), or pool "
     "the bids in one 'bid' column"),
    ("bad.csv", "bid_0,bid_1\n0.1,inf\nx,0.2\n0.1\n0.1,NULL\n0.2,-1\n0.3,nan\n" + WIDE_BIDS, {},
     "6 bad row(s) of 36 (1 wrong_field_count, 2 empty_or_nan, 1 not_a_number, 1 not_finite, 1 negative); first: "
     "line 2: bid_1 'inf' is not finite; line 3: bid_0 'x' is not a number; line 4: 1 fields, expected 2; "
     "line 5: bid_1 'NULL' is empty/NaN; line 6: bid_1 '-1' is negative; fix those rows, or set "
     "data.on_bad_rows=drop to drop and count them"),
    ("size.csv", "auction_id,bid\n1,0.1\n1,0.2\n2,0.3\n", {"n_bidders": 2},
     "1 bad row(s) of 3 (1 auction_size); first: line 4: its auction has the wrong number of bids; fix those rows, "
     "or set data.on_bad_rows=drop to drop and count them"),
    ("q41.csv", "bid_0,bid_1\n0.1," + "x" * 41 + "\n", {},
     "1 bad row(s) of 1 (1 not_a_number); first: line 2: bid_1 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'... "
     "(41 characters) is not a number; fix those rows, or set data.on_bad_rows=drop to drop and count them"),
    ("typo.csv", "bid_0,bid_1,bdi_2\n", {},
     "column(s) ['bdi_2'] look like bid columns but are not read (the bid columns read are ['bid_0', 'bid_1'], so "
     "the log would lose a bidder); rename them to continue the numbering of the bid columns if they hold bids, or "
     "to a name not like 'bid<number>' if they do not"),
    ("mixed.csv", "bid_0,bid_1,bid2\n", {},
     "column(s) ['bid2'] look like bid columns but are not read (the bid columns read are ['bid_0', 'bid_1'], so "
     "the log would lose a bidder); rename them to continue the numbering of the bid columns if they hold bids, or "
     "to a name not like 'bid<number>' if they do not"),
    ("long.csv", "auction_id,bid,Bid_3\n", {},
     "column(s) ['Bid_3'] look like bid columns but are not read (the bid columns read are ['bid', 'auction_id'], "
     "so the log would lose a bidder); rename them to continue the numbering of the bid columns if they hold bids, "
     "or to a name not like 'bid<number>' if they do not"),
    ("q40.csv", "bid_0,bid_1\n0.1," + "x" * 40 + "\n", {},
     "1 bad row(s) of 1 (1 not_a_number); first: line 2: bid_1 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' is not "
     "a number; fix those rows, or set data.on_bad_rows=drop to drop and count them"),
]


@pytest.mark.parametrize("name, data, kwargs, message", CASES, ids=[c[0] for c in CASES])
def test_each_refusal_is_one_whole_line_naming_the_file(tmp_path, name, data, kwargs, message):
    path = _write(tmp_path, name, data)
    with pytest.raises(BidDataError) as err:
        load_bids_csv(path, **kwargs)
    assert str(err.value) == f"{path}: {message}"


def test_a_directory_and_a_missing_file(tmp_path):
    with pytest.raises(BidDataError) as err:
        load_bids_csv(tmp_path)
    assert str(err.value) == (
        f"{tmp_path}: a directory, not a file; pass the path of the CSV file itself (data.path=<dir>/<file>.csv)")
    with pytest.raises(BidDataError) as err:
        load_bids_csv(str(tmp_path / "none.csv"))
    assert str(err.value) == (f"{tmp_path / 'none.csv'}: file not found; pass the path of a CSV of logged bids "
                              "('bid' or 'bid_0..bid_{n-1}' columns)")


def test_limits_are_inclusive(tmp_path):
    # 1100 header fields is still read as a header; exactly 50 bids and exactly 100 bidders are taken
    with pytest.raises(BidDataError, match="no bid columns"):
        load_bids_csv(_write(tmp_path, "h.csv", "a" + "," * 1099))
    data = load_bids_csv(_write(tmp_path, "fifty.csv", "bid\n" + "".join(f"0.{i:02d}\n" for i in range(50))), n_bidders=2)
    assert data.bids.shape == (25, 2)
    data = load_bids_csv(_write(tmp_path, "hundred.csv", "bid\n" + "".join(f"0.{i:02d}\n" for i in range(100))),
                         n_bidders=100)
    assert data.bids.shape == (1, 100)


def test_quoted_cells_and_crlf_are_read(tmp_path):
    text = "bid_0,bid_1\r\n" + "".join(f'"{a}",{b}\r\n' for a, b in (line.split(",") for line in WIDE_BIDS.split()))
    data = load_bids_csv(_write(tmp_path, "q.csv", text))
    assert data.bids.shape == (30, 2) and data.by_bidder
    assert data.bids[0].tolist() == [0.10, 0.11]


def test_auctions_grouped_by_an_auction_id_column_anywhere_in_the_row(tmp_path):
    # auction_id second, auctions interleaved: each auction's bids in file order
    rows = [("0.1", "b"), ("0.2", "a"), ("0.3", "b"), ("0.4", "a")] + [(f"0.{i:02d}", f"z{i // 2}") for i in range(56)]
    data = load_bids_csv(_write(tmp_path, "l.csv", "bid,auction_id\n" + "".join(f"{b},{a}\n" for b, a in rows)))
    assert data.n_bidders == 2 and not data.by_bidder
    assert data.bids[0].tolist() == [0.2, 0.4] and data.bids[1].tolist() == [0.1, 0.3]
    assert data.bids.shape == (30, 2) and data.rows.used == 60


def test_the_most_common_auction_size_is_the_bidder_count_and_others_dropped(tmp_path):
    rows = [(f"a{i // 3}", f"0.{i:02d}") for i in range(60)] + [("odd", "0.5"), ("odd", "0.6")]
    data = load_bids_csv(_write(tmp_path, "m.csv", "auction_id,bid\n" + "".join(f"{a},{b}\n" for a, b in rows)),
                         on_bad_rows="drop")
    assert data.n_bidders == 3 and data.bids.shape == (20, 3)
    assert data.rows.rejected == {"auction_size": 2} and data.rows.used == 60


def test_named_bidders_fill_their_own_columns_and_a_repeated_bidder_drops_the_auction(tmp_path):
    rows = []
    for i in range(30):
        rows += [(i, "bob", 0.2 + i / 100), (i, "al", 0.1 + i / 1000)]
    rows += [(99, "al", 0.3), (99, "al", 0.4)]
    text = "bidder,auction_id,bid\n" + "".join(f"{b},{a},{x:g}\n" for a, b, x in rows)
    data = load_bids_csv(_write(tmp_path, "b.csv", text), on_bad_rows="drop")
    assert data.by_bidder and data.n_bidders == 2
    want = [[0.1 + i / 1000, 0.2 + i / 100] for i in sorted(range(30), key=str)]  # auctions in auction_id order
    assert torch.allclose(data.bids, torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-12)
    assert data.rows.rejected == {"auction_size": 2}


def test_nan_words_in_any_case_are_empty_not_unreadable(tmp_path):
    text = "bid_0,bid_1\n" + WIDE_BIDS + "0.1,NaN\n0.1,NULL\n0.1, None \n0.1,NA\n0.1,abc\n"
    data = load_bids_csv(_write(tmp_path, "n.csv", text), on_bad_rows="drop")
    assert data.rows.rejected == {"empty_or_nan": 4, "not_a_number": 1}


@pytest.mark.parametrize("n", [1, 2.5, True, "3", 101, 0, -2])
def test_check_n_bidders_refuses_what_is_no_whole_count_in_range(n):
    with pytest.raises(ValueError) as err:
        check_n_bidders(n)
    assert str(err.value) == (
        f"data.n_bidders={n}: an auction has 2 to 100 bidders here (fewer is no auction; the estimator's cost grows "
        "with the count); set data.n_bidders=2 or more, or null to read it from the file")


@pytest.mark.parametrize("n", [2, 3, 2.0, 100])
def test_check_n_bidders_takes_whole_counts_from_2_to_100(n):
    check_n_bidders(n)


def test_row_counts_metrics_and_summary():
    c = RowCounts(read=5, used=3, rejected={"negative": 1, "auction_size": 1}, blank_lines=2)
    assert c.metrics() == {
        "data/rows_read": 5.0, "data/rows_used": 3.0, "data/rows_rejected": 2.0,
        "data/rows_rejected/negative": 1.0, "data/rows_rejected/auction_size": 1.0,
    }
    assert c.summary("x.csv") == "x.csv: read 5 rows, used 3, rejected 2 (1 negative, 1 auction_size), 2 blank line(s) skipped"
    assert RowCounts(read=2, used=2).summary("y") == "y: read 2 rows, used 2, rejected 0 (none), 0 blank line(s) skipped"
    assert RowCounts().metrics() == {"data/rows_read": 0.0, "data/rows_used": 0.0, "data/rows_rejected": 0.0}


@pytest.mark.parametrize("name", ["bdi_2", "bid2", "Bid_2", "BID 2", "bd_2", "bidd_2", "bif-2", "ibd2", "bids_12"])
def test_a_column_one_typo_from_a_bid_column_looks_like_one(name):
    assert looks_like_a_bid_column(name)


@pytest.mark.parametrize("name", ["bidder_2", "value_2", "auction_id", "bid", "price2", "b_2", "x1", "bid_x"])
def test_other_columns_do_not_look_like_bid_columns(name):
    assert not looks_like_a_bid_column(name)


def test_a_typo_column_is_refused_but_other_extra_columns_are_read_past(tmp_path):
    rows = "".join(f"{line},7\n" for line in WIDE_BIDS.split())
    data = load_bids_csv(_write(tmp_path, "ok.csv", "bid_0,bid_1,value_2\n" + rows))
    assert data.n_bidders == 2 and data.bids.shape == (30, 2)
    with pytest.raises(BidDataError, match=r"\['Bid3'\] look like bid columns"):
        load_bids_csv(_write(tmp_path, "typo.csv", "bid1,bid2,Bid3\n" + rows))

"""Property tests for the bids CSV reader on generated files: every layout reads back exactly what was
written, and bad rows are counted exactly, named by line, and dropped only on request."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pipeline.games.bids_csv import MIN_BIDS, BidDataError, load_bids_csv

bid_values = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def auctions(draw):
    n_bidders = draw(st.integers(2, 5))
    n_auctions = draw(st.integers(MIN_BIDS // n_bidders + 1, 40))
    table = draw(st.lists(st.lists(bid_values, min_size=n_bidders, max_size=n_bidders),
                          min_size=n_auctions, max_size=n_auctions))
    return np.array(table, dtype=np.float64)


def _write(text: str, *, bom: bool, crlf: bool) -> Path:
    if crlf:
        text = text.replace("\n", "\r\n")
    path = Path(tempfile.mkdtemp()) / "bids.csv"
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode())
    return path


def _render(table: np.ndarray, layout: str) -> str:
    n = table.shape[1]
    if layout == "wide":
        return "note," + ",".join(f"bid_{i}" for i in range(n)) + "\n" + "".join(
            "x," + ",".join(repr(float(b)) for b in row) + "\n" for row in table)
    if layout == "bidder":
        return "auction_id,bidder,bid\n" + "".join(
            f"a{a},p{i},{float(b)!r}\n" for a, row in enumerate(table) for i, b in enumerate(row))
    return "bid\n" + "".join(f"{float(b)!r}\n" for b in table.flatten())


@given(table=auctions(), layout=st.sampled_from(["wide", "bidder", "column"]), bom=st.booleans(), crlf=st.booleans())
def test_every_layout_reads_back_exactly_what_was_written(table, layout, bom, crlf):
    path = _write(_render(table, layout), bom=bom, crlf=crlf)
    loaded = load_bids_csv(path, n_bidders=table.shape[1] if layout == "column" else None)
    assert loaded.n_bidders == table.shape[1]
    assert loaded.rows.read == loaded.rows.used == (table.shape[0] if layout == "wide" else table.size)
    got = loaded.bids.numpy()
    if layout == "bidder":
        # Auctions come back in auction_id order (text order: a0, a1, a10, ...), bidders in name order.
        order = np.argsort([f"a{a}" for a in range(table.shape[0])], kind="stable")
        np.testing.assert_array_equal(got, table[order])
    else:
        np.testing.assert_array_equal(got, table)


BAD = {
    "wrong_field_count": ["1.0", "1.0,2.0,3.0"],
    "empty_or_nan": [",1.0", "nan,1.0", "NA,0.5"],
    "not_a_number": ["abc,1.0", "1.0,1..2"],
    "not_finite": ["inf,1.0", "1.0,-inf"],
    "negative": ["-0.5,1.0", "1.0,-1e-9"],
}


@given(
    n_good=st.integers(MIN_BIDS, 80),
    bad=st.lists(st.tuples(st.sampled_from(sorted(BAD)), st.integers(0, 2), st.integers(0, 10_000)), max_size=12),
)
def test_bad_rows_are_counted_named_and_dropped_only_on_request(n_good, bad):
    lines = [f"{i / 100!r},{i / 50!r}" for i in range(n_good)]
    inserted = []  # (position in lines, reason)
    for reason, variant, where in bad:
        text = BAD[reason][variant % len(BAD[reason])]
        position = where % (len(lines) + 1)
        lines.insert(position, text)
        inserted = [(p + (p >= position), r) for p, r in inserted] + [(position, reason)]
    path = _write("bid_0,bid_1\n" + "\n".join(lines) + "\n", bom=False, crlf=False)
    expected = {}
    for _, reason in inserted:
        expected[reason] = expected.get(reason, 0) + 1

    loaded = load_bids_csv(path, on_bad_rows="drop")
    assert loaded.rows.rejected == expected
    assert (loaded.rows.read, loaded.rows.used) == (n_good + len(bad), n_good)
    np.testing.assert_array_equal(loaded.bids.numpy()[:, 0], np.arange(n_good) / 100)
    if not bad:
        return
    try:
        load_bids_csv(path)
    except BidDataError as error:
        message = str(error)
    else:
        raise AssertionError("bad rows loaded without on_bad_rows=drop")
    first_five = sorted(p for p, _ in inserted)[:5]
    assert "\n" not in message and str(path) in message
    assert all(f"line {p + 2}:" in message for p in first_five)
    assert f"{len(bad)} bad row(s)" in message

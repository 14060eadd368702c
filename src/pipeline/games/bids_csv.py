"""Logged first-price bids from a CSV file: one vectorised pass, and nothing dropped without a count.

Layouts (header row required; other columns are ignored, except one that looks like a bid column, e.g.
``bdi_2`` or ``bid2`` next to ``bid_0, bid_1``: the file is refused, naming it, since reading it as 2 bidders
would silently drop a bidder):

- one auction per row: ``bid_0, ..., bid_{n-1}`` (or ``bid1, ..., bidn``); column i is bidder i.
- one bid per row: a column ``bid`` and, optionally, ``auction_id`` (every auction must then hold
  ``n_bidders`` rows) and ``bidder`` (names the bidder; needs ``auction_id``). Without
  ``auction_id`` consecutive groups of ``n_bidders`` rows are the auctions, so ``n_bidders`` is
  required.

Bids are in the data's own units (any positive scale). A row is bad when it has the wrong number of
fields, an empty/NaN, non-numeric, infinite or negative bid, or belongs to an auction with the
wrong number of bids. With ``on_bad_rows="error"`` (default) any bad row stops the load with one
line naming the file, the count per reason, the first five bad lines and the fix; with
``on_bad_rows="drop"`` they are dropped and counted (`RowCounts`). Blank lines carry no data and
are counted apart.

Why hand-written: the csv module's DictReader built a dict per row (a 1,000,000-row file took 82 s
and 4 GB with the old two-pass loader); pandas' C parser fills short rows with NaN and reports only
the first long one, so it can neither count nor name bad rows. Here the bytes are split once with
numpy and each bid column is converted in one ``astype`` call.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from pipeline.games.bid_checks import constant_bidder

MIN_BIDS = 50
MAX_NAMED = 5
# The most bidders per auction a log may have. Why a limit: the estimator's cost grows fast with it (for unlike
# bidders each bidder's tie polynomial runs over all the others, ~n^3 tensor operations per solver iteration, and
# the inversion builds an (auctions, n, n) table of competing bids; for alike bidders the binomial coefficients
# C(n - 1, k) overflow float64 near n = 1,030), while first-price logs have a handful. A file past it is almost
# surely not one auction per row (a transposed table, one long line), so it is refused before any work.
MAX_BIDDERS = 100
MAX_QUOTED = 40  # characters of one field an error message quotes
MAX_HEADER_FIELDS = 10 * MAX_BIDDERS + 100  # bid columns plus room for ignored ones; beyond it, not a bids header
BAD_ROWS = ("error", "drop")
_BOM = b"\xef\xbb\xbf"
_NAN_WORDS = {b"", b"nan", b"na", b"null", b"none"}

# Reason codes, in the order a row is checked; 0 is a good row.
_REASONS = ("ok", "wrong_field_count", "empty_or_nan", "not_a_number", "not_finite", "negative", "auction_size")


class BidDataError(ValueError):
    """Logged bids that cannot be used; the message names the file, the problem and the fix."""


@dataclass
class RowCounts:
    """What the loader did with the file's rows: every row is either used or rejected for a reason."""

    read: int = 0
    used: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    blank_lines: int = 0

    def metrics(self) -> dict[str, float]:
        out = {"data/rows_read": float(self.read), "data/rows_used": float(self.used),
               "data/rows_rejected": float(sum(self.rejected.values()))}
        out |= {f"data/rows_rejected/{reason}": float(n) for reason, n in self.rejected.items()}
        return out

    def summary(self, path: Path | str) -> str:
        dropped = sum(self.rejected.values())
        reasons = ", ".join(f"{n} {r}" for r, n in self.rejected.items()) or "none"
        return (f"{path}: read {self.read} rows, used {self.used}, rejected {dropped} ({reasons}), "
                f"{self.blank_lines} blank line(s) skipped")


@dataclass
class BidData:
    bids: Tensor  # (n_auctions, n_bidders) float64, in the file's units
    n_bidders: int
    by_bidder: bool  # column i is the same bidder in every auction (bid_i columns or a bidder column)
    rows: RowCounts

    @property
    def flat(self) -> Tensor:
        return self.bids.flatten()


def _fail(path: Path, problem: str, fix: str) -> BidDataError:
    return BidDataError(f"{path}: {problem}; {fix}")


def _quote(text: str) -> str:
    """``repr(text)``, cut to `MAX_QUOTED` characters with its length said when longer: an error quotes a bounded amount."""
    if len(text) <= MAX_QUOTED:
        return repr(text)
    return f"{text[:MAX_QUOTED]!r}... ({len(text)} characters)"


def _quote_list(names: list[str], most: int = 8) -> str:
    """The first ``most`` names (each `_quote`d) and how many there are in all."""
    shown = ", ".join(_quote(n) for n in names[:most])
    return f"[{shown}]" if len(names) <= most else f"[{shown}, ...] ({len(names)} columns)"


def _check_bidders(path: Path, n: int, what: str) -> None:
    """Refuse fewer than 2 or more than `MAX_BIDDERS` bidders per auction, naming ``what`` said so."""
    if n < 2:
        raise _fail(path, f"{what}: a first-price log needs at least 2 bidders per auction",
                    "pass the number of bidders per auction (data.n_bidders=2 or more)")
    if n > MAX_BIDDERS:
        raise _fail(path, f"{what}: at most {MAX_BIDDERS} bidders per auction are accepted (the estimator's cost grows "
                    "with the bidder count, as n^3 for unlike bidders)",
                    "check that each row is one auction (not a transposed table), or pool the bids in one 'bid' column")


def _wide_columns(path: Path, columns: list[str]) -> list[int] | None:
    """Positions of ``bid_0..bid_{n-1}`` (or ``bid1..bidn``) in bidder order; None when neither is there."""
    for pattern, start in ((r"bid_(\d+)", 0), (r"bid(\d+)", 1)):
        numbered: dict[int, int] = {}
        for position, name in enumerate(columns):
            if (m := re.fullmatch(pattern, name)) is not None:
                if int(m.group(1)) in numbered:
                    raise _fail(path, f"column {name!r} appears twice", "give each bidder one column")
                numbered[int(m.group(1))] = position
        if not numbered:
            continue
        expected = list(range(start, start + len(numbered)))
        if sorted(numbered) != expected:
            prefix = "bid_" if start == 0 else "bid"
            found = [f"{prefix}{i}" for i in sorted(numbered)]
            missing = [f"{prefix}{i}" for i in range(start, max(numbered) + 1) if i not in numbered]
            raise _fail(path, f"bid columns have gaps: found {_quote_list(found)}, missing {_quote_list(missing)}",
                        f"number the columns {prefix}{start}..{prefix}{start + len(numbered) - 1} without gaps")
        return [numbered[i] for i in expected]
    return None


def _edits(a: str, b: str) -> int:
    """Optimal-string-alignment distance: insertions, deletions, substitutions and swaps of neighbours."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[-1][-1]


def looks_like_a_bid_column(name: str) -> bool:
    """A column name one typo from a bid column: letters within one edit of 'bid' (any case), then a number
    ('bdi_2', 'Bid_2', 'bid2', 'bd_2', 'bid-2'). Such a column left unread silently drops a bidder."""
    found = re.fullmatch(r"([a-z]+)[\s_.\-]*(\d+)", name.strip().lower())
    return found is not None and _edits(found.group(1), "bid") <= 1


def _unused_bid_columns(path: Path, columns: list[str], used: list[int]) -> None:
    """Refuse a header with a column that looks like a bid column (`looks_like_a_bid_column`) but is not read."""
    unused = [name for i, name in enumerate(columns) if i not in used and looks_like_a_bid_column(name)]
    if unused:
        read = [columns[i] for i in used]
        raise _fail(path, f"column(s) {_quote_list(unused)} look like bid columns but are not read (the bid columns "
                    f"read are {_quote_list(read)}, so the log would lose a bidder)",
                    "rename them to continue the numbering of the bid columns if they hold bids, or to a name not "
                    "like 'bid<number>' if they do not")


def check_bids_file(path: Path) -> None:
    """BidDataError unless `path` names a file (a directory, or nothing there)."""
    if path.is_dir():
        raise _fail(path, "a directory, not a file", "pass the path of the CSV file itself (data.path=<dir>/<file>.csv)")
    if not path.is_file():
        raise _fail(path, "file not found", "pass the path of a CSV of logged bids ('bid' or 'bid_0..bid_{n-1}' columns)")


def check_n_bidders(n_bidders) -> None:
    """ValueError unless `n_bidders` (data.n_bidders) is a whole number of bidders in [2, MAX_BIDDERS]."""
    whole = not isinstance(n_bidders, bool) and isinstance(n_bidders, int | float) and float(n_bidders).is_integer()
    if not whole or not 2 <= n_bidders <= MAX_BIDDERS:
        raise ValueError(f"data.n_bidders={n_bidders}: an auction has 2 to {MAX_BIDDERS} bidders here (fewer is no "
                         "auction; the estimator's cost grows with the count); set data.n_bidders=2 or more, or "
                         "null to read it from the file")


def _read_text(path: Path) -> bytes:
    """The file's bytes without a byte-order mark, checked to be UTF-8 text, quotes resolved."""
    check_bids_file(path)
    raw = path.read_bytes()
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise _fail(path, "UTF-16 text", "save it as 'CSV UTF-8' (comma delimited)")
    if b"\x00" in raw:
        raise _fail(path, "binary file (NUL bytes), not CSV text", "export the bids as a comma-separated text file")
    raw = raw.removeprefix(_BOM)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(path, f"not UTF-8 text (byte {exc.start} is 0x{raw[exc.start]:02x})",
                    "save it as 'CSV UTF-8' (comma delimited)") from None
    if b'"' in raw:
        # Rare in numeric logs: resolve quoting with the csv module (slower), then take the fast path.
        rows = list(csv.reader(io.StringIO(text, newline="")))
        if any("," in cell or "\n" in cell for row in rows for cell in row):
            raise _fail(path, "a quoted field holds a comma or a line break",
                        "remove commas and line breaks from the cells")
        raw = "\n".join(",".join(row) for row in rows).encode()
    return raw.replace(b"\r", b"")


def _parse_numbers(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values, reason code) per token; one vectorised conversion, a per-token loop only when it fails."""
    values = np.full(tokens.shape[0], np.nan)
    reasons = np.zeros(tokens.shape[0], dtype=np.int8)
    try:
        values = tokens.astype(np.bytes_).astype(np.float64)
    except ValueError:
        for i, token in enumerate(tokens.tolist()):
            stripped = token.strip()
            if stripped.lower() in _NAN_WORDS:
                reasons[i] = _REASONS.index("empty_or_nan")
                continue
            try:
                values[i] = float(stripped)
            except ValueError:
                reasons[i] = _REASONS.index("not_a_number")
    for name, bad in (("empty_or_nan", np.isnan(values)), ("not_finite", np.isinf(values)), ("negative", values < 0)):
        reasons[(reasons == 0) & bad] = _REASONS.index(name)
    return values, reasons


def _describe(reason: int, columns: list[str], column: int, token: bytes, n_fields: int, expected: int) -> str:
    name = _REASONS[reason]
    if name == "wrong_field_count":
        return f"{n_fields} fields, expected {expected}"
    if name == "auction_size":
        return "its auction has the wrong number of bids"
    text = token.decode(errors="replace").strip()
    what = {"empty_or_nan": "is empty/NaN", "not_a_number": "is not a number", "not_finite": "is not finite",
            "negative": "is negative"}[name]
    return f"{columns[column]} {_quote(text)} {what}"


def load_bids_csv(path: str | Path, n_bidders: int | None = None, on_bad_rows: str = "error") -> BidData:
    """Read logged first-price bids (layouts in the module docstring) into an (auctions, bidders) tensor."""
    path = Path(path)
    if on_bad_rows not in BAD_ROWS:
        raise BidDataError(f"on_bad_rows={on_bad_rows!r}; choose one of {BAD_ROWS}")
    if n_bidders is not None:
        _check_bidders(path, int(n_bidders), f"n_bidders={n_bidders}")
    raw = _read_text(path)
    header, _, body = raw.partition(b"\n")
    if header.count(b",") >= MAX_HEADER_FIELDS:  # before splitting it: one 200 MB line is 30M fields
        first = [c.strip() for c in header[:1000].decode(errors="replace").split(",")[:3]]
        raise _fail(path, f"the header has {header.count(b',') + 1} fields (first {_quote_list(first)}), over "
                    f"{MAX_HEADER_FIELDS}: not a bids header (at most {MAX_BIDDERS} bidders per auction)",
                    "the first line must be a header naming the bid column(s), one auction or one bid per row")
    columns = [c.strip() for c in header.decode().split(",")] if header.strip() else []
    if not columns:
        raise _fail(path, "empty file", "the first line must be a header naming the bid column(s)")
    wide = None if "bid" in columns else _wide_columns(path, columns)
    if wide is None and "bid" not in columns:
        raise _fail(path, f"no bid columns (found {_quote_list(columns)})",
                    "name them 'bid' (+ optional 'auction_id', 'bidder'), 'bid_0..bid_{n-1}' or 'bid1..bidn'")
    used_columns = wide if wide is not None else [columns.index(c) for c in ("bid", "auction_id", "bidder")
                                                    if c in columns]
    _unused_bid_columns(path, columns, used_columns)
    if wide is not None:
        _check_bidders(path, len(wide), f"{len(wide)} bidders ({columns[wide[0]]}..{columns[wide[-1]]})")
    if wide is not None and n_bidders is not None and n_bidders != len(wide):
        raise _fail(path, f"{len(wide)} bid columns ({columns[wide[0]]}..{columns[wide[-1]]}) but n_bidders={n_bidders}",
                    "drop n_bidders or fix the columns")
    if wide is None and "bidder" in columns and "auction_id" not in columns:
        raise _fail(path, "a 'bidder' column without 'auction_id'", "add auction_id so bids can be grouped")
    if wide is None and "auction_id" not in columns and n_bidders is None:
        raise _fail(path, "one bid per row without an 'auction_id' column",
                    "pass n_bidders (data.n_bidders=...) or add auction_id")

    body = body.removesuffix(b"\n")
    expected = len(columns)
    # Lines and their field counts, from the positions of newlines and commas.
    array = np.frombuffer(body, dtype=np.uint8)
    ends = np.append(np.flatnonzero(array == ord("\n")), array.size) if body else np.zeros(0, dtype=np.int64)
    starts = np.concatenate([[0], ends[:-1] + 1]) if ends.size else ends
    commas = np.flatnonzero(array == ord(","))
    n_fields = np.searchsorted(commas, ends) - np.searchsorted(commas, starts) + 1
    del array, commas
    blank = (ends - starts) == 0
    offsets = np.concatenate([[0], np.cumsum(n_fields)[:-1]]).astype(np.int64) if ends.size else ends
    tokens = np.array(body.replace(b"\n", b",").split(b","), dtype=object) if body else np.zeros(0, dtype=object)
    del body

    reason = np.where(~blank & (n_fields != expected), _REASONS.index("wrong_field_count"), 0).astype(np.int8)
    reason_column = np.zeros(reason.shape, dtype=np.int64)
    good = np.flatnonzero(~blank & (reason == 0))
    bid_columns = wide if wide is not None else [columns.index("bid")]
    values = np.full((good.size, len(bid_columns)), np.nan)
    for j, column in enumerate(bid_columns):
        values[:, j], why = _parse_numbers(tokens[offsets[good] + column])
        first_here = (why > 0) & (reason[good] == 0)
        reason[good[first_here]] = why[first_here]
        reason_column[good[first_here]] = column

    rows = np.flatnonzero(~blank)
    used = reason[good] == 0
    if wide is not None:
        auctions, line_of_auction = values[used], good[used]
        n = len(wide)
        by_bidder = True
    else:
        auctions, line_of_auction, n, by_bidder = _group_long(
            path, columns, tokens, offsets, good[used], values[used, 0], n_bidders, reason)
    counts = RowCounts(read=int(rows.size), blank_lines=int(blank.sum()))
    counts.rejected = {_REASONS[r]: int((reason[rows] == r).sum()) for r in range(1, len(_REASONS))
                       if (reason[rows] == r).any()}
    counts.used = counts.read - sum(counts.rejected.values())
    if counts.rejected and on_bad_rows == "error":
        bad = rows[reason[rows] > 0][:MAX_NAMED]
        named = "; ".join(
            f"line {i + 2}: " + _describe(int(reason[i]), columns, int(reason_column[i]),
                                          tokens[offsets[i] + reason_column[i]] if reason[i] != 1 else b"",
                                          int(n_fields[i]), expected)
            for i in bad)
        reasons = ", ".join(f"{k} {r}" for r, k in counts.rejected.items())
        raise _fail(path, f"{sum(counts.rejected.values())} bad row(s) of {counts.read} ({reasons}); first: {named}",
                    "fix those rows, or set data.on_bad_rows=drop to drop and count them")
    del line_of_auction
    if n < 2:
        raise _fail(path, f"{n} bidder(s) per auction", "a first-price log needs at least 2 bidders per auction")
    if auctions.size < MIN_BIDS:
        raise _fail(path, f"only {auctions.size} usable bids, need at least {MIN_BIDS} to estimate the opponents' "
                    "bid distribution", "log more auctions")
    return BidData(torch.from_numpy(np.ascontiguousarray(auctions)), int(n), by_bidder, counts)


def _group_long(path, columns, tokens, offsets, lines, bids, n_bidders, reason):
    """One bid per row -> (auctions, n) by auction_id (and bidder); rows of wrong-sized auctions are marked bad."""
    size_code = _REASONS.index("auction_size")
    if "auction_id" not in columns:
        n = int(n_bidders)
        whole = bids.size - bids.size % n
        reason[lines[whole:]] = size_code  # a trailing incomplete auction
        return bids[:whole].reshape(-1, n), lines[:whole], n, False
    ids = tokens[offsets[lines] + columns.index("auction_id")].astype(np.bytes_)
    _, auction, sizes = np.unique(ids, return_inverse=True, return_counts=True)
    if "bidder" in columns:
        names = tokens[offsets[lines] + columns.index("bidder")].astype(np.bytes_)
        labels, bidder = np.unique(names, return_inverse=True)
        n = labels.size
        _check_bidders(path, n, f"{n} bidders named in the 'bidder' column")
        # An auction must name each bidder once: a repeated bidder makes it the wrong size too.
        pair = auction.astype(np.int64) * n + bidder
        _, pair_index, pair_count = np.unique(pair, return_inverse=True, return_counts=True)
        repeated = np.zeros(sizes.size, dtype=bool)
        repeated[auction[pair_count[pair_index] > 1]] = True
    else:
        n = int(n_bidders) if n_bidders is not None else int(np.bincount(sizes).argmax())
        _check_bidders(path, n, f"{n} bidders (the most common number of rows per auction_id)")
        bidder, repeated = None, np.zeros(sizes.size, dtype=bool)
    complete = (sizes == n) & ~repeated
    keep = complete[auction]
    reason[lines[~keep]] = size_code
    auction_index = np.cumsum(complete) - 1
    table = np.empty((int(complete.sum()), n))
    rows = auction_index[auction[keep]]
    if bidder is None:
        order = np.argsort(auction[keep], kind="stable")
        position = np.arange(order.size) % n
        table[rows[order], position] = bids[keep][order]
    else:
        table[rows, bidder[keep]] = bids[keep]
    return table, lines[keep], n, bidder is not None


def check_bid_values(path: str | Path, data: BidData) -> None:
    """BidDataError (one line) for a log whose bids cannot be equilibrium bids of private values: all equal, or one
    bidder who bids the same in every auction (`constant_bidder`, the same check in every layout)."""
    path = Path(path)
    if float(data.bids.max()) == float(data.bids.min()):
        raise _fail(path, f"every bid is {float(data.bids.max()):g}: equal bids say nothing about the values behind "
                    "them", "check that the bid column holds the bids (not a reserve or a fixed price)")
    if (constant := constant_bidder(data.bids, data.by_bidder)) is not None:
        raise _fail(path, f"{constant} (a constant bid column): no equilibrium of private values bids that",
                    "drop that bidder's bids and pass the others' count (data.n_bidders), or check the column")


def save_bids_csv(path: str | Path, bids: Tensor, n_bidders: int) -> Path:
    """Write bids one per row with ``auction_id`` (consecutive groups of ``n_bidders``)."""
    path = Path(path)
    flat = torch.as_tensor(bids).flatten().tolist()
    if len(flat) % n_bidders:
        raise ValueError(f"{len(flat)} bids do not split into auctions of {n_bidders}")
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["auction_id", "bid"])
        writer.writerows((i // n_bidders, f"{b:.10g}") for i, b in enumerate(flat))
    return path

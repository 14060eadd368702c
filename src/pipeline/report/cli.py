"""``python -m pipeline.report DIR [DIR ...] [--out OUT]``: build the report and print a summary."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.report.collect import NOT_OK, ReportInputError, RunRecordWarning
from pipeline.report.markdown import fmt
from pipeline.report.stats import DEFAULT_REPS, DEFAULT_SEED


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.report",
        description="Seed-distribution report (IQM, bootstrap CIs, plots) from run or sweep dirs.",
    )
    parser.add_argument("inputs", nargs="+", metavar="DIR", help="run dirs or sweep dirs (searched recursively)")
    parser.add_argument("--out", default=None, help="report dir (default: DIR/report when one DIR is given)")
    parser.add_argument("--reps", type=_positive, default=DEFAULT_REPS, help="bootstrap resamples (default %(default)s)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="bootstrap seed (default %(default)s)")
    return parser.parse_args(argv)


def _fmt(value: Any) -> str:
    return "-" if value is None else fmt(value)


def summary_lines(report: dict[str, Any]) -> list[str]:
    header = ("group", "metric", "ok", *NOT_OK, "mean ± std", "IQM [95% CI]")
    rows = [header]
    for name, g in report["groups"].items():
        mean = "-" if g["mean"] is None else f"{_fmt(g['mean'])} ± {_fmt(g['std'])}"
        iqm = "-" if g["iqm"] is None else f"{_fmt(g['iqm'])} [{_fmt(g['iqm_ci'][0])}, {_fmt(g['iqm_ci'][1])}]"
        rows.append((name, str(g["primary_metric"]), str(g["n_ok"]), *(str(g[f"n_{s}"]) for s in NOT_OK), mean, iqm))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return ["  ".join(value.ljust(width) for value, width in zip(row, widths)).rstrip() for row in rows]


def _writable(folder: Path) -> bool:
    """Whether a file can be made in `folder` (absent: judged by its nearest existing parent)."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return True  # not a dir of runs: build_report says what is wrong with it
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def _positive(text: str) -> int:
    """argparse type of --reps: a bootstrap needs at least one resample (0 or -3 gave an IndexError deep in rliable)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: the bootstrap needs at least 1 resample (default {DEFAULT_REPS})")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from pipeline.report.build import MARKDOWN_FILE, build_report

    start = time.perf_counter()
    if args.out is not None:
        try:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            probe = Path(args.out) / ".write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            print(f"error: --out {args.out}: {exc.strerror or exc}; choose a folder you can write", file=sys.stderr)
            return 2
    elif len(args.inputs) == 1 and not _writable(Path(args.inputs[0])):
        # The default, <DIR>/report, inside a dir that cannot be written (a read-only copy, another user's runs).
        print(f"error: cannot write the report into {Path(args.inputs[0]) / 'report'}: the folder is not writable; "
              "write it elsewhere with --out <dir>", file=sys.stderr)
        return 2
    try:
        with warnings.catch_warnings():
            # Skipped records are listed below with the report's other warnings; once is enough.
            warnings.simplefilter("ignore", RunRecordWarning)
            report = build_report(args.inputs, args.out, reps=args.reps, seed=args.seed)
    except ReportInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for line in summary_lines(report):
        print(line)
    for warning in report["warnings"]:
        print(f"warning: {warning}")
    if report["partial"]:
        print(f"partial report: {report['status_counts']['running']} run(s) still running; build it again when they finish")
    elapsed = time.perf_counter() - start
    print(f"{report['n_runs']} runs, {len(report['groups'])} groups, built in {elapsed:.1f} s")
    print(f"report: {Path(report['out_dir']) / MARKDOWN_FILE}")
    return 0

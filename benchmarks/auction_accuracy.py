"""Second-price revenue from first-price bids against the exact truth and two oracles, over data seeds.

Logs come from `auction_logs.py` (equilibrium bids of value distributions the estimator never reads). Per case,
N and seed: the point estimate at every reserve (`pipeline.games.rmac.predict_counterfactuals` for alike bidders,
`pipeline.games.asymmetric.asymmetric_table` for unlike ones, bids only), its worst |error| over the reserves,
the true-values oracle's (the same revenue from the true values' empirical CDFs, `auction_logs.oracle`) and the
bids-only oracle's (GPV's pseudo-values with the TRUE bid density and the bids' empirical CDF,
`auction_logs.bids_oracle_values`: the floor for an estimator that reads the bid density perfectly).

Per cell (case x N): median over seeds of each worst error and of the per-seed ratios to each oracle, the
seed-to-seed spread of the ratio to the values oracle (half its interquartile range), the share of (seed, reserve)
points whose point +- 2 SD (the estimator's own SD) holds the truth, the logs flagged as not to be trusted near
the top, and the CPU seconds per log.

`python benchmarks/auction_accuracy.py --grid` runs the declared benchmark (`auction_logs.GRID_CASES`, N = 5,000
and 20,000, 6 seeds), one JSON line per cell to ``--jsonl`` as each finishes, then the table; ``--cases``,
``--sizes``, ``--seeds`` pick a subset. Dirty logs: ``--round 0.05``, ``--zeros 0.02``, ``--mass 0.03`` (3% of
the bids at one value), ``--reserve 0.2 [--complete-only]`` (a hard reserve in the logs: non-bids as 0, or only the
auctions where everybody bid). ``--bounds``: the share of (seed, reserve) pairs whose robust bounds hold the
truth, per epsilon, instead (alike bidders).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from auction_logs import (  # noqa: E402
    CASES,
    GRID_CASES,
    Case,
    bids_oracle_values,
    oracle,
    truth,
    with_mass_point,
    with_reserve,
)

import pipeline.games.asymmetric as asymmetric  # noqa: E402
from pipeline.games.rmac import predict_counterfactuals  # noqa: E402
from pipeline.games.rules import parse_rule  # noqa: E402


def estimate(case: Case, bids: np.ndarray) -> tuple[list[float], dict]:
    """Point revenue at each of the case's reserves from the bids alone, and what else the estimator reported
    (per-reserve SDs, the reserves it flags, the method)."""
    rules = [parse_rule(f"second_price_r{r:g}").name for r in case.reserves]
    table = torch.from_numpy(np.ascontiguousarray(bids))
    if case.symmetric:
        found = predict_counterfactuals(table.flatten(), case.n_bidders, rules, [])
        sd = [found.point_sd.get(f"cf/{r}/point", np.nan) for r in rules]
        # rules the estimator does not estimate (under a reserve in the logs) are NaN: left out of every worst error
        return [found.table.get(f"cf/{r}/point", np.nan) for r in rules], {
            "top": found.value_top, "sd": sd, "flagged": found.untrusted_reserves(list(case.reserves)),
            "method": found.inversion}
    found = asymmetric.asymmetric_point(table, rules)
    sd = [found.point_sd.get(f"cf/{r}/point", np.nan) for r in rules]
    return [found.table[f"cf/{r}/point"] for r in rules], {
        "sd": sd, "flagged": found.untrusted_reserves(list(case.reserves)), "method": found.inversion}


def prepare(bids: np.ndarray, step: float | None, zeros: float, seed: int, mass: float = 0.0) -> np.ndarray:
    if step:
        bids = np.round(bids / step) * step
    if zeros:
        bids = bids.copy()
        bids[np.random.default_rng(seed + 7919).random(bids.shape) < zeros] = 0.0
    if mass:
        bids = with_mass_point(bids, mass, seed)
    return bids


def draw(case: Case, n_auctions: int, seed: int, reserve: float = 0.0, complete_only: bool = False):
    """(the case as logged, values, bids): with a hard ``reserve``, the values under it bid 0, or (``complete_only``)
    only the auctions where everybody bid are kept."""
    if reserve:
        case = with_reserve(case, reserve)
    values, bids = case.draw(n_auctions, seed)
    if complete_only:
        keep = (bids > 0).all(1)
        values, bids = values[keep], bids[keep]
    return case, values, bids


def coverage(case: Case, n_auctions: int, seeds: int, epsilons=(0.001, 0.005, 0.02), step: float | None = None,
             zeros: float = 0.0) -> dict:
    """Share of (seed, reserve) pairs whose robust bounds hold the exact truth, per epsilon (alike bidders only)."""
    rules = [parse_rule(f"second_price_r{r:g}").name for r in case.reserves]
    truths = {rule: truth(case, r) for rule, r in zip(rules, case.reserves)}
    held = {e: 0 for e in epsilons}
    missed: list[str] = []
    for seed in range(seeds):
        _, bids = case.draw(n_auctions, seed)
        table = predict_counterfactuals(torch.from_numpy(prepare(bids, step, zeros, seed)).flatten(), case.n_bidders,
                                        rules, list(epsilons)).table
        for e in epsilons:
            label = f"{e:g}"
            inside = {r: table[f"cf/{r}/lower_eps{label}"] - 1e-9 <= truths[r] <= table[f"cf/{r}/upper_eps{label}"] + 1e-9
                      for r in rules}
            held[e] += sum(inside.values())
            missed += [f"seed {seed} {r} eps {label}" for r, ok in inside.items() if not ok]
    return {"case": case.name, "n": n_auctions, "seeds": seeds, "round": step, "zeros": zeros,
            "covered": {f"{e:g}": held[e] / (seeds * len(rules)) for e in epsilons}, "missed": missed}


def run_case(case: Case, n_auctions: int, seeds: int, step: float | None = None, zeros: float = 0.0,
             mass: float = 0.0, reserve: float = 0.0, complete_only: bool = False, first_seed: int = 0) -> dict:
    truths = np.array([truth(case, r) for r in case.reserves])
    errors, oracle_errors, bids_oracle_errors, sds, flagged, methods, seconds = [], [], [], [], [], [], []
    for seed in range(first_seed, first_seed + seeds):
        logged, values, bids = draw(case, n_auctions, seed, reserve, complete_only)
        t0 = time.process_time()
        points, extra = estimate(logged, prepare(bids, step, zeros, seed, mass))
        seconds.append(time.process_time() - t0)
        errors.append(np.array(points) - truths)
        sds.append(np.array(extra.get("sd", [np.nan] * len(truths)), dtype=float))
        flagged.append(extra.get("flagged", []))
        methods.append(extra.get("method", ""))
        pseudo = bids_oracle_values(logged, bids, values, complete_only)
        if complete_only:  # the kept auctions hold values over the reserve only: put the rest's share back, at 0
            below = float(case.dist.cdf(reserve))
            missing = np.zeros((int(round(values.size * below / (1 - below))), 1))
            values, pseudo = np.concatenate([values.reshape(-1, 1), missing]), np.concatenate([pseudo.reshape(-1, 1), missing])
        oracle_errors.append(np.array([oracle(case, values, r) for r in case.reserves]) - truths)
        bids_oracle_errors.append(np.array([oracle(case, pseudo, r) for r in case.reserves]) - truths)
    errors, oracle_errors, sds = np.array(errors), np.array(oracle_errors), np.array(sds)
    estimated = np.isfinite(errors)  # every worst error over the reserves the estimator estimates
    worst = np.where(estimated, np.abs(errors), 0.0).max(1)
    worst_oracle = np.where(estimated, np.abs(oracle_errors), 0.0).max(1)
    worst_bids_oracle = np.where(estimated, np.abs(np.array(bids_oracle_errors)), 0.0).max(1)
    ratio = worst / worst_oracle
    to_bids = worst / worst_bids_oracle
    mean, sd = errors.mean(0), errors.std(0, ddof=1) if seeds > 1 else np.zeros(errors.shape[1])
    held = np.abs(errors) <= 2 * sds + 1e-9
    bad = to_bids > 2.0  # a log whose estimate is bad: over twice the bids-only oracle
    warned = np.array([len(f) > 0 for f in flagged])
    # per (log, reserve): a bad point is over twice the log's bids-only worst error; is it flagged?
    flags = np.array([[any(abs(r - f) < 1e-9 for f in fl) for r in case.reserves] for fl in flagged])
    bad_points = estimated & (np.where(estimated, np.abs(errors), 0.0) > 2 * worst_bids_oracle[:, None])
    over_points = estimated & (np.where(estimated, np.abs(errors), 0.0) > worst_bids_oracle[:, None])
    return {
        "case": case.name, "n": n_auctions, "seeds": seeds, "first_seed": first_seed, "round": step, "zeros": zeros,
        "mass": mass, "reserve": reserve, "complete_only": complete_only,
        "worst": float(np.median(worst)), "oracle": float(np.median(worst_oracle)),
        "bids_oracle": float(np.median(worst_bids_oracle)),
        "ratio": float(np.median(ratio)), "ratio_spread": float(np.subtract(*np.percentile(ratio, [75, 25])) / 2),
        "ratio_to_bids_oracle": float(np.median(to_bids)),
        "per_seed": {"worst": worst.round(5).tolist(), "ratio": ratio.round(3).tolist(),
                     "ratio_to_bids_oracle": to_bids.round(3).tolist(), "flagged": flagged, "methods": methods},
        "sd_coverage": float(held[np.isfinite(sds)].mean()) if np.isfinite(sds).any() else None,
        "warned": int(warned.sum()), "bad": int(bad.sum()), "bad_warned": int((bad & warned).sum()),
        "bad_points": int(bad_points.sum()), "bad_points_flagged": int((bad_points & flags).sum()),
        "flagged_points": int((flags & estimated).sum()), "flagged_over": int((flags & over_points).sum()),
        "points": int(estimated.sum()),
        "bias": {f"{r:g}": round(float(m), 5) for r, m in zip(case.reserves, mean)},
        "sd": {f"{r:g}": round(float(s), 5) for r, s in zip(case.reserves, sd)},
        "bias_in_sd": {f"{r:g}": round(float(m / s), 2) if s > 0 else 0.0 for r, m, s in zip(case.reserves, mean, sd)
                       if np.isfinite(m)},
        "worst_at": {f"{r:g}": int(c) for r, c in zip(case.reserves, np.bincount(
            np.where(estimated, np.abs(errors), -1.0).argmax(1), minlength=len(case.reserves)))},
        "cpu_s_per_log": round(float(np.mean(seconds)), 3),
    }


def line(row: dict) -> str:
    cover = "-" if row["sd_coverage"] is None else f"{row['sd_coverage']:.2f}"
    return (f"{row['case']:20s} N={row['n']:>6} worst {row['worst']:.4f} | values oracle {row['oracle']:.4f} "
            f"ratio {row['ratio']:.2f} +-{row['ratio_spread']:.2f} | bids-only oracle {row['bids_oracle']:.4f} "
            f"ratio {row['ratio_to_bids_oracle']:.2f} | 2SD cover {cover} | bad points flagged "
            f"{row['bad_points_flagged']}/{row['bad_points']}, flagged {row['flagged_points']}/{row['points']} "
            f"({row['flagged_over']} over the bids-only worst) | {row['cpu_s_per_log']:.1f} CPU s/log")


def table(rows: list[dict]) -> str:
    """The grid as a markdown table: one line per case, N = 5,000 and 20,000 side by side."""
    sizes = sorted({r["n"] for r in rows})
    by = {(r["case"], r["n"]): r for r in rows}
    head = ("| case | " + " | ".join(f"N={n}: worst / bids-only / **ratio** (to values)" for n in sizes)
            + " | ratio to values 5k -> 20k (grows beyond spread?) | point +- 2 SD holds the truth | bad points "
            "flagged |")
    out = [head, "|" + "---|" * (len(sizes) + 4)]
    for case in dict.fromkeys(r["case"] for r in rows):
        cells = [by.get((case, n)) for n in sizes]
        text = [f"{c['worst']:.4f} / {c['bids_oracle']:.4f} / **{c['ratio_to_bids_oracle']:.2f}** ({c['ratio']:.2f})"
                if c else "-" for c in cells]
        grows = "-"
        if len(sizes) >= 2 and cells[0] and cells[-1]:
            step = cells[-1]["ratio"] - cells[0]["ratio"]
            spread = max(cells[0]["ratio_spread"], cells[-1]["ratio_spread"])
            grows = f"{cells[0]['ratio']:.2f} -> {cells[-1]['ratio']:.2f} ({'yes' if step > spread else 'no'})"
        cover = " / ".join("-" if not c or c["sd_coverage"] is None else f"{c['sd_coverage']:.2f}" for c in cells)
        warned = " / ".join(f"{c['bad_points_flagged']}/{c['bad_points']}" if c else "-" for c in cells)
        out.append(f"| {case} | " + " | ".join(text) + f" | {grows} | {cover} | {warned} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", action="store_true", help="the declared benchmark (GRID_CASES)")
    parser.add_argument("--cases", nargs="+", default=None, choices=list(CASES))
    parser.add_argument("--sizes", type=int, nargs="+", default=[5_000, 20_000])
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--round", type=float, default=None, help="round the bids to this step")
    parser.add_argument("--zeros", type=float, default=0.0, help="set this share of the bids to 0")
    parser.add_argument("--mass", type=float, default=0.0, help="move this share of the bids to one value")
    parser.add_argument("--reserve", type=float, default=0.0, help="a hard reserve in the logged auctions")
    parser.add_argument("--complete-only", action="store_true", help="with --reserve: only auctions where all bid")
    parser.add_argument("--bounds", action="store_true", help="coverage of the robust bounds instead (alike bidders)")
    parser.add_argument("--jsonl", default=None, help="append one JSON line per finished cell")
    parser.add_argument("--table", default=None, help="print the table of a --jsonl file and stop")
    args = parser.parse_args(argv)
    if args.table:
        print(table([json.loads(x) for x in Path(args.table).read_text().splitlines() if x.strip()]))
        return
    torch.set_num_threads(1)
    names = args.cases or (list(GRID_CASES) if args.grid else ["beta22_n3", "v2_n4", "uniform_n3", "asym_1_2"])
    rows = []
    start = time.process_time()
    if args.bounds:
        for name in [c for c in names if CASES[c].symmetric]:
            for n_auctions in args.sizes:
                rows.append(coverage(CASES[name], n_auctions, args.seeds, step=args.round, zeros=args.zeros))
                print(rows[-1], flush=True)
        return
    for name in names:
        for n_auctions in args.sizes:
            rows.append(run_case(CASES[name], n_auctions, args.seeds, args.round, args.zeros, args.mass, args.reserve,
                                 args.complete_only, args.first_seed))
            print(line(rows[-1]), flush=True)
            if args.jsonl:
                with open(args.jsonl, "a") as f:
                    f.write(json.dumps(rows[-1]) + "\n")
    print(table(rows))
    print(f"cost: {time.process_time() - start:.0f} CPU s in all, estimator "
          f"{sum(r['cpu_s_per_log'] * r['seeds'] for r in rows):.0f} CPU s for {sum(r['seeds'] for r in rows)} logs")


if __name__ == "__main__":
    main()

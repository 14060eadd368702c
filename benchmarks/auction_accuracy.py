"""Second-price revenue from first-price bids against the exact truth and the true-values oracle, over data seeds.

Logs come from `auction_logs.py` (closed-form equilibrium bids; the estimator never reads that code). Per case,
N and seed: the point estimate at every reserve (`pipeline.games.rmac.predict_counterfactuals` for alike bidders,
`pipeline.games.asymmetric.asymmetric_table` for the asymmetric pair, bids only), its worst |error| over the
reserves, and the oracle's (the same revenue from the true values' empirical CDFs, `auction_logs.oracle`), and the
bids-only oracle's (GPV's pseudo-values with the TRUE bid density and the bids' empirical CDF,
`auction_logs.bids_oracle_values`: the floor for an estimator that reads the bid density perfectly).
Reported per case and N: median over seeds of the worst error, of each oracle's worst error and of the per-seed
ratios, and per reserve the mean signed error with its SD over seeds.
`python benchmarks/auction_accuracy.py [--cases beta22_n3 ...] [--sizes 5000 20000] [--seeds 30] [--round 0.05]
[--zeros 0.02] [--bounds] [--out results.json]`; ``--bounds``: the share of (seed, reserve) pairs whose robust
bounds hold the truth, per epsilon, instead.
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
from auction_logs import CASES, Case, bids_oracle_values, oracle, truth  # noqa: E402

from pipeline.games.asymmetric import asymmetric_table  # noqa: E402
from pipeline.games.rmac import predict_counterfactuals  # noqa: E402
from pipeline.games.rules import parse_rule  # noqa: E402


def estimate(case: Case, bids: np.ndarray) -> tuple[list[float], dict]:
    """Point revenue at each of the case's reserves from the bids alone, and what else the estimator reported."""
    rules = [parse_rule(f"second_price_r{r:g}").name for r in case.reserves]
    table = torch.from_numpy(np.ascontiguousarray(bids))
    if case.symmetric:
        found = predict_counterfactuals(table.flatten(), case.n_bidders, rules, [])
        return [found.table[f"cf/{r}/point"] for r in rules], {"top": found.scale.top * found.scale.unit}
    out, _ = asymmetric_table(table, rules)
    return [out[f"cf/{r}/point"] for r in rules], {}


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


def prepare(bids: np.ndarray, step: float | None, zeros: float, seed: int) -> np.ndarray:
    if step:
        bids = np.round(bids / step) * step
    if zeros:
        bids = bids.copy()
        bids[np.random.default_rng(seed + 7919).random(bids.shape) < zeros] = 0.0
    return bids


def run_case(case: Case, n_auctions: int, seeds: int, step: float | None = None, zeros: float = 0.0) -> dict:
    truths = np.array([truth(case, r) for r in case.reserves])
    errors, oracle_errors, bids_oracle_errors, tops, seconds = [], [], [], [], 0.0
    for seed in range(seeds):
        values, bids = case.draw(n_auctions, seed)
        t0 = time.process_time()
        points, extra = estimate(case, prepare(bids, step, zeros, seed))
        seconds += time.process_time() - t0
        errors.append(np.array(points) - truths)
        oracle_errors.append(np.array([oracle(case, values, r) for r in case.reserves]) - truths)
        pseudo = bids_oracle_values(case, bids)
        bids_oracle_errors.append(np.array([oracle(case, pseudo, r) for r in case.reserves]) - truths)
        tops.append(extra.get("top", np.nan))
    errors, oracle_errors = np.array(errors), np.array(oracle_errors)
    worst, worst_oracle = np.abs(errors).max(1), np.abs(oracle_errors).max(1)
    worst_bids_oracle = np.abs(np.array(bids_oracle_errors)).max(1)
    mean, sd = errors.mean(0), errors.std(0, ddof=1)
    return {
        "case": case.name, "n": n_auctions, "seeds": seeds, "round": step, "zeros": zeros,
        "worst": float(np.median(worst)), "oracle": float(np.median(worst_oracle)),
        "ratio": float(np.median(worst / worst_oracle)),
        "ratio_of_medians": float(np.median(worst) / np.median(worst_oracle)),
        "bids_oracle": float(np.median(worst_bids_oracle)),
        "ratio_to_bids_oracle": float(np.median(worst / worst_bids_oracle)),
        "bias": {f"{r:g}": round(float(m), 5) for r, m in zip(case.reserves, mean)},
        "sd": {f"{r:g}": round(float(s), 5) for r, s in zip(case.reserves, sd)},
        "bias_in_sd": {f"{r:g}": round(float(m / s), 2) if s > 0 else 0.0 for r, m, s in zip(case.reserves, mean, sd)},
        "oracle_sd": {f"{r:g}": round(float(s), 5) for r, s in zip(case.reserves, oracle_errors.std(0, ddof=1))},
        "worst_at": {f"{r:g}": int(c) for r, c in zip(case.reserves, np.bincount(np.abs(errors).argmax(1),
                                                                                   minlength=len(case.reserves)))},
        "ratio_without_top": float(np.median(np.abs(errors[:, :-1]).max(1) / worst_oracle)),
        "top_median": float(np.nanmedian(tops)) if case.symmetric else None,
        "cpu_s_per_log": round(seconds / seeds, 3),
    }


def line(row: dict) -> str:
    biases = " ".join(f"{r}:{b:+.4f}({row['bias_in_sd'][r]:+.1f})" for r, b in row["bias"].items())
    return (f"{row['case']:11s} N={row['n']:>6} worst {row['worst']:.4f} oracle {row['oracle']:.4f} "
            f"ratio {row['ratio']:.2f} ({row['ratio_of_medians']:.2f}; below the top reserve "
            f"{row['ratio_without_top']:.2f}) bids-only oracle {row['bids_oracle']:.4f} ratio "
            f"{row['ratio_to_bids_oracle']:.2f} | bias(SDs) {biases}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--sizes", type=int, nargs="+", default=[5_000, 20_000])
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--round", type=float, default=None, help="round the bids to this step")
    parser.add_argument("--zeros", type=float, default=0.0, help="set this share of the bids to 0")
    parser.add_argument("--bounds", action="store_true", help="coverage of the robust bounds instead (alike bidders)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    if args.bounds:
        for name in [c for c in args.cases if CASES[c].symmetric]:
            for n_auctions in args.sizes:
                rows.append(coverage(CASES[name], n_auctions, args.seeds, step=args.round, zeros=args.zeros))
                print(rows[-1], flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(rows, indent=1))
        return
    for name in args.cases:
        for n_auctions in args.sizes:
            rows.append(run_case(CASES[name], n_auctions, args.seeds, args.round, args.zeros))
            print(line(rows[-1]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

"""The one auction solver against the symmetric solver it replaced: time ratio and equality, same invocation.

`pipeline.games.solver` solves symmetric and asymmetric auctions with one implementation (a symmetric
auction is one population of n alike bidders). The target: on symmetric logs its results equal the old
symmetric solver's and it takes at most 1.5x its time. The reference is that old solver itself
(`solve_equilibrium` and `solve_bounds` of `src/pipeline/games/rmac.py` at commit REFERENCE, read from
git, so nothing is copied into the tree), timed alternately with the new one on the same inputs.

Cases: 5,000 equilibrium bids of U[0, 1] values, 2 and 3 bidders, 0.01 grid, the types the point
estimate gives them (`inverted_value_cdf`), first price and second price at r = 0.5: the equilibrium
(1,000 fictitious-play iterations at most) and the bounds (200 Frank-Wolfe iterations, 3 epsilons,
revenue). Reported per case: the best of ``--repeats`` seconds of each, their ratio (new / old) and the
largest difference of their results. The asymmetric path (2 bidders U[0, 1] x U[0, 2], 5,000 auctions,
first price: equilibrium and bounds) has no old solver left to race; it is reported as its seconds over
the symmetric 2-bidder first-price reference's, a ratio on the same machine.
`python benchmarks/rmac_solver.py [--repeats 3]`
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import torch

from pipeline.games import asymmetric, rmac, solver
from pipeline.games.auction import Rule, parse_rule, simulate_first_price_bids

REFERENCE = "4d4ee4c"  # the last commit with the two solvers (rmac.py's symmetric one is the reference)
EPSILONS = (0.001, 0.005, 0.02)
ROOT = Path(__file__).resolve().parent.parent


def old_solver():
    """`pipeline.games.rmac` as it was at REFERENCE (a module), or None when git cannot show it."""
    try:
        text = subprocess.run(["git", "show", f"{REFERENCE}:src/pipeline/games/rmac.py"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    path = Path(tempfile.mkdtemp()) / "rmac_reference.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("rmac_reference", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["rmac_reference"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def symmetric_inputs(n: int) -> dict:
    sim = simulate_first_price_bids(5000 // n * n, n, grid=None, generator=torch.Generator().manual_seed(0))
    bids = sim.bids.flatten()
    scale = rmac.choose_value_scale(bids, n, 0.01)
    top = math.ceil(scale.top * 1.5 / 0.01 - 1e-9) * 0.01
    logged = rmac.fit_logged_auction(bids / scale.unit, n, 0.01, top=top)
    values, cdf = rmac.inverted_value_cdf(bids / scale.unit, n, 0.01)
    return {"logged": logged, "weights": rmac.value_type_weights(values, cdf, logged.actions, scale.top),
            "mask": rmac.value_point_mask(values, logged, scale.top), "unit": scale.unit}


def best_of(repeats: int, *calls):
    """Each call run ``repeats`` times, alternating: (best seconds of each, last result of each)."""
    seconds = [math.inf] * len(calls)
    results = [None] * len(calls)
    for _ in range(repeats):
        for i, call in enumerate(calls):
            t0 = time.perf_counter()
            results[i] = call()
            seconds[i] = min(seconds[i], time.perf_counter() - t0)
    return seconds, results


def largest_difference(a, b) -> float:
    if hasattr(a, "revenue"):
        return max(abs(a.revenue - b.revenue), abs(a.welfare - b.welfare), float((a.pmf - b.pmf).abs().max()))
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def measure(repeats: int = 3) -> dict:
    torch.set_num_threads(1)
    old = old_solver()
    if old is None:
        print(f"rmac_solver: no git history with commit {REFERENCE}; nothing to compare against")
        return {"skipped": f"git show {REFERENCE} failed"}
    out: dict = {"reference": f"symmetric solver of rmac.py at {REFERENCE}", "cases": {}}
    print(f"rmac_solver: one solver (pipeline.games.solver) against the symmetric one at {REFERENCE}, best of {repeats}")
    reference_first_price = None
    for n in (2, 3):
        data = symmetric_inputs(n)
        logged, weights, mask, unit = data["logged"], data["weights"], data["mask"], data["unit"]
        eps = [e / unit for e in EPSILONS]
        for name in (f"first_price_n{n}", "second_price_r0.5"):
            rule = parse_rule(name)
            inside = Rule(rule.kind, reserve=rule.reserve / unit)
            (t_new, t_old), (new, ref) = best_of(
                repeats,
                partial(solver.solve_equilibrium, weights, logged.types, inside, n, logged.actions, 1000),
                partial(old.solve_equilibrium, weights, logged.types, inside, n, logged.actions, 0.01, 1000))
            (b_new, b_old), (bounds_new, bounds_old) = best_of(
                repeats,
                partial(solver.solve_bounds, [logged], new, inside, n, logged.actions, logged.types, eps, "revenue",
                        200, [mask]),
                partial(old.solve_bounds, logged, ref, inside, n, eps, "revenue", 200, mask))
            if n == 2 and rule.kind == "first_price":
                reference_first_price = t_old + b_old
            for part, (tn, to, diff) in {"equilibrium": (t_new, t_old, largest_difference(new, ref)),
                                         "bounds": (b_new, b_old, largest_difference(bounds_new, bounds_old))}.items():
                key = f"n{n}_{name}_{part}"
                out["cases"][key] = {"new_s": round(tn, 4), "old_s": round(to, 4), "ratio": round(tn / to, 3),
                                     "largest_difference": diff}
                print(f"  {key:38s} new {tn:7.3f} s  old {to:7.3f} s  ratio {tn / to:5.2f}x (target <= 1.5x)  "
                      f"largest difference {diff:.1e}")
    ratios = [case["ratio"] for case in out["cases"].values()]
    out["worst_ratio"] = max(ratios)
    total_new = sum(c["new_s"] for c in out["cases"].values())
    total_old = sum(c["old_s"] for c in out["cases"].values())
    out["total_ratio"] = round(total_new / total_old, 3)
    print(f"  symmetric total: ratio {out['total_ratio']:.2f}x, worst case {out['worst_ratio']:.2f}x")

    bids, _ = asymmetric.asymmetric_uniform_equilibrium(5000, (1.0, 2.0), 1)
    rules = ["first_price_n2"]
    t0 = time.perf_counter()
    points, _ = asymmetric.asymmetric_table(bids, rules)
    asymmetric.asymmetric_bounds(bids, rules, points, EPSILONS, ("revenue",))
    seconds = time.perf_counter() - t0
    out["asymmetric_first_price"] = {"seconds": round(seconds, 3),
                                     "ratio_to_symmetric_reference": round(seconds / reference_first_price, 3)}
    print(f"  asymmetric U[0,1] x U[0,2] first price (point + bounds): {seconds:.2f} s, "
          f"{seconds / reference_first_price:.2f}x the symmetric 2-bidder reference's equilibrium + bounds")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    result = measure(args.repeats)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    sys.exit(0)

"""A million logged auctions end to end: `python -m pipeline experiment=rmac_auction data.path=<file>`.

Writes 3-bidder equilibrium bids (values U[0, 1], bids 2/3 v to 4 decimals, one auction per row) for
N = 100,000, 300,000 and 1,000,000 auctions and runs the default experiment on each in a fresh
process on one CPU thread: wall time and peak resident memory (ru_maxrss of that process alone),
against the targets 60 s and 1.5 GB at a million. Memory should grow sublinearly in N once the bids
are binned: the per-auction growth between the two largest files is reported. The loader alone is
timed as well. `python benchmarks/rmac_million.py [--sizes 100000 1000000]`
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TARGET_S, TARGET_MB = 60.0, 1500.0

# Runs the CLI as a child and reports that child's peak RSS: a fresh wrapper per size, so
# RUSAGE_CHILDREN holds only this run.
_WRAPPER = """
import resource, subprocess, sys, time
t0 = time.perf_counter()
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
wall = time.perf_counter() - t0
peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(f"{proc.returncode} {wall:.3f} {peak_kb}")
if proc.returncode:
    print(proc.stderr[-3000:], file=sys.stderr)
"""


def write_bids(path: Path, n_auctions: int, n_bidders: int = 3, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    bids = rng.random((n_auctions, n_bidders)) * (n_bidders - 1) / n_bidders
    header = ",".join(f"bid_{i}" for i in range(n_bidders))
    np.savetxt(path, bids, fmt="%.4f", delimiter=",", header=header, comments="")
    return path


def run_once(path: Path, out: Path) -> dict:
    command = [sys.executable, "-m", "pipeline", "experiment=rmac_auction", f"data.path={path}",
               f"hydra.run.dir={out}", "device.num_threads=1"]
    result = subprocess.run([sys.executable, "-c", _WRAPPER, *command], capture_output=True, text=True)
    code, wall, peak_kb = result.stdout.split()[-3:]
    if int(code) != 0:
        raise RuntimeError(f"run on {path} failed: {result.stderr[-2000:]}")
    record = json.loads((out / "result.json").read_text())
    return {"wall_time_s": float(wall), "peak_mb": int(peak_kb) / 1024, "status": record["status"],
            "time_breakdown_s": record.get("time_breakdown_s"), "rows_used": record["metrics"].get("data/rows_used")}


def time_loader(path: Path) -> float:
    from pipeline.games.bids_csv import load_bids_csv

    t0 = time.perf_counter()
    load_bids_csv(path)
    return time.perf_counter() - t0


def measure(sizes=(100_000, 300_000, 1_000_000)) -> dict:
    results: dict = {"targets": {"wall_time_s": TARGET_S, "peak_mb": TARGET_MB}, "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            path = write_bids(Path(tmp) / f"bids_{n}.csv", n)
            run = run_once(path, Path(tmp) / f"run_{n}")
            run["file_mb"] = path.stat().st_size / 2**20
            run["loader_s"] = time_loader(path)
            results["runs"][n] = run
            print(f"  N = {n:>9,} auctions x 3: {run['wall_time_s']:6.1f} s, peak {run['peak_mb']:7.0f} MB "
                  f"(file {run['file_mb']:.0f} MB, loader alone {run['loader_s']:.2f} s)")
    big, small = max(sizes), sorted(sizes)[-2] if len(sizes) > 1 else None
    top = results["runs"][big]
    results["ratio_wall_to_target"] = round(top["wall_time_s"] / TARGET_S, 3)
    results["ratio_peak_to_target"] = round(top["peak_mb"] / TARGET_MB, 3)
    if small is not None:
        growth = (top["peak_mb"] - results["runs"][small]["peak_mb"]) * 2**20 / (big - small)
        results["bytes_per_extra_auction"] = round(growth, 1)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 300_000, 1_000_000])
    args = parser.parse_args(argv)
    results = measure(tuple(args.sizes))
    print(json.dumps({k: v for k, v in results.items() if k != "runs"}))


if __name__ == "__main__":
    main()

"""The local SLURM cluster (make cluster-up) against this machine, measured in one invocation:

    .venv/bin/python benchmarks/cluster_sweep.py [--seeds 8] [--repeats 2] [--latency-jobs 10]   # --repeats 0: latency only

latency  submit-to-start per job: `sbatch --wrap` of a job that writes the time it started; the time from
         before the sbatch call to that start (scheduler + slurmd + job launch; no Python start-up).
sweep    wall time of `python -m pipeline -m experiment=supervised_digits trainer=debug seed=range(0,N)`
         with hydra/launcher=slurm (cpus_per_task=1: as many jobs at once as the node has CPUs) and with
         hydra/launcher=joblib (n_jobs = cores), alternated, `--repeats` of each; the ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def latency(n: int, partition: str, out: Path) -> list[float]:
    waits = []
    for i in range(n):
        stamp = out / f"started{i}"
        t0 = time.time()
        subprocess.run(["sbatch", "-p", partition, "-c", "1", "--mem=100M", "-o", "/dev/null",
                        "--wrap", f"date +%s.%N > {stamp}"], check=True, capture_output=True)
        while not (stamp.exists() and stamp.read_text().strip()):
            time.sleep(0.02)
        waits.append(float(stamp.read_text()) - t0)
    return waits


def sweep(launcher: str, seeds: int, partition: str, out: Path) -> float:
    extra = ([f"hydra.launcher.partition={partition}", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1",
              "hydra.launcher.timeout_min=20"] if launcher == "slurm" else [])
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pipeline", "-m", "experiment=supervised_digits", "trainer=debug",
                           f"seed=range(0,{seeds})", f"hydra/launcher={launcher}", *extra,
                           f"hydra.sweep.dir={out / f'{launcher}-{time.time_ns()}'}"],
                          capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "offline"})
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{launcher} sweep failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--latency-jobs", type=int, default=10)
    ap.add_argument("--partition", default="test")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        waits = latency(a.latency_jobs, a.partition, out)
        times: dict[str, list[float]] = {"slurm": [], "joblib": []}
        for _ in range(a.repeats):
            for launcher in ("slurm", "joblib"):
                times[launcher].append(sweep(launcher, a.seeds, a.partition, out))
                print(f"{launcher}: {times[launcher][-1]:.1f} s", flush=True)
    result = {
        "latency_s": {"median": statistics.median(waits), "min": min(waits), "max": max(waits), "n": len(waits)},
        "sweep_s": times,
        "slurm_over_joblib": statistics.median(times["slurm"]) / statistics.median(times["joblib"]) if a.repeats else None,
        "seeds": a.seeds, "cores": os.cpu_count(),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

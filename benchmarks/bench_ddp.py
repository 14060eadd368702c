"""One run on 1 and on 2 processes (trainer=ddp, gloo on CPU), measured in one invocation:

    .venv/bin/python benchmarks/bench_ddp.py [--epochs 2 10] [--width 1024] [--repeats 1]

A wide MLP on digits (model.hidden=[W, W]), where the gradient dominates a step: the same global batch (128) run as
one process (batch 128, one thread), one process on two threads (device.num_threads=2), and two processes of batch
64 (one thread each). A run's fit time (its record's `time_breakdown_s.train`) includes starting the other rank and
the gloo rendezvous, so each layout runs twice, at the two epoch counts, and the time per epoch is the difference of
the fit times over the difference of the epochs. Prints each and the ratios against one process on one thread;
`--repeats` alternates the layouts and takes medians.
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


def layouts(batch: int) -> dict[str, tuple[str, ...]]:
    """The same global batch three ways: one process on one thread, one on two threads, two processes of half."""
    return {
        "1 process, 1 thread": (f"data.batch_size={batch}", "device.num_threads=1"),
        "1 process, 2 threads": (f"data.batch_size={batch}", "device.num_threads=2"),
        "2 processes, 1 thread each": ("trainer=ddp", f"data.batch_size={batch // 2}", "device.num_threads=1"),
    }


def fit_seconds(extra: tuple[str, ...], epochs: int, width: int, out: Path) -> float:
    run_dir = out / f"run-{time.time_ns()}"
    proc = subprocess.run([sys.executable, "-m", "pipeline", "experiment=supervised_digits", "device=cpu", "model.dropout=0",
                           f"model.hidden=[{width},{width}]", f"trainer.max_epochs={epochs}", "trainer.enable_progress_bar=false",
                           "checkpoint.enabled=false", *extra, f"hydra.run.dir={run_dir}"],
                          capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "offline"})
    if proc.returncode != 0:
        raise SystemExit(f"run {' '.join(extra)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    record = json.loads((run_dir / "result.json").read_text())
    return float(record["time_breakdown_s"]["train"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, nargs=2, default=[2, 10])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=1)
    # A step's gradient arithmetic grows with the batch, the all-reduce of the gradient does not.
    parser.add_argument("--batch", type=int, default=128, help="the global batch (even)")
    args = parser.parse_args()
    LAYOUTS = layouts(args.batch)
    times: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    with tempfile.TemporaryDirectory(prefix="bench-ddp-") as tmp:
        for _ in range(args.repeats):
            for name, extra in LAYOUTS.items():
                short, long = (fit_seconds(extra, e, args.width, Path(tmp)) for e in args.epochs)
                times[name].append((long - short) / (args.epochs[1] - args.epochs[0]))
    reference = statistics.median(times["1 process, 1 thread"])
    print(f"supervised_digits, MLP [{args.width}, {args.width}], global batch {args.batch}, epochs {args.epochs[0]} vs {args.epochs[1]}, "
          f"median of {args.repeats}; {os.cpu_count()} CPUs")
    for name, values in times.items():
        per_epoch = statistics.median(values)
        print(f"  {name:<28} {per_epoch:7.3f} s/epoch   x{per_epoch / reference:.2f} of one process on one thread")


if __name__ == "__main__":
    main()

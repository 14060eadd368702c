"""Do K agents in one process need as many env steps as single runs? `experiment=ppo_cartpole`'s stop times.

    python benchmarks/ppo_stop_steps.py --blocks 15 --first-seed 1000 --out outputs/bench/stop_steps   # ~1 h, 2 cores

Agent i of a `seeds_per_process=K` run is the single run of seed `seed + i` in distribution, not bitwise (the
random draws are shared across agents, and the batch's float32 forms - the sigmoid-form tanh, the narrow-output
matmul - round differently from the plain ops a single run's small tensors take). The cost per solved seed of K = 16
against 16 single runs depends on it: an agent that needs more env steps to stop costs more. This script runs, per
block of 16 seeds, three arms and records each agent's `early_stop.env_step` (the env steps at its first
deterministic evaluation of 500; the preset's budget when it never stops):

- `single`: the 16 seeds as single runs (K = 1, the plain ops);
- `batch`: one K = 16 run of the same seeds (the float32 forms on, as shipped);
- `batch_plain`: the same with both forms switched off (their size thresholds set out of reach).

Each block's results are written to `--out` (`<arm><first seed>.json`) as they finish, so an interrupted call
resumes where it stopped; `--jobs 2` runs two blocks at a time (one thread each: env steps, not wall time, are
measured). The summary compares the arms' mean stop steps (ratio of means with a bootstrap 95% CI) and gives a
Mann-Whitney test, from every result file in `--out`.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ARMS = ("single", "batch", "batch_plain")


def run_arm(arm: str, first_seed: int, k: int) -> list[int | None]:
    """One block of one arm, in this process: the agents' stop env steps (None: never stopped)."""
    import pipeline.nets.ensemble as ensemble
    import pipeline.nets.mlp as mlp

    sys.path.insert(0, str(HERE))
    from seed_batching import compose_cfg

    from pipeline.runtime.run import run

    if arm == "batch_plain":
        mlp.FAST_TANH_MIN_NUMEL = mlp.FAST_TANH_NOGRAD_MIN_NUMEL = ensemble.NARROW_MIN_ROWS = 1 << 62
    runs = [(s, 1) for s in range(first_seed, first_seed + k)] if arm == "single" else [(first_seed, k)]
    stops: list[int | None] = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed, n in runs:
            cfg = compose_cfg(["experiment=ppo_cartpole", f"seeds_per_process={n}", f"seed={seed}",
                               "trainer.enable_progress_bar=false"])
            records = run(cfg, Path(tmp) / f"seed{seed}")
            failed = [r for r in records if r.get("status") != "ok"]
            if failed:
                raise RuntimeError(f"{arm} seed {seed}: {failed[0].get('error')}")
            stops += [(r.get("early_stop") or {}).get("env_step") for r in records]
    return stops


def summarize(out: Path, budget: int) -> dict:
    from scipy.stats import mannwhitneyu

    arms: dict[str, list[float]] = {}
    for f in sorted(out.glob("*.json")):
        m = re.fullmatch(r"([a-z_]+?)(\d+)\.json", f.name)
        if m and m.group(1) in ARMS:
            # An agent that never stopped spent the whole budget.
            arms.setdefault(m.group(1), []).extend(budget if x is None else x for x in json.loads(f.read_text()))
    rng = np.random.default_rng(0)
    summary: dict = {"arms": {}, "pairs": {}}
    for arm, v in arms.items():
        a = np.asarray(v, float)
        summary["arms"][arm] = {"agents": len(a), "mean": round(a.mean()), "se": round(a.std(ddof=1) / math.sqrt(len(a)))}
    names = [a for a in ARMS if a in arms]
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            a, b = np.asarray(arms[y], float), np.asarray(arms[x], float)  # y over x: batch / single, ...
            boot = [rng.choice(a, len(a)).mean() / rng.choice(b, len(b)).mean() for _ in range(5000)]
            lo, hi = np.percentile(boot, [2.5, 97.5])
            summary["pairs"][f"{y}/{x}"] = {"ratio_of_means": round(a.mean() / b.mean(), 3), "ci95": [round(lo, 3), round(hi, 3)],
                                             "mann_whitney_p": round(float(mannwhitneyu(a, b).pvalue), 3)}
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=15, help="blocks of 16 seeds")
    parser.add_argument("--first-seed", type=int, default=1000)
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--jobs", type=int, default=2, help="blocks run at a time, each its own process")
    parser.add_argument("--out", type=Path, default=Path("outputs/bench/stop_steps"))
    parser.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)  # one block in this process (a worker)
    args = parser.parse_args(argv)
    k = 16
    args.out.mkdir(parents=True, exist_ok=True)
    if args.arm:
        import torch

        torch.set_num_threads(1)
        stops = run_arm(args.arm, args.first_seed, k)
        (args.out / f"{args.arm}{args.first_seed}.json").write_text(json.dumps(stops))
        return 0
    todo = [(arm, args.first_seed + b * k) for b in range(args.blocks) for arm in args.arms
            if not (args.out / f"{arm}{args.first_seed + b * k}.json").exists()]

    def work(job: tuple[str, int]) -> None:
        arm, seed = job
        done = subprocess.run([sys.executable, __file__, "--arm", arm, "--first-seed", str(seed), "--out", str(args.out)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{arm} block {seed}: exit {done.returncode}\n{done.stderr[-2000:]}")
        print(f"{arm} seeds {seed}-{seed + k - 1}: {(args.out / f'{arm}{seed}.json').read_text()}", flush=True)

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(work, todo))
    from seed_batching import compose_cfg

    budget = int(compose_cfg(["experiment=ppo_cartpole"]).task.total_steps)
    summary = summarize(args.out, budget)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    for arm, s in summary["arms"].items():
        print(f"{arm:12s} {s['agents']:4d} agents, mean stop {s['mean']} env steps (se {s['se']})")
    for pair, s in summary["pairs"].items():
        print(f"{pair:20s} ratio of means {s['ratio_of_means']} (95% CI {s['ci95'][0]}-{s['ci95'][1]}), "
              f"Mann-Whitney p = {s['mann_whitney_p']}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())

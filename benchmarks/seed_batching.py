"""Seeds for free: wall time per solved seed, K seeds trained together in one process vs one seed per run.

    python benchmarks/seed_batching.py                      # K = 16 against 5 single-seed runs
    python benchmarks/seed_batching.py --k 16 --single-seeds 5 --batched task.envs_per_agent=1

Both sides run here, in this process, on one CPU thread, one after the other:
(a) the single-seed default `experiment=dqn_cartpole` for seeds 0..n-1, each through `pipeline.run.run`;
(b) `experiment=dqn_cartpole_batched` with `seeds_per_process=K`, once, through the same function.
A seed is solved when its final greedy evaluation (`eval/return_mean`, 20 episodes) is >= 475.
The cost of a solved seed is a side's total wall time over its number of solved seeds, and the
number that matters is the ratio batched / single (the target: <= 0.33 at K = 16, with >= 15 of 16
solved). Both sides are measured in the same invocation because this machine class is shared and
noisy (+-15-30%): absolute times move, the ratio much less.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from hydra import compose, initialize_config_module

from pipeline.run import run

SOLVED_AT = 475.0


def _compose(overrides: Sequence[str]):
    with initialize_config_module("pipeline.conf", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def _side(wall_s: float, finals: list[float], env_steps: list[int]) -> dict:
    solved = sum(f >= SOLVED_AT for f in finals)
    return {
        "wall_time_s": round(wall_s, 2),
        "seeds": len(finals),
        "solved": solved,
        "final_returns": [round(f, 1) for f in finals],
        "env_steps": int(sum(env_steps)),
        "env_steps_per_s": round(sum(env_steps) / wall_s, 1),
        "cost_per_solved_seed_s": round(wall_s / solved, 2) if solved else math.inf,
    }


def measure_single(seeds: Sequence[int], out: Path, overrides: Sequence[str] = ()) -> dict:
    """The single-seed default, one run per seed, back to back."""
    finals, steps, wall = [], [], 0.0
    for s in seeds:
        cfg = _compose(["experiment=dqn_cartpole", f"seed={s}", "trainer.enable_progress_bar=false", *overrides])
        t0 = time.perf_counter()
        record = run(cfg, out / f"single_seed{s}")
        wall += time.perf_counter() - t0
        if record["status"] != "ok":
            raise RuntimeError(f"single-seed run seed={s} failed: {record['error']}")
        finals.append(record["metrics"]["eval/return_mean"])
        steps.append(record["env_steps"])
    return _side(wall, finals, steps)


def measure_batched(k: int, seed: int, out: Path, overrides: Sequence[str] = ()) -> dict:
    """One seed-batched run of K agents; the agents' own run records give the finals."""
    cfg = _compose(
        ["experiment=dqn_cartpole_batched", f"seeds_per_process={k}", f"seed={seed}", "trainer.enable_progress_bar=false", *overrides]
    )
    run_dir = out / "batched"
    t0 = time.perf_counter()
    summary = run(cfg, run_dir)
    wall = time.perf_counter() - t0
    if summary["status"] != "ok":
        raise RuntimeError(f"seed-batched run failed: {summary['error']}")
    records = [json.loads((run_dir / f"seed{seed + i}" / "result.json").read_text()) for i in range(k)]
    side = _side(wall, [r["metrics"]["eval/return_mean"] for r in records], [r["env_steps"] for r in records])
    side["stop_env_steps"] = [(r.get("early_stop") or {}).get("env_step") for r in records]
    side["time_breakdown_s"] = records[0].get("time_breakdown_s", {})
    return side


def measure(
    k: int = 16,
    seed: int = 0,
    single_seeds: int = 5,
    batched_overrides: Sequence[str] = (),
    single_overrides: Sequence[str] = (),
    out_dir: str | Path | None = None,
) -> dict:
    """Run both sides in this process on one thread; wall time, solved counts, cost per solved seed, and their ratio."""
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(out_dir) if out_dir is not None else Path(tmp)
        # single_seeds=0 measures the batched side alone (e.g. while tuning its preset).
        single = measure_single(range(single_seeds), out, single_overrides) if single_seeds else None
        batched = measure_batched(k, seed, out, batched_overrides)
    ratio = batched["cost_per_solved_seed_s"] / single["cost_per_solved_seed_s"] if single else math.nan
    return {
        "k": k,
        "seed": seed,
        "threads": torch.get_num_threads(),
        "single": single,
        "batched": batched,
        "cost_ratio": round(ratio, 3) if math.isfinite(ratio) else None,
        "target": {"cost_ratio_at_most": 0.33, "solved_at_least": 15 if k == 16 else math.ceil(15 * k / 16)},
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--single-seeds", type=int, default=5)
    parser.add_argument("--batched", nargs="*", default=[], help="extra overrides for the seed-batched run")
    parser.add_argument("--single", nargs="*", default=[], help="extra overrides for the single-seed runs")
    parser.add_argument("--out", default=None, help="keep the run records here (default: a temporary dir)")
    args = parser.parse_args(argv)
    result = measure(args.k, args.seed, args.single_seeds, args.batched, args.single, args.out)
    print(json.dumps(result, indent=2))
    single, batched = result["single"], result["batched"]
    if single:
        print(
            f"single-seed: {single['solved']}/{single['seeds']} solved in {single['wall_time_s']:.1f} s "
            f"-> {single['cost_per_solved_seed_s']} s per solved seed"
        )
    print(
        f"K={args.k} batched: {batched['solved']}/{batched['seeds']} solved in {batched['wall_time_s']:.1f} s "
        f"-> {batched['cost_per_solved_seed_s']} s per solved seed ({batched['env_steps_per_s']:.0f} env steps/s over all agents)\n"
        f"cost ratio batched/single: {result['cost_ratio']} (target <= {result['target']['cost_ratio_at_most']}, "
        f">= {result['target']['solved_at_least']} solved)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

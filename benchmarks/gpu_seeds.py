"""Every preset on one GPU (`device=cuda`), many seeds per process: per-sample throughput and cost per solved seed.

    python benchmarks/gpu_seeds.py                          # what benchmarks/gpu_seeds.sh runs: all runs below
    python benchmarks/gpu_seeds.py --only ppo_recipe ppo_atari   # some of them (names as in RUNS)
    python benchmarks/gpu_seeds.py --device cpu --smoke     # the same code path on CPU: trainer=debug, K <= 2

Each run is one process-internal pipeline run (`seed_batching.run_records`) of K agents with `device=<device>`;
a run that fails is reported as failed and the others go on, so one GPU call gives every number it can.
- recipe runs: PureJaxRL's PPO / DQN CartPole config (benchmarks/bench_jax.py's PPO_RECIPE / DQN_RECIPE), a fixed
  budget, no early stop, eager and with `device.compile=true` (a record without a `compile` entry in its
  time breakdown ran eager: the task has no compiled path yet, and the table says so);
- preset runs: each experiment preset at the K and budget of RUNS (null budget: the preset's own; the CartPole
  presets stop each seed at their confirmed evaluation of 500). MuJoCo and Atari budgets are short: they
  measure speed and memory, not learning to the end.
Tables: env steps and backpropagated samples (PPO: epochs x env steps; DQN, SAC, TD3: updates x batch) per
second over all agents, the GPU memory peak (`torch.cuda.max_memory_allocated`, reset before each run), seeds
solved (final deterministic/greedy evaluation >= the record's threshold) and wall seconds per solved seed.
Results go to `--out` as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import seed_batching  # noqa: E402
from bench_jax import DQN_RECIPE, PPO_RECIPE  # noqa: E402

COMPILED = ["device.compile=true"]


class Run(NamedTuple):
    name: str
    overrides: list[str]
    k: int
    budget: int | None = None  # env steps a seed (task.total_steps); None: the preset's own


def ppo_recipe(budget: int) -> list[str]:
    return [*PPO_RECIPE, f"task.total_steps={budget}", f"task.eval_every={budget}"]


def dqn_recipe(budget: int) -> list[str]:
    return [*DQN_RECIPE, f"task.total_steps={budget}", f"task.eval_every={budget}"]


NO_CKPT = ["checkpoint.enabled=false"]
RUNS = [
    Run("ppo_recipe", ppo_recipe(65_536), 1024),
    Run("ppo_recipe_compiled", ppo_recipe(65_536) + COMPILED, 1024),
    Run("dqn_recipe", dqn_recipe(50_000), 256),
    Run("dqn_recipe_compiled", dqn_recipe(50_000) + COMPILED, 256),
    Run("ppo_cartpole", ["experiment=ppo_cartpole"], 1024),
    Run("ppo_cartpole_compiled", ["experiment=ppo_cartpole", *COMPILED], 1024),
    Run("dqn_cartpole_seeds", ["experiment=dqn_cartpole_seeds"], 1024),
    Run("dqn_cartpole", ["experiment=dqn_cartpole"], 16),
    Run("dqn_acrobot", ["experiment=dqn_acrobot"], 64),
    Run("ppo_acrobot", ["experiment=ppo_acrobot", *NO_CKPT], 64, 200_000),
    Run("ppo_pendulum", ["experiment=ppo_pendulum", *NO_CKPT], 64, 200_000),
    Run("cem_cartpole", ["experiment=cem_cartpole"], 64),
    Run("sac_pendulum", ["experiment=sac_pendulum", *NO_CKPT], 16),
    Run("sac_halfcheetah", ["experiment=sac_halfcheetah", *NO_CKPT], 16, 30_000),
    Run("td3_halfcheetah", ["experiment=td3_halfcheetah", *NO_CKPT], 16, 30_000),
    # No checkpoints: saving K agents' frames is not the loop's speed (and a small replay would be saved whole).
    Run("ppo_atari", ["experiment=ppo_atari", *NO_CKPT, "task.final_eval_episodes=2"], 8, 20_480),
    Run("dqn_atari", ["experiment=dqn_atari", *NO_CKPT, "task.learning_starts=2500", "task.buffer_size=10000",
                      "task.eval_every=100000", "task.final_eval_episodes=2"], 16, 10_000),
    Run("supervised_digits", ["experiment=supervised_digits"], 16),
    Run("gan_digits", ["experiment=gan_digits", "trainer.max_epochs=10"], 1),
    Run("gan_atari", ["experiment=gan_atari", "trainer.max_epochs=2"], 1),
    Run("rmac_auction", ["experiment=rmac_auction"], 1),
]
SMOKE = ["trainer=debug"]


def overrides_of(run: Run, device: str, smoke: bool) -> list[str]:
    k = min(run.k, 2) if smoke else run.k
    budget = [f"task.total_steps={run.budget}"] if run.budget and not smoke else []
    return [*run.overrides, *budget, *(SMOKE if smoke else []), f"seeds_per_process={k}", f"device={device}"]


def backprop_samples(cfg, records: list[dict]) -> int | None:
    """Samples that went through a backward pass: PPO's epochs over each env step, else updates x batch."""
    task = cfg.task
    if "update_epochs" in task:
        return sum(int(r["env_steps"]) for r in records) * int(task.update_epochs)
    if "batch_size" in task and records[0].get("env_steps") is not None:
        return int(sum(r["metrics"].get("train/updates", 0.0) for r in records) * int(task.batch_size))
    return None


def measure(run: Run, device: str, smoke: bool, out: Path) -> dict:
    cuda = device == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    overrides = overrides_of(run, device, smoke)
    result = {"run": run.name, "overrides": overrides, "device": device}
    try:
        wall, _, records = seed_batching.run_records(overrides, out)
    except Exception as exc:  # one failing preset must not cost the others their numbers
        print(f"{run.name}: FAILED ({type(exc).__name__}: {str(exc)[:300]})", flush=True)
        return {**result, "error": f"{type(exc).__name__}: {exc}"}
    steps = sum(int(r.get("env_steps") or 0) for r in records)
    samples = backprop_samples(seed_batching.compose_cfg(overrides), records)
    threshold = records[0].get("threshold")
    finals = [r["metrics"].get("eval/return_mean") for r in records]
    solved = sum(f is not None and f >= threshold for f in finals) if threshold is not None else None
    breakdown = records[0].get("time_breakdown_s", {})
    result.update({
        "agents": len(records), "wall_time_s": round(wall, 1), "env_steps": steps,
        "env_steps_per_s": round(steps / wall) if steps else None,
        "backprop_samples": samples, "samples_per_s": round(samples / wall) if samples else None,
        "gpu_memory_peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
        "threshold": threshold, "solved": solved,
        "wall_per_solved_seed_s": round(wall / solved, 2) if solved else (math.inf if solved == 0 else None),
        "compiled": "compile" in breakdown, "time_breakdown_s": breakdown,
        "primary_metric": records[0].get("primary_metric"),
        "metric_mean": _mean([r["metrics"].get(records[0].get("primary_metric")) for r in records]),
    })
    print(f"{run.name}: K={result['agents']} {result['wall_time_s']} s, {result['env_steps_per_s']} env steps/s, "
          f"{result['samples_per_s']} samples/s, solved {solved}/{len(records)}", flush=True)
    return result


def _mean(values: list) -> float | None:
    values = [v for v in values if isinstance(v, int | float)]
    return round(sum(values) / len(values), 3) if values else None


def tables(results: list[dict]) -> None:
    print("\nPer-sample throughput over all agents (wall clock)")
    print("| run | K | wall s | env steps/s | backprop samples/s | GPU memory peak GiB | compiled |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            print(f"| {r['run']} | | failed: {r['error'][:80]} | | | | |")
            continue
        compiled = "yes" if r["compiled"] else ("no (eager: no compiled path)" if "device.compile=true" in r["overrides"] else "no")
        print(f"| {r['run']} | {r['agents']} | {r['wall_time_s']} | {r['env_steps_per_s']} | {r['samples_per_s']} | "
              f"{r['gpu_memory_peak_gib']} | {compiled} |")
    print("\nPer solved seed (final evaluation >= the record's threshold)")
    print("| run | K | env steps a seed (mean) | solved | threshold | wall s / solved seed | primary metric (mean) |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        if "error" not in r:
            print(f"| {r['run']} | {r['agents']} | {round(r['env_steps'] / r['agents']) if r['env_steps'] else '-'} | {r['solved']} | {r['threshold']} | "
                  f"{r['wall_per_solved_seed_s']} | {r['primary_metric']} = {r['metric_mean']} |")


def main(argv: list[str] | None = None) -> int:
    names = [r.name for r in RUNS]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--smoke", action="store_true", help="trainer=debug and K <= 2: check the code path in minutes")
    parser.add_argument("--only", nargs="+", choices=names, default=names, metavar="RUN", help=f"some of: {' '.join(names)}")
    parser.add_argument("--out", type=Path, default=Path("outputs/bench/gpu_seeds.json"))
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_seeds: torch sees no CUDA device (torch.cuda.is_available() is False); run on a CUDA machine, "
              "or check the code path with --device cpu --smoke", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    if args.device == "cuda":
        print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)
    results = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for run in RUNS:
            if run.name in args.only:
                results.append(measure(run, args.device, args.smoke, Path(tmp) / run.name))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": args.device, "smoke": args.smoke, "runs": results}, indent=2) + "\n")
    tables(results)
    print(f"total {time.perf_counter() - t0:.0f} s; results: {args.out}")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())

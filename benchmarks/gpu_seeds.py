"""Many seeds on one GPU: K = 256 and 1024 CartPole agents and K = 16 Atari agents in one process each.

    python benchmarks/gpu_seeds.py                                 # what benchmarks/gpu_seeds.sh runs
    python benchmarks/gpu_seeds.py --device cpu --k 8 --steps small # the same code path on CPU, in a minute

For each run: wall time, env steps/s over all agents (training loop and end to end), the GPU memory
peak (`torch.cuda.max_memory_allocated`, reset before each run) and the seeds solved (final greedy
evaluation >= the env's threshold: 475 for CartPole, 18 for Pong). CartPole runs the
`experiment=dqn_cartpole_seeds` recipe in full (100k env steps per agent at most, an agent stops at
its first greedy evaluation of 500); Atari runs `experiment=dqn_atari` for a fixed short budget per
agent (`--atari-steps`; Pong is not solved in it: the run measures speed and memory, and its replay
of 56 KB per transition lives on the GPU, K x buffer_size of them).
`--steps small` shrinks every run to a few rounds (a check that the script works, no solved seeds).
Results go to `--out` as JSON and to stdout, one line per run.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import seed_batching  # noqa: E402

SMALL_CARTPOLE = ["task.total_steps=1024", "task.eval_every=512", "task.learning_starts=256"]
SMALL_ATARI = [
    "task.total_steps=64", "task.learning_starts=32", "task.buffer_size=256", "+env.kwargs.max_episode_steps=200",
    "task.eval_every=1000", "task.eval_episodes=1", "task.final_eval_episodes=1",
]


def cartpole(k: int, small: bool) -> tuple[list[str], float]:
    return ["experiment=dqn_cartpole_seeds", f"seeds_per_process={k}", *(SMALL_CARTPOLE if small else [])], 475.0


def atari(k: int, small: bool, steps: int) -> tuple[list[str], float]:
    budget = SMALL_ATARI if small else [
        f"task.total_steps={steps}", f"task.learning_starts={steps // 4}", f"task.buffer_size={steps}",
        f"task.eval_every={10 * steps}", "task.final_eval_episodes=2",
    ]
    # No checkpoints: saving K agents' frames is not the loop's speed (and a small replay would be saved whole).
    return ["experiment=dqn_atari", f"seeds_per_process={k}", "checkpoint.enabled=false", *budget], 18.0


def measure(name: str, overrides: list[str], solved_at: float, device: str, out: Path) -> dict:
    cuda = device == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    wall, _, records = seed_batching.run_records([*overrides, f"device={device}"], out)
    steps = sum(int(r["env_steps"]) for r in records)
    finals = [r["metrics"]["eval/return_mean"] for r in records]
    loop = records[0].get("batch_env_steps_per_s") if len(records) > 1 else records[0]["env_steps_per_s"]
    result = {
        "run": name, "agents": len(records), "device": device, "wall_time_s": round(wall, 1), "env_steps": steps,
        "loop_env_steps_per_s": loop, "end_to_end_env_steps_per_s": round(steps / wall, 1),
        "gpu_memory_peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
        "solved": sum(f >= solved_at for f in finals), "solved_at": solved_at,
        "time_breakdown_s": records[0]["time_breakdown_s"], "overrides": overrides,
    }
    memory = f"{result['gpu_memory_peak_gib']} GiB" if cuda else "n/a (cpu)"
    print(
        f"{name}: K={result['agents']} wall {result['wall_time_s']} s, {result['loop_env_steps_per_s']} env steps/s over all agents "
        f"(training loop; {result['end_to_end_env_steps_per_s']} end to end), GPU memory peak {memory}, "
        f"solved {result['solved']}/{result['agents']} (final greedy mean >= {solved_at:g})",
        flush=True,
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--k", type=int, nargs="+", default=[256, 1024], help="CartPole agents per run")
    parser.add_argument("--atari-k", type=int, default=16, help="Atari agents (0: skip Atari)")
    parser.add_argument("--atari-steps", type=int, default=10_000, help="Atari env steps per agent")
    parser.add_argument("--steps", choices=("full", "small"), default="full")
    parser.add_argument("--out", type=Path, default=Path("outputs/bench/gpu_seeds.json"))
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_seeds: torch sees no CUDA device (torch.cuda.is_available() is False); run on a CUDA machine, "
              "or check the code path with --device cpu --k 8 --steps small", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    small = args.steps == "small"
    if args.device == "cuda":
        print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)
    runs = [(f"cartpole_k{k}", *cartpole(k, small)) for k in args.k]
    if args.atari_k:
        runs.append((f"atari_k{args.atari_k}", *atari(args.atari_k, small, args.atari_steps)))
    results = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for name, overrides, solved_at in runs:
            results.append(measure(name, overrides, solved_at, args.device, Path(tmp) / name))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": args.device, "steps": args.steps, "runs": results}, indent=2) + "\n")
    print(f"total {time.perf_counter() - t0:.0f} s; results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Seeds for free: wall time per solved seed, K agents trained together in one process vs one seed per run.

    python benchmarks/seed_batching.py                                   # K = 16 against 5 single-seed runs
    python benchmarks/seed_batching.py --k 64 --single-seeds 5
    python benchmarks/seed_batching.py --single-experiment dqn_acrobot --batched-experiment dqn_acrobot \
        --single env=acrobot --solved-at -100

Both sides run here, in this process, on one CPU thread, one after the other, through `pipeline.runtime.run.run`
(or, with `--as-commands`, each run as its own `python -m pipeline ...` command, as a user pays for it: the
interpreter's start and imports included):
(a) the single-seed preset (`experiment=dqn_cartpole`) for seeds s..s+n-1 (s: `--seed`, the first of the K agents);
(b) one run of `seeds_per_process=K` agents of the batched preset (`experiment=dqn_cartpole_seeds`:
    the same recipe with tensor envs, 8 envs per agent and a narrower MLP; see its YAML header).
A seed is solved when its final greedy evaluation (`eval/return_mean`, 20 episodes) reaches
`--solved-at` (475 for CartPole). The cost of a solved seed is a side's total wall time over its
number of solved seeds; the number that matters is the ratio batched / single. Both sides are
measured in the same invocation because this machine class is shared and noisy (+-15-30%).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from hydra import compose, initialize_config_module

from pipeline.runtime.run import run

CARTPOLE_SOLVED = 475.0


def compose_cfg(overrides: Sequence[str]):
    with initialize_config_module("pipeline.conf", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def run_records(overrides: Sequence[str], run_dir: Path) -> tuple[float, float, list[dict]]:
    """One pipeline run (K agents): its wall time, its CPU time and the K records; a failed agent raises.

    CPU time is this process's own cost: on a shared machine wall time also counts the other jobs.
    """
    cfg = compose_cfg([*overrides, "trainer.enable_progress_bar=false"])
    t0, c0 = time.perf_counter(), time.process_time()
    records = run(cfg, run_dir)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    failed = [r for r in records if r["status"] != "ok"]
    if failed:
        raise RuntimeError(f"run {' '.join(overrides)} failed: {failed[0]['error']}")
    return wall, cpu, records


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_command(overrides: Sequence[str], run_dir: Path) -> tuple[float, float, list[dict]]:
    """One pipeline run as its own command (`python -m pipeline ...`, one thread): its wall time from start to exit,
    its CPU time and the K records; a failed command or agent raises."""
    cmd = [sys.executable, "-m", "pipeline", *overrides, "trainer.enable_progress_bar=false", "device.num_threads=1",
           f"hydra.run.dir={run_dir}"]
    t0, c0 = time.perf_counter(), children_cpu_s()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, children_cpu_s() - c0
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr[-2000:]}")
    paths = sorted(run_dir.glob("seed*/result.json"), key=lambda p: int(p.parent.name[4:])) or [run_dir / "result.json"]
    records = [json.loads(p.read_text()) for p in paths]
    failed = [r for r in records if r["status"] != "ok"]
    if failed:
        raise RuntimeError(f"run {' '.join(overrides)} failed: {failed[0]['error']}")
    return wall, cpu, records


def side(wall_s: float, cpu_s: float, records: list[dict], solved_at: float) -> dict:
    finals = [r["metrics"]["eval/return_mean"] for r in records]
    steps = sum(int(r["env_steps"]) for r in records)
    solved = sum(f >= solved_at for f in finals)
    return {
        "wall_time_s": round(wall_s, 2),
        "seeds": len(finals),
        "solved": solved,
        "final_returns": [round(f, 1) for f in finals],
        "env_steps": steps,
        "env_steps_per_s": round(steps / wall_s, 1),
        "wall_per_env_step_ms": round(1000 * wall_s / steps, 5) if steps else math.inf,
        "stop_env_steps": [(r.get("early_stop") or {}).get("env_step") for r in records],
        "cost_per_solved_seed_s": round(wall_s / solved, 2) if solved else math.inf,
        "cpu_time_s": round(cpu_s, 2),
        "cpu_per_solved_seed_s": round(cpu_s / solved, 2) if solved else math.inf,
    }


def measure_single(experiment: str, seeds: Sequence[int], out: Path, overrides: Sequence[str] = (), solved_at: float = CARTPOLE_SOLVED,
                   as_commands: bool = False) -> dict:
    """The single-seed preset, one run per seed, back to back."""
    runner = run_command if as_commands else run_records
    wall, cpu, records = 0.0, 0.0, []
    for s in seeds:
        w, c, recs = runner([f"experiment={experiment}", f"seed={s}", *overrides], out / f"single_seed{s}")
        wall, cpu = wall + w, cpu + c
        records += recs
    return side(wall, cpu, records, solved_at)


def measure_batched(
    experiment: str, k: int, seed: int, out: Path, overrides: Sequence[str] = (), solved_at: float = CARTPOLE_SOLVED,
    as_commands: bool = False,
) -> dict:
    """One run of K agents; the agents' records give the finals, the first one the shared time breakdown."""
    runner = run_command if as_commands else run_records
    wall, cpu, records = runner([f"experiment={experiment}", f"seeds_per_process={k}", f"seed={seed}", *overrides], out / f"k{k}")
    result = side(wall, cpu, records, solved_at)
    result["time_breakdown_s"] = records[0].get("time_breakdown_s", {})
    return result


def ratio(batched: dict, single: dict | None, key: str = "cost_per_solved_seed_s") -> float | None:
    if not single:
        return None
    r = batched[key] / single[key]
    return round(r, 3) if math.isfinite(r) else None


def measure(
    k: int = 16,
    seed: int = 0,
    single_seeds: int = 5,
    batched_overrides: Sequence[str] = (),
    single_overrides: Sequence[str] = (),
    out_dir: str | Path | None = None,
    single_experiment: str = "dqn_cartpole",
    batched_experiment: str = "dqn_cartpole_seeds",
    solved_at: float = CARTPOLE_SOLVED,
    single: dict | None = None,
    as_commands: bool = False,
) -> dict:
    """Both sides in this process on one thread (or the batched side against a `single` measured before);
    `as_commands`: each run as its own command."""
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(out_dir) if out_dir is not None else Path(tmp)
        if single is None and single_seeds:
            single = measure_single(single_experiment, range(seed, seed + single_seeds), out, single_overrides, solved_at, as_commands)
        batched = measure_batched(batched_experiment, k, seed, out, batched_overrides, solved_at, as_commands)
    return {
        "k": k, "seed": seed, "threads": torch.get_num_threads(), "solved_at": solved_at, "as_commands": as_commands,
        "single_experiment": single_experiment, "batched_experiment": batched_experiment,
        "single": single, "batched": batched, "cost_ratio": ratio(batched, single),
        "cpu_cost_ratio": ratio(batched, single, "cpu_per_solved_seed_s"),
        "step_cost_ratio": ratio(batched, single, "wall_per_env_step_ms"),
    }


def summary_line(result: dict) -> str:
    single, batched, k = result["single"], result["batched"], result["k"]
    lines = []
    if single:
        lines.append(
            f"  single-seed {result['single_experiment']}: {single['solved']}/{single['seeds']} solved in {single['wall_time_s']:.1f} s "
            f"-> {single['cost_per_solved_seed_s']} s per solved seed (CPU {single['cpu_per_solved_seed_s']} s)"
        )
    lines.append(
        f"  K={k} {result['batched_experiment']}: {batched['solved']}/{batched['seeds']} solved in {batched['wall_time_s']:.1f} s "
        f"-> {batched['cost_per_solved_seed_s']} s per solved seed (CPU {batched['cpu_per_solved_seed_s']} s; "
        f"{batched['env_steps_per_s']:.0f} env steps/s over all agents)"
    )
    lines.append(f"  time breakdown of the K={k} run (s): {json.dumps(batched['time_breakdown_s'])}")
    lines.append(f"  cost ratio K={k} / single per solved seed: wall {result['cost_ratio']}, CPU {result['cpu_cost_ratio']}")
    if single and result.get("step_cost_ratio") is not None:
        # With agents that stop when solved, the per-solved-seed ratio also carries which side's seeds happened to
        # stop sooner (the two sides are the same seeds, equal in distribution, not bitwise); per env step it does not.
        lines.append(
            f"  per env step: wall {result['step_cost_ratio']} (env steps a seed: single {single['env_steps'] / single['seeds']:.0f}, "
            f"K={k} {batched['env_steps'] / batched['seeds']:.0f})"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--single-seeds", type=int, default=5, help="0: measure the batched side alone")
    parser.add_argument("--single-experiment", default="dqn_cartpole")
    parser.add_argument("--batched-experiment", default="dqn_cartpole_seeds")
    parser.add_argument("--solved-at", type=float, default=CARTPOLE_SOLVED)
    parser.add_argument("--batched", nargs="*", default=[], help="extra overrides for the K-agent run")
    parser.add_argument("--single", nargs="*", default=[], help="extra overrides for the single-seed runs")
    parser.add_argument("--out", default=None, help="keep the run records here (default: a temporary dir)")
    parser.add_argument("--as-commands", action="store_true", help="each run as its own `python -m pipeline` command")
    args = parser.parse_args(argv)
    result = measure(
        args.k, args.seed, args.single_seeds, args.batched, args.single, args.out,
        args.single_experiment, args.batched_experiment, args.solved_at, as_commands=args.as_commands,
    )
    print(json.dumps(result, indent=2))
    print(summary_line(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`make bench`: speed as ratios against a reference measured in the same invocation, on one CPU thread.

    make bench                                   # everything below (~30 min on 2 shared cores, ppo16 ~13 of it)
    make bench ARGS="--only k1"                  # one or more parts: k1 k16 k64 acrobot atari rmac_million rmac_grid ppo16 debug rmac_solver stacked
    make bench ARGS="--only envpool"             # not in the default set: needs pip install -e ".[envpool]"

k1      `experiment=dqn_cartpole` (K = 1: Lightning, Hydra, loggers, run record) against
        `benchmarks/bare_dqn.py`, the plain PyTorch loop a researcher would write, identical
        hyperparameters, a fixed number of env steps (no early stop): env steps/s and their ratio.
k16     wall time per solved seed of `experiment=dqn_cartpole_seeds` at K = 16 against single-seed
k64     `experiment=dqn_cartpole` runs (seeds 0..4, measured once for both), with the K-agent run's
        time breakdown (act / env / learn / eval).
acrobot `experiment=dqn_acrobot` at K = 16 against the same preset at K = 1 (solved: -100).
ppo16   wall time per solved seed of `experiment=ppo_cartpole seeds_per_process=16` against single-seed
        `experiment=ppo_cartpole` runs of the same seeds (solved: final deterministic mean >= 475; target <= 0.3x),
        in process and as commands; `--ppo-seed-blocks N` pools N blocks of 16 seeds (default 4, ~13 min with the
        commands: one block's stop luck moves its ratio by ~15%), with a 95% interval from resampling the blocks.
atari   `experiment=dqn_atari device=cpu`, a short explicit budget: env steps/s over all agents at
        K = 4 against K = 1.
debug   every preset with `trainer=debug device=cpu`, in seconds and as a multiple of
        `python -c "import torch"` timed alongside (`benchmarks/debug_presets.py`).
rmac_solver  the one auction solver (`pipeline.games.solver`) against the symmetric solver it replaced
        (read from git), alternately on the same inputs: time ratio (target <= 1.5x) and equality.
stacked any module stacked generically (vmap over functional_call) against the hand-written ensemble on the same MLP:
        CPU per DQN and PPO update at K = 16 and 64, eager and compiled (`benchmarks/bench_stacked.py`; targets
        <= 1.5x eager, <= 1.15x compiled).
envpool the EnvPool backend against the gymnasium one (`benchmarks/bench_envpool.py`): env steps/s of CartPole and
        Atari vector envs, their ratio; only with `--only envpool`, and a one-line skip when envpool is not installed.

The machine is shared and noisy, so k1 alternates the two implementations and keeps the best of
`--repeats`, and every number that matters is a ratio of two runs of this invocation.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bare_dqn  # noqa: E402
import seed_batching  # noqa: E402

PARTS = ("k1", "k16", "k64", "acrobot", "atari", "rmac_million", "rmac_grid", "ppo16", "debug", "rmac_solver", "stacked")
OPTIONAL_PARTS = ("envpool",)  # run only when named in --only
# The default preset's hyperparameters, spelled out for the bare loop.
SHARED = dict(
    hidden=(128, 128), lr=2.3e-3, adam_fused=True, gamma=0.99, batch_size=64, buffer_size=100_000,
    learning_starts=1_000, train_freq=256, gradient_steps=32, target_update_interval=10, eps_start=1.0,
    eps_end=0.04, eps_duration=8_000, max_grad_norm=10.0, eval_every=2_500, eval_episodes=10,
    final_eval_episodes=20, threshold=475.0,
)
# Atari on CPU, a few hundred agent steps each: long enough to measure steps/s, short enough for a bench.
# No checkpoints: the final one would save the replay (56 KB a transition), which is not the loop's speed.
ATARI = [
    "experiment=dqn_atari", "device=cpu", "task.total_steps=384", "task.learning_starts=128", "task.buffer_size=1024",
    "task.eval_every=1000000", "task.eval_episodes=1", "task.final_eval_episodes=1", "task.log_every=256",
    "+env.kwargs.max_episode_steps=400", "checkpoint.enabled=false",
]


def pipeline_dqn(steps: int, seed: int, out: Path) -> dict:
    wall, _, records = seed_batching.run_records(
        ["experiment=dqn_cartpole", f"seed={seed}", f"task.total_steps={steps}", "task.stop_at_return=null"], out
    )
    (record,) = records
    return {
        "env_steps": record["env_steps"], "loop_env_steps_per_s": record["env_steps_per_s"], "wall_time_s": round(wall, 3),
        "time_breakdown_s": record["time_breakdown_s"], "eval_return_mean": record["metrics"]["eval/return_mean"],
    }


def bare(steps: int, seed: int) -> dict:
    t0 = time.perf_counter()
    result = bare_dqn.run(**SHARED, total_steps=steps, seed=seed, stop_at_return=None, threads=1)
    wall = time.perf_counter() - t0
    # The bare loop's rate includes its final evaluation; the pipeline's loop rate does not (its
    # end-to-end time does), so the end-to-end ratio is the stricter comparison.
    return {
        "env_steps": result["env_steps"], "loop_env_steps_per_s": result["env_steps_per_s"], "wall_time_s": round(wall, 3),
        "time_breakdown_s": result["time_breakdown_s"], "eval_return_mean": result["eval_return_mean"],
    }


def k1_speed(steps: int, repeats: int, seed: int) -> dict:
    runs: dict[str, list[dict]] = {"pipeline": [], "bare": []}
    with tempfile.TemporaryDirectory() as tmp:
        # One throw-away pipeline run first: imports and first-call costs are not the loop's speed.
        pipeline_dqn(1_000, seed, Path(tmp) / "warmup")
        for r in range(repeats):
            runs["bare"].append(bare(steps, seed))
            runs["pipeline"].append(pipeline_dqn(steps, seed, Path(tmp) / f"run{r}"))
    best = {name: min(rs, key=lambda x: x["wall_time_s"]) for name, rs in runs.items()}
    d = {
        "env_steps": steps, "repeats": repeats, "pipeline": best["pipeline"], "bare": best["bare"],
        "ratio_loop_env_steps_per_s": round(best["pipeline"]["loop_env_steps_per_s"] / best["bare"]["loop_env_steps_per_s"], 3),
        "ratio_end_to_end": round(best["bare"]["wall_time_s"] / best["pipeline"]["wall_time_s"], 3),
        "all_runs": runs,
    }
    print(f"k1: DQN on CartPole-v1, {steps} env steps, identical hyperparameters, best of {repeats}")
    for name in ("bare", "pipeline"):
        r = d[name]
        print(f"  {name:9s} loop {r['loop_env_steps_per_s']:8.1f} env steps/s   end-to-end {r['wall_time_s']:6.2f} s   "
              f"breakdown {json.dumps(r['time_breakdown_s'])}")
    print(f"  ratio pipeline/bare: loop env steps/s {d['ratio_loop_env_steps_per_s']:.2f}x (target >= 1.2x), "
          f"end-to-end speed {d['ratio_end_to_end']:.2f}x")
    return d


def seeds(k: int, single: dict | None, single_seeds: int, target: str) -> dict:
    result = seed_batching.measure(k=k, single_seeds=single_seeds, single=single)
    print(f"k{k}: CartPole-v1, K={k} agents in one process against single-seed runs ({target})")
    print(seed_batching.summary_line(result))
    return result


def acrobot(k: int, single_seeds: int) -> dict:
    result = seed_batching.measure(
        k=k, single_seeds=single_seeds, single_experiment="dqn_acrobot", batched_experiment="dqn_acrobot", solved_at=-100.0
    )
    print(f"acrobot: Acrobot-v1 (solved: final greedy mean >= -100), K={k} against K=1 (target >= 15/16 solved)")
    print(seed_batching.summary_line(result))
    return result


def pooled(blocks: list[dict], resamples: int = 5000) -> dict:
    """Ratios over several seed blocks: each side's total wall time over its total solved seeds (or env steps), and
    the per-solved-seed ratio's 95% interval from resampling the blocks (one block's stop luck moves it ~15%)."""

    def ratio(chosen: list[dict], per: str) -> float:
        cost = {side: sum(b[side]["wall_time_s"] for b in chosen) / max(sum(b[side][per] for b in chosen), 1e-12)
                for side in ("single", "batched")}
        return cost["batched"] / cost["single"] if cost["single"] else math.inf

    total = {side: {key: sum(b[side][key] for b in blocks) for key in ("wall_time_s", "solved", "env_steps")} for side in ("single", "batched")}
    out = {
        "blocks": len(blocks), **{f"{side}_{key}": v for side, t in total.items() for key, v in t.items()},
        "cost_ratio": round(ratio(blocks, "solved"), 3) if total["batched"]["solved"] and total["single"]["solved"] else None,
        "step_cost_ratio": round(ratio(blocks, "env_steps"), 3),
        "block_cost_ratios": [b["cost_ratio"] for b in blocks],
    }
    if len(blocks) > 1 and out["cost_ratio"] is not None:
        rng = np.random.default_rng(0)
        draws = [ratio([blocks[i] for i in rng.integers(0, len(blocks), len(blocks))], "solved") for _ in range(resamples)]
        out["cost_ratio_ci95"] = [round(float(v), 3) for v in np.percentile(draws, [2.5, 97.5])]
    return out


def ppo(k: int, single_seeds: int, blocks: int = 1, first_seed: int = 0) -> dict:
    print(f"ppo{k}: CartPole-v1, experiment=ppo_cartpole, K={k} against K=1 (target <= 0.3x, >= 15/16 solved)")
    runs = []
    for b in range(blocks):
        # Block b: seeds first + b*k .. first + b*k + k - 1 on both sides.
        s = first_seed + b * k
        runs.append(seed_batching.measure(k=k, seed=s, single_seeds=single_seeds, single_experiment="ppo_cartpole",
                                          batched_experiment="ppo_cartpole"))
        print(f" seeds {s}-{s + k - 1}:", flush=True)
        print(seed_batching.summary_line(runs[-1]))
    result = dict(runs[0])
    if blocks > 1:
        result["blocks"], result["pooled"] = runs, pooled(runs)
        p = result["pooled"]
        ci = p.get("cost_ratio_ci95")
        print(f" {blocks} blocks pooled: cost ratio per solved seed {p['cost_ratio']}"
              + (f" (95% interval over the blocks {ci[0]}-{ci[1]})" if ci else "")
              + f", {p['batched_solved']} / {p['single_solved']} solved; per env step {p['step_cost_ratio']}")
    # The same, each run as its own `python -m pipeline` command: what 16 single runs cost a user, start-up included.
    commands = seed_batching.measure(k=k, seed=first_seed, single_seeds=single_seeds, single_experiment="ppo_cartpole",
                                     batched_experiment="ppo_cartpole", as_commands=True)
    print(f"ppo{k}, each run as its own command (interpreter start and imports included):")
    print(seed_batching.summary_line(commands))
    result["commands"] = commands
    return result


def atari(k: int) -> dict:
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in (1, k):
            wall, _, records = seed_batching.run_records([*ATARI, f"seeds_per_process={n}"], Path(tmp) / f"k{n}")
            steps = sum(int(r["env_steps"]) for r in records)
            # The loop's rate over all agents: env steps over the training seconds (the final evaluation excluded).
            loop = records[0]["batch_env_steps_per_s"] if n > 1 else records[0]["env_steps_per_s"]
            out[f"k{n}"] = {
                "agents": n, "env_steps": steps, "wall_time_s": round(wall, 2), "loop_env_steps_per_s": loop,
                "end_to_end_env_steps_per_s": round(steps / wall, 1), "time_breakdown_s": records[0]["time_breakdown_s"],
            }
    one, many = out["k1"], out[f"k{k}"]
    out["ratio_loop_env_steps_per_s"] = round(many["loop_env_steps_per_s"] / one["loop_env_steps_per_s"], 3)
    print(f"atari: {ATARI[0]} on CPU, {ATARI[2]}, K={k} against K=1")
    for name, r in (("K=1", one), (f"K={k}", many)):
        print(f"  {name:5s} loop {r['loop_env_steps_per_s']:7.1f} env steps/s over all agents, end-to-end {r['wall_time_s']:.1f} s, "
              f"breakdown {json.dumps(r['time_breakdown_s'])}")
    print(f"  ratio K={k} / K=1 env steps/s over all agents: {out['ratio_loop_env_steps_per_s']:.2f}x")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=PARTS + OPTIONAL_PARTS, default=list(PARTS),
                        help=f"the parts to run (default: all but {', '.join(OPTIONAL_PARTS)})")
    parser.add_argument("--steps", type=int, default=20_000, help="k1: env steps per DQN run")
    parser.add_argument("--repeats", type=int, default=2, help="k1: runs per implementation, the best kept")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--single-seeds", type=int, default=5, help="k16/k64: single-seed CartPole runs (seeds 0..n-1)")
    parser.add_argument("--acrobot-single-seeds", type=int, default=2)
    # Each side's cost per solved seed carries which of its seeds happened to stop sooner (10k-60k env steps; the
    # per-seed mean over 16 seeds moved by 20% between blocks): all 16 singles, and --ppo-seed-blocks to pool more.
    parser.add_argument("--ppo-single-seeds", type=int, default=16)
    parser.add_argument("--ppo-seed-blocks", type=int, default=4,
                        help="ppo16: blocks of 16 seeds (0-15, 16-31, ...), pooled (~2 min each on one core)")
    parser.add_argument("--ppo-first-seed", type=int, default=0, help="ppo16: the first block's first seed")
    parser.add_argument("--debug-repeats", type=int, default=3, help="debug: runs per preset, the median kept")
    parser.add_argument("--out", type=Path, default=Path("outputs/bench/results.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    results: dict = {}
    if "k1" in args.only:
        results["k1"] = k1_speed(args.steps, args.repeats, args.seed)
    single = None
    for k, target in ((16, "target <= 0.25x, >= 15/16 solved"), (64, "target <= 0.15x, >= 61/64 solved")):
        if f"k{k}" in args.only:
            results[f"k{k}"] = seeds(k, single, args.single_seeds, target)
            single = results[f"k{k}"]["single"]  # measured once for both
    if "acrobot" in args.only:
        results["acrobot"] = acrobot(16, args.acrobot_single_seeds)
    if "ppo16" in args.only:
        results["ppo16"] = ppo(16, args.ppo_single_seeds, args.ppo_seed_blocks, args.ppo_first_seed)
    if "atari" in args.only:
        results["atari"] = atari(4)
    if "rmac_million" in args.only:
        import rmac_million

        results["rmac_million"] = rmac_million.measure()
        print("RMAC, a million auctions:", json.dumps({k: v for k, v in results["rmac_million"].items() if k != "runs"}))
    if "rmac_grid" in args.only:
        import rmac_grid

        results["rmac_grid"] = rmac_grid.measure()
    if "debug" in args.only:
        import debug_presets

        results["debug"] = debug_presets.measure(repeats=args.debug_repeats)
    if "rmac_solver" in args.only:
        import rmac_solver

        results["rmac_solver"] = rmac_solver.measure()
    if "stacked" in args.only:
        import bench_stacked

        results["stacked"] = bench_stacked.measure()
    if "envpool" in args.only:
        import bench_envpool

        try:
            results["envpool"] = bench_envpool.measure()
        except ValueError as error:  # envpool not installed: its one-line refusal
            print(f"envpool: skipped: {error}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()

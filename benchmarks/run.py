"""`make bench`: speed as ratios against a reference measured in the same invocation.

1. DQN on CartPole: the pipeline's `experiment=dqn_cartpole` (Lightning, Hydra, loggers, run record)
   against `benchmarks/bare_dqn.py`, the plain PyTorch loop a researcher would write, with identical
   hyperparameters and a fixed number of env steps (no early stop). Reported: env steps/s of the
   training loop, end-to-end wall time, the time breakdown, and the ratio pipeline / bare.
2. Seed batching (when `benchmarks/seed_batching.py` is present): wall time per solved seed, K seeds
   in one process against single-seed runs.

Runs alternate between the two implementations and the best of `--repeats` is kept for each, since
this machine is shared and noisy. Everything runs on one CPU thread.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bare_dqn  # noqa: E402

# The default preset's hyperparameters, spelled out for the bare loop.
SHARED = dict(
    hidden=(128, 128), lr=2.3e-3, adam_fused=True, gamma=0.99, batch_size=64, buffer_size=100_000,
    learning_starts=1_000, train_freq=256, gradient_steps=32, target_update_interval=10, eps_start=1.0,
    eps_end=0.04, eps_duration=8_000, max_grad_norm=10.0, eval_every=2_500, eval_episodes=10,
    final_eval_episodes=20, threshold=475.0,
)


def pipeline_dqn(steps: int, seed: int, out: Path) -> dict:
    from hydra import compose, initialize_config_module

    from pipeline.run import run

    overrides = [
        "experiment=dqn_cartpole", f"seed={seed}", "trainer.enable_progress_bar=false",
        f"task.total_steps={steps}", "task.stop_at_return=null",
    ]
    with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    t0 = time.perf_counter()
    record = run(cfg, out)
    wall = time.perf_counter() - t0
    if record["status"] != "ok":
        raise RuntimeError(f"pipeline run failed: {record['error']}")
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


def dqn_speed(steps: int, repeats: int, seed: int) -> dict:
    runs: dict[str, list[dict]] = {"pipeline": [], "bare": []}
    with tempfile.TemporaryDirectory() as tmp:
        # One throw-away pipeline run first: imports and first-call costs are not the loop's speed.
        pipeline_dqn(1_000, seed, Path(tmp) / "warmup")
        for r in range(repeats):
            runs["bare"].append(bare(steps, seed))
            runs["pipeline"].append(pipeline_dqn(steps, seed, Path(tmp) / f"run{r}"))
    best = {name: min(rs, key=lambda x: x["wall_time_s"]) for name, rs in runs.items()}
    return {
        "env_steps": steps,
        "repeats": repeats,
        "pipeline": best["pipeline"],
        "bare": best["bare"],
        "ratio_loop_env_steps_per_s": round(best["pipeline"]["loop_env_steps_per_s"] / best["bare"]["loop_env_steps_per_s"], 3),
        "ratio_end_to_end": round(best["bare"]["wall_time_s"] / best["pipeline"]["wall_time_s"], 3),
        "all_runs": runs,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000, help="env steps per DQN run")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-seed-batching", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("outputs/bench/results.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    results: dict = {"dqn_speed": dqn_speed(args.steps, args.repeats, args.seed)}
    d = results["dqn_speed"]
    print(f"DQN on CartPole-v1, {args.steps} env steps, identical hyperparameters, best of {args.repeats}, 1 thread")
    for name in ("bare", "pipeline"):
        r = d[name]
        print(f"  {name:9s} loop {r['loop_env_steps_per_s']:8.1f} env steps/s   end-to-end {r['wall_time_s']:6.2f} s   "
              f"breakdown {json.dumps(r['time_breakdown_s'])}")
    print(f"  ratio pipeline/bare: loop env steps/s {d['ratio_loop_env_steps_per_s']:.2f}x, "
          f"end-to-end speed {d['ratio_end_to_end']:.2f}x  (target >= 1.0x)")

    if not args.skip_seed_batching and (HERE / "seed_batching.py").is_file():
        import seed_batching

        results["seed_batching"] = seed_batching.measure()
        print("Seed batching:", json.dumps({k: v for k, v in results["seed_batching"].items() if not isinstance(v, list | dict)}))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()

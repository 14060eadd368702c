"""Tuning benchmark: `experiment=dqn_cartpole` tuned with pipeline's Optuna sweeper, then confirmed.

    python benchmarks/tune_dqn.py                                   # 20 trials x 8 seeds, median pruner, 10 fresh seeds
    python benchmarks/tune_dqn.py --trials 4 --seeds 4 --confirm-top 1 --confirm-seeds 5   # a reduced run

One `python -m pipeline -m ... hydra/sweeper=optuna` invocation on one CPU thread per run (device.num_threads=1,
the basic launcher: trials one after another). Reports the wall time, trials completed / pruned / failed, and for
the confirmed best configuration against the untouched preset, on the same fresh seeds: the IQM (95% CI) of the
final greedy return and of the time to 475, the probability of improvement and the optimism gap. The preset
was itself tuned by hand on seeds 0-4, so it may well still win: the numbers say which.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

SPACE = [
    "optimizer.lr=tag(log, interval(3e-4, 1e-2))",
    "task.gradient_steps=choice(16, 32, 64)",
    "model.hidden=choice([64,64],[128,128])",
]


def _ci(stats: dict | None) -> str:
    if not stats or stats.get("iqm") is None:
        return "-"
    return f"{stats['iqm']:.1f} [{stats['iqm_ci'][0]:.1f}, {stats['iqm_ci'][1]:.1f}]"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--confirm-top", type=int, default=3)
    parser.add_argument("--confirm-seeds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("outputs/bench/tune_dqn") / time.strftime("%Y-%m-%d_%H-%M-%S"))
    parser.add_argument("overrides", nargs="*", help="more overrides, e.g. hydra.sweeper.pruner=none")
    args = parser.parse_args(argv)
    command = [
        sys.executable, "-m", "pipeline", "-m", "experiment=dqn_cartpole", "hydra/sweeper=optuna", "device=cpu",
        "device.num_threads=1", "trainer.enable_progress_bar=false", f"hydra.sweeper.n_trials={args.trials}",
        f"hydra.sweeper.seeds={args.seeds}", "hydra.sweeper.pruner=median",
        f"hydra.sweeper.confirm_top={args.confirm_top}", f"hydra.sweeper.confirm_seeds={args.confirm_seeds}",
        f"hydra.sweep.dir={args.out.resolve()}", *SPACE, *args.overrides,
    ]
    print(" ".join(command), flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(command, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"tuning failed (exit {proc.returncode}); see {args.out}")
    tune = json.loads((args.out / "tune" / "tune.json").read_text())
    best = next((c for c in tune["candidates"] if c["trial"] == tune["best_trial"]), None)
    result = {
        "wall_time_s": round(wall, 1),
        "trials": tune["trials"],
        "seeds_per_trial": args.seeds,
        "confirm_seeds": tune["confirm_seeds"],
        "best_params": tune["best_params"],
        "best_tuned_value": tune["best_tuned_value"],
        "preset_wins": tune["preset_wins"],
        "best": None if best is None else {k: best[k] for k in ("value", "primary", "time_to_threshold_s", "optimism_gap",
                                                                "probability_of_improvement_over_preset")},
        "preset": {k: tune["preset"][k] for k in ("value", "primary", "time_to_threshold_s")} if tune["preset"] else None,
        "tune_dir": str(args.out / "tune"),
    }
    (args.out / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    if best is not None:
        th_b, th_p = best["time_to_threshold_s"] or {}, result["preset"]["time_to_threshold_s"] or {}
        print(f"\n| | final return IQM [95% CI] | time to 475 IQM [95% CI] (reached) |\n|---|---|---|\n"
              f"| best (trial {tune['best_trial']}) | {_ci(best['primary'])} | {_ci(th_b)} s ({th_b.get('reached')}/{th_b.get('of')}) |\n"
              f"| preset | {_ci(result['preset']['primary'])} | {_ci(th_p)} s ({th_p.get('reached')}/{th_p.get('of')}) |")
    return result


if __name__ == "__main__":
    main()

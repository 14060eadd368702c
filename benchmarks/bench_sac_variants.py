"""Where our SAC differs from CleanRL's, each difference on its own: the preset (CleanRL's temperature start and loss,
the exact tanh log-det) against one switch changed at a time, on HalfCheetah-v4, seeds run K at a time in one process.

    .venv/bin/python benchmarks/bench_sac_variants.py                       # every variant, seeds 1000-1001, 50k env steps
    .venv/bin/python benchmarks/bench_sac_variants.py --report               # the table from the results file

Variants (each is `experiment=sac_halfcheetah` plus these overrides):
- preset: CleanRL's alpha start (1.0), its temperature loss (-alpha (log pi + target), a fresh draw), the exact log-det;
- log_alpha_loss: task.temperature_loss=log_alpha (SB3's -log_alpha (log pi + target) on the actor step's draw);
- alpha_start_0.2: task.alpha_start=0.2 (what the preset used before it matched CleanRL);
- cleanrl_log_det: task.log_det_epsilon=1e-6 (CleanRL's log(1 - a^2 + 1e-6)).
(The critics' weights frozen in the actor loss changes no number, only the work: tests/tasks pins the equality.)
Each finished (variant, seed) appends a line to benchmarks/results/sac_variants.jsonl: final deterministic return
(20 fresh episodes), training returns per 10k env steps, CPU s; a rerun trains only what is missing.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "outputs" / "bench-sac-variants"
RESULTS = Path(os.environ.get("SAC_VARIANTS_RESULTS", ROOT / "benchmarks" / "results" / "sac_variants.jsonl"))
VARIANTS = {
    "preset": [],
    "log_alpha_loss": ["task.temperature_loss=log_alpha"],
    "alpha_start_0.2": ["task.alpha_start=0.2"],
    "cleanrl_log_det": ["task.log_det_epsilon=1e-6"],
}
WINDOW = 10_000


def rows() -> list[dict]:
    return [json.loads(x) for x in RESULTS.read_text().splitlines() if x.strip()] if RESULTS.exists() else []


def run_variant(name: str, seeds: list[int], steps: int, env_id: str) -> None:
    done = {(r["variant"], r["seed"], r["env_steps"], r["env"]) for r in rows()}
    if all((name, s, steps, env_id) in done for s in seeds):
        return
    run_dir = OUT / f"{name}-{env_id}-{steps}-seeds{seeds[0]}-{seeds[-1]}"
    resume = ["ckpt_path=last"] if (run_dir / "checkpoints" / "last.ckpt").exists() else []
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "pipeline", "experiment=sac_halfcheetah", f"env.id={env_id}", f"seed={seeds[0]}",
                    f"seeds_per_process={len(seeds)}", f"task.total_steps={steps}", "task.final_eval_episodes=20",
                    *VARIANTS[name], "trainer.enable_progress_bar=false", f"hydra.run.dir={run_dir}", *resume],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        record = json.loads((run_dir / f"seed{seed}" / "result.json").read_text())
        points = []
        with open(run_dir / f"seed{seed}" / "metrics.csv") as f:
            points = [(int(float(r["step"])), float(r["train/episodic_return"])) for r in csv.DictReader(f)
                      if r.get("train/episodic_return")]
        windows = []
        for end in range(WINDOW, steps + 1, WINDOW):
            inside = [v for s, v in points if end - WINDOW < s <= end]
            windows.append([end, float(np.mean(inside)) if inside else None])
        line = {"variant": name, "overrides": VARIANTS[name], "env": env_id, "seed": seed, "env_steps": steps,
                "final_return": float(record["metrics"]["eval/return_mean"]), "train_returns": windows,
                "cpu_s": cpu / len(seeds), "resumed": bool(resume), "commit": commit, "status": record["status"]}
        with RESULTS.open("a") as f:
            f.write(json.dumps(line) + "\n")
        print(f"  {name} seed {seed}: final {line['final_return']:.0f}", flush=True)


def report() -> int:
    by: dict[str, list[dict]] = {}
    for r in rows():
        by.setdefault(r["variant"], []).append(r)
    if not by:
        print("no results yet")
        return 1
    print("| variant | overrides | seeds | final (each seed) | mean | training return by 10k window (mean over seeds) |")
    print("|---|---|---|---|---|---|")
    for name, rs in by.items():
        rs = sorted(rs, key=lambda r: r["seed"])
        finals = [r["final_return"] for r in rs]
        curve = np.nanmean(np.array([[np.nan if p[1] is None else p[1] for p in r["train_returns"]] for r in rs], float), 0)
        print(f"| {name} | {' '.join(rs[0]['overrides']) or '(preset)'} | {len(rs)} | {', '.join(f'{v:.0f}' for v in finals)} | "
              f"{np.mean(finals):.0f} | {', '.join(f'{v:.0f}' for v in curve)} |")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1000, 1001])
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--env-id", default="HalfCheetah-v4")
    parser.add_argument("--report", action="store_true")
    args = parser.parse_args(argv)
    if args.report:
        return report()
    for name in args.variants:
        run_variant(name, args.seeds, args.steps, args.env_id)
    return report()


if __name__ == "__main__":
    raise SystemExit(main())

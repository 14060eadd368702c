"""`make bench-cleanrl`: PPO on Pendulum-v1, the pipeline against CleanRL's `ppo_continuous_action.py`, 16 seeds.

    make bench-cleanrl                                      # both sides, seeds 0-15, 1M env steps each
    make bench-cleanrl ARGS="--ours-runs <run folder>"      # our side from a finished seeds_per_process=16 run
    CLEANRL_GIT=/path/to/a/clone make bench-cleanrl         # no network: clone CleanRL from a local copy

- CleanRL: its `ppo_continuous_action.py`, unmodified, from a scratch clone (outputs/bench-cleanrl/cleanrl, never
  vendored), in its own virtualenv (`.venv-cleanrl`: CleanRL's gymnasium 0.29.1, which its wrappers need; torch
  pinned as ours). One process a seed (`benchmarks/cleanrl_ppo.py`), with our preset's settings passed as its flags
  (read from `python -m pipeline experiment=ppo_pendulum --cfg job`, so the two cannot drift apart). What its file
  fixes and ours does not: observation and reward normalisation (always on there; off in our preset), Adam's eps
  1e-5 (ours 1e-8). Its finished agent is scored like ours: the mean action (no sampling), clipped to the bounds,
  over 20 fresh episodes whose seeds no training episode used, observations normalised with the statistics frozen
  at the end of training.
- Ours: `python -m pipeline experiment=ppo_pendulum seeds_per_process=16` (one process), each seed's final
  deterministic 20-episode mean from its record (`eval/return_mean`).
Finished CleanRL seeds are kept in outputs/bench-cleanrl/cleanrl.jsonl; a rerun only trains the missing ones.
Reported: per-seed finals, each side's IQM with its 95% stratified-bootstrap CI (rliable, as `pipeline.report`),
the IQM difference (ours - CleanRL) with its CI, P(ours > CleanRL), and the verdict the issue asks for: ours is
worse only if its IQM's CI lies wholly below CleanRL's. Results: outputs/bench-cleanrl/result.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml
from other_side import own_venv, scratch_clone, sh

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "outputs" / "bench-cleanrl"
VENV = ROOT / ".venv-cleanrl"
# CleanRL's own pins where it has them (gymnasium 0.29.1: its wrappers and `final_info` predate 1.0; numpy < 2 for
# that gymnasium); torch is the pipeline's, so both sides run the same kernels.
CLEANRL_PACKAGES = ["torch==2.13.0", "gymnasium==0.29.1", "numpy==1.26.4", "tyro==1.0.17", "tensorboard==2.21.0"]
CLEANRL_GIT = os.environ.get("CLEANRL_GIT", "https://github.com/vwxyzjn/cleanrl")
PRESET = "ppo_pendulum"


def cleanrl_venv() -> Path:
    return own_venv(VENV, CLEANRL_PACKAGES, "bench-cleanrl")


def cleanrl_source() -> tuple[Path, str]:
    clone = OUT / "cleanrl"
    commit = scratch_clone(CLEANRL_GIT, clone, "CLEANRL_GIT", "vwxyzjn/cleanrl")
    return clone / "cleanrl" / "ppo_continuous_action.py", commit


def preset_flags() -> tuple[list[str], dict]:
    """CleanRL's flags for our preset's settings, from the composed config."""
    text = sh([sys.executable, "-m", "pipeline", f"experiment={PRESET}", "--cfg", "job"], capture_output=True,
              cwd=ROOT).stdout
    cfg = yaml.safe_load(text)
    task, optimizer = cfg["task"], cfg["optimizer"]

    def switch(name: str, on: bool) -> str:
        return f"--{name}" if on else f"--no-{name}"

    flags = [
        "--env-id", cfg["env"]["id"], "--total-timesteps", str(task["total_steps"]),
        "--num-envs", str(task["envs_per_agent"]), "--num-steps", str(task["num_steps"]),
        "--num-minibatches", str(task["num_minibatches"]), "--update-epochs", str(task["update_epochs"]),
        "--gamma", str(task["gamma"]), "--gae-lambda", str(task["gae_lambda"]), "--learning-rate", str(optimizer["lr"]),
        switch("anneal-lr", task["anneal_lr"]), "--ent-coef", str(task["ent_coef"]),
        switch("clip-vloss", task["clip_value_loss"]), "--clip-coef", str(task["clip_coef"]),
        "--vf-coef", str(task["vf_coef"]), "--max-grad-norm", str(task["max_grad_norm"]),
        switch("norm-adv", task["norm_adv"]),
    ]
    return flags, cfg


def run_cleanrl(python: Path, script: Path, flags: list[str], seeds: list[int], episodes: int, core: int | None) -> dict:
    done_file = OUT / "cleanrl.jsonl"
    done = {}
    if done_file.exists():
        for line in done_file.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                done[row["seed"]] = row
    for seed in seeds:
        if seed in done:
            continue
        cmd = [str(python), "-W", "ignore", str(ROOT / "benchmarks" / "cleanrl_ppo.py"), "--script", str(script),
               "--seed", str(seed), "--episodes", str(episodes), "--", *flags]
        if core is not None:
            cmd = ["taskset", "-c", str(core), *cmd]
        t0 = time.perf_counter()
        line = sh(cmd, capture_output=True).stdout.strip().splitlines()[-1]
        row = json.loads(line)
        print(f"  CleanRL seed {seed}: final {row['final_return_mean']:.1f} ({time.perf_counter() - t0:.0f} s)", flush=True)
        with done_file.open("a") as f:
            f.write(json.dumps(row) + "\n")
        done[seed] = row
    return {s: done[s] for s in seeds}


def run_ours(seeds: list[int], runs: Path | None, core: int | None) -> dict[int, float]:
    if runs is None:
        runs = OUT / "ours"
        cmd = [sys.executable, "-m", "pipeline", f"experiment={PRESET}", f"seed={seeds[0]}",
               f"seeds_per_process={len(seeds)}", f"hydra.run.dir={runs}"]
        if core is not None:
            cmd = ["taskset", "-c", str(core), *cmd]
        sh(cmd, cwd=ROOT, stdout=subprocess.DEVNULL)
    finals = {}
    for result in sorted(runs.glob("**/result.json")):
        record = json.loads(result.read_text())
        if record.get("status") == "ok" and record["seed"] in seeds:
            finals[record["seed"]] = float(record["metrics"]["eval/return_mean"])
    missing = sorted(set(seeds) - set(finals))
    if missing:
        raise SystemExit(f"error: no finished record for seed(s) {missing} under {runs}; run the preset for them")
    return finals


def compare(ours: list[float], theirs: list[float]) -> dict:
    from rliable import library

    from pipeline.report.stats import (
        CONFIDENCE,
        DEFAULT_REPS,
        fast_iqm,
        interval_estimates,
        probability_of_improvement,
        seeded_global_numpy,
    )

    x, y = np.asarray(ours, float).reshape(-1, 1), np.asarray(theirs, float).reshape(-1, 1)
    with seeded_global_numpy(0):
        _, interval = library.get_interval_estimates({"d": [x, y]}, lambda a, b: fast_iqm(a) - fast_iqm(b),
                                                     reps=DEFAULT_REPS, confidence_interval_size=CONFIDENCE)
    a, b = interval_estimates(ours), interval_estimates(theirs)
    return {"ours": a, "cleanrl": b, "iqm_difference": fast_iqm(x) - fast_iqm(y),
            "iqm_difference_ci": [float(v) for v in np.asarray(interval["d"]).reshape(2)],
            "p_ours_better": probability_of_improvement(ours, theirs),
            "ours_worse_by_ci": a["iqm_ci"][1] < b["iqm_ci"][0]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=16, help="seeds 0..n-1 on both sides")
    parser.add_argument("--episodes", type=int, default=20, help="CleanRL's final deterministic evaluation episodes")
    parser.add_argument("--ours-runs", type=Path, default=None,
                        help="a finished `experiment=ppo_pendulum seeds_per_process=N` run folder to read instead of running it")
    parser.add_argument("--core", type=int, default=None, help="pin both sides to this CPU core (taskset)")
    parser.add_argument("--cleanrl-only", action="store_true", help="train the missing CleanRL seeds, then stop")
    args = parser.parse_args(argv)
    if args.ours_runs is not None and not args.ours_runs.is_dir():
        raise SystemExit(f"error: --ours-runs {args.ours_runs} is not a folder; give the run folder of a finished preset run")
    seeds = list(range(args.seeds))
    flags, _ = preset_flags()
    python = cleanrl_venv()
    script, commit = cleanrl_source()
    print(f"bench-cleanrl: CleanRL {commit[:7]} ppo_continuous_action.py {' '.join(flags)}", flush=True)
    theirs = run_cleanrl(python, script, flags, seeds, args.episodes, args.core)
    if args.cleanrl_only:
        return 0
    ours = run_ours(seeds, args.ours_runs, args.core)
    result = compare([ours[s] for s in seeds], [theirs[s]["final_return_mean"] for s in seeds])
    result.update(cleanrl_commit=commit, flags=flags, packages=CLEANRL_PACKAGES, seeds=seeds,
                  ours_finals=[ours[s] for s in seeds], cleanrl_finals=[theirs[s]["final_return_mean"] for s in seeds],
                  cleanrl_train_s=[theirs[s]["train_s"] for s in seeds])
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "result.json").write_text(json.dumps(result, indent=1))
    print(f"\nPPO Pendulum-v1, {len(seeds)} seeds, {flags[3]} env steps each; final deterministic 20-episode means")
    print("| seed | pipeline | CleanRL |\n|---|---|---|")
    for s in seeds:
        print(f"| {s} | {ours[s]:.1f} | {theirs[s]['final_return_mean']:.1f} |")
    for name in ("ours", "cleanrl"):
        r = result[name]
        print(f"{name}: IQM {r['iqm']:.1f} [95% CI {r['iqm_ci'][0]:.1f}, {r['iqm_ci'][1]:.1f}], mean {r['mean']:.1f}")
    lo, hi = result["iqm_difference_ci"]
    p = result["p_ours_better"]
    print(f"IQM difference (ours - CleanRL) {result['iqm_difference']:.1f} [95% CI {lo:.1f}, {hi:.1f}]; "
          f"P(ours > CleanRL) {p['p']:.2f} [{p['ci'][0]:.2f}, {p['ci'][1]:.2f}]")
    print("verdict: " + ("ours is WORSE (its IQM's CI lies below CleanRL's)" if result["ours_worse_by_ci"]
                         else "ours is not worse by the IQM's 95% CI"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

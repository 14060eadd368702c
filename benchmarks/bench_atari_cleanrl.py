"""PPO on Atari: env steps per CPU second, `experiment=ppo_atari` at K = 1 and K = 4 against CleanRL's `ppo_atari_envpool.py`.

    python benchmarks/bench_atari_cleanrl.py                                  # 2 pairs, 5 iterations (5,120 env steps)
    python benchmarks/bench_atari_cleanrl.py --script /path/to/ppo_atari_envpool.py --pairs 3 --iterations 8
    CLEANRL_GIT=/path/to/a/clone python benchmarks/bench_atari_cleanrl.py     # no network: CleanRL from a local copy

- CleanRL: its `cleanrl/ppo_atari_envpool.py`, unmodified, from `--script` or a scratch clone
  (outputs/bench-atari-cleanrl/cleanrl, never vendored), in its own virtualenv (outputs/bench-atari-cleanrl/venv):
  torch pinned as ours (CPU wheel), CleanRL's gym 0.23.1, and envpool 0.8.4, the newest release whose
  `env_type="gym"` still gives gym's old API that the script uses (envpool 1.x returns a gymnasium pool: the
  script stops at `envs.num_envs = ...` with "property 'num_envs' ... has no setter").
- Ours: `python -m pipeline experiment=ppo_atari env.backend=envpool` (envpool 1.2.5 in the pipeline's venv),
  K = 1 and `seeds_per_process=4`; evaluation only at the end (one game per agent, the least the task allows).
- Both: the same game (`--game`), the preset's envs, rollout length, epochs and minibatches, pinned to one core
  (`taskset`, `OMP_NUM_THREADS=1`; our device.num_threads is 1), run one after another in pairs (CleanRL, K = 1,
  K = 4), each at 1 iteration and at `--iterations` iterations. Whole-process CPU seconds (user + system, all
  threads) from the kernel; env steps over all agents. "Marginal" divides the extra env steps of the long run by
  its extra CPU seconds, which leaves start-up (imports, pool creation, the final evaluation) out; start-up is
  the 1-iteration run's CPU seconds less its share of the marginal cost.
Ratios are ours / CleanRL per env step (at K = 4 per env step of all agents): above 1 means ours is faster.
Results: outputs/bench-atari-cleanrl/result.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import yaml
from other_side import own_venv, scratch_clone, sh

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "outputs" / "bench-atari-cleanrl"
VENV = OUT / "venv"
CLEANRL_PACKAGES = ["torch==2.13.0", "envpool==0.8.4", "gym==0.23.1", "numpy==1.26.4", "tyro==1.0.17",
                    "tensorboard==2.21.0"]
CLEANRL_GIT = os.environ.get("CLEANRL_GIT", "https://github.com/vwxyzjn/cleanrl")
PRESET = "ppo_atari"


def cpu_seconds(cmd: list[str], log: Path, cwd: Path, env: dict) -> float:
    """Run `cmd` to completion; its user + system CPU seconds (all threads), output to `log`."""
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=cwd, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd[:6])} ... exited {proc.returncode}; see {log}")
    return usage.ru_utime + usage.ru_stime


def preset() -> dict:
    text = sh([sys.executable, "-m", "pipeline", f"experiment={PRESET}", "--cfg", "job"], capture_output=True,
              cwd=ROOT).stdout
    return yaml.safe_load(text)["task"]


def cleanrl_cmd(python: Path, script: Path, game: str, task: dict, steps: int) -> list[str]:
    return [str(python), "-W", "ignore", str(script), "--env-id", f"{game}-v5", "--total-timesteps", str(steps),
            "--num-envs", str(task["envs_per_agent"]), "--num-steps", str(task["num_steps"]),
            "--num-minibatches", str(task["num_minibatches"]), "--update-epochs", str(task["update_epochs"]),
            "--no-cuda"]


def ours_cmd(game: str, k: int, steps: int, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "pipeline", f"experiment={PRESET}", "env.backend=envpool", f"env.id=ALE/{game}-v5",
            f"seeds_per_process={k}", f"task.total_steps={steps}", f"task.eval_every={10 * steps}",
            "task.final_eval_episodes=1", "device=cpu", "device.num_threads=1", f"hydra.run.dir={run_dir}"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--script", type=Path, default=None,
                        help="CleanRL's ppo_atari_envpool.py (default: a scratch clone of CLEANRL_GIT)")
    parser.add_argument("--game", default="Pong", help="Atari game, e.g. Pong or Breakout")
    parser.add_argument("--iterations", type=int, default=5, help="PPO iterations of the long run (>= 2)")
    parser.add_argument("--pairs", type=int, default=2, help="interleaved repeats of (CleanRL, K=1, K=4)")
    parser.add_argument("--core", type=int, default=0, help="the CPU core every run is pinned to")
    args = parser.parse_args(argv)
    if args.iterations < 2:
        raise SystemExit(f"error: --iterations {args.iterations}: must be >= 2 (the 1-iteration run is the start-up)")
    if args.script is not None and not args.script.is_file():
        raise SystemExit(f"error: --script {args.script} is not a file; give CleanRL's cleanrl/ppo_atari_envpool.py")
    task = preset()
    python = own_venv(VENV, CLEANRL_PACKAGES, "bench-atari-cleanrl")
    if args.script is None:
        clone = OUT / "cleanrl"
        commit = scratch_clone(CLEANRL_GIT, clone, "CLEANRL_GIT", "vwxyzjn/cleanrl")
        args.script, source = clone / "cleanrl" / "ppo_atari_envpool.py", f"CleanRL {commit[:7]}"
    else:
        source = str(args.script)
    batch = task["envs_per_agent"] * task["num_steps"]
    budgets = {"start": batch, "long": batch * args.iterations}
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    pin = ["taskset", "-c", str(args.core)]
    logs = OUT / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    sides = [("CleanRL", 1), ("ours", 1), ("ours", 4)]
    print(f"bench-atari-cleanrl: {source} ppo_atari_envpool.py against experiment={PRESET}, {args.game}, "
          f"{args.iterations} x {batch} env steps per agent, core {args.core}", flush=True)
    rows = []
    for pair in range(args.pairs):
        for side, k in sides:
            cpu = {}
            for name, steps in budgets.items():
                tag = f"{side}-K{k}-{name}-{pair}"
                if side == "CleanRL":
                    cwd = OUT / "cleanrl-runs"
                    cwd.mkdir(exist_ok=True)
                    cmd = cleanrl_cmd(python, args.script, args.game, task, steps)
                else:
                    run_dir = OUT / "ours" / tag
                    shutil.rmtree(run_dir, ignore_errors=True)  # a finished run there would be refused
                    cwd, cmd = ROOT, ours_cmd(args.game, k, steps, run_dir)
                cpu[name] = cpu_seconds(pin + cmd, logs / f"{tag}.log", cwd, env)
            steps = {name: k * n for name, n in budgets.items()}
            marginal = (steps["long"] - steps["start"]) / (cpu["long"] - cpu["start"])
            row = {"pair": pair, "side": side, "K": k, "env_steps": steps["long"], "cpu_s": cpu["long"],
                   "steps_per_cpu_s": steps["long"] / cpu["long"], "marginal_steps_per_cpu_s": marginal,
                   "startup_cpu_s": cpu["start"] - steps["start"] / marginal}
            rows.append(row)
            print(f"  pair {pair} {side} K={k}: {row['env_steps']} env steps in {row['cpu_s']:.1f} CPU s "
                  f"({row['steps_per_cpu_s']:.0f}/s whole process, {marginal:.0f}/s marginal)", flush=True)
    (OUT / "result.json").write_text(json.dumps({"source": source, "packages": CLEANRL_PACKAGES, "game": args.game,
                                                 "iterations": args.iterations, "core": args.core, "rows": rows},
                                                indent=1))
    ref = {r["pair"]: r for r in rows if r["side"] == "CleanRL"}
    print("\n| side | K | env steps | CPU s | env steps / CPU s | marginal env steps / CPU s | start-up CPU s "
          "| ours / CleanRL: whole (pairs), marginal (pairs) |\n|---|---|---|---|---|---|---|---|")
    for side, k in sides:
        mine = [r for r in rows if (r["side"], r["K"]) == (side, k)]
        whole = [r["steps_per_cpu_s"] / ref[r["pair"]]["steps_per_cpu_s"] for r in mine]
        marg = [r["marginal_steps_per_cpu_s"] / ref[r["pair"]]["marginal_steps_per_cpu_s"] for r in mine]
        ratio = "-" if side == "CleanRL" else \
            f"{statistics.median(whole):.2f}x ({min(whole):.2f}-{max(whole):.2f}), " \
            f"{statistics.median(marg):.2f}x ({min(marg):.2f}-{max(marg):.2f})"
        print(f"| {side} | {k} | {mine[0]['env_steps']} | {statistics.median(r['cpu_s'] for r in mine):.1f} "
              f"| {statistics.median(r['steps_per_cpu_s'] for r in mine):.0f} "
              f"| {statistics.median(r['marginal_steps_per_cpu_s'] for r in mine):.0f} "
              f"| {statistics.median(r['startup_cpu_s'] for r in mine):.1f} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

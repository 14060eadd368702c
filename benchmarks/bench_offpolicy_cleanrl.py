"""`make bench-offpolicy-cleanrl`: SAC and TD3 on HalfCheetah, the pipeline against CleanRL's sac_continuous_action.py
and td3_continuous_action.py, at the same budget and seeds.

    make bench-offpolicy-cleanrl                             # both algorithms, seeds 0-3, 300k env steps (hours)
    make bench-offpolicy-cleanrl ARGS="--smoke"              # the whole path on a tiny budget (minutes)
    make bench-offpolicy-cleanrl ARGS="--algos sac --singles" # also 4 single runs: the K = 4 run's cost per seed
    CLEANRL_GIT=/path/to/a/clone make bench-offpolicy-cleanrl  # no network: clone CleanRL from a local copy

- CleanRL: its files, unmodified, from a scratch clone (outputs/bench-offpolicy-cleanrl/cleanrl, never vendored), in
  their own virtualenv (`outputs/bench-offpolicy-cleanrl/venv`: CleanRL's gymnasium 0.29.1 with MuJoCo; torch pinned as
  ours). One process per seed (this file's `--run-one` mode, run by that
  virtualenv's python: it runs CleanRL's file with `runpy` and then scores the agent it left behind), with our
  preset's settings as its flags (read from `python -m pipeline experiment=<algo>_halfcheetah --cfg job`, so the
  two cannot drift apart). Scored like ours: the deterministic action (SAC: tanh of the mean; TD3: the actor's
  output), 20 fresh episodes whose seeds no training episode used.
- Ours: `python -m pipeline experiment=<algo>_halfcheetah seeds_per_process=4` (one process), each seed's final
  deterministic 20-episode mean (`eval/return_mean`); with `--singles`, also each seed as its own run, and the
  CPU seconds of the K = 4 process per seed against the single runs'.
- The env: HalfCheetah-v4 on both sides by default (CleanRL's gymnasium 0.29.1 has no v5; ours runs v4 too).
Finished CleanRL seeds are kept in outputs/bench-offpolicy-cleanrl/cleanrl-<algo>.jsonl; a rerun trains only the
missing ones. Reported per algorithm: per-seed finals, each side's IQM with its 95% stratified-bootstrap CI
(rliable, as `pipeline.report`), the IQM difference with its CI, and the verdict the issue asks for: ours is worse
only if its IQM's CI lies wholly below CleanRL's. Results: outputs/bench-offpolicy-cleanrl/result.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "outputs" / "bench-offpolicy-cleanrl"
VENV = OUT / "venv"  # under outputs/ (ignored by git): the other side never enters the checkout
# CleanRL's pins where it has them (gymnasium 0.29.1: its `final_info` / `final_observation` predate 1.0; numpy < 2
# for that gymnasium); torch is ours. Its replay buffer is its own (cleanrl_utils, in the clone).
CLEANRL_PACKAGES = ["torch==2.13.0", "gymnasium[mujoco]==0.29.1", "mujoco==3.17.0", "numpy==1.26.4", "tyro==1.0.17",
                    "tensorboard==2.21.0"]
CLEANRL_GIT = os.environ.get("CLEANRL_GIT", "https://github.com/vwxyzjn/cleanrl")
SCRIPTS = {"sac": "sac_continuous_action.py", "td3": "td3_continuous_action.py"}
SMOKE = {"total_steps": 1_200, "learning_starts": 400, "episodes": 2, "max_episode_steps": 100}


# ---- inside CleanRL's virtualenv: one seed, then its score (no pipeline imports here) ------------------------------
def run_one(script: str, algo: str, seed: int, episodes: int, max_episode_steps: int | None, flags: list[str]) -> None:
    import contextlib
    import io
    import runpy
    import tempfile

    import gymnasium as gym
    import numpy as np
    import torch

    torch.set_num_threads(1)
    env_id = flags[flags.index("--env-id") + 1]
    sys.path.insert(0, str(Path(script).resolve().parents[1]))  # the clone's root: its cleanrl_utils
    os.chdir(tempfile.mkdtemp(prefix="cleanrl-"))  # its runs/ folder goes here
    sys.argv = [script, "--seed", str(seed), "--no-cuda", *flags]
    start = time.perf_counter()
    cpu0 = time.process_time()
    with contextlib.redirect_stdout(io.StringIO()):
        namespace = runpy.run_path(script, run_name="__main__")
    train_s, train_cpu_s = time.perf_counter() - start, time.process_time() - cpu0
    actor = namespace["actor"]
    env = gym.make(env_id, **({} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}))
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=10_000 * (seed + 1) + i)
        total, done = 0.0, False
        while not done:
            x = torch.as_tensor(np.asarray(obs, dtype=np.float32))[None]
            with torch.no_grad():
                action = actor.get_action(x)[2] if algo == "sac" else actor(x)
            obs, reward, terminated, truncated, _ = env.step(action[0].numpy())
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    print(json.dumps({"seed": seed, "final_return_mean": float(np.mean(returns)), "final_returns": returns,
                      "train_s": train_s, "train_cpu_s": train_cpu_s}))


# ---- the pipeline's side ---------------------------------------------------------------------------------------------
def preset_config(algo: str, overrides: list[str]) -> dict:
    import yaml
    from scratch import sh

    text = sh([sys.executable, "-m", "pipeline", f"experiment={algo}_halfcheetah", *overrides, "--cfg", "job"],
              capture_output=True, cwd=ROOT).stdout
    return yaml.safe_load(text)


def cleanrl_flags(algo: str, cfg: dict) -> list[str]:
    task = cfg["task"]
    flags = ["--env-id", cfg["env"]["id"], "--total-timesteps", str(task["total_steps"]), "--buffer-size", str(task["buffer_size"]),
             "--gamma", str(task["gamma"]), "--tau", str(task["tau"]), "--batch-size", str(task["batch_size"]),
             "--learning-starts", str(task["learning_starts"]), "--policy-frequency", str(task["policy_frequency"])]
    if algo == "sac":
        flags += ["--policy-lr", str(task["policy_lr"]), "--q-lr", str(task["q_lr"]),
                  "--target-network-frequency", str(task["target_network_frequency"]), "--alpha", str(task["alpha"]),
                  "--autotune" if task["autotune"] else "--no-autotune"]
    else:
        if task["policy_lr"] != task["q_lr"]:
            raise SystemExit(f"error: CleanRL's TD3 has one learning rate; the preset has policy_lr={task['policy_lr']} "
                             f"and q_lr={task['q_lr']}")
        flags += ["--learning-rate", str(task["q_lr"]), "--policy-noise", str(task["policy_noise"]),
                  "--exploration-noise", str(task["exploration_noise"]), "--noise-clip", str(task["noise_clip"])]
    return flags


def run_cleanrl(algo: str, python: Path, script: Path, flags: list[str], seeds: list[int], episodes: int,
                max_episode_steps: int | None, tag: str) -> dict:
    from scratch import sh

    done_file = OUT / f"cleanrl-{algo}{tag}.jsonl"
    done = {}
    if done_file.exists():
        done = {row["seed"]: row for row in map(json.loads, filter(str.strip, done_file.read_text().splitlines()))}
    for seed in seeds:
        if seed in done:
            continue
        cmd = [str(python), "-W", "ignore", __file__, "--run-one", "--algo", algo, "--script", str(script), "--seed", str(seed),
               "--episodes", str(episodes)]
        if max_episode_steps is not None:
            cmd += ["--max-episode-steps", str(max_episode_steps)]
        row = json.loads(sh([*cmd, "--", *flags], capture_output=True).stdout.strip().splitlines()[-1])
        print(f"  CleanRL {algo} seed {seed}: final {row['final_return_mean']:.1f} ({row['train_s']:.0f} s)", flush=True)
        with done_file.open("a") as f:
            f.write(json.dumps(row) + "\n")
        done[seed] = row
    return {s: done[s] for s in seeds}


def run_ours(algo: str, seeds: list[int], overrides: list[str], run_dir: Path) -> tuple[dict[int, float], float]:
    """Our finals per seed, and the CPU seconds of the process (its children's rusage)."""
    from scratch import sh

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    sh([sys.executable, "-m", "pipeline", f"experiment={algo}_halfcheetah", f"seed={seeds[0]}", f"seeds_per_process={len(seeds)}",
        *overrides, "trainer.enable_progress_bar=false", f"hydra.run.dir={run_dir}"], cwd=ROOT, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    finals = {}
    for result in sorted(run_dir.glob("**/result.json")):
        record = json.loads(result.read_text())
        if record.get("status") == "ok":
            finals[int(record["seed"])] = float(record["metrics"]["eval/return_mean"])
    return finals, cpu


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", nargs="+", choices=sorted(SCRIPTS), default=["sac", "td3"])
    parser.add_argument("--seeds", type=int, default=4, help="seeds 0..n-1 on both sides")
    parser.add_argument("--env-id", default="HalfCheetah-v4", help="on both sides (CleanRL's gymnasium 0.29.1 has no v5)")
    parser.add_argument("--episodes", type=int, default=20, help="final deterministic evaluation episodes")
    parser.add_argument("--singles", action="store_true", help="also run each seed alone: the K-seed run's CPU per seed against them")
    parser.add_argument("--smoke", action="store_true", help=f"a tiny budget through the whole path: {SMOKE}")
    # --run-one: inside CleanRL's virtualenv (this file runs itself there).
    parser.add_argument("--run-one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--algo", help=argparse.SUPPRESS)
    parser.add_argument("--script", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--max-episode-steps", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("cleanrl_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_one:
        run_one(args.script, args.algo, args.seed, args.episodes, args.max_episode_steps, [a for a in args.cleanrl_args if a != "--"])
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_cleanrl import compare  # the same statistics as the PPO comparison
    from scratch import own_venv, scratch_clone

    overrides = [f"env.id={args.env_id}"]
    episodes, limit, tag = args.episodes, None, ""
    if args.smoke:
        overrides += [f"task.total_steps={SMOKE['total_steps']}", f"task.learning_starts={SMOKE['learning_starts']}",
                      f"+env.kwargs.max_episode_steps={SMOKE['max_episode_steps']}", "task.eval_every=100000",
                      f"task.final_eval_episodes={SMOKE['episodes']}"]
        episodes, limit, tag = SMOKE["episodes"], SMOKE["max_episode_steps"], "-smoke"
    python = own_venv(VENV, CLEANRL_PACKAGES, "bench-offpolicy-cleanrl")
    commit = scratch_clone(CLEANRL_GIT, OUT / "cleanrl", "CLEANRL_GIT", "vwxyzjn/cleanrl")
    seeds, results = list(range(args.seeds)), {}
    for algo in args.algos:
        cfg = preset_config(algo, overrides)
        flags = cleanrl_flags(algo, cfg)
        print(f"bench-offpolicy-cleanrl: CleanRL {commit[:7]} {SCRIPTS[algo]} {' '.join(flags)}", flush=True)
        theirs = run_cleanrl(algo, python, OUT / "cleanrl" / "cleanrl" / SCRIPTS[algo], flags, seeds, episodes, limit, tag)
        ours, cpu = run_ours(algo, seeds, overrides, OUT / f"ours-{algo}{tag}")
        missing = sorted(set(seeds) - set(ours))
        if missing:
            raise SystemExit(f"error: no finished record for seed(s) {missing} of our {algo} run under {OUT}")
        result = compare([ours[s] for s in seeds], [theirs[s]["final_return_mean"] for s in seeds])
        result.update(flags=flags, ours_finals=[ours[s] for s in seeds], cleanrl_finals=[theirs[s]["final_return_mean"] for s in seeds],
                      ours_cpu_s=cpu, cleanrl_cpu_s=[theirs[s]["train_cpu_s"] for s in seeds])
        if args.singles:
            single_cpu = sum(run_ours(algo, [s], overrides, OUT / f"ours-{algo}{tag}-single{s}")[1] for s in seeds)
            result.update(singles_cpu_s=single_cpu, batch_cost_per_seed_vs_singles=cpu / single_cpu)
        results[algo] = result
        steps = cfg["task"]["total_steps"]
        print(f"\n{algo.upper()} {args.env_id}, {len(seeds)} seeds, {steps} env steps each; final deterministic {episodes}-episode means")
        rows = "\n".join(f"| {s} | {ours[s]:.1f} | {theirs[s]['final_return_mean']:.1f} |" for s in seeds)
        print(f"| seed | pipeline | CleanRL |\n|---|---|---|\n{rows}")
        print("\n".join(f"{n}: IQM {result[n]['iqm']:.1f} [95% CI {result[n]['iqm_ci'][0]:.1f}, {result[n]['iqm_ci'][1]:.1f}]"
                        for n in ("ours", "cleanrl")))
        lo, hi = result["iqm_difference_ci"]
        print(f"IQM difference (ours - CleanRL) {result['iqm_difference']:.1f} [95% CI {lo:.1f}, {hi:.1f}]; CPU s: ours "
              f"{cpu:.0f} (K={len(seeds)}, one process), CleanRL {sum(result['cleanrl_cpu_s']):.0f} ({len(seeds)} processes)")
        if args.singles:
            print(f"K={len(seeds)} CPU per seed against single runs: {result['batch_cost_per_seed_vs_singles']:.2f}x")
        print("verdict: " + ("ours is WORSE (its IQM's CI lies below CleanRL's)" if result["ours_worse_by_ci"]
                             else "ours is not worse by the IQM's 95% CI"))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"result{tag}.json").write_text(json.dumps({"cleanrl_commit": commit, "packages": CLEANRL_PACKAGES, "seeds": seeds,
                                                       "env_id": args.env_id, **results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

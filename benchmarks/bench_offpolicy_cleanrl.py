"""`make bench-offpolicy-cleanrl`: SAC and TD3 on MuJoCo (HalfCheetah, Hopper), the pipeline against CleanRL's
sac_continuous_action.py and td3_continuous_action.py, at the same budget, seeds and env version.

    make bench-offpolicy-cleanrl                                    # all of it: 2 algos x 2 envs x 4 seeds x 2 sides, 100k steps
    make bench-offpolicy-cleanrl ARGS="--sides cleanrl"             # only CleanRL's missing runs (run the sides in parallel)
    make bench-offpolicy-cleanrl ARGS="--report"                    # the verdicts, curves and CPU from what is committed
    make bench-offpolicy-cleanrl ARGS="--smoke"                     # the whole path on a tiny budget (minutes; not committed)
    CLEANRL_GIT=/path/to/a/clone make bench-offpolicy-cleanrl       # no network: clone CleanRL from a local copy

Each finished run appends one JSON line to benchmarks/results/offpolicy_cleanrl.jsonl (committed as seeds finish):
`algo`, `env`, `side` (ours | cleanrl), `seed`, `env_steps`, `final_return` (the deterministic policy's mean over
`episodes` fresh episodes whose seeds no training episode used), `final_returns`, `train_returns` ([step, mean of the
training episodes that ended in the 10k env steps up to it]), `cpu_s` (CPU seconds of training and scoring, one
seed: ours is its K-seed process's CPU / K), `cpu_model`, and the settings. A rerun trains only what is missing.

- CleanRL: its files, unmodified, from a scratch clone (outputs/bench-offpolicy-cleanrl/cleanrl, never vendored), in
  their own virtualenv (CleanRL's gymnasium 0.29.1 with MuJoCo; torch pinned as ours), one process per seed (this
  file's `--run-one` mode runs CleanRL's file with `runpy` and then scores the actor it left behind). It gets only
  `--env-id`, `--total-timesteps`, `--seed` and `--no-cuda`: every other setting is its own default. Our preset
  claims those defaults; the bench reads CleanRL's `Args` from its file and prints every field where our preset
  differs (the replay capacity counts as equal when both hold the whole budget).
- Ours: `python -m pipeline experiment=<algo>_<env> env.id=<Env>-v4 seeds_per_process=4` (one process, seeds 0-3),
  each seed's final deterministic `eval/return_mean` and its training curve from metrics.csv. A killed run of ours
  continues from its checkpoint (`ckpt_path=last`) when the bench is run again.
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "outputs" / "bench-offpolicy-cleanrl"
# Another file with OFFPOLICY_RESULTS (a bench run from a worktree pinned to a commit appends to the checkout's file).
RESULTS = Path(os.environ.get("OFFPOLICY_RESULTS", ROOT / "benchmarks" / "results" / "offpolicy_cleanrl.jsonl"))
VENV = OUT / "venv"  # under outputs/ (ignored by git): the other side never enters the checkout
# CleanRL's pins where it has them (gymnasium 0.29.1: its `final_info` / `final_observation` predate 1.0; numpy < 2
# for that gymnasium); torch is ours. Its replay buffer is its own (cleanrl_utils, in the clone).
CLEANRL_PACKAGES = ["torch==2.13.0", "gymnasium[mujoco]==0.29.1", "mujoco==3.17.0", "numpy==1.26.4", "tyro==1.0.17",
                    "tensorboard==2.21.0"]
CLEANRL_GIT = os.environ.get("CLEANRL_GIT", "https://github.com/vwxyzjn/cleanrl")
SCRIPTS = {"sac": "sac_continuous_action.py", "td3": "td3_continuous_action.py"}
PRESET_ENV = {"HalfCheetah": "halfcheetah", "Hopper": "hopper", "Walker2d": "walker2d"}
WINDOW = 10_000  # env steps per point of train_returns
SMOKE = {"total_steps": 1_200, "learning_starts": 400, "episodes": 2, "max_episode_steps": 100}
# CleanRL's Args field -> our task keys that claim it (TD3's one learning_rate is both of ours).
CLAIMED = {
    "sac": {"buffer_size": ["buffer_size"], "gamma": ["gamma"], "tau": ["tau"], "batch_size": ["batch_size"],
            "learning_starts": ["learning_starts"], "policy_lr": ["policy_lr"], "q_lr": ["q_lr"],
            "policy_frequency": ["policy_frequency"], "target_network_frequency": ["target_network_frequency"],
            "autotune": ["autotune"]},
    "td3": {"buffer_size": ["buffer_size"], "gamma": ["gamma"], "tau": ["tau"], "batch_size": ["batch_size"],
            "learning_starts": ["learning_starts"], "learning_rate": ["policy_lr", "q_lr"],
            "policy_noise": ["policy_noise"], "exploration_noise": ["exploration_noise"], "noise_clip": ["noise_clip"],
            "policy_frequency": ["policy_frequency"]},
}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def window_means(points: list[tuple[int, float]], total: int) -> list[list[float]]:
    """[[step, mean of the returns of episodes that ended in (step - WINDOW, step]]] for step = WINDOW, 2 WINDOW, ..."""
    out = []
    for end in range(WINDOW, total + 1, WINDOW):
        inside = [r for s, r in points if end - WINDOW < s <= end]
        out.append([end, sum(inside) / len(inside) if inside else None])
    return out


# ---- inside CleanRL's virtualenv: one seed, then its score (no pipeline imports here) ------------------------------
def run_one(script: str, algo: str, seed: int, episodes: int, max_episode_steps: int | None, flags: list[str]) -> None:
    import contextlib
    import io
    import re
    import runpy
    import tempfile

    import gymnasium as gym
    import numpy as np
    import torch

    torch.set_num_threads(1)
    env_id = flags[flags.index("--env-id") + 1]
    total = int(flags[flags.index("--total-timesteps") + 1])
    sys.path.insert(0, str(Path(script).resolve().parents[1]))  # the clone's root: its cleanrl_utils
    os.chdir(tempfile.mkdtemp(prefix="cleanrl-"))  # its runs/ folder goes here
    sys.argv = [script, "--seed", str(seed), "--no-cuda", *flags]
    start, cpu0 = time.perf_counter(), time.process_time()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        namespace = runpy.run_path(script, run_name="__main__")
    train_s, train_cpu_s = time.perf_counter() - start, time.process_time() - cpu0
    # Its own progress lines: "global_step=1000, episodic_return=[-312.4]".
    episodes_seen = [(int(m.group(1)), float(m.group(2))) for m in
                     re.finditer(r"global_step=(\d+), episodic_return=\[?([-\d.e+]+)", printed.getvalue())]
    actor = namespace["actor"]
    env = gym.make(env_id, **({} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}))
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=10_000 * (seed + 1) + i)
        total_return, done = 0.0, False
        while not done:
            x = torch.as_tensor(np.asarray(obs, dtype=np.float32))[None]
            with torch.no_grad():
                action = actor.get_action(x)[2] if algo == "sac" else actor(x)
            obs, reward, terminated, truncated, _ = env.step(action[0].numpy())
            total_return += float(reward)
            done = terminated or truncated
        returns.append(total_return)
    print(json.dumps({"final_return": float(np.mean(returns)), "final_returns": returns, "train_s": train_s,
                      "cpu_s": time.process_time() - cpu0, "train_cpu_s": train_cpu_s,
                      "train_returns": window_means(episodes_seen, total)}))


# ---- the pipeline's side ---------------------------------------------------------------------------------------------
def preset(algo: str, env: str) -> str:
    name = env.split("-")[0]
    if name not in PRESET_ENV:
        raise SystemExit(f"error: no preset for {env}; the bench runs {', '.join(f'{n}-v4' for n in PRESET_ENV)}")
    return f"{algo}_{PRESET_ENV[name]}"


def preset_config(algo: str, env: str, overrides: list[str]) -> dict:
    import yaml
    from other_side import sh

    text = sh([sys.executable, "-m", "pipeline", f"experiment={preset(algo, env)}", *overrides, "--cfg", "job"],
              capture_output=True, cwd=ROOT).stdout
    return yaml.safe_load(text)


def cleanrl_defaults(script: Path) -> dict:
    """CleanRL's `Args` dataclass defaults, read from its file (literals and int()/float() of literals)."""
    tree = ast.parse(script.read_text())
    args = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Args")
    out = {}
    for node in args.body:
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            try:
                out[node.target.id] = eval(compile(ast.Expression(node.value), str(script), "eval"),
                                           {"__builtins__": {}, "int": int, "float": float})
            except Exception:  # noqa: BLE001 - a default computed from the environment (exp_name): not a setting
                pass
    return out


def differences(algo: str, task: dict, theirs: dict) -> list[str]:
    """Every claimed setting where our preset is not CleanRL's default, in words."""
    out = []
    for field, ours_keys in CLAIMED[algo].items():
        for key in ours_keys:
            a, b = task[key], theirs[field]
            if field == "buffer_size" and min(a, b) >= task["total_steps"]:
                continue  # both hold every transition of the run
            if a != b:
                out.append(f"task.{key}={a} (CleanRL's {field}={b})")
    return out


def results() -> list[dict]:
    if not RESULTS.exists():
        return []
    return [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]


def have(algo: str, env: str, side: str, seed: int, steps: int) -> bool:
    return any((r["algo"], r["env"], r["side"], r["seed"], r["env_steps"]) == (algo, env, side, seed, steps) for r in results())


def append(row: dict) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(row) + "\n"
    fd = os.open(RESULTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)  # one write: the sides may run side by side
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def run_cleanrl(algo: str, env: str, python: Path, script: Path, seeds: list[int], steps: int, episodes: int,
                max_episode_steps: int | None, extra: dict, record: bool) -> None:
    from other_side import sh

    flags = ["--env-id", env, "--total-timesteps", str(steps)]
    for seed in seeds:
        if record and have(algo, env, "cleanrl", seed, steps):
            continue
        cmd = [str(python), "-W", "ignore", __file__, "--run-one", "--algo", algo, "--script", str(script), "--seed", str(seed),
               "--episodes", str(episodes)]
        if max_episode_steps is not None:
            cmd += ["--max-episode-steps", str(max_episode_steps)]
        row = json.loads(sh([*cmd, "--", *flags], capture_output=True).stdout.strip().splitlines()[-1])
        print(f"  CleanRL {algo} {env} seed {seed}: final {row['final_return']:.1f} ({row['cpu_s']:.0f} CPU s)", flush=True)
        if record:
            append({"algo": algo, "env": env, "side": "cleanrl", "seed": seed, "env_steps": steps, **row, "k": 1,
                    "flags": flags, **extra})


def run_ours(algo: str, env: str, seeds: list[int], steps: int, overrides: list[str], tag: str, extra: dict,
             record: bool) -> None:
    from other_side import sh

    if record and all(have(algo, env, "ours", s, steps) for s in seeds):
        return
    run_dir = OUT / f"ours-{algo}-{env}-{steps}-seeds{seeds[0]}-{seeds[-1]}{tag}"
    records = sorted(run_dir.glob("seed*/result.json"))
    finished = len(records) == len(seeds) and all(json.loads(p.read_text()).get("status") == "ok" for p in records)
    cpu_file = run_dir / "bench_cpu_s.json"  # CPU of each finished segment (a killed segment's is lost: noted)
    segments = json.loads(cpu_file.read_text()) if cpu_file.exists() else []
    if not finished:
        resume = ["ckpt_path=last"] if (run_dir / "checkpoints" / "last.ckpt").exists() else []
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        sh([sys.executable, "-m", "pipeline", f"experiment={preset(algo, env)}", f"seed={seeds[0]}", f"seeds_per_process={len(seeds)}",
            *overrides, "trainer.enable_progress_bar=false", f"hydra.run.dir={run_dir}", *resume], cwd=ROOT,
           stdout=subprocess.DEVNULL)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        segments.append({"cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), "resumed": bool(resume)})
        cpu_file.write_text(json.dumps(segments))
    cpu = sum(s["cpu_s"] for s in segments)
    # The env steps (per agent) those segments trained: the record's last len(segments) segments.
    first = run_dir / f"seed{seeds[0]}" / "result.json"
    ran = json.loads(first.read_text()).get("segments", [])[-len(segments):] if segments else []
    cpu_env_steps = sum(int(s.get("to_step") or 0) - int(s.get("from_step") or 0) for s in ran)
    for seed in seeds:
        record_ = json.loads((run_dir / f"seed{seed}" / "result.json").read_text())
        if record_.get("status") != "ok":
            raise SystemExit(f"error: our {algo} {env} seed {seed} ended {record_.get('status')}: {record_.get('error')}")
        points = []
        with open(run_dir / f"seed{seed}" / "metrics.csv") as f:
            for row in csv.DictReader(f):
                if row.get("train/episodic_return"):
                    points.append((int(float(row["step"])), float(row["train/episodic_return"])))
        row = {"final_return": float(record_["metrics"]["eval/return_mean"]),
               "final_return_std": record_["metrics"].get("final_eval/return_std"), "train_returns": window_means(points, steps),
               "cpu_s": cpu / len(seeds), "cpu_s_process": cpu, "cpu_complete": not any(s["resumed"] for s in segments) or None,
               "cpu_env_steps": cpu_env_steps,
               "wall_s_process": record_.get("wall_time_s")}
        print(f"  ours {algo} {env} seed {seed}: final {row['final_return']:.1f} ({row['cpu_s']:.0f} CPU s a seed)", flush=True)
        if record and not have(algo, env, "ours", seed, steps):
            append({"algo": algo, "env": env, "side": "ours", "seed": seed, "env_steps": steps, **row, "k": len(seeds),
                    "overrides": overrides, **extra})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", nargs="+", choices=sorted(SCRIPTS), default=["sac", "td3"])
    parser.add_argument("--envs", nargs="+", default=["HalfCheetah-v4", "Hopper-v4"],
                        help="on both sides (CleanRL's gymnasium 0.29.1 has no v5)")
    parser.add_argument("--sides", nargs="+", choices=["ours", "cleanrl"], default=["ours", "cleanrl"])
    parser.add_argument("--seeds", type=int, default=4, help="seeds 0..n-1 on both sides (ours: one K = n process)")
    parser.add_argument("--steps", type=int, default=100_000, help="env steps per seed")
    parser.add_argument("--episodes", type=int, default=20, help="final deterministic evaluation episodes")
    parser.add_argument("--smoke", action="store_true", help=f"a tiny budget through the whole path, not recorded: {SMOKE}")
    parser.add_argument("--report", action="store_true", help="print the verdicts from the results file and draw the curves")
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
    if args.report:
        from offpolicy_cleanrl_report import report

        return report(results(), ROOT / "docs" / "images")
    from other_side import own_venv, scratch_clone

    steps, episodes, limit, tag, record = args.steps, args.episodes, None, "", True
    smoke = []
    if args.smoke:
        steps, episodes, limit, tag, record = SMOKE["total_steps"], SMOKE["episodes"], SMOKE["max_episode_steps"], "-smoke", False
        smoke = [f"task.learning_starts={SMOKE['learning_starts']}", f"+env.kwargs.max_episode_steps={SMOKE['max_episode_steps']}",
                 "task.eval_every=100000", f"task.final_eval_episodes={SMOKE['episodes']}"]
    python = own_venv(VENV, CLEANRL_PACKAGES, "bench-offpolicy-cleanrl")
    commit = scratch_clone(CLEANRL_GIT, OUT / "cleanrl", "CLEANRL_GIT", "vwxyzjn/cleanrl")
    seeds = list(range(args.seeds))
    ours_commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or None
    for env in args.envs:
        for algo in args.algos:
            overrides = [f"env.id={env}", f"task.total_steps={steps}", f"task.final_eval_episodes={episodes}", *smoke]
            script = OUT / "cleanrl" / "cleanrl" / SCRIPTS[algo]
            cfg = preset_config(algo, env, overrides)
            theirs = cleanrl_defaults(script)
            diff = differences(algo, cfg["task"], theirs)
            print(f"bench-offpolicy-cleanrl: {algo} {env} {steps} steps, CleanRL {commit[:7]} {SCRIPTS[algo]} with its defaults; "
                  f"ours {preset(algo, env)}: " + ("; ".join(diff) if diff else "the same settings"), flush=True)
            extra = {"cleanrl_commit": commit, "commit": ours_commit, "cpu_model": cpu_model(), "differences": diff,
                     "date": time.strftime("%Y-%m-%d")}
            if "cleanrl" in args.sides:
                run_cleanrl(algo, env, python, script, seeds, steps, episodes, limit, extra, record)
            if "ours" in args.sides:
                run_ours(algo, env, seeds, steps, overrides, tag, extra, record)
    if record:
        print(f"bench-offpolicy-cleanrl: results in {RESULTS}; `--report` for the verdicts")
    return 0


if __name__ == "__main__":
    sys.exit(main())

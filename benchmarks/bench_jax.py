"""`make bench-jax`: PPO on CartPole-v1 for K seeds, the pipeline (PyTorch, JAX-free) against PureJaxRL (JAX).

    make bench-jax                                  # K = 16 and 64, one CPU core each side
    make bench-jax ARGS="--k 16 --repeats 1"        # one K
    PUREJAXRL_GIT=/path/to/a/clone make bench-jax   # no network: clone PureJaxRL from a local copy

Both sides train K agents in one process on one CPU core (`taskset -c <core>`, one thread each: torch's
`num_threads=1`, XLA's single-threaded Eigen), interleaved (JAX, ours, JAX, ours, ... for `--repeats`):
- JAX: PureJaxRL's `ppo.py` with its published CartPole defaults (4 envs x 128 steps, 500k env steps a
  seed, 4 epochs x 4 minibatches, lr 2.5e-4 annealed), `jit(vmap(make_train))` over K keys, run by
  `benchmarks/purejaxrl_ppo.py` in its own virtualenv (`.venv-jax`: jax, flax, optax, gymnax, distrax;
  never a dependency of the pipeline). The code is cloned into outputs/bench-jax/ at run time, never
  vendored. Its compile time is reported separately and counted in its cost.
- Ours: `python -m pipeline experiment=ppo_cartpole seeds_per_process=K` (rl-baselines3-zoo's settings,
  at most 100k env steps a seed; each seed stops at its first 30-episode deterministic evaluation of 500,
  the preset's `task.stop_at_return`), through `benchmarks/seed_batching.py`. The table shows the env
  steps each side spent: PureJaxRL's fixed scan cannot stop a seed early.
A seed is solved when its greedy/deterministic mean over fresh episodes reaches 475 (JAX: 10 episodes;
ours: the record's 20-episode final evaluation). Cost per solved seed = a side's wall seconds (JAX:
compile + run; ours: the whole run) over its solved seeds; the ratio is ours / JAX (target <= 1.0 at K = 64).
Results: outputs/bench-jax/result.json and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from scratch import own_venv, scratch_clone, sh

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "outputs" / "bench-jax"
VENV = ROOT / ".venv-jax"
# The versions this benchmark was run with (Python 3.11, CPU): a JAX side that moves on by itself is not a
# reference. PureJaxRL's ppo.py is written for gymnax 0.0.x (5-tuple steps; 1.0 fails to unpack) and its
# wrappers.py imports brax and navix at module level, so both are installed though CartPole uses neither.
JAX_PACKAGES = ["jax==0.10.2", "jaxlib==0.10.2", "flax==0.12.8", "optax==0.2.8", "gymnax==0.0.9", "distrax==0.1.9",
                "chex==0.1.92", "brax==0.14.2", "navix==0.7.4"]
PUREJAXRL_GIT = os.environ.get("PUREJAXRL_GIT", "https://github.com/luchris429/purejaxrl")
SOLVED = 475.0


def children_cpu_s() -> float:
    """CPU seconds of this process's finished children: on a shared core wall time also counts the others."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def jax_venv() -> Path:
    return own_venv(VENV, JAX_PACKAGES, "bench-jax")


def purejaxrl_source() -> tuple[Path, str]:
    """A scratch clone of PureJaxRL (its purejaxrl/ folder) and the commit it is at."""
    clone = OUT / "purejaxrl"
    commit = scratch_clone(PUREJAXRL_GIT, clone, "PUREJAXRL_GIT", "luchris429/purejaxrl")
    return clone / "purejaxrl", commit


def pinned(core: int, cmd: list[str]) -> list[str]:
    return ["taskset", "-c", str(core), *cmd]


def run_jax(python: Path, src: Path, k: int, seed: int, core: int) -> dict:
    out = OUT / f"jax_k{k}_seed{seed}.json"
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"}
    t0, c0 = time.perf_counter(), children_cpu_s()
    sh(pinned(core, [str(python), str(ROOT / "benchmarks" / "purejaxrl_ppo.py"), "--purejaxrl", str(src),
                     "--k", str(k), "--seed", str(seed), "--out", str(out)]), env=env, stdout=subprocess.DEVNULL)
    result = json.loads(out.read_text())
    result["process_s"] = round(time.perf_counter() - t0, 2)
    result["process_cpu_s"] = round(children_cpu_s() - c0, 2)
    result["cost_s"] = round(result["compile_s"] + result["run_s"], 2)
    result["cost_per_solved_seed_s"] = round(result["cost_s"] / result["solved"], 2) if result["solved"] else math.inf
    return result


def run_ours(k: int, seed: int, core: int) -> dict:
    out = OUT / f"ours_k{k}_seed{seed}.json"
    t0 = time.perf_counter()
    done = sh(pinned(core, [sys.executable, str(ROOT / "benchmarks" / "seed_batching.py"), "--k", str(k), "--seed", str(seed),
                            "--single-seeds", "0", "--batched-experiment", "ppo_cartpole"]), capture_output=True)
    text = done.stdout
    result = json.loads(text[: text.index("\n}") + 2])["batched"]
    result.update(side="pipeline", k=k, seed=seed, process_s=round(time.perf_counter() - t0, 2))
    out.write_text(json.dumps(result, indent=1))
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--repeats", type=int, default=1, help="interleaved pairs per K (seeds 0, 1000, ...)")
    parser.add_argument("--core", type=int, default=0, help="the CPU core both sides are pinned to")
    args = parser.parse_args(argv)
    python = jax_venv()
    src, commit = purejaxrl_source()
    rows = []
    for k in args.k:
        for rep in range(args.repeats):
            seed = 1000 * rep
            jax_side = run_jax(python, src, k, seed, args.core)
            print(f"  K={k} seed={seed} PureJaxRL: {jax_side['solved']}/{k} solved, compile {jax_side['compile_s']} s + "
                  f"run {jax_side['run_s']} s", flush=True)
            ours = run_ours(k, seed, args.core)
            print(f"  K={k} seed={seed} pipeline: {ours['solved']}/{k} solved, {ours['wall_time_s']} s "
                  f"(breakdown {json.dumps(ours.get('time_breakdown_s', {}))})", flush=True)
            ratio = ours["cost_per_solved_seed_s"] / jax_side["cost_per_solved_seed_s"]
            rows.append({"k": k, "seed": seed, "purejaxrl": jax_side, "pipeline": ours,
                         "ratio": round(ratio, 3) if math.isfinite(ratio) else None})
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "result.json").write_text(json.dumps({"purejaxrl_commit": commit, "packages": JAX_PACKAGES, "rows": rows}, indent=1))
    print(f"\nPPO CartPole-v1, one CPU core each (PureJaxRL {commit[:7]}; solved: deterministic mean >= {SOLVED:.0f})")
    print("| K | seed | PureJaxRL solved | env steps a seed | compile s | run s | s / solved seed | process CPU s | "
          "pipeline solved | env steps a seed (mean) | wall s | s / solved seed | CPU s | ratio (ours/JAX) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        j, o = r["purejaxrl"], r["pipeline"]
        print(f"| {r['k']} | {r['seed']} | {j['solved']}/{r['k']} | {j['env_steps_per_seed']} | {j['compile_s']} | {j['run_s']} | "
              f"{j['cost_per_solved_seed_s']} | {j['process_cpu_s']} | {o['solved']}/{r['k']} | {round(o['env_steps'] / r['k'])} | "
              f"{o['wall_time_s']} | {o['cost_per_solved_seed_s']} | {o['cpu_time_s']} | {r['ratio']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

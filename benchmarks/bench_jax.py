"""`make bench-jax`: PPO and DQN on CartPole-v1 for K seeds, the pipeline (PyTorch, JAX-free) against PureJaxRL (JAX).

    make bench-jax                                    # all three parts below, 2 interleaved pairs each
    make bench-jax ARGS="--parts recipe --k 16 64"    # one part, some K
    make bench-jax ARGS="--parts solved --jax-budget 300000"   # PureJaxRL's budget given, no search
    make bench-jax ARGS="--parts solved --solved-k 16 --jax-budget 300000 --solved-seeds 9000 9100"  # chosen seed blocks
    make bench-jax ARGS="--compile"                   # the pipeline side also with device.compile=true
    PUREJAXRL_GIT=/path/to/a/clone make bench-jax     # no network: clone PureJaxRL from a local copy
    .venv/bin/python benchmarks/bench_jax.py --print outputs/bench-jax/result.json   # the tables of a saved run

Every run trains K agents in one process on one CPU core (`taskset -c <core>`, one thread: torch's
`num_threads=1`, XLA's single-threaded Eigen); the two sides alternate (JAX, ours, JAX, ours, ...) and each pair
is repeated (`--repeats`, seeds 0, 1000, ...). Costs are CPU seconds (the machine may be shared).
- JAX: PureJaxRL's own `ppo.py` / `dqn.py` (`jit(vmap(make_train))` over K keys, its published CartPole
  config read from its file), run by `benchmarks/purejaxrl_ppo.py` / `purejaxrl_dqn.py` in their own
  virtualenv (`.venv-jax`, never a dependency of the pipeline), cloned into outputs/bench-jax/ at run time.
  Compile time (`.lower().compile()`) is shown apart from the compiled run.
- Ours: each run is its own process (`bench_jax.py --child`); its start-up and imports (torch, Lightning,
  the pipeline) are shown apart from the run. The run's training loop = the CPU seconds of the process and its
  finished children, read around each training iteration (the task's `iterate`: acting, env, learning) and each
  log row (setup, evaluations and the final 20-episode evaluation left out; JAX's greedy evaluation is left out
  the same way). With `device.compile=true` an iteration in which torch.compile made graphs is compile: its CPU
  seconds minus the median of the steady iterations after the last compile are shown apart (like JAX's), the
  rest stays in the loop. Inductor compiles in this process (TORCHINDUCTOR_COMPILE_THREADS=1: the C++
  compiler runs as waited-for child processes, whose CPU counts) and cold (its caches off, as JAX's compile is).

Parts (`--parts`):
- recipe: the identical recipe. Both sides run PureJaxRL's PPO CartPole config (4 envs x 128 steps, 4 epochs
  x 4 minibatches, 64-64 tanh actor and critic, Adam 2.5e-4 eps 1e-5 annealed linearly, gamma 0.99, lambda
  0.95, clip 0.2 with value clipping, entropy 0.01, value 0.5, grad norm 0.5): `task=ppo`'s defaults with
  Adam's lr/eps set (PPO_RECIPE), `--budget` env steps a seed, no early stop (`task.stop_at_return=null`),
  K = `--k`. Env steps and backpropagated samples (epochs x env steps) per CPU second of the training loop.
- dqn: the same for PureJaxRL's DQN config (DQN_RECIPE: 10 envs, one update of 128 per 10 env steps, ...),
  `--dqn-budget` env steps a seed, K = `--dqn-k`; backpropagated samples = updates x 128.
- solved: cost per solved seed. Ours: `experiment=ppo_cartpole` (rl-zoo's recipe with a quarter of its learning
  work, each seed stops at its first confirmed 30-episode deterministic evaluation of 500); PureJaxRL: its published config at the
  smallest budget of `--jax-budgets` at which it solves >= 15/16 of its K seeds (searched on the first pair;
  `--jax-budget` gives it), one pair per first seed of `--solved-seeds` (default 5000, 6000, ... `--repeats` of them).
  Solved: greedy mean >= 475 over fresh episodes (JAX 10, ours 20). Cost = the
  whole process's CPU seconds (JAX: import, compile, run, evaluation; ours: start-up, run, evaluation).
Results: outputs/bench-jax/result.json and markdown tables on stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from other_side import own_venv, scratch_clone, sh

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "outputs" / "bench-jax"
VENV = ROOT / ".venv-jax"
# The versions this benchmark was run with (Python 3.11, CPU): a JAX side that moves on by itself is not a
# reference. PureJaxRL's ppo.py is written for gymnax 0.0.x (5-tuple steps; 1.0 fails to unpack) and its
# wrappers.py imports brax and navix at module level, so both are installed though CartPole uses neither;
# its dqn.py needs flashbax.
JAX_PACKAGES = ["jax==0.10.2", "jaxlib==0.10.2", "flax==0.12.8", "optax==0.2.8", "gymnax==0.0.9", "distrax==0.1.9",
                "chex==0.1.92", "brax==0.14.2", "navix==0.7.4", "flashbax==0.1.3"]
PUREJAXRL_GIT = os.environ.get("PUREJAXRL_GIT", "https://github.com/luchris429/purejaxrl")
SOLVED = 475.0
XLA_ENV = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"}
# PureJaxRL's ppo.py config on our side: the preset ppo_cartpole_purejaxrl (task=ppo's defaults, its Adam, float32
# CartPole as gymnax); no stop, no checkpoints.
PPO_RECIPE = ["experiment=ppo_cartpole_purejaxrl", "task.stop_at_return=null", "checkpoint.enabled=false"]
# PureJaxRL's dqn.py config: 10 envs a seed, buffer 10,000, batch 128, learning from 10,000 env steps, one update
# per vector step (train_frequency = 10 env steps), hard target copy every 500 env steps, epsilon 1 -> 0.05
# over 250k, Adam 2.5e-4, MSE, no gradient clipping, 120-84 ReLU.
DQN_RECIPE = ["task=dqn", "model=mlp", "model.hidden=[120,84]", "loss=mse", "optimizer=adam", "optimizer.lr=0.00025",
              "optimizer.fused=true", "scheduler=none", "env=cartpole_tensor", "env.dtype=float32", "data=none", "trainer=rl",
              "task.envs_per_agent=10", "task.buffer_size=10000", "task.batch_size=128", "task.learning_starts=10000",
              "task.train_frequency=10", "task.gradient_steps=1", "task.target_update=hard", "task.target_update_interval=500",
              "task.max_grad_norm=null", "task.eps_start=1.0", "task.eps_end=0.05", "task.eps_duration=250000",
              "task.gamma=0.99", "task.stop_at_return=null", "checkpoint.enabled=false"]
LOOP_PARTS = ("act", "env", "learn", "log")


def children_cpu_s() -> float:
    """CPU seconds of this process's finished children: on a shared core wall time also counts the others."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def pinned(core: int, cmd: list[str]) -> list[str]:
    return ["taskset", "-c", str(core), *cmd]


def per_cpu_s(amount: float, cpu_s: float) -> float:
    return round(amount / cpu_s) if cpu_s > 0 else math.inf


def run_jax(python: Path, src: Path, algo: str, k: int, seed: int, core: int, budget: int | None, evaluate: bool) -> dict:
    out = OUT / f"jax_{algo}_k{k}_seed{seed}_{budget}.json"
    cmd = [str(python), str(ROOT / "benchmarks" / f"purejaxrl_{algo}.py"), "--purejaxrl", str(src), "--k", str(k),
           "--seed", str(seed), "--out", str(out)]
    cmd += ["--total-timesteps", str(budget)] if budget else []
    cmd += [] if evaluate else ["--no-eval"]
    t0, c0 = time.perf_counter(), children_cpu_s()
    sh(pinned(core, cmd), env={**os.environ, **XLA_ENV}, stdout=subprocess.DEVNULL)
    r = json.loads(out.read_text())
    r.update(process_s=round(time.perf_counter() - t0, 2), process_cpu_s=round(children_cpu_s() - c0, 2))
    r["env_steps"], r["samples"] = r["env_steps_per_seed"] * k, r["backprop_samples_per_seed"] * k
    r["loop_cpu_s"] = r["run_cpu_s"]
    return r


def run_ours(name: str, overrides: list[str], k: int, seed: int, core: int) -> dict:
    """One pipeline run of K agents as its own pinned process (`--child`); what it measured about itself."""
    out = OUT / f"ours_{name}_k{k}_seed{seed}.json"
    t0, c0 = time.perf_counter(), children_cpu_s()
    sh(pinned(core, [sys.executable, __file__, "--child", str(out), "--", *overrides, f"seeds_per_process={k}", f"seed={seed}"]),
       stdout=subprocess.DEVNULL)
    r = json.loads(out.read_text())
    r.update(process_s=round(time.perf_counter() - t0, 2), process_cpu_s=round(children_cpu_s() - c0, 2))
    return r


def cpu_s() -> float:
    """CPU seconds of this process and its finished children (inductor's C++ compiler runs as child processes)."""
    return time.process_time() + children_cpu_s()


class LoopClock:
    """CPU seconds of every training iteration (the task class's own `iterate`) and of every log row (`log_progress`),
    read around each call (a call inside another counts once), with whether torch.compile made graphs during it."""

    def __init__(self, compiled_graphs) -> None:
        self.compiled_graphs = compiled_graphs
        self.iterations: list[tuple[float, int]] = []  # (CPU seconds, graphs made)
        self.log_cpu_s = 0.0
        self.depth = 0

    def wrap(self, cls: type, name: str) -> None:
        method = vars(cls)[name]

        def timed(task, *args, **kwargs):
            if self.depth:
                return method(task, *args, **kwargs)
            self.depth += 1
            graphs, c0 = self.compiled_graphs(), cpu_s()
            try:
                return method(task, *args, **kwargs)
            finally:
                spent = cpu_s() - c0
                self.depth -= 1
                if name == "iterate":
                    self.iterations.append((spent, self.compiled_graphs() - graphs))
                else:
                    self.log_cpu_s += spent

        setattr(cls, name, timed)

    def split(self) -> dict:
        """The loop's CPU seconds and the compile's: an iteration that compiled counts the median steady iteration
        (those after the last compile; none: all that did not compile) in the loop, the rest of its CPU as compile."""
        compiled = [i for i, (_, c) in enumerate(self.iterations) if c]
        after = [cpu for cpu, c in self.iterations[compiled[-1] + 1:]] if compiled else []
        steady = after or [cpu for cpu, c in self.iterations if not c]
        steady_s = statistics.median(steady) if steady else 0.0
        compile_cpu_s = sum((max(0.0, self.iterations[i][0] - steady_s) for i in compiled), 0.0)
        return {"loop_cpu_s": sum(cpu for cpu, _ in self.iterations) - compile_cpu_s + self.log_cpu_s,
                "compile_cpu_s": compile_cpu_s, "iterations": len(self.iterations), "compiling_iterations": len(compiled),
                "graphs": sum(g for _, g in self.iterations),
                "steady_iteration_cpu_s": steady_s, "log_cpu_s": self.log_cpu_s}


def child(out: Path, overrides: list[str]) -> int:
    """In a fresh process: imports timed apart from the run, then the run (CPU seconds of its iterations and log rows,
    compile apart; the records' wall-time breakdown beside them)."""
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"  # the compile's CPU in this process and its waited-for children
    os.environ["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"  # a cold compile each run, as JAX's
    t0, c0 = time.perf_counter(), time.process_time()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import lightning  # noqa: F401  (the run would import it: its cost belongs to start-up)
    import torch
    from seed_batching import run_records

    from pipeline.nets.ensemble import compiled_graphs
    from pipeline.tasks.dqn import DQNTask
    from pipeline.tasks.ppo import PPOTask
    from pipeline.tasks.rl_task import RLTask

    import_s, import_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    torch.set_num_threads(1)
    clock = LoopClock(compiled_graphs)
    for cls in (PPOTask, DQNTask):
        clock.wrap(cls, "iterate")
    clock.wrap(RLTask, "log_progress")
    graphs, children0 = compiled_graphs(), children_cpu_s()
    with tempfile.TemporaryDirectory() as run_dir:  # a fresh run dir each time (a finished one refuses a rerun)
        wall, cpu, records = run_records(overrides, Path(run_dir) / "run")
    cpu += children_cpu_s() - children0
    split = clock.split()
    parts = records[0]["time_breakdown_s"]
    loop_share = sum(parts.get(p, 0.0) for p in LOOP_PARTS) / wall
    finals = [r["metrics"]["eval/return_mean"] for r in records]
    updates = sum(r["metrics"].get("train/updates", 0.0) for r in records)
    result = {
        "side": "pipeline", "overrides": overrides, "import_s": round(import_s, 2), "import_cpu_s": round(import_cpu_s, 2),
        "run_s": round(wall, 2), "run_cpu_s": round(cpu, 2), "loop_cpu_s": round(split["loop_cpu_s"], 2),
        "compile_cpu_s": round(split["compile_cpu_s"], 2), "loop_method": "cpu per iteration",
        "loop": {key: round(v, 4) if isinstance(v, float) else v for key, v in split.items()},
        "graphs_outside_iterations": compiled_graphs() - graphs - split["graphs"],  # compiled outside the loop: not timed
        # The estimate this bench used before (the run's CPU seconds times the loop's share of wall time), kept to compare.
        "loop_cpu_s_by_wall_share": round(cpu * loop_share, 2),
        "time_breakdown_s": parts, "env_steps": sum(int(r["env_steps"]) for r in records), "updates": updates,
        "final_returns": [round(f, 1) for f in finals], "solved": sum(f >= SOLVED for f in finals),
        "stop_env_steps": [(r.get("early_stop") or {}).get("env_step") for r in records],
        "git_commit": records[0].get("git_commit"),
    }
    out.write_text(json.dumps(result, indent=1))
    return 0


def learning_work(algo: str, ours: dict) -> int:
    """Backpropagated samples of a pipeline run: PPO's epochs over each env step, DQN's updates x batch."""
    if algo == "ppo":
        return ours["env_steps"] * 4  # PPO_RECIPE: task=ppo's update_epochs=4
    return int(ours["updates"]) * 128  # DQN_RECIPE: task.batch_size=128


def save(result: dict, out: Path) -> None:
    """The results so far (after every pair: a stopped bench keeps what it measured; `--print` shows it)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))


def recipe_rows(python: Path, src: Path, algo: str, ks: list[int], budget: int, args, result: dict) -> list[dict]:
    recipe = PPO_RECIPE if algo == "ppo" else DQN_RECIPE
    variants = [("eager", [])] + ([("compiled", ["device.compile=true"])] if args.compile else [])
    rows = []
    for k in ks:
        for rep in range(args.repeats):
            seed = 1000 * rep
            j = run_jax(python, src, algo, k, seed, args.core, budget, evaluate=False)
            print(f"  {algo} K={k} seed={seed} PureJaxRL: compile {j['compile_cpu_s']} CPU s, run {j['run_cpu_s']} CPU s", flush=True)
            for name, extra in variants:
                o = run_ours(f"{algo}_{name}", [*recipe, f"task.total_steps={budget}", f"task.eval_every={budget}", *extra],
                             k, seed, args.core)
                o["samples"] = learning_work(algo, o)
                print(f"  {algo} K={k} seed={seed} pipeline ({name}): import {o['import_cpu_s']} CPU s, run {o['run_cpu_s']} "
                      f"CPU s (loop {o['loop_cpu_s']}, compile {o['compile_cpu_s']}; loop by wall share "
                      f"{o['loop_cpu_s_by_wall_share']}), breakdown {json.dumps(o['time_breakdown_s'])}", flush=True)
                rows.append({"algo": algo, "k": k, "seed": seed, "variant": name, "budget": budget, "purejaxrl": j, "pipeline": o,
                             "sample_ratio": round((o["loop_cpu_s"] / o["samples"]) / (j["loop_cpu_s"] / j["samples"]), 3),
                             "step_ratio": round((o["loop_cpu_s"] / o["env_steps"]) / (j["loop_cpu_s"] / j["env_steps"]), 3)})
                result[f"{algo}_recipe_rows"] = rows
                save(result, args.out)
    return rows


def solved_rows(python: Path, src: Path, ks: list[int], args, result: dict) -> list[dict]:
    rows = []
    for k in ks:
        need = math.ceil(15 * k / 16)
        budget = args.jax_budget
        for seed in args.solved_seeds or [5000 + 1000 * rep for rep in range(args.repeats)]:
            tried = []
            for b in ([budget] if budget else args.jax_budgets):
                j = run_jax(python, src, "ppo", k, seed, args.core, b, evaluate=True)
                tried.append({"budget": b, "solved": j["solved"], "process_cpu_s": j["process_cpu_s"]})
                print(f"  solved K={k} seed={seed} PureJaxRL {b}: {j['solved']}/{k}, {j['process_cpu_s']} CPU s", flush=True)
                if j["solved"] >= need:
                    break
            budget = budget or tried[-1]["budget"]
            o = run_ours("ppo_cartpole", ["experiment=ppo_cartpole"], k, seed, args.core)
            print(f"  solved K={k} seed={seed} pipeline: {o['solved']}/{k}, {o['process_cpu_s']} CPU s", flush=True)
            jc = j["process_cpu_s"] / j["solved"] if j["solved"] else math.inf
            oc = o["process_cpu_s"] / o["solved"] if o["solved"] else math.inf
            rows.append({"k": k, "seed": seed, "jax_budget": j["env_steps_per_seed"], "search": tried, "purejaxrl": j, "pipeline": o,
                         "jax_cpu_per_solved_s": round(jc, 2), "ours_cpu_per_solved_s": round(oc, 2),
                         "ratio": round(oc / jc, 3) if math.isfinite(oc / jc) else None})
            result["solved_rows"] = rows
            save(result, args.out)
    return rows


def recipe_table(rows: list[dict], title: str) -> None:
    print(f"\n{title}: CPU seconds on one core (ours: the process's and its children's); rates per CPU second of the "
          "training loop, compile apart; ratio = our CPU per unit / JAX's")
    print("| K | seed | variant | JAX compile CPU s | ours compile CPU s | JAX run CPU s | ours start-up CPU s | "
          "ours run CPU s (loop) | env steps/CPU s JAX | ours | samples/CPU s JAX | ours | ratio per env step | ratio per sample |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    older = False
    for r in rows:
        j, o = r["purejaxrl"], r["pipeline"]
        variant, compile_cpu = r["variant"], o.get("compile_cpu_s") or "-"
        if "loop_method" not in o:  # a record of the bench before its loop was timed per iteration
            older, compiled = True, o["time_breakdown_s"].get("compile")
            variant += f" (compile {compiled:.1f} s wall) *" if compiled else " *"
        print(f"| {r['k']} | {r['seed']} | {variant} | {j['compile_cpu_s']} | {compile_cpu} | {j['run_cpu_s']} | {o['import_cpu_s']} | "
              f"{o['run_cpu_s']} ({o['loop_cpu_s']}) | {per_cpu_s(j['env_steps'], j['loop_cpu_s']):,} | "
              f"{per_cpu_s(o['env_steps'], o['loop_cpu_s']):,} | {per_cpu_s(j['samples'], j['loop_cpu_s']):,} | "
              f"{per_cpu_s(o['samples'], o['loop_cpu_s']):,} | {r['step_ratio']} | {r['sample_ratio']} |")
    if older:
        print("  * an older record: its loop is the run's own CPU seconds times the loop's share of wall time, which "
              "leaves out the C++ compiler's CPU (flattering compiled rows) and an iteration's work outside its booked "
              "phases (DQN's exploration draws: its loop came out ~1.2x too small); rerun for the loop's CPU per iteration")
    for key in sorted({(r["k"], r["variant"]) for r in rows}):
        ratios = [r["sample_ratio"] for r in rows if (r["k"], r["variant"]) == key]
        print(f"  K={key[0]} {key[1]}: ratio per sample median {statistics.median(ratios)} over {len(ratios)} pairs "
              f"(range {min(ratios)}-{max(ratios)})")


def solved_table(rows: list[dict]) -> None:
    print("\nPer solved seed, whole-process CPU seconds on one core (ours: experiment=ppo_cartpole; "
          "PureJaxRL: its config at the smallest budget solving >= 15/16)")
    print("| K | seed | PureJaxRL budget | solved | CPU s | CPU s / solved | pipeline solved | env steps a seed (mean) | "
          "CPU s | CPU s / solved | ratio (ours/JAX) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        j, o, k = r["purejaxrl"], r["pipeline"], r["k"]
        print(f"| {k} | {r['seed']} | {r['jax_budget']:,} | {j['solved']}/{k} | {j['process_cpu_s']} | {r['jax_cpu_per_solved_s']} | "
              f"{o['solved']}/{k} | {round(o['env_steps'] / k):,} | {o['process_cpu_s']} | {r['ours_cpu_per_solved_s']} | {r['ratio']} |")


def print_tables(result: dict, out: Path) -> None:
    print(f"\nPureJaxRL {result['purejaxrl_commit'][:7]}, one CPU core (taskset -c {result['core']}); results: {out}")
    for algo in ("ppo", "dqn"):
        rows = result.get(f"{algo}_recipe_rows")
        if rows:
            recipe_table(rows, f"{algo.upper()}, identical recipe (PureJaxRL's config), {rows[0]['budget']:,} env steps a seed")
    if result.get("solved_rows"):
        solved_table(result["solved_rows"])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(Path(argv[1]), argv[3:])
    if argv[:1] == ["--print"]:  # the tables of a saved result.json (a bench stopped early keeps its pairs)
        print_tables(json.loads(Path(argv[1]).read_text()), Path(argv[1]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=("recipe", "dqn", "solved"), default=["recipe", "dqn", "solved"])
    parser.add_argument("--k", type=int, nargs="+", default=[16, 64, 256], help="K for the identical PPO recipe")
    parser.add_argument("--dqn-k", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--solved-k", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--budget", type=int, default=65_536, help="env steps a seed, identical PPO recipe (x 512)")
    parser.add_argument("--dqn-budget", type=int, default=50_000, help="env steps a seed, identical DQN recipe")
    parser.add_argument("--jax-budget", type=int, default=None, help="PureJaxRL's budget for the solved part (no search)")
    parser.add_argument("--jax-budgets", type=int, nargs="+", default=[100_000, 200_000, 300_000, 500_000])
    parser.add_argument("--repeats", type=int, default=2, help="interleaved pairs per K (seeds 0, 1000, ...; solved: 5000, 6000, ...)")
    parser.add_argument("--solved-seeds", type=int, nargs="+", default=None,
                        help="the solved part's first seeds, one pair each (seeds s..s+K-1 on both sides; default 5000, 6000, ...)")
    parser.add_argument("--core", type=int, default=0, help="the CPU core both sides are pinned to")
    parser.add_argument("--compile", action="store_true", help="the pipeline side also with device.compile=true")
    parser.add_argument("--out", type=Path, default=OUT / "result.json")
    args = parser.parse_args(argv)
    if args.budget % 512:
        parser.error(f"--budget {args.budget}: PureJaxRL's PPO iterates 512 env steps a seed; pass a multiple of 512")
    python = own_venv(VENV, JAX_PACKAGES, "bench-jax")
    clone = OUT / "purejaxrl"
    commit = scratch_clone(PUREJAXRL_GIT, clone, "PUREJAXRL_GIT", "luchris429/purejaxrl")
    src = clone / "purejaxrl"
    result = {"purejaxrl_commit": commit, "packages": JAX_PACKAGES, "core": args.core, "ppo_recipe": PPO_RECIPE,
              "dqn_recipe": DQN_RECIPE}
    if "recipe" in args.parts:
        recipe_rows(python, src, "ppo", args.k, args.budget, args, result)
    if "dqn" in args.parts:
        recipe_rows(python, src, "dqn", args.dqn_k, args.dqn_budget, args, result)
    if "solved" in args.parts:
        solved_rows(python, src, args.solved_k, args, result)
    save(result, args.out)
    print_tables(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

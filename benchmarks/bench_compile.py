"""`device.compile=true` against eager PyTorch: PPO's and DQN's K-agent iterations on CartPole, one invocation.

    python benchmarks/bench_compile.py                      # PPO K = 16, 64, 256; DQN K = 16, 64; 3 rounds
    taskset -c 0 python benchmarks/bench_compile.py --rounds 2 --ppo-k 64 --dqn-k
    python benchmarks/bench_compile.py --profile 64         # + where a compiled PPO iteration's time goes at K = 64

The recipes are PureJaxRL's (benchmarks/bench_jax.py's PPO_RECIPE and DQN_RECIPE, built here in process): PPO is
task=ppo's defaults (4 envs x 128 steps an iteration, 4 epochs x 4 minibatches, 64-64 tanh actor and critic, Adam
2.5e-4 / eps 1e-5 annealed, grad norm 0.5) on float32 tensor CartPoles; DQN is 10 envs a seed, one update of batch
128 every vector step, 120-84 ReLU, MSE, Adam 2.5e-4 (learning from the first 1,280 env steps instead of 10,000:
only the steady state is timed). Each variant is a fresh task driven through its own iterations on one torch
thread; variants alternate within a round, rounds repeat, and the medians are printed. Per variant: env steps and
backpropagated samples (agents x minibatch rows x updates) per CPU second of whole iterations (acting, env, learning;
process CPU time), and the compile cost apart: the first iteration's CPU time minus a
steady one's, the C++ compiler's child processes included (inductor's caches are off, so each compiled variant
compiles cold).

Variants: `eager` (the recipe's Adam: torch's default for-loop implementation on CPU), `eager-foreach`, `eager-fused`
(`fused=True`: one kernel for every parameter), `compiled-update` (the update through torch.compile, the rollout
eager, fused Adam), `compiled-rollout` (device.compile=true as a run has it: the update and PPO's tensor-env rollout
step compiled; DQN has no compiled rollout, so it is PPO's only).
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import statistics
import time
from types import SimpleNamespace

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # compile in this process: its CPU time is counted
os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")  # every compiled variant compiles cold

import torch  # noqa: E402

from pipeline.nets.actor_critic import ActorCritic  # noqa: E402
from pipeline.nets.mlp import MLP  # noqa: E402
from pipeline.tasks.dqn import DQNTask  # noqa: E402
from pipeline.tasks.ppo import PPOTask  # noqa: E402

CART = {"id": "CartPole-v1", "backend": "tensor", "dtype": "float32"}
VARIANTS = {  # name: (device.compile, Adam's implementation keyword, PPO's tensor-env rollout step compiled too)
    "eager": (False, {"fused": False}, False),
    "eager-foreach": (False, {"foreach": True}, False),
    "eager-fused": (False, {"fused": True}, False),
    "compiled-update": (True, {"fused": True}, False),
    "compiled-rollout": (True, {"fused": True}, True),
}
NEVER = 10**9


def ppo_task(k: int, adam: dict) -> PPOTask:
    return PPOTask.create(
        net=functools.partial(ActorCritic, hidden=(64, 64), act="tanh"),
        optimizer=functools.partial(torch.optim.Adam, lr=2.5e-4, eps=1e-5, **adam), env=CART, n_agents=k, seed=1000,
        total_steps=10**7, eval_every=NEVER, log_every=NEVER, eval_episodes=1, final_eval_episodes=1,
    )


def dqn_task(k: int, adam: dict) -> DQNTask:
    return DQNTask.create(
        net=functools.partial(MLP, hidden=(120, 84)), optimizer=functools.partial(torch.optim.Adam, lr=2.5e-4, **adam),
        loss=torch.nn.MSELoss(), env=CART, n_agents=k, seed=1000, total_steps=10**7, envs_per_agent=10, buffer_size=10000,
        batch_size=128, learning_starts=1280, train_frequency=10, gradient_steps=1, target_update="hard",
        target_update_interval=500, max_grad_norm=None, eps_start=1.0, eps_end=0.05, eps_duration=250000, gamma=0.99,
        eval_every=NEVER, log_every=NEVER, eval_episodes=1, final_eval_episodes=1,
    )


def start(task, compiled: bool, rollout: bool = True):
    """What a fit does before its first step, without Lightning's trainer."""
    task.compile_updates = compiled
    task.compile_rollout = rollout
    opt = task.configure_optimizers()
    opt = opt["optimizer"] if isinstance(opt, dict) else opt
    task.optimizers = lambda: SimpleNamespace(optimizer=opt)
    task.lr_schedulers = lambda: None
    task.on_fit_start()
    task.on_train_start()
    return task


def cpu_s() -> float:
    """This process's CPU seconds and its finished children's: inductor runs the C++ compiler as child processes."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def measure(algo: str, k: int, variant: str, iterations: int) -> dict:
    compiled, adam, rollout = VARIANTS[variant]
    torch._dynamo.reset()
    task = start((ppo_task if algo == "ppo" else dqn_task)(k, adam), compiled, rollout)
    if algo == "dqn":  # fill to learning_starts first (not timed): rounds from then on act and learn
        while len(task.buffer) < task.config.learning_starts:
            task.collect(1)
    per_iteration = task.batch_per_agent * task.config.update_epochs if algo == "ppo" else task.config.batch_size
    cpu, steps_before = [], task.env_steps
    for _ in range(iterations + 1):
        c0 = cpu_s()
        task.iterate()
        cpu.append(cpu_s() - c0)
    steady = statistics.median(cpu[1:])
    env_steps = (task.env_steps - steps_before) / (iterations + 1)  # per agent per iteration
    return {
        "env_steps_per_cpu_s": k * env_steps / steady,
        "samples_per_cpu_s": k * per_iteration / steady,
        "compile_cpu_s": max(0.0, cpu[0] - steady) if compiled else 0.0,
        "compile_booked_s": task.time_breakdown_s.get("compile", 0.0),
    }


def profile(k: int, variant: str, iterations: int = 2) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    compiled, adam, rollout = VARIANTS[variant]
    task = start(ppo_task(k, adam), compiled, rollout)
    task.iterate()  # compiles
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(iterations):
            task.iterate()
    print(f"\nPPO K = {k}, {variant}: {iterations} iterations; phases (s): "
          + ", ".join(f"{p} {v:.2f}" for p, v in task.time_breakdown_s.items()))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ppo-k", type=int, nargs="*", default=[16, 64, 256])
    parser.add_argument("--dqn-k", type=int, nargs="*", default=[16, 64])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ppo-iterations", type=int, default=3, help="timed PPO iterations per variant (after the first)")
    parser.add_argument("--dqn-rounds", type=int, default=300, help="timed DQN rounds per variant (after the first)")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--profile", type=int, default=None, metavar="K", help="also profile a compiled PPO iteration at K")
    parser.add_argument("--profile-variant", default="compiled-rollout", choices=list(VARIANTS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    cases = [("ppo", k, args.ppo_iterations) for k in args.ppo_k] + [("dqn", k, args.dqn_rounds) for k in args.dqn_k]
    results: dict[tuple, list[dict]] = {}

    def variants(algo: str) -> list[str]:  # DQN has no compiled rollout: its compiled-rollout would be compiled-update
        return [v for v in args.variants if algo == "ppo" or v != "compiled-rollout"]

    for r in range(args.rounds):
        for algo, k, n in cases:
            for variant in variants(algo):
                row = measure(algo, k, variant, n)
                results.setdefault((algo, k, variant), []).append(row)
                print(f"round {r + 1} {algo} K={k} {variant}: " + ", ".join(f"{key} {v:,.2f}" for key, v in row.items()), flush=True)
    print(f"\nMedians of {args.rounds} rounds (one torch thread; CPU seconds of this process; x: whole-iteration samples per "
          "CPU s against the same round's eager / eager-fused)")
    print("| algo | K | variant | env steps / CPU s | backprop samples / CPU s | x eager | x eager-fused | compile CPU s |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")

    def ratio(rows: list[dict], base: str, algo: str, k: int) -> str:
        if base not in args.variants:
            return "-"
        against = results[(algo, k, base)]
        return f"{statistics.median(a['samples_per_cpu_s'] / b['samples_per_cpu_s'] for a, b in zip(rows, against)):.2f}x"

    for algo, k, _ in cases:
        for variant in variants(algo):
            rows = results[(algo, k, variant)]
            med = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
            print(f"| {algo} | {k} | {variant} | {med['env_steps_per_cpu_s']:,.0f} | {med['samples_per_cpu_s']:,.0f} | "
                  f"{ratio(rows, 'eager', algo, k)} | {ratio(rows, 'eager-fused', algo, k)} | {med['compile_cpu_s']:.1f} |")
    if args.profile:
        profile(args.profile, args.profile_variant)


if __name__ == "__main__":
    main()

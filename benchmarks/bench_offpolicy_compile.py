"""SAC's and TD3's K-agent update, eager against `device.compile=true`, and against K single-agent updates: CPU per
agent-update on HalfCheetah's sizes (17 observations, 6 actions, 256-256 actor and critics, batch 256).

    .venv/bin/python benchmarks/bench_offpolicy_compile.py                  # K = 1 and 4, both algorithms
    .venv/bin/python benchmarks/bench_offpolicy_compile.py --k 1 4 16 --updates 300

Each task is built as a run builds it (`SACTask.create` / `TD3Task.create` on HalfCheetah-v4), its replay filled by
`--fill` env steps of uniform actions, then the tasks' `learn_step`s are timed in rounds, interleaved in this one
process (process CPU seconds, one torch thread), after a warm-up that includes every compile. Printed: CPU ms per
agent-update of each form, the compiled / eager ratio, and K-agent / single-agent per agent. A CleanRL single run's CPU
per env step (its update plus one env step) is in benchmarks/results/offpolicy_cleanrl.jsonl (`--report` of
bench_offpolicy_cleanrl.py prints it).
"""

from __future__ import annotations

import argparse
import functools
import time
from types import SimpleNamespace

import torch

from pipeline.nets.continuous_control import DeterministicActor, SquashedGaussianActor
from pipeline.tasks.sac import SACTask
from pipeline.tasks.td3 import TD3Task

ALGOS = {"sac": (SACTask, SquashedGaussianActor), "td3": (TD3Task, DeterministicActor)}


def make(algo: str, k: int, compiled: bool, fill: int, env_id: str):
    cls, actor = ALGOS[algo]
    task = cls.create(net=functools.partial(actor, hidden=(256, 256)), env={"id": env_id}, n_agents=k, seed=0,
                      learning_starts=fill, buffer_size=fill + 10, optimizer=functools.partial(torch.optim.Adam))
    task.compile_updates = compiled
    task.on_fit_start()
    task.configure_optimizers()
    task.optimizers = lambda: SimpleNamespace(optimizer=task.actor_opt)
    for _ in range(fill):
        task.act_and_store()
    return task


def cpu_per_update(task, updates: int) -> float:
    t0 = time.process_time()
    for _ in range(updates):
        task.learn_step(task.sample_batch())
    return (time.process_time() - t0) / updates


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", nargs="+", choices=sorted(ALGOS), default=["sac", "td3"])
    parser.add_argument("--k", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--updates", type=int, default=100, help="updates per timed round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fill", type=int, default=1000)
    parser.add_argument("--env-id", default="HalfCheetah-v4")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"{'algo':5} {'K':>3} {'eager ms':>9} {'compiled ms':>12} {'compiled/eager':>15} {'compile s':>10}   (CPU per agent-update)")
    for algo in args.algos:
        singles = {}
        for k in args.k:
            tasks = {c: make(algo, k, c, args.fill, args.env_id) for c in (False, True)}
            t0 = time.process_time()
            for task in tasks.values():  # warm-up: every graph compiled (an actor step comes every policy_frequency)
                cpu_per_update(task, 4)
            compile_s = time.process_time() - t0
            times = {c: [] for c in tasks}
            for _ in range(args.rounds):
                for c, task in tasks.items():
                    times[c].append(cpu_per_update(task, args.updates) / k)
            eager, compiled = min(times[False]), min(times[True])
            singles.setdefault("eager", eager if k == 1 else None)
            singles.setdefault("compiled", compiled if k == 1 else None)
            print(f"{algo:5} {k:>3} {eager * 1e3:>9.2f} {compiled * 1e3:>12.2f} {compiled / eager:>15.2f} {compile_s:>10.1f}")
            if k > 1 and singles["eager"]:
                print(f"      K = {k} per agent against K = 1: eager {eager / singles['eager']:.2f}x, compiled "
                      f"{compiled / singles['compiled']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

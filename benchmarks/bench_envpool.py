"""Env steps per second: the EnvPool backend against the gymnasium vector env, random actions, in one invocation.

    python benchmarks/bench_envpool.py                          # CartPole-v1 at E = 4, 16, 64; ALE/Pong-v5 at E = 4
    python benchmarks/bench_envpool.py --envs 16 --atari-envs 8 --threads 2 --repeats 5

Both sides are `make_vector_env`'s classes as the RL tasks step them (pipeline.rl.envpool_vector.EnvPoolVectorEnv,
pipeline.rl.vector.GymVectorEnv): same-step auto-reset, torch tensors out, actions drawn before the clock
starts. EnvPool runs on `--threads` threads (default 1: the gymnasium path is one thread), so its CPU
seconds are comparable. The sides alternate `--repeats` times and each cell is the median; the ratio is
EnvPool over gymnasium, per wall second and per CPU second (process time, all threads). Without envpool
it stops with the install command.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from pipeline.rl.envpool_vector import EnvPoolVectorEnv, envpool_module
from pipeline.rl.vector import GymVectorEnv, env_seeds

ATARI = {"frame_skip": 4, "screen_size": 84, "noop_max": 30, "frame_stack": 4, "terminal_on_life_loss": False, "clip_rewards": True}


def steps_per_second(make, n_envs: int, steps: int, seed: int) -> tuple[float, float]:
    """(env steps per wall second, per CPU second) of `steps` vector steps with random actions."""
    env = make()
    try:
        env.reset()
        if env.n_actions is not None:
            actions = torch.from_numpy(np.random.default_rng(seed).integers(0, env.n_actions, size=(steps, n_envs)))
        else:
            low, high = env.action_space.low, env.action_space.high
            actions = torch.from_numpy(np.random.default_rng(seed).uniform(low, high, size=(steps, n_envs, *low.shape)))
        wall, cpu = time.perf_counter(), time.process_time()
        for t in range(steps):
            env.step(actions[t])
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        env.close()
    return steps * n_envs / wall, steps * n_envs / max(cpu, 1e-9)


def measure_case(env_id: str, kwargs: dict, n_envs: int, env_steps: int, threads: int, repeats: int) -> dict:
    seeds = env_seeds(range(n_envs), 1)  # n_envs agents of one env: every row a separate seed
    steps = max(1, env_steps // n_envs)
    sides = {
        "gymnasium": lambda: GymVectorEnv(env_id, kwargs, seeds, "cpu"),
        "envpool": lambda: EnvPoolVectorEnv(env_id, kwargs, seeds, "cpu", num_threads=threads),
    }
    runs: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
    for r in range(repeats):
        for side, make in sides.items():
            runs[side].append(steps_per_second(make, n_envs, steps, seed=r))
    row = {"env": env_id, "E": n_envs, "steps": steps * n_envs}
    for side, values in runs.items():
        row[f"{side}_wall"] = statistics.median(v[0] for v in values)
        row[f"{side}_cpu"] = statistics.median(v[1] for v in values)
    row["ratio_wall"] = row["envpool_wall"] / row["gymnasium_wall"]
    row["ratio_cpu"] = row["envpool_cpu"] / row["gymnasium_cpu"]
    return row


def measure(
    envs: tuple[int, ...] = (4, 16, 64), cartpole_steps: int = 40_000, atari: str = "ALE/Pong-v5",
    atari_envs: tuple[int, ...] = (4,), atari_steps: int = 4_000, threads: int = 1, repeats: int = 3,
) -> dict:
    """Every case, printed as a table; {"rows": [...]} for benchmarks/run.py's results. Refuses in one line without envpool."""
    envpool_module()  # the one-line refusal, before any work
    torch.set_num_threads(1)
    cases = [("CartPole-v1", {}, e, cartpole_steps) for e in envs]
    if atari:
        cases += [(atari, ATARI, e, atari_steps) for e in atari_envs]
    rows = []
    print(f"env steps per second, random actions, EnvPool on {threads} thread(s), median of {repeats}")
    print("| env | E | gymnasium /wall s | EnvPool /wall s | ratio | gymnasium /CPU s | EnvPool /CPU s | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|", flush=True)
    for env_id, kwargs, n_envs, steps in cases:
        r = measure_case(env_id, kwargs, n_envs, steps, threads, repeats)
        rows.append(r)
        print(
            f"| {r['env']} | {r['E']} | {r['gymnasium_wall']:,.0f} | {r['envpool_wall']:,.0f} | {r['ratio_wall']:.1f}x "
            f"| {r['gymnasium_cpu']:,.0f} | {r['envpool_cpu']:,.0f} | {r['ratio_cpu']:.1f}x |", flush=True,
        )
    return {"threads": threads, "repeats": repeats, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, nargs="+", default=[4, 16, 64], help="CartPole envs per vector env")
    parser.add_argument("--cartpole-steps", type=int, default=40_000, help="env steps per CartPole measurement")
    parser.add_argument("--atari", default="ALE/Pong-v5", help="an Atari id ('' to skip)")
    parser.add_argument("--atari-envs", type=int, nargs="+", default=[4])
    parser.add_argument("--atari-steps", type=int, default=4_000, help="env steps per Atari measurement")
    parser.add_argument("--threads", type=int, default=1, help="EnvPool's threads (gymnasium's path uses one)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    results = measure(
        tuple(args.envs), args.cartpole_steps, args.atari, tuple(args.atari_envs), args.atari_steps, args.threads, args.repeats
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

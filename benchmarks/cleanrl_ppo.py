"""Run CleanRL's `ppo_continuous_action.py` for one seed, then evaluate its final agent deterministically.

Runs inside `.venv-cleanrl` (made by benchmarks/bench_cleanrl.py: CleanRL's own pins, gymnasium 0.29.1), never in
the pipeline's environment. CleanRL's file is executed unmodified from a scratch clone (`runpy`, as `__main__`,
with its own command line); afterwards its module globals still hold the trained `agent` and the `envs` whose
NormalizeObservation wrapper carries the running mean/var the agent was trained with. The evaluation freezes
those statistics and plays `--episodes` fresh Pendulum episodes (seeds 10_000 * (seed + 1) + i, none used in
training) with the mean action (no sampling), clipped to the action bounds, and prints one JSON line:

    {"seed": 0, "final_return_mean": -170.2, "final_returns": [...], "train_last10_mean": ..., "train_s": ...}

    python benchmarks/cleanrl_ppo.py --script <clone>/cleanrl/ppo_continuous_action.py --seed 0 --episodes 20 \
        -- --env-id Pendulum-v1 --total-timesteps 1000000 ...
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import runpy
import sys
import tempfile
import time


def evaluate(namespace: dict, env_id: str, seed: int, episodes: int) -> list[float]:
    import gymnasium as gym
    import numpy as np
    import torch

    agent, envs = namespace["agent"], namespace["envs"]
    wrapper = envs.envs[0]
    while not isinstance(wrapper, gym.wrappers.NormalizeObservation):
        wrapper = wrapper.env
    rms, epsilon = wrapper.obs_rms, wrapper.epsilon
    env = gym.make(env_id)
    low, high = env.action_space.low, env.action_space.high
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=10_000 * (seed + 1) + i)
        total, done = 0.0, False
        while not done:
            normed = np.clip((obs - rms.mean) / np.sqrt(rms.var + epsilon), -10, 10)
            with torch.no_grad():
                mean = agent.actor_mean(torch.as_tensor(normed, dtype=torch.float32)[None])[0].numpy()
            obs, reward, terminated, truncated, _ = env.step(np.clip(mean, low, high))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return returns


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--script", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("cleanrl_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    args.script = os.path.abspath(args.script)
    extra = [a for a in args.cleanrl_args if a != "--"]
    env_id = extra[extra.index("--env-id") + 1]
    import torch

    torch.set_num_threads(1)
    workdir = tempfile.mkdtemp(prefix="cleanrl-")
    os.chdir(workdir)  # its runs/ (TensorBoard) folder goes here
    sys.argv = [args.script, "--seed", str(args.seed), "--no-cuda", *extra]
    log = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(log):
        namespace = runpy.run_path(args.script, run_name="__main__")
    train_s = time.perf_counter() - start
    episodic = [float(x) for x in re.findall(r"episodic_return=\[?(-?[\d.]+)", log.getvalue())]
    returns = evaluate(namespace, env_id, args.seed, args.episodes)
    print(json.dumps({
        "seed": args.seed,
        "final_return_mean": sum(returns) / len(returns),
        "final_returns": returns,
        "train_episodes": len(episodic),
        "train_last10_mean": sum(episodic[-10:]) / max(1, len(episodic[-10:])),
        "train_s": round(train_s, 1),
    }), flush=True)


if __name__ == "__main__":
    main()

"""Reference DQN on CartPole in plain PyTorch + gymnasium, one file, top to bottom.

This is the independent yardstick for the pipeline's DQN task: it imports
nothing from `pipeline`, and its defaults are the same hyperparameters as
`experiment=dqn_cartpole`. Run it as a script (prints one JSON object) or
call `run(**hparams)` from a benchmark to get the same dict in-process.

    python benchmarks/bare_dqn.py --seed 0
    python benchmarks/bare_dqn.py --seed 0 --hidden 256 256 --gradient-steps 128 --stop-at-return none

The schedule follows rl-zoo's CartPole DQN (train every 256 env steps, a
hard target copy every 10 env steps, i.e. a fresh target for each training
phase), with a 128-128 net and 32 gradient steps per phase instead of
256-256 and 128: on seeds 0-4 it needed more env steps to first reach 500
(median 45k against 35k) but a third of the gradient updates (about 5-8k
against 7-22k), each cheaper: 17 s against 41 s median wall time. The greedy
policy swings between 500 and 100-250 between evaluations, so training stops
at the first greedy evaluation of `stop_at_return` and the result says so
(`stop_reason`); the final evaluation uses other start states than the
periodic ones, so the stop rule cannot select for them.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

DEFAULTS = dict(
    env_id="CartPole-v1",
    seed=0,
    total_steps=100_000,
    hidden=(128, 128),
    lr=2.3e-3,
    adam_fused=True,
    gamma=0.99,
    batch_size=64,
    buffer_size=100_000,
    learning_starts=1_000,
    train_freq=256,
    gradient_steps=32,
    target_update_interval=10,
    eps_start=1.0,
    eps_end=0.04,
    eps_duration=8_000,
    max_grad_norm=10.0,
    eval_every=2_500,
    eval_episodes=10,
    final_eval_episodes=20,
    threshold=475.0,
    stop_at_return=500.0,
    threads=1,
)


def q_network(obs_dim: int, n_actions: int, hidden: Sequence[int]) -> nn.Module:
    layers: list[nn.Module] = []
    width = obs_dim
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    return nn.Sequential(*layers, nn.Linear(width, n_actions))


def greedy_returns(q: nn.Module, env_id: str, n_episodes: int, seed: int) -> list[float]:
    """Run `n_episodes` greedy episodes side by side, one batched forward per step.

    Episode i starts from reset(seed=seed + i), so every evaluation with the
    same seed faces the same start states. Batching the episodes makes an
    evaluation cost about as many forwards as one episode, not ten.
    """
    envs = [gym.make(env_id) for _ in range(n_episodes)]
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]).astype(np.float32)
    returns = [0.0] * n_episodes
    alive = list(range(n_episodes))
    with torch.inference_mode():
        while alive:
            actions = q(torch.from_numpy(obs[alive])).argmax(dim=1).tolist()
            still_alive = []
            for i, action in zip(alive, actions):
                next_obs, reward, terminated, truncated, _ = envs[i].step(action)
                returns[i] += float(reward)
                obs[i] = next_obs
                if not (terminated or truncated):
                    still_alive.append(i)
            alive = still_alive
    for env in envs:
        env.close()
    return returns


def run(**hparams) -> dict:
    unknown = set(hparams) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"unknown hyperparameters: {sorted(unknown)}")
    a = argparse.Namespace(**{**DEFAULTS, **hparams})
    hidden = tuple(int(h) for h in a.hidden)

    # Seeding, visible: python, numpy, torch, the env and its action space.
    torch.set_num_threads(a.threads)
    random.seed(a.seed)
    np.random.seed(a.seed)
    torch.manual_seed(a.seed)
    rng = np.random.default_rng(a.seed)
    env = gym.make(a.env_id)
    env.action_space.seed(a.seed)
    obs, _ = env.reset(seed=a.seed)
    obs_dim, n_actions = int(np.prod(env.observation_space.shape)), int(env.action_space.n)

    q = q_network(obs_dim, n_actions, hidden)
    q_target = q_network(obs_dim, n_actions, hidden)
    q_target.load_state_dict(q.state_dict())
    for p in q_target.parameters():
        p.requires_grad_(False)
    optimizer = torch.optim.Adam(q.parameters(), lr=a.lr, fused=a.adam_fused)

    # Replay storage as numpy arrays (cheap per-step writes) with torch views
    # over the same memory (cheap batched gathers); dones = terminated only,
    # since a time-limit truncation must still bootstrap.
    cap = a.buffer_size
    obs_np = np.zeros((cap, obs_dim), np.float32)
    next_obs_np = np.zeros((cap, obs_dim), np.float32)
    actions_np = np.zeros(cap, np.int64)
    rewards_np = np.zeros(cap, np.float32)
    dones_np = np.zeros(cap, np.float32)
    obs_t, next_obs_t, actions_t, rewards_t, dones_t = map(
        torch.from_numpy, (obs_np, next_obs_np, actions_np, rewards_np, dones_np)
    )
    pos = size = 0

    times = dict(env=0.0, act=0.0, learn=0.0, eval=0.0)
    evals: list[dict] = []
    n_updates, episodes = 0, 0
    time_to_threshold_s = cpu_to_threshold_s = steps_to_threshold = None
    stop_reason = "total_steps"
    # CPU time next to wall time: on a shared machine the wall clock also
    # counts other processes, while process time is this run's own cost.
    start, cpu_start = time.perf_counter(), time.process_time()
    step = 0
    while step < a.total_steps:
        t0 = time.perf_counter()
        epsilon = a.eps_start + min(step / a.eps_duration, 1.0) * (a.eps_end - a.eps_start)
        if rng.random() < epsilon:
            action = int(env.action_space.sample())
        else:
            with torch.inference_mode():
                action = int(q(torch.from_numpy(obs).unsqueeze(0)).argmax())
        t1 = time.perf_counter()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        obs_np[pos], next_obs_np[pos] = obs, next_obs
        actions_np[pos], rewards_np[pos], dones_np[pos] = action, reward, terminated
        pos, size = (pos + 1) % cap, min(size + 1, cap)
        if terminated or truncated:
            obs, _ = env.reset()
            episodes += 1
        else:
            obs = next_obs
        step += 1
        t2 = time.perf_counter()
        times["act"] += t1 - t0
        times["env"] += t2 - t1

        if step > a.learning_starts:
            # A hard copy every few env steps means the target equals the
            # online net at the start of each training phase and stays fixed
            # during it (the rl-zoo schedule, counted in env steps).
            if step % a.target_update_interval == 0:
                q_target.load_state_dict(q.state_dict())
            if step % a.train_freq == 0:
                # One index draw for the whole phase, gathered with
                # index_select on a flat index, then sliced per update.
                idx = torch.randint(0, size, (a.gradient_steps * a.batch_size,))
                b_obs = obs_t.index_select(0, idx).view(a.gradient_steps, a.batch_size, obs_dim)
                b_next = next_obs_t.index_select(0, idx).view(a.gradient_steps, a.batch_size, obs_dim)
                b_act = actions_t.index_select(0, idx).view(a.gradient_steps, a.batch_size, 1)
                b_rew = rewards_t.index_select(0, idx).view(a.gradient_steps, a.batch_size)
                b_done = dones_t.index_select(0, idx).view(a.gradient_steps, a.batch_size)
                # The target net only changes between phases (its updates are
                # counted in env steps), so every TD target of the phase comes
                # from one batched forward instead of one small forward per update.
                with torch.no_grad():
                    next_q = q_target(b_next).max(dim=-1).values
                    targets = b_rew + a.gamma * (1.0 - b_done) * next_q
                for k in range(a.gradient_steps):
                    q_taken = q(b_obs[k]).gather(1, b_act[k]).squeeze(1)
                    loss = F.smooth_l1_loss(q_taken, targets[k])
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    if a.max_grad_norm:
                        nn.utils.clip_grad_norm_(q.parameters(), a.max_grad_norm)
                    optimizer.step()
                n_updates += a.gradient_steps
            times["learn"] += time.perf_counter() - t2

        if a.eval_every and step % a.eval_every == 0:
            t3 = time.perf_counter()
            returns = greedy_returns(q, a.env_id, a.eval_episodes, seed=a.seed + 100_000)
            mean = statistics.fmean(returns)
            times["eval"] += time.perf_counter() - t3
            elapsed = time.perf_counter() - start
            evals.append(dict(env_step=step, wall_time_s=round(elapsed, 3), return_mean=mean))
            if time_to_threshold_s is None and mean >= a.threshold:
                time_to_threshold_s, steps_to_threshold = elapsed, step
                cpu_to_threshold_s = time.process_time() - cpu_start
            if a.stop_at_return is not None and mean >= a.stop_at_return:
                stop_reason = f"greedy eval mean {mean:.1f} >= stop_at_return {a.stop_at_return}"
                break

    t4 = time.perf_counter()
    final = greedy_returns(q, a.env_id, a.final_eval_episodes, seed=a.seed + 200_000)
    times["eval"] += time.perf_counter() - t4
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    env.close()
    return dict(
        impl="bare_dqn",
        hparams={k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(a).items()},
        env_steps=step,
        episodes=episodes,
        updates=n_updates,
        stop_reason=stop_reason,
        wall_time_s=round(wall, 3),
        cpu_time_s=round(cpu, 3),
        env_steps_per_s=round(step / wall, 1),
        time_breakdown_s={k: round(v, 3) for k, v in times.items()},
        eval_return_mean=statistics.fmean(final),
        eval_return_std=statistics.pstdev(final),
        time_to_threshold_s=None if time_to_threshold_s is None else round(time_to_threshold_s, 3),
        cpu_time_to_threshold_s=None if cpu_to_threshold_s is None else round(cpu_to_threshold_s, 3),
        steps_to_threshold=steps_to_threshold,
        evals=evals,
    )


def _optional_float(text: str) -> float | None:
    return None if text.lower() in ("none", "null", "off") else float(text)


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean, got {text!r}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in DEFAULTS.items():
        flag = "--" + name.replace("_", "-")
        if name == "hidden":
            parser.add_argument(flag, type=int, nargs="+", default=list(default))
        elif name == "stop_at_return":
            parser.add_argument(flag, type=_optional_float, default=default, help="'none' disables")
        elif isinstance(default, bool):
            parser.add_argument(flag, type=_bool, default=default)
        else:
            parser.add_argument(flag, type=type(default), default=default)
    print(json.dumps(run(**vars(parser.parse_args(argv)))))


if __name__ == "__main__":
    main()

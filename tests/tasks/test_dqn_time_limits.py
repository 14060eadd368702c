"""A time limit ends an episode without ending the MDP: the K-agent DQN loop stores it as not terminal.

Random play through `DQNTask`'s own acting loop (`fit`: the single-env fast path at K = 1, E = 1 on gymnasium, the
general loop otherwise) on CartPole and Acrobot with a short `max_episode_steps`, gymnasium and tensor envs. What
the replay holds is judged by the physics alone, not by the env's flags: a transition is terminal exactly when
its next observation is outside CartPole's bounds (|x| > 2.4 or |angle| > 12 degrees) or has Acrobot's tip above
the bar (-cos t1 - cos(t1 + t2) > 1). An episode that ended otherwise ended at the time limit: it must be
stored as not terminal (its target bootstraps), after exactly `max_episode_steps` steps, with the observation
the last action led to (not the next episode's first).
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn

from pipeline.nets.mlp import MLP
from pipeline.tasks.dqn import DQNTask

LIMIT = {"CartPole-v1": 16, "Acrobot-v1": 6}
STEPS_PER_ENV = 150


def cartpole_fell(next_obs: torch.Tensor) -> torch.Tensor:
    return (next_obs[:, 0].abs() > 2.4) | (next_obs[:, 2].abs() > 12 * 2 * torch.pi / 360)


def acrobot_reached(next_obs: torch.Tensor) -> torch.Tensor:
    c1, s1, c2, s2 = next_obs[:, 0].double(), next_obs[:, 1].double(), next_obs[:, 2].double(), next_obs[:, 3].double()
    return -c1 - (c1 * c2 - s1 * s2) > 1.0  # cos(t1 + t2) = c1 c2 - s1 s2


TERMINAL = {"CartPole-v1": cartpole_fell, "Acrobot-v1": acrobot_reached}


def random_play(env_id: str, backend: str, k: int, envs: int) -> DQNTask:
    env = {"id": env_id, "backend": backend, "kwargs": {"max_episode_steps": LIMIT[env_id]}}
    if backend == "tensor":
        env["dtype"] = "float64"
    total = STEPS_PER_ENV * envs

    def net(in_features, out_features):
        return MLP(in_features, out_features, hidden=(8,))

    task = DQNTask.create(
        env=env, n_agents=k, envs_per_agent=envs, seed=5, net=net, optimizer=lambda p: torch.optim.SGD(p, lr=0.01),
        loss=nn.SmoothL1Loss(), total_steps=total, train_frequency=total // 3, learning_starts=10**9, gradient_steps=1,
        batch_size=8, buffer_size=1000, eps_end=1.0, eval_every=10**9, eval_episodes=1, final_eval_episodes=1,
        log_every=10**9,
    )
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0)
    task.fit_and_evaluate(trainer, None, None)
    return task


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Acrobot-v1"])
@pytest.mark.parametrize(("backend", "k", "envs"), [("gym", 1, 1), ("gym", 2, 1), ("gym", 1, 2), ("tensor", 1, 1), ("tensor", 2, 2)])
def test_time_limits_are_stored_as_not_terminal_and_terminations_as_terminal(env_id, backend, k, envs):
    task = random_play(env_id, backend, k, envs)
    limit, terminal = LIMIT[env_id], TERMINAL[env_id]
    buffer = task.buffer
    assert len(buffer) == STEPS_PER_ENV * envs
    truncations = terminations = 0
    for a in range(k):
        for e in range(envs):
            # Agent a's transitions, step after step, of its env e.
            rows = torch.arange(STEPS_PER_ENV) * envs + e + a * buffer.capacity
            obs, next_obs, dones = buffer.obs[rows], buffer.next_obs[rows], buffer.dones[rows]
            assert torch.equal(dones.bool(), terminal(next_obs)), (a, e, dones.tolist())
            start = 0
            for t in range(STEPS_PER_ENV):
                ended = t == STEPS_PER_ENV - 1 or not torch.equal(obs[t + 1], next_obs[t])
                if not ended:
                    continue
                length = t + 1 - start
                if dones[t] == 1.0:
                    terminations += 1
                    assert length <= limit
                elif t < STEPS_PER_ENV - 1:  # an episode cut by the time limit, not by the end of the run
                    truncations += 1
                    assert length == limit, (a, e, t, length)
                else:
                    assert length <= limit  # still running when the run ended
                start = t + 1
    # Each run really did reach its time limits (and CartPole also fell before its limit).
    assert truncations >= k * envs * (STEPS_PER_ENV // limit) // 2
    if env_id == "CartPole-v1":
        assert terminations >= 1

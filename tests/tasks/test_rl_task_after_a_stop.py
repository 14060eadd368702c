"""RLTask's per-agent bookkeeping after agents stop: each finished episode is credited to the agent whose env ran it,
whichever agents left the batch before (slot 0 among them, so a slot read as an agent shows). The expectation is the
single run of each agent's seed: with uniform random acting (DQN at epsilon 1), agent i of a batch plays exactly the
episodes the single run of its seed plays, so their returns and env steps must be equal, not close.
"""

import functools
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from pipeline.nets.mlp import MLP
from pipeline.tasks.dqn import DQNTask

CART = {"id": "CartPole-v1", "backend": "tensor", "dtype": "float64"}
NEVER = 10**9
E = 2  # envs per agent: a row r of the vector env is slot r // E's


def dqn(k: int, seed: int) -> DQNTask:
    task = DQNTask.create(n_agents=k, seed=seed, env=CART, envs_per_agent=E, total_steps=400, train_frequency=40,
                          learning_starts=NEVER, eps_start=1.0, eps_end=1.0, buffer_size=500, eval_every=NEVER,
                          log_every=NEVER, stop_confirm_episodes=0, net=functools.partial(MLP, hidden=(8,)),
                          loss=nn.SmoothL1Loss(), optimizer=functools.partial(torch.optim.Adam, lr=1e-3))
    task.on_fit_start()
    opt = task.configure_optimizers()
    task.optimizers = lambda: SimpleNamespace(optimizer=opt)  # what Lightning hands RLTask when the batch shrinks
    return task


def rounds(task: DQNTask, n: int) -> None:
    """n iterations as training_step runs them: iterate, then the finished episodes credited."""
    for _ in range(n):
        task.iterate()
        task.credit_finished()


@pytest.mark.parametrize("stopped", [[0], [0, 2], [1]])
def test_episodes_after_a_stop_are_credited_to_the_agents_whose_envs_ran_them(stopped):
    batch = dqn(3, seed=5)  # agents: seeds 5, 6, 7
    rounds(batch, 3)
    at_stop = [len(r) for r in batch.episode_returns]
    batch.stop_agents(dict.fromkeys(stopped, "test"))
    rounds(batch, 4)
    for agent in range(3):
        alone = dqn(1, seed=5 + agent)
        rounds(alone, 3 if agent in stopped else 7)
        assert batch.agent_env_steps(agent) == alone.env_steps
        assert batch.episode_returns[agent] == alone.episode_returns[0], agent
        # CartPole at random: episodes of ~20 steps, so a learning agent finishes several after the stop.
        assert at_stop[agent] >= 2 and (agent in stopped or len(alone.episode_returns[0]) >= at_stop[agent] + 4)

"""REINFORCE (Williams 1992) with K seeds in one process: docs/add_an_algorithm.md's RL example, one file on RLTask.

RLTask (pipeline.tasks.rl_task) runs everything around the algorithm: the K-agent batch and its envs, evaluation
and the stop rule, logging, checkpoints and resume, records and model files. This file is only the algorithm:
how its network acts (`policy`: what evaluations, `python -m pipeline.eval`, `pipeline.load` and export play), the
network (`build_net`), the budget (`iterations_left`) and one iteration (`iterate`): `num_steps` steps of every
learning agent's envs, then one policy-gradient step on the discounted rewards-to-go.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn
from torch.distributions import Categorical

from pipeline.nets.ensemble import make_ensemble
from pipeline.rl.policies import CategoricalPolicy
from pipeline.tasks.base import TaskParts
from pipeline.tasks.configs import RLConfig
from pipeline.tasks.rl_task import RLProgress, RLTask


@dataclass
class ReinforceConfig(RLConfig):
    """RLConfig's keys (budget, evaluation, stop rule, logging) and REINFORCE's own."""

    _target_: str = "reinforce.ReinforceTask"
    num_steps: int = 64  # steps of each env per update


class Rollout(NamedTuple):
    """One rollout of the learning agents, [T, K, E] each."""

    log_probs: torch.Tensor
    rewards: torch.Tensor
    done: torch.Tensor


@dataclass
class ReinforceProgress(RLProgress):
    updates: int = 0  # checkpointed with RLTask's counters


class ReinforceTask(RLTask):
    Config = ReinforceConfig
    algorithm = "reinforce"
    checkpoint_format = "example.reinforce/1"
    RunProgress = ReinforceProgress
    policy = CategoricalPolicy  # how its network acts: the most likely action, or a draw from softmax(logits)

    def build_net(self, parts: TaskParts) -> nn.Module:
        net = parts.require("net", "reinforce", "choose a network with model=mlp")
        if not hasattr(self.action_space, "n"):
            raise ValueError(f"task=reinforce here takes discrete actions; {self.env_id} has {self.action_space}")
        # K members, member i initialised as the single run of seed + i.
        return make_ensemble(net, self.agent_seeds, self.obs_shape, int(self.action_space.n))

    def iterations_left(self) -> int:
        return (self.config.total_steps - self.env_steps) // (self.config.num_steps * self.envs_per_agent)

    def rollout(self) -> Rollout:
        steps = []
        ended, returns = [], []
        for _ in range(self.config.num_steps):
            policy = Categorical(logits=self.net(self.agent_view(self.obs).float()))  # [K, E] actions
            actions = policy.sample()
            step = self.env.step(actions.reshape(-1))
            steps.append((policy.log_prob(actions), self.agent_view(step.reward).float(), self.agent_view(step.done)))
            returns.append(self.add_rewards(step.reward, step.done))
            ended.append(step.done)
            self.obs = step.obs
        self.env_steps += self.config.num_steps * self.envs_per_agent
        self.credit_episodes(torch.stack(ended), torch.stack(returns))
        return Rollout(*(torch.stack(x) for x in zip(*steps)))

    def iterate(self) -> None:
        rollout = self.rollout()
        # Discounted rewards-to-go within the rollout (an episode the rollout cuts counts only what it saw).
        to_go, running = torch.zeros_like(rollout.rewards), torch.zeros_like(rollout.rewards[0])
        for t in reversed(range(len(rollout.rewards))):
            running = rollout.rewards[t] + self.config.gamma * running * (~rollout.done[t])
            to_go[t] = running
        weights = (to_go - to_go.mean((0, 2), keepdim=True)) / (to_go.std((0, 2), keepdim=True) + 1e-8)
        # Each agent's mean loss, summed over agents: each agent gets exactly its own gradient.
        loss = -(rollout.log_probs * weights).mean((0, 2)).sum()
        optimizer = self.optimizers().optimizer
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        self.updates += 1

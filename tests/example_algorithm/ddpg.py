"""DDPG (Lillicrap et al. 2016) with K seeds in one process: docs/add_an_algorithm.md's off-policy example, one file
on the off-policy actor-critic layer.

`OffPolicyActorCriticTask` (pipeline.tasks.offpolicy) runs everything around the algorithm: each agent's replay rows,
its actor (`net`), its critic (`critic_class`, stacked over the K agents) and both targets (`update_targets`: Polyak by
task.tau), acting (uniform actions until learning_starts, then `behaviour_actions`) with one `learn_step` per env
step, the two optimizers, checkpoints with the replay, and shrinking all of it when agents stop; RLTask the rest
(evaluations, the stop rule, records and model files). This file is only the algorithm: its two losses, as pure
functions of the networks and tensors [K, B, ...], how it explores (Gaussian noise on the actor's action, as
CleanRL's ddpg_continuous_action.py) and one gradient step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from pipeline.config.ranges import count, number
from pipeline.nets import contracts
from pipeline.nets.continuous_control import QNet
from pipeline.nets.contracts import ModelContract
from pipeline.rl.offpolicy import exploration_actions
from pipeline.rl.policies import DeterministicActorPolicy
from pipeline.rl.replay import Transitions
from pipeline.tasks.configs import OffPolicyActorCriticConfig
from pipeline.tasks.offpolicy import OffPolicyActorCriticTask


@dataclass
class DDPGConfig(OffPolicyActorCriticConfig):
    """OffPolicyActorCriticConfig's keys (replay, batch, tau, policy_lr, q_lr, critic_hidden, ...) and DDPG's own."""

    model_contract: ClassVar[ModelContract | None] = contracts.TD3  # a deterministic actor: unit, bounds, forward

    _target_: str = "ddpg.DDPGTask"
    policy_frequency: int = count(1)  # critic steps per actor step and target update: every step, as the paper's
    exploration_noise: float = number(0.1, low=0)  # std of the Gaussian noise on actions in [-1, 1]


def ddpg_critic_losses(actor_target, critic, critic_target, obs, actions, rewards, next_obs, terminated,
                       gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(each agent's MSE of Q(s, a) to r + gamma (1 - terminated) Q'(s', mu'(s')) [K], its batch mean of Q [K])."""
    with torch.no_grad():
        next_q = critic_target(next_obs, actor_target.unit(next_obs))
        target = rewards + gamma * (1.0 - terminated.to(rewards.dtype)) * next_q
    q = critic(obs, actions)
    return ((q - target) ** 2).mean(-1), q.detach().mean(-1)


def ddpg_actor_losses(actor, critic, obs) -> torch.Tensor:
    """Each agent's -mean Q(s, mu(s)) [K]."""
    return -critic(obs, actor.unit(obs)).mean(-1)


class DDPGTask(OffPolicyActorCriticTask):
    Config = DDPGConfig
    algorithm = "ddpg"
    checkpoint_format = "example.ddpg/1"
    actor_contract = contracts.TD3
    model_option = "deterministic_actor"
    policy = DeterministicActorPolicy  # the actor's action; deterministic=False adds N(0, exploration_noise^2)
    critic_class = QNet  # one critic per agent (the layer's default is TwinQ)
    target_actor = True  # actor_target, moved with the target critic by update_targets
    loss_functions = {"critic": ddpg_critic_losses, "actor": ddpg_actor_losses}

    def behaviour_actions(self, obs: torch.Tensor) -> torch.Tensor:
        return exploration_actions(self.net.unit(obs), self.config.exploration_noise, self.generators)

    def learn_step(self, batch: Transitions) -> None:
        hp = self.config
        self.critic_step(*self.losses("critic")(self.actor_target, self.critic, self.critic_target, *batch, hp.gamma))
        if self.critic_updates() % hp.policy_frequency == 0:
            with self.critics_frozen():  # the actor's loss reaches the critic's weights: no gradients for them
                self.actor_step(self.losses("actor")(self.net, self.critic, batch.obs))
            self.update_targets()

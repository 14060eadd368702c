"""Twin Delayed DDPG (Fujimoto et al. 2018) for K agents at once (K = 1 is an ordinary run).

Reads like CleanRL's td3_continuous_action.py with a leading agent axis, on the off-policy actor-critic layer
`pipeline.tasks.offpolicy.OffPolicyActorCriticTask` (replay rows, critics and their targets, the actor's target,
acting, checkpoints) and RLTask's K-agent batch:
agent i is seed `seed + i` with its own deterministic actor and its target, twin Q critics and their targets,
Adam moments and random stream. It explores with Gaussian noise on its actions (`exploration_noise`, in units of
the action scale), learns its critics toward the clipped double-Q target of its target actor's actions under
clipped smoothing noise (`policy_noise`, `noise_clip`), and every `policy_frequency`-th critic step takes one
actor step on -Q1(s, actor(s)) and Polyak-averages both targets.
"""

from __future__ import annotations

import torch

from pipeline.nets import contracts
from pipeline.rl.offpolicy import exploration_actions, td3_actor_losses, td3_critic_losses
from pipeline.rl.policies import DeterministicActorPolicy
from pipeline.rl.replay import Transitions
from pipeline.tasks.configs import TD3Config
from pipeline.tasks.offpolicy import OffPolicyActorCriticTask


class TD3Task(OffPolicyActorCriticTask):
    """TD3: a deterministic actor with a target, twin critics, target policy smoothing, delayed actor updates."""

    Config = TD3Config
    algorithm = "td3"
    actor_contract = contracts.TD3
    model_option = "deterministic_actor"
    policy = DeterministicActorPolicy
    checkpoint_format = "pipeline.td3/1"
    target_actor = True
    loss_functions = {"critic": td3_critic_losses, "actor": td3_actor_losses}

    def behaviour_actions(self, obs: torch.Tensor) -> torch.Tensor:
        return exploration_actions(self.net.unit(obs), self.config.exploration_noise, self.generators)

    def learn_step(self, batch: Transitions) -> None:
        hp = self.config
        smoothing = self.noise(batch.actions) * hp.policy_noise
        self.critic_step(*self.losses("critic")(self.actor_target, self.critic, self.critic_target, *batch, smoothing,
                                                 hp.noise_clip, hp.gamma))
        if self.critic_updates() % hp.policy_frequency == 0:
            with self.critics_frozen():
                self.actor_step(self.losses("actor")(self.net, self.critic, batch.obs))
            self.update_targets()

"""Soft Actor-Critic (Haarnoja et al. 2018) for K agents at once (K = 1 is an ordinary run), on the off-policy
actor-critic layer it shares with TD3 (`pipeline.tasks.offpolicy.OffPolicyActorCriticTask`).

Reads like CleanRL's sac_continuous_action.py with a leading agent axis on every tensor. RLTask runs the K-agent
batch (envs, generators, evaluation and the stop rule, logging, checkpoints, records), the off-policy layer the
replay rows, critics, acting and the optimizer steps; this file is the algorithm.
Agent i is seed `seed + i` with its own squashed-Gaussian actor (`net`, member i), twin Q critics and their
targets (members i of the stacked networks of `pipeline.nets.continuous_control`, initialised as the single run
of its seed), entropy temperature (`log_alpha[i]`), Adam moments (one optimizer per network family over stacked
weights is K optimizers: every loss is the SUM over agents of each agent's own loss), replay rows
(`pipeline.rl.replay`), envs and generator (its warm-up actions, replay draws and policy noise). Agent i of a
K-agent run therefore trains like the single run of seed `seed + i`, in distribution.

Each env step: every agent acts (uniformly at random before `learning_starts`, then from its policy), the
transitions go to the agents' replay rows, and past `learning_starts` each agent takes one gradient step on its
critics (the soft twin-Q target of `pipeline.rl.offpolicy`), every `policy_frequency`-th step that many actor and
temperature steps, and every `target_network_frequency`-th step a Polyak update of its target critics. Actions
are learnt in [-1, 1] and scaled to the env's bounds (which the actor keeps) on the way out. One iteration is
`ROUND_STEPS` (`pipeline.tasks.offpolicy`) env steps of every agent. The optimizer group gives the optimizer (Adam)
and nothing else: the learning rates are `task.policy_lr` and `task.q_lr` (the temperature's is q_lr, as CleanRL's);
an `optimizer.lr` that is set is not used, and the run says so in one line (the presets set `optimizer.lr: null`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from pipeline.nets import contracts
from pipeline.nets.ensemble import keep_optimizer_members_
from pipeline.rl.offpolicy import sac_actor_losses, sac_critic_losses, temperature_loss
from pipeline.rl.policies import SquashedGaussianPolicy
from pipeline.rl.replay import Transitions
from pipeline.rl.squashed_gaussian import squashed_gaussian_sample
from pipeline.tasks.base import TaskParts
from pipeline.tasks.configs import SACConfig
from pipeline.tasks.offpolicy import OffPolicyActorCriticTask


class SACTask(OffPolicyActorCriticTask):
    """SAC: a squashed-Gaussian actor, twin soft Q critics, and (autotune) a temperature per agent."""

    Config = SACConfig
    algorithm = "sac"
    actor_contract = contracts.SAC
    model_option = "squashed_gaussian_actor"
    policy = SquashedGaussianPolicy
    checkpoint_format = "pipeline.sac/1"
    loss_functions = {"critic": sac_critic_losses, "actor": sac_actor_losses}
    q_lr_sets = "critics, temperature"

    def build_net(self, parts: TaskParts) -> nn.Module:
        net = super().build_net(parts)
        hp = self.config
        # One temperature per agent: tuned from alpha_start (CleanRL's 1.0), or fixed at alpha.
        start = hp.alpha_start if hp.autotune else hp.alpha
        self.log_alpha = nn.Parameter(torch.full((self.n_agents,), math.log(start) if start > 0 else -math.inf),
                                      requires_grad=bool(hp.autotune))
        self.target_entropy = float(hp.target_entropy) if hp.target_entropy is not None else -float(self.action_dim)
        self.alpha_opt: torch.optim.Optimizer | None = None
        return net

    def configure_optimizers(self):
        if self.config.autotune:
            self.alpha_opt = self.optimizer_factory([self.log_alpha], lr=self.config.q_lr)
        return super().configure_optimizers()

    def own_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"alpha": self.alpha_opt} if self.alpha_opt is not None else {}

    def behaviour_actions(self, obs: torch.Tensor) -> torch.Tensor:
        return squashed_gaussian_sample(*self.net.distribution(obs), self.generators)[0]

    def learn_step(self, batch: Transitions) -> None:
        hp = self.config
        alpha = self.log_alpha.detach().exp()
        eps = hp.log_det_epsilon
        self.critic_step(*self.losses("critic")(self.net, self.critic, self.critic_target, *batch, self.noise(batch.actions),
                                                 alpha, hp.gamma, eps))
        if self.critic_updates() % hp.policy_frequency == 0:
            # Delayed, as CleanRL: policy_frequency actor (and temperature) steps every policy_frequency critic steps.
            for _ in range(hp.policy_frequency):
                with self.critics_frozen():
                    loss, log_prob = self.losses("actor")(self.net, self.critic, batch.obs, self.noise(batch.actions), alpha, eps)
                    self.actor_step(loss)
                if self.alpha_opt is not None:
                    cleanrl = hp.temperature_loss == "cleanrl"
                    if cleanrl:  # CleanRL's: a fresh draw from the actor just updated
                        with torch.no_grad():
                            log_prob = squashed_gaussian_sample(*self.net.distribution(batch.obs), self.generators, eps)[1]
                    self.alpha_opt.zero_grad(set_to_none=True)
                    temperature_loss(self.log_alpha, log_prob, self.target_entropy, scaled=cleanrl).sum().backward()
                    self.alpha_opt.step()
                    alpha = self.log_alpha.detach().exp()
            self._recent["train/entropy"] = -log_prob.mean(-1)
        self._recent["train/alpha"] = alpha
        if self.critic_updates() % hp.target_network_frequency == 0:
            self.update_targets()

    def keep_own_(self, keep: torch.Tensor, n_before: int, training: bool) -> None:
        old = self.log_alpha
        self.log_alpha = nn.Parameter(old.detach().index_select(0, keep), requires_grad=old.requires_grad)
        if training and self.alpha_opt is not None:
            keep_optimizer_members_(self.alpha_opt, [(old, self.log_alpha)], keep, n_before)

    def own_state(self) -> dict:
        return {"log_alpha": self.log_alpha.detach().cpu().clone()}

    def load_own_state(self, state: dict) -> None:
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])

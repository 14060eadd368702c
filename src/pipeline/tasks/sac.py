"""Soft Actor-Critic (Haarnoja et al. 2018) for K agents at once (K = 1 is an ordinary run), on `RLTask`, and the
off-policy actor-critic algorithm it shares with TD3 (`pipeline.tasks.td3`).

Reads like CleanRL's sac_continuous_action.py with a leading agent axis on every tensor. RLTask runs the K-agent
batch (envs, generators, evaluation and the stop rule, logging, checkpoints, records); this file is the algorithm.
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
`ROUND_STEPS` env steps of every agent. The optimizer group gives the optimizer (Adam) and nothing else: the
learning rates are `task.policy_lr` and `task.q_lr` (the temperature's is q_lr, as CleanRL's); an `optimizer.lr`
that is set is not used, and the run says so in one line (the presets set `optimizer.lr: null`).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import ClassVar

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from pipeline.nets import contracts
from pipeline.nets.continuous_control import SquashedGaussianActor, TwinQ, make_offpolicy_agents
from pipeline.nets.contracts import ModelContract
from pipeline.nets.ensemble import (
    compile_over_members,
    compiled_graphs,
    keep_optimizer_members_,
    stacked_optimizer,
)
from pipeline.nets.stacked import check_outputs
from pipeline.rl.offpolicy import sac_actor_losses, sac_critic_losses, temperature_loss
from pipeline.rl.policies import SquashedGaussianPolicy
from pipeline.rl.replay import ReplayBuffer, Transitions
from pipeline.rl.squashed_gaussian import per_agent_normal, squashed_gaussian_sample
from pipeline.rl.targets import freeze, soft_update
from pipeline.tasks.base import TaskParts, check_finite
from pipeline.tasks.configs import SACConfig
from pipeline.tasks.rl_task import RLProgress, RLTask, per_agent

# Env steps (of every agent's envs) per iteration: acting and learning interleave step by step inside it.
ROUND_STEPS = 50

log = logging.getLogger(__name__)


@dataclass
class OffPolicyProgress(RLProgress):
    updates: list[int] = per_agent(int)  # critic steps of each agent (a stopped agent keeps its count)


class OffPolicyActorCriticTask(RLTask):
    """K agents with an actor (`net`), twin critics and their targets, each learning from its replay rows (SAC, TD3).

    A subclass sets `actor_class`, `model_option`, `algorithm`, `checkpoint_format`, `loss_functions` (its steps'
    losses as functions of the networks and of noise drawn beforehand: `pipeline.rl.offpolicy`), and writes
    `behaviour_actions` (what the agents play while learning) and `learn_step` (one gradient step, through `losses`,
    `critic_step` and `actor_step`); `own_optimizers`, `keep_own_`, `own_state` / `load_own_state` carry any per-agent
    state of its own. With `device.compile=true` every loss function runs through torch.compile (forward and
    backward; `compile_over_members`), and an update that compiled is booked as compile time, not learn.
    """

    RunProgress = OffPolicyProgress
    checkpointed_nets = ("net", "agents_net", "critic", "critic_target")
    actor_class: ClassVar[type[nn.Module]]
    actor_contract: ClassVar[ModelContract]  # what any actor must have (ours meets it: `actor_class`)
    model_option: ClassVar[str]
    loss_functions: ClassVar[dict[str, Callable]]

    # ---- what an algorithm writes --------------------------------------------------------------
    def behaviour_actions(self, obs: torch.Tensor) -> torch.Tensor:
        """Actions in [-1, 1] [K, E, D] that the learning agents play on observations [K, E, *obs_shape]."""
        raise TypeError(f"{type(self).__name__} must define behaviour_actions")

    def learn_step(self, batch: Transitions) -> None:
        """One gradient step of every learning agent on its minibatch [K, B, ...]."""
        raise TypeError(f"{type(self).__name__} must define learn_step")

    def own_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Optimizers besides the actor's and the critics' (SAC: the temperature's), by name."""
        return {}

    def keep_own_(self, keep: torch.Tensor, n_before: int, training: bool) -> None:
        """Shrink the subclass's own per-agent state to the learning agents `keep`."""

    def own_state(self) -> dict:
        return {}

    def load_own_state(self, state: dict) -> None:
        pass

    def unused_lr_line(self) -> str | None:
        """The one line a run prints when the optimizer group carries a learning rate (`optimizer.lr`), which these
        tasks do not use: their rates are task.policy_lr and task.q_lr. None when it carries none."""
        given = getattr(self.optimizer_factory, "keywords", {}).get("lr")
        if given is None:
            return None
        hp = self.config
        return (f"task={self.algorithm} does not use optimizer.lr={given}: its learning rates are task.policy_lr={hp.policy_lr} "
                f"(actor) and task.q_lr={hp.q_lr} (critics{', temperature' if self.algorithm == 'sac' else ''}); set those "
                f"(and optimizer.lr=null to silence this)")

    # ---- RLTask's hooks ----------------------------------------------------------------------------
    def build_net(self, parts: TaskParts) -> nn.Module:
        hp, space = self.config, self.action_space
        if line := self.unused_lr_line():
            log.warning(line)
        actor = parts.require("net", self.algorithm, f"choose the actor with model={self.model_option}")
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise ValueError(f"task={self.algorithm} needs continuous actions (a flat Box); {self.env_id} has {space}: "
                             "use task=dqn or task=ppo")
        if not (np.isfinite(space.low).all() and np.isfinite(space.high).all()):
            raise ValueError(f"task={self.algorithm} scales actions to the env's bounds and {self.env_id}'s are not finite "
                             f"({space}); wrap it in gymnasium.wrappers.RescaleAction")
        self.action_dim = int(space.shape[0])
        bounded = functools.partial(actor, action_low=space.low.tolist(), action_high=space.high.tolist())
        critic = functools.partial(TwinQ, hidden=tuple(hp.critic_hidden))
        # Our actor class as a hand-written ensemble; any other actor meeting `actor_contract` stacked generically.
        duty = f"model={self.model_option} or an actor of your own: {self.actor_contract.describe()}"
        methods = [name for name, _, _ in self.actor_contract.calls if name != "forward"]
        try:
            net, self.critic = make_offpolicy_agents(bounded, critic, self.agent_seeds, math.prod(self.obs_shape),
                                                     self.action_dim, methods)
        except TypeError as exc:  # the actor's constructor refused the task's keywords
            raise ValueError(f"task={self.algorithm} needs {duty}; building {getattr(actor, 'func', actor)} failed: {exc}") from None
        if missing := [name for name in methods if not hasattr(net, name)]:
            raise ValueError(f"task={self.algorithm} needs {duty}; {getattr(actor, 'func', actor)} has no {', '.join(missing)}")
        D = self.action_dim
        check_outputs(net, self.algorithm, duty, self.obs_shape, ("N", D))
        for name, _, _ in self.actor_contract.calls:
            if name != "forward":
                want = [("N", D), ("N", D)] if name == "distribution" else ("N", D)
                check_outputs(net, self.algorithm, duty, (D,) if name == "bounds" else self.obs_shape, want, name)
        self.critic_target = freeze(copy.deepcopy(self.critic))
        self.replay_bytes_per_transition = ReplayBuffer.bytes_per_transition(self.obs_shape, torch.float32, (self.action_dim,), torch.float32)
        self.replay_restored: bool | None = None
        self._recent: dict[str, torch.Tensor] = {}  # the last update's statistics, [learning agents]
        self.compiled_losses: dict[str, Callable] = {}  # device.compile=true: made on first use
        self.compile_s = 0.0  # seconds spent compiling the updates so far
        return net

    def configure_optimizers(self):
        """The optimizer group's optimizer for the actor (task.policy_lr; what RLTask keeps and checkpoints) and for the
        critics (task.q_lr; kept here); Adam fused over the stacked weights (`stacked_optimizer`)."""
        self.critic_opt = stacked_optimizer(functools.partial(self.optimizer_factory, lr=self.config.q_lr), self.critic.parameters())
        self.actor_opt = stacked_optimizer(functools.partial(self.optimizer_factory, lr=self.config.policy_lr), self.net.parameters())
        return self.actor_opt

    def on_fit_start(self) -> None:
        super().on_fit_start()
        self.buffer = ReplayBuffer(self.config.buffer_size, self.obs_shape, len(self.slots), device=self.device,
                                   action_shape=(self.action_dim,), action_dtype=torch.float32)

    def iterations_left(self) -> int:
        return max(0, math.ceil((self.config.total_steps - self.env_steps) / (ROUND_STEPS * self.envs_per_agent)))

    def iterate(self) -> None:
        hp = self.config
        for _ in range(min(ROUND_STEPS, math.ceil((hp.total_steps - self.env_steps) / self.envs_per_agent))):
            self.act_and_store()
            if self.env_steps > hp.learning_starts:
                graphs, t0 = compiled_graphs() if self.compile_updates else 0, time.perf_counter()
                self.learn_step(self.sample_batch())
                seconds = time.perf_counter() - t0
                if self.compile_updates and compiled_graphs() != graphs:  # this update compiled (forward, backward)
                    self.compile_s += seconds
                    self.add_time("compile", seconds)
                else:
                    self.add_time("learn", seconds)

    def keep_agents_(self, keep: torch.Tensor, keep_slots: list[int], training: bool) -> None:
        n_before = int(self.critic.n_members)
        pairs = self.critic.keep_members_(keep)
        self.critic_target.keep_members_(keep)
        if training:
            # The critics stack every agent's q1, then every agent's q2: 2K members.
            keep_optimizer_members_(self.critic_opt, pairs, torch.cat([keep, keep + n_before]), 2 * n_before)
            self.buffer.keep_agents_(keep)
            self._recent = {k: v.index_select(0, keep) for k, v in self._recent.items()}
        self.keep_own_(keep, n_before, training)

    def train_metrics(self, slot: int, agent: int) -> dict[str, float]:
        return {k: float(v[slot]) for k, v in self._recent.items()}

    def algorithm_state(self) -> dict:
        worth = self.config.save_replay is True or (
            self.config.save_replay == "auto"
            and self.buffer.nbytes * len(self.buffer) <= self.config.replay_save_max_mb * 2**20 * self.buffer.capacity)
        return {"optimizers": {name: opt.state_dict() for name, opt in {"critic": self.critic_opt, **self.own_optimizers()}.items()},
                "replay": self.buffer.state_dict() if worth else None,
                "recent": {k: v.cpu() for k, v in self._recent.items()}, **self.own_state()}

    def load_algorithm_state(self, state: dict) -> None:
        if self.slots:
            self.load_own_state(state)

    def resume_algorithm_state(self, state: dict) -> None:
        for name, opt in {"critic": self.critic_opt, **self.own_optimizers()}.items():
            opt.load_state_dict(state["optimizers"][name])
        self._recent = {k: v.to(self.device) for k, v in state["recent"].items()}
        if self.slots:
            self.replay_restored = state["replay"] is not None
            if self.replay_restored:
                self.buffer.load_state_dict(state["replay"])

    def final_agent_metrics(self, i: int) -> dict[str, float]:
        return {"train/updates": float(self.updates[i])}

    def algorithm_record(self, i: int) -> dict:
        extras = {"replay_bytes_per_transition": self.replay_bytes_per_transition}
        if self.replay_restored is not None:
            extras["replay_restored_on_resume"] = self.replay_restored
        return extras

    # ---- acting ---------------------------------------------------------------------------------
    def act_and_store(self) -> None:
        """One step of every learning agent's envs; the transitions (actions in [-1, 1]) into its replay rows."""
        K, E, D = len(self.slots), self.envs_per_agent, self.action_dim
        t0 = time.perf_counter()
        obs = self.agent_view(self.obs)
        if self.env_steps < self.config.learning_starts:  # warm-up: uniform in [-1, 1], agent k's from its generator
            actions = torch.stack([torch.rand(E, D, generator=g, device=g.device) for g in self.generators]) * 2 - 1
        else:
            with torch.no_grad():
                actions = self.behaviour_actions(obs)
        env_actions = self.net.bounds(actions).reshape(K * E, D)
        t1 = time.perf_counter()
        step = self.env.step(env_actions)

        def per_step(x: torch.Tensor) -> torch.Tensor:  # [K * E, ...] -> [E, K, ...]: E lockstep transitions per agent
            return self.agent_view(x).transpose(0, 1)

        self.buffer.add(obs.transpose(0, 1), actions.transpose(0, 1), per_step(step.reward), per_step(step.final_obs),
                        per_step(step.terminated))
        returns = self.add_rewards(step.reward, step.done)
        if bool(step.done.any()):
            self.credit_episodes(step.done.unsqueeze(0), returns.unsqueeze(0))
        self.obs = step.obs
        self.env_steps += E
        self.add_time("act", t1 - t0)
        self.add_time("env", time.perf_counter() - t1)

    # ---- learning -------------------------------------------------------------------------------
    def sample_batch(self) -> Transitions:
        """One minibatch per learning agent, [K, B, ...], drawn with its generator."""
        return Transitions(*(x[0] for x in self.buffer.sample(1, self.config.batch_size, self.generators)))

    def losses(self, name: str) -> Callable:
        """`loss_functions[name]`, or the same through torch.compile with `device.compile=true` (compiled on first use:
        static shapes until agents first stop, then one symbolic-K graph)."""
        fn = self.loss_functions[name]
        if not self.compile_updates:
            return fn
        if name not in self.compiled_losses:
            self.compiled_losses[name] = compile_over_members(fn, self.device)
        return self.compiled_losses[name]

    def noise(self, like: torch.Tensor) -> torch.Tensor:
        """Standard normal draws shaped like `like` [K, ...], agent k's from its generator."""
        return per_agent_normal(like.shape, self.generators, like.device, like.dtype)

    def critic_step(self, loss: torch.Tensor, q_mean: torch.Tensor) -> None:
        """One optimizer step of every agent's twin critics on its loss [K] (Q1's batch mean [K] is logged)."""
        check_finite(loss, self.env_steps, hint="lower task.q_lr")
        self.critic_opt.zero_grad(set_to_none=True)
        loss.sum().backward()
        self.critic_opt.step()
        for agent in self.slots:
            self.updates[agent] += 1
        self._recent["train/q_loss"] = loss.detach() / 2
        self._recent["train/q_mean"] = q_mean

    @contextlib.contextmanager
    def critics_frozen(self) -> Iterator[None]:
        """The critics take no weight gradients inside (an actor loss through them): those would be discarded (the
        critics' next step starts from zero), and not computing them saves the backward's weight products."""
        params = list(self.critic.parameters())
        for p in params:
            p.requires_grad_(False)
        try:
            yield
        finally:
            for p in params:
                p.requires_grad_(True)

    def actor_step(self, loss: torch.Tensor) -> None:
        """One optimizer step of every agent's actor on `loss` [K] (summed: each agent gets its own gradient)."""
        self.actor_opt.zero_grad(set_to_none=True)
        loss.sum().backward()
        self.actor_opt.step()
        self._recent["train/actor_loss"] = loss.detach()

    def critic_updates(self) -> int:
        """Critic steps so far of the learning agents (they step in lockstep)."""
        return self.updates[self.slots[0]]


class SACTask(OffPolicyActorCriticTask):
    """SAC: a squashed-Gaussian actor, twin soft Q critics, and (autotune) a temperature per agent."""

    Config = SACConfig
    algorithm = "sac"
    actor_class = SquashedGaussianActor
    actor_contract = contracts.SAC
    model_option = "squashed_gaussian_actor"
    policy = SquashedGaussianPolicy
    checkpoint_format = "pipeline.sac/1"
    loss_functions = {"critic": sac_critic_losses, "actor": sac_actor_losses}

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
            soft_update(self.critic_target, self.critic, hp.tau)

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

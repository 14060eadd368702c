"""The off-policy layer: RL tasks that learn from a replay buffer per agent (DQN, SAC, TD3), and the actor-critic
family on it (SAC, TD3), between `RLTask` and one algorithm, as SB3's `OffPolicyAlgorithm` sits under DQN, SAC and TD3.

`OffPolicyTask` holds the replay plumbing once. Each learning agent has its own replay rows (`buffer`: a
`pipeline.rl.replay.ReplayBuffer` of task.buffer_size transitions per agent, built at fit start, shrunk when agents
stop). A checkpoint holds the buffer when `task.save_replay` says so (auto: when the learning agents' transitions take
at most task.replay_save_max_mb); a resumed run without it refills the buffer first, and its record says which
(`replay_restored_on_resume`). Every agent's record gives one stored transition's size (`replay_bytes_per_transition`)
and its final metrics its gradient steps (`train/updates`, the progress field `updates`). Its Config is
`pipeline.tasks.configs.OffPolicyConfig`.

`OffPolicyActorCriticTask` adds K actors (`net`), critics and their targets, each agent learning from its replay rows
at every env step: SAC, TD3, and docs/add_an_algorithm.md's DDPG. Its Config is `OffPolicyActorCriticConfig`.
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
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from pipeline.nets.continuous_control import TwinQ, make_offpolicy_agents
from pipeline.nets.contracts import ModelContract
from pipeline.nets.ensemble import (
    compile_over_members,
    compiled_graphs,
    keep_optimizer_members_,
    stacked_optimizer,
)
from pipeline.nets.stacked import check_outputs
from pipeline.rl.replay import ReplayBuffer, Transitions
from pipeline.rl.squashed_gaussian import per_agent_normal
from pipeline.rl.targets import freeze, soft_update
from pipeline.tasks.base import TaskParts, check_finite
from pipeline.tasks.rl_task import RLProgress, RLTask, per_agent

# Env steps (of every agent's envs) per iteration of an actor-critic task: acting and learning interleave step by step
# inside it.
ROUND_STEPS = 50

log = logging.getLogger(__name__)


@dataclass
class OffPolicyProgress(RLProgress):
    updates: list[int] = per_agent(int)  # gradient steps of each agent (a stopped agent keeps its count)


class OffPolicyTask(RLTask):
    """K agents, each learning from its own replay rows (`buffer`). A subclass stores its transitions with
    `buffer.add` and counts its gradient steps in `updates`; what it adds to a checkpoint goes beside the replay's
    (`{**super().algorithm_state(), ...}`), and `keep_agents_` / `resume_algorithm_state` call `super()`."""

    RunProgress = OffPolicyProgress

    def __init__(self, config: Any, parts: TaskParts):
        super().__init__(config, parts)
        self.replay_bytes_per_transition = ReplayBuffer.bytes_per_transition(self.obs_shape, **self.replay_layout())
        self.replay_restored: bool | None = None  # a resumed run: whether its checkpoint held the buffer

    def replay_layout(self) -> dict[str, Any]:
        """How one transition is stored (`ReplayBuffer`'s obs_dtype, action_shape, action_dtype): uint8 frames as uint8
        (4x smaller than float32: the network converts them), other observations as float32; a discrete action as one
        int64, a Box's as float32 [*shape]."""
        obs_dtype = torch.uint8 if self.observation_space.dtype == np.uint8 else torch.float32
        if isinstance(self.action_space, gym.spaces.Box):
            return {"obs_dtype": obs_dtype, "action_shape": tuple(self.action_space.shape), "action_dtype": torch.float32}
        return {"obs_dtype": obs_dtype, "action_shape": (), "action_dtype": torch.int64}

    def on_fit_start(self) -> None:
        super().on_fit_start()
        self.buffer = ReplayBuffer(self.config.buffer_size, self.obs_shape, len(self.slots), device=self.device,
                                   **self.replay_layout())

    def sample_batch(self) -> Transitions:
        """One minibatch per learning agent, [K, B, ...], drawn with its generator."""
        return Transitions(*(x[0] for x in self.buffer.sample(1, self.config.batch_size, self.generators)))

    def replay_worth_saving(self) -> bool:
        """task.save_replay: true, false, or auto: when the learning agents' transitions take at most
        task.replay_save_max_mb together."""
        hp = self.config
        if hp.save_replay == "auto":
            held = self.buffer.n_agents * len(self.buffer) * self.replay_bytes_per_transition
            return held <= hp.replay_save_max_mb * 2**20
        return bool(hp.save_replay)

    def keep_agents_(self, keep: torch.Tensor, keep_slots: list[int], training: bool) -> None:
        if training:
            self.buffer.keep_agents_(keep)

    def algorithm_state(self) -> dict:
        return {"replay": self.buffer.state_dict() if self.replay_worth_saving() else None}

    def resume_algorithm_state(self, state: dict) -> None:
        if self.slots:
            self.replay_restored = state.get("replay") is not None
            if self.replay_restored:
                self.buffer.load_state_dict(state["replay"])

    def final_agent_metrics(self, i: int) -> dict[str, float]:
        return {"train/updates": float(self.updates[i])}

    def algorithm_record(self, i: int) -> dict:
        extras: dict = {"replay_bytes_per_transition": self.replay_bytes_per_transition}
        if self.replay_restored is not None:
            extras["replay_restored_on_resume"] = self.replay_restored
        return extras


class OffPolicyActorCriticTask(OffPolicyTask):
    """K agents with an actor (`net`), critics (`critic`: `critic_class` per agent, twin Q by default) and their targets,
    each learning from its replay rows (SAC, TD3, DDPG).

    Each env step: every agent acts (uniformly at random before `learning_starts`, then `behaviour_actions`), the
    transitions go to its replay rows, and past `learning_starts` it takes one `learn_step` on a minibatch of them. One
    iteration is `ROUND_STEPS` env steps of every agent. Actions are learnt in [-1, 1] and scaled to the env's bounds
    (which the actor keeps) on the way out.

    A subclass sets `actor_contract`, `model_option`, `algorithm`, `checkpoint_format`, `policy`, `loss_functions` (its
    steps' losses as functions of the networks and of noise drawn beforehand: `pipeline.rl.offpolicy`), and writes
    `behaviour_actions` (what the agents play while learning) and `learn_step` (one gradient step, through `losses`,
    `critic_step`, `actor_step` and `update_targets`). `target_actor = True` keeps a Polyak-averaged copy of the actor
    (`actor_target`: TD3, DDPG), checkpointed and shrunk with the rest; `own_optimizers`, `keep_own_`, `own_state` /
    `load_own_state` carry any per-agent state of its own. The optimizer group gives the optimizer (Adam) and nothing
    else: the learning rates are task.policy_lr and task.q_lr (`unused_lr_line`). With `device.compile=true` every loss
    function runs through torch.compile (forward and backward; `compile_over_members`), and an update that compiled is
    booked as compile time, not learn.
    """

    checkpointed_nets = ("net", "agents_net", "critic", "critic_target")
    actor_contract: ClassVar[ModelContract]  # what any actor must have (ours meet it)
    model_option: ClassVar[str]
    loss_functions: ClassVar[dict[str, Callable]]
    #: Each agent's critics: `critic_class(obs_dim, action_dim, hidden=task.critic_hidden)` (TwinQ: Q1 and Q2, stacked
    #: by hand; any other class, DDPG's one `QNet`, stacked generically: `make_offpolicy_agents`).
    critic_class: ClassVar[Callable[..., nn.Module]] = TwinQ
    #: A Polyak-averaged target of the actor (`actor_target`), moved by `update_targets`.
    target_actor: ClassVar[bool] = False
    #: What task.q_lr sets, in the line of an unused optimizer.lr.
    q_lr_sets: ClassVar[str] = "critics"

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.target_actor and "actor_target" not in cls.checkpointed_nets:
            cls.checkpointed_nets = (*cls.checkpointed_nets, "actor_target")

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
                f"(actor) and task.q_lr={hp.q_lr} ({self.q_lr_sets}); set those (and optimizer.lr=null to silence this)")

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
        critic = functools.partial(self.critic_class, hidden=tuple(hp.critic_hidden))
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
        # Critics stacked per agent (TwinQ: every agent's Q1, then every agent's Q2; a generic stack: one member per
        # agent): the optimizer shrinks them so.
        self.critics_per_agent = int(next(self.critic.parameters()).shape[0]) // len(self.agent_seeds)
        self.critic_target = freeze(copy.deepcopy(self.critic))
        if self.target_actor:
            self.actor_target = freeze(copy.deepcopy(net))
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
        n_before, copies = int(self.critic.n_members), self.critics_per_agent
        pairs = self.critic.keep_members_(keep)
        self.critic_target.keep_members_(keep)
        if self.target_actor:
            self.actor_target.keep_members_(keep)
        if training:
            stacked = torch.cat([keep + c * n_before for c in range(copies)])
            keep_optimizer_members_(self.critic_opt, pairs, stacked, copies * n_before)
            self._recent = {k: v.index_select(0, keep) for k, v in self._recent.items()}
        super().keep_agents_(keep, keep_slots, training)
        self.keep_own_(keep, n_before, training)

    def train_metrics(self, slot: int, agent: int) -> dict[str, float]:
        return {k: float(v[slot]) for k, v in self._recent.items()}

    def algorithm_state(self) -> dict:
        return {**super().algorithm_state(),
                "optimizers": {name: opt.state_dict() for name, opt in {"critic": self.critic_opt, **self.own_optimizers()}.items()},
                "recent": {k: v.cpu() for k, v in self._recent.items()}, **self.own_state()}

    def load_algorithm_state(self, state: dict) -> None:
        if self.slots:
            self.load_own_state(state)

    def resume_algorithm_state(self, state: dict) -> None:
        for name, opt in {"critic": self.critic_opt, **self.own_optimizers()}.items():
            opt.load_state_dict(state["optimizers"][name])
        self._recent = {k: v.to(self.device) for k, v in state["recent"].items()}
        super().resume_algorithm_state(state)

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
        step = self.step_envs(self.net.bounds(actions).reshape(K * E, D), acting_since=t0)
        t1 = time.perf_counter()

        def per_step(x: torch.Tensor) -> torch.Tensor:  # [K * E, ...] -> [E, K, ...]: E lockstep transitions per agent
            return self.agent_view(x).transpose(0, 1)

        self.buffer.add(obs.transpose(0, 1), actions.transpose(0, 1), per_step(step.reward), per_step(step.final_obs),
                        per_step(step.terminated))
        self.add_time("env", time.perf_counter() - t1)

    # ---- learning -------------------------------------------------------------------------------
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
        """One optimizer step of every agent's critics on its loss [K] (summed over its critics; their mean and Q1's
        batch mean [K] are logged)."""
        check_finite(loss, self.env_steps, hint="lower task.q_lr")
        self.critic_opt.zero_grad(set_to_none=True)
        loss.sum().backward()
        self.critic_opt.step()
        for agent in self.slots:
            self.updates[agent] += 1
        self._recent["train/q_loss"] = loss.detach() / self.critics_per_agent
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

    def update_targets(self) -> None:
        """Polyak-average the target critics (and `actor_target`) toward the learning networks by task.tau."""
        if self.target_actor:
            soft_update(self.actor_target, self.net, self.config.tau)
        soft_update(self.critic_target, self.critic, self.config.tau)

    def critic_updates(self) -> int:
        """Critic steps so far of the learning agents (they step in lockstep)."""
        return self.updates[self.slots[0]]

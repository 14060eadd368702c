"""Soft Actor-Critic (Haarnoja et al. 2018) for K agents at once (K = 1 is an ordinary run), and the off-policy
actor-critic batch it shares with TD3 (`pipeline.tasks.td3`).

Reads like CleanRL's sac_continuous_action.py with a leading agent axis on every tensor: agent i is seed
`seed + i` with its own squashed-Gaussian actor, twin Q critics and their targets (members i of the stacked
networks of `pipeline.nets.continuous_control`, initialised as the single run of its seed), entropy temperature
(`log_alpha[i]`), Adam moments (one optimizer over stacked weights is K optimizers: every loss is the SUM over
agents of each agent's own loss), replay rows (`pipeline.rl.replay`), envs (rows i*E ... of one vector env) and
random stream (a generator seeded with `seed + i` for its warm-up actions, replay draws and policy noise). Agent i
of a K-agent run therefore trains like the single run of seed `seed + i`, in distribution.

Each env step: every agent acts (uniformly at random before `learning_starts`, then from its policy), the
transitions go to the agents' replay rows, and past `learning_starts` each agent takes one gradient step on
its critics (the soft twin-Q target of `pipeline.rl.offpolicy`), every `policy_frequency`-th step that many
actor and temperature steps, and every `target_network_frequency`-th step a Polyak update of its target
critics. Actions are learnt in [-1, 1] and scaled to the env's bounds on the way out. One Lightning step is
`ROUND_STEPS` env steps of every agent. Every `eval_every` env steps each agent plays deterministic episodes
(tanh of the mean) on separately seeded envs; an agent reaching `stop_at_return` stops learning and leaves the
batch. Durable: `checkpoint_state()` holds weights, targets, temperatures, optimizers, replay buffers (when
under `replay_save_max_mb`), every generator, the envs and the counters.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from typing import ClassVar

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from pipeline.nets.continuous_control import SquashedGaussianActor, TwinQ, make_offpolicy_agents
from pipeline.nets.ensemble import keep_optimizer_members_
from pipeline.rl.envs import env_threshold, make_env
from pipeline.rl.offpolicy import sac_actor_loss, temperature_loss, twin_q_loss, twin_q_target
from pipeline.rl.replay import ReplayBuffer, Transitions
from pipeline.rl.squashed_gaussian import squashed_gaussian_sample
from pipeline.rl.targets import freeze, soft_update
from pipeline.rl.vector import evaluate_agents, make_vector_env
from pipeline.store.checkpoint import rng_state, set_rng_state
from pipeline.tasks.base import Task, TaskParts, check_finite
from pipeline.tasks.configs import SACConfig
from pipeline.tasks.rl_agents import RLAgents

EVAL_SEED_OFFSET = 10_000
FINAL_EVAL_SEED_OFFSET = 20_000
# Env steps (of every agent's envs) per Lightning step: acting and learning interleave step by step inside it.
ROUND_STEPS = 50


@dataclass
class OffPolicyProgress:
    """What an off-policy actor-critic run counts (per agent where a list); checkpointed as it is."""

    env_steps: int = 0  # per agent (lockstep)
    updates: int = 0  # critic steps per agent
    episode_returns: list[list[float]] = field(default_factory=list)
    evaluations: list[list[tuple[int, float, float]]] = field(default_factory=list)
    time_to_threshold_s: list[float | None] = field(default_factory=list)
    early_stop: list[dict | None] = field(default_factory=list)
    stop_step: list[int | None] = field(default_factory=list)
    stop_time_s: list[float | None] = field(default_factory=list)
    stop_updates: list[int | None] = field(default_factory=list)
    last_log_step: int = 0

    @classmethod
    def start(cls, K: int) -> OffPolicyProgress:
        return cls(episode_returns=[[] for _ in range(K)], evaluations=[[] for _ in range(K)], time_to_threshold_s=[None] * K,
                   early_stop=[None] * K, stop_step=[None] * K, stop_time_s=[None] * K, stop_updates=[None] * K)


def box_space_of(task: str, env_id: str, kwargs: dict) -> tuple[tuple[int, ...], gym.spaces.Box]:
    """The observation shape and the (flat, bounded) Box action space of `env_id`; anything else refused in one line."""
    probe = make_env(env_id, **kwargs)
    obs_shape, space = tuple(probe.observation_space.shape), probe.action_space
    probe.close()
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        raise ValueError(f"task={task} needs continuous actions (a flat Box); {env_id} has {space}: use task=dqn or task=ppo")
    if not (np.isfinite(space.low).all() and np.isfinite(space.high).all()):
        raise ValueError(f"task={task} scales actions to the env's bounds and {env_id}'s are not finite ({space}); "
                         "wrap it in gymnasium.wrappers.RescaleAction")
    return obs_shape, space


class OffPolicyActorCriticTask(RLAgents, Task):
    """K agents with an actor, twin critics and their targets, learning from a replay buffer each (SAC, TD3).

    A subclass sets `actor_class`, `name` and `checkpoint_format`, and writes `behaviour_actions` (what the
    agents play while learning) and `learn_step` (one gradient step, after `critic_step`); `algorithm_nets`
    names its other networks (kept, shrunk and checkpointed with the rest), and `_keep_own_`,
    `algorithm_state` / `load_algorithm_state` carry any other per-agent state.
    """

    uses = frozenset({"model", "env"})
    trains_seeds_together = True
    writes_curves = True
    checkpointing = "state"
    primary_metric = "eval/return_mean"
    primary_curve = "eval/return_mean"
    monitorable_metrics = ()
    name: ClassVar[str]
    actor_class: ClassVar[type[nn.Module]]
    model_option: ClassVar[str]
    checkpoint_format: ClassVar[str]
    algorithm_nets: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config, parts: TaskParts):
        super().__init__(config, parts)
        hp = self.config
        actor = parts.require("net", self.name, f"choose the actor with model={self.model_option}")
        env = parts.require("env", self.name, "choose an environment with env=pendulum|halfcheetah|hopper|walker2d")
        if not (isinstance(actor, functools.partial) and isinstance(actor.func, type) and issubclass(actor.func, self.actor_class)):
            raise ValueError(f"task={self.name} needs model={self.model_option} ({self.actor_class.__name__}); "
                             f"got {getattr(actor, 'func', actor)}")
        self.automatic_optimization = False
        self.env_cfg, self.env_id = dict(env), str(env["id"])
        self.obs_shape, space = box_space_of(self.name, self.env_id, dict(env.get("kwargs") or {}))
        self.action_dim = int(space.shape[0])
        bounded = functools.partial(actor, action_low=space.low.tolist(), action_high=space.high.tolist())
        critic = functools.partial(TwinQ, hidden=tuple(hp.critic_hidden))
        self.actor, self.critic = make_offpolicy_agents(bounded, critic, self.agent_seeds, math.prod(self.obs_shape), self.action_dim)
        self.critic_target = freeze(copy.deepcopy(self.critic))
        # `actor` trains the agents still learning (member m is agent slots[m]); `agents_actor` holds every agent's
        # policy for the record, each written when the agent stops or the run ends.
        self.agents_actor = freeze(copy.deepcopy(self.actor))
        self.slots = list(range(self.n_agents))
        self.threshold = float(hp.threshold) if hp.threshold is not None else env_threshold(self.env_id)
        self.capture_video = bool(hp.capture_video)
        self.replay_bytes_per_transition = ReplayBuffer.bytes_per_transition(self.obs_shape, torch.float32, (self.action_dim,), torch.float32)
        self.return_bounds: tuple[float, float] | None = None
        for name, value in vars(OffPolicyProgress.start(self.n_agents)).items():
            setattr(self, name, value)
        self._recent: dict[str, torch.Tensor] = {}  # the last update's statistics, [learning agents]
        self.final_metrics: list[dict[str, float]] = []
        self._elapsed_before = 0.0
        self._t_train_start: float | None = None
        self._train_seconds = 0.0
        self._resume: dict | None = None
        self.replay_restored: bool | None = None

    # ---- what an algorithm writes --------------------------------------------------------------
    def behaviour_actions(self, obs: torch.Tensor) -> torch.Tensor:
        """Actions in [-1, 1] [K, E, D] that the learning agents play on observations [K, E, *obs_shape]."""
        raise TypeError(f"{type(self).__name__} must define behaviour_actions")

    def learn_step(self, batch: Transitions) -> None:
        """One gradient step of every learning agent on its minibatch [K, B, ...]."""
        raise TypeError(f"{type(self).__name__} must define learn_step")

    def algorithm_optimizers(self) -> list[torch.optim.Optimizer]:
        """Optimizers besides the critics' and the actor's (SAC: the temperature's)."""
        return []

    def _keep_own_(self, keep: torch.Tensor, n_before: int, training: bool) -> None:
        """Shrink per-agent state besides the networks to the learning agents `keep`."""

    def algorithm_state(self) -> dict:
        return {}

    def load_algorithm_state(self, state: dict) -> None:
        pass

    # ---- Lightning plumbing --------------------------------------------------------------------
    def configure_optimizers(self):
        hp = self.config
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=hp.q_lr)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=hp.policy_lr)
        return [self.critic_opt, self.actor_opt, *self.algorithm_optimizers()]

    def _optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.critic_opt, self.actor_opt, *self.algorithm_optimizers()]

    def train_dataloader(self) -> DataLoader:
        rounds = math.ceil((self.config.total_steps - self.env_steps) / (ROUND_STEPS * self.config.envs_per_agent))
        return DataLoader(range(max(1, rounds)), batch_size=None, shuffle=False)

    def on_fit_start(self) -> None:
        seeds, E = [self.agent_seeds[a] for a in self.slots], self.config.envs_per_agent
        self.env = make_vector_env(self.env_cfg, seeds, E, device=self.device)
        self.return_bounds = self.env.return_bounds
        self.obs = self.env.reset()
        self.buffer = ReplayBuffer(self.config.buffer_size, self.obs_shape, len(seeds), device=self.device,
                                   action_shape=(self.action_dim,), action_dtype=torch.float32)
        self.generators = [torch.Generator(device=self.device).manual_seed(s) for s in seeds]
        self.episode_return = torch.zeros(len(seeds) * E, device=self.device, dtype=torch.float64)

    def on_train_start(self) -> None:
        if self._resume is not None:
            self._restore_training_state(self._resume)
            self._resume = None
        self._t_train_start = time.perf_counter()

    # ---- acting ---------------------------------------------------------------------------------
    def random_actions(self, E: int) -> torch.Tensor:
        """Warm-up actions, uniform in [-1, 1] [K, E, D], agent k's from its own generator."""
        return torch.stack([torch.rand(E, self.action_dim, generator=g, device=g.device) for g in self.generators]) * 2 - 1

    def act_and_store(self) -> None:
        """One step of every learning agent's envs; the transitions (actions in [-1, 1]) into its replay rows."""
        K, E = len(self.slots), self.config.envs_per_agent
        t0 = time.perf_counter()
        obs = self.obs.view(K, E, *self.obs_shape)
        if self.env_steps < self.config.learning_starts:
            actions = self.random_actions(E)
        else:
            with torch.no_grad():
                actions = self.behaviour_actions(obs)
        env_actions = self.actor.bounds(actions).reshape(K * E, self.action_dim)
        t1 = time.perf_counter()
        step = self.env.step(env_actions)
        t2 = time.perf_counter()

        def per_agent(x: torch.Tensor) -> torch.Tensor:  # [K * E, ...] -> [E, K, ...]
            return x.view(K, E, *x.shape[1:]).transpose(0, 1)

        self.buffer.add(obs.transpose(0, 1), actions.transpose(0, 1), per_agent(step.reward), per_agent(step.final_obs),
                        per_agent(step.terminated))
        self.episode_return = self.episode_return + step.reward
        if bool(step.done.any()):
            for row in step.done.nonzero().view(-1).tolist():
                self.episode_returns[self.slots[row // E]].append(float(self.episode_return[row]))
            self.episode_return = self.episode_return.masked_fill(step.done, 0.0)
        self.obs = step.obs
        self.env_steps += E
        self.add_time("act", t1 - t0)
        self.add_time("env", t2 - t1 + time.perf_counter() - t2)

    # ---- learning -------------------------------------------------------------------------------
    def sample_batch(self) -> Transitions:
        """One minibatch per learning agent, [K, B, ...], drawn with its generator."""
        return Transitions(*(x[0] for x in self.buffer.sample(1, self.config.batch_size, self.generators)))

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
        """One Adam step of every agent's actor on `loss` [K] (summed: each agent gets its own gradient)."""
        self.actor_opt.zero_grad(set_to_none=True)
        loss.sum().backward()
        self.actor_opt.step()
        self._recent["train/actor_loss"] = loss.detach()

    def critic_step(self, batch: Transitions, target: torch.Tensor) -> None:
        """One Adam step of every agent's twin critics toward `target` [K, B]."""
        q1, q2 = self.critic(batch.obs, batch.actions)
        loss = twin_q_loss(q1, q2, target)
        check_finite(loss, self.env_steps, hint="lower task.q_lr")
        self.critic_opt.zero_grad(set_to_none=True)
        loss.sum().backward()
        self.critic_opt.step()
        self.updates += 1
        self._recent["train/q_loss"] = loss.detach() / 2
        self._recent["train/q_mean"] = q1.detach().mean(-1)

    def training_step(self, batch, batch_idx):
        hp = self.config
        E = hp.envs_per_agent
        if self.env_steps >= hp.total_steps or not self.slots:
            self.trainer.should_stop = True
            return None
        before = self.env_steps
        for _ in range(min(ROUND_STEPS, math.ceil((hp.total_steps - self.env_steps) / E))):
            self.act_and_store()
            if self.env_steps > hp.learning_starts:
                t0 = time.perf_counter()
                self.learn_step(self.sample_batch())
                self.add_time("learn", time.perf_counter() - t0)
        if self.env_steps - self.last_log_step >= hp.log_every:
            self.log_progress()
        if self.env_steps // hp.eval_every != before // hp.eval_every:
            self.evaluate_now()
        if not self.slots:
            self.trainer.should_stop = True
        if self.checkpoint_hook is not None:
            self.checkpoint_hook()
        return None

    # ---- the batch of agents --------------------------------------------------------------------
    def learning_agents(self) -> list[int]:
        return list(self.slots)

    def _nets(self) -> tuple[str, ...]:
        return ("actor", "critic", "critic_target", *self.algorithm_nets)

    def stop_agents(self, stopping: list[int], reasons: dict[int, str]) -> None:
        elapsed = self.elapsed_s()
        for slot in stopping:
            agent = self.slots[slot]
            self.agents_actor.load_member_state_dict(agent, self.actor.member_state_dict(slot))
            self.stop_step[agent], self.stop_time_s[agent], self.stop_updates[agent] = self.env_steps, elapsed, self.updates
            self.early_stop[agent] = {"env_step": self.env_steps, "reason": reasons[slot]}
        keep = [s for s in range(len(self.slots)) if s not in stopping]
        if keep:
            self._keep_slots(keep)
        else:
            self.slots = []

    def _keep_slots(self, keep_slots: list[int], training: bool = True) -> None:
        """Shrink the batch to `keep_slots`; `training`: the optimizers, envs, buffers and generators exist and shrink too."""
        keep = torch.tensor(keep_slots, device=self.device)
        n_before, E = len(self.slots), self.config.envs_per_agent
        pairs = {name: getattr(self, name).keep_members_(keep) for name in self._nets()}
        if training:
            keep_optimizer_members_(self.actor_opt, pairs["actor"], keep, n_before)
            # The critics stack every agent's q1, then every agent's q2: 2K members.
            keep_optimizer_members_(self.critic_opt, pairs["critic"], torch.cat([keep, keep + n_before]), 2 * n_before)
            rows = (keep.view(-1, 1) * E + torch.arange(E, device=self.device)).view(-1)
            self.env.keep_envs_(rows)
            self.buffer.keep_agents_(keep)
            self.obs = self.obs.index_select(0, rows)
            self.episode_return = self.episode_return.index_select(0, rows)
            self.generators = [self.generators[s] for s in keep_slots]
            self._recent = {k: v.index_select(0, keep) for k, v in self._recent.items()}
        self._keep_own_(keep, n_before, training)
        self.slots = [self.slots[s] for s in keep_slots]

    # ---- evaluation and logging -----------------------------------------------------------------
    def deterministic_returns(self, n_episodes: int, seed_offset: int, learning_only: bool = False) -> np.ndarray:
        """[agents, n_episodes] returns of the deterministic policies, on envs seeded apart from training."""
        if learning_only:
            net, agents = self.actor, list(self.slots)
        else:
            self.sync_agents_actor()
            net, agents = self.agents_actor, list(range(self.n_agents))
        returns = evaluate_agents(net, self.env_cfg, [self.agent_seeds[a] for a in agents], n_episodes, seed_offset, device=self.device)
        return returns.double().cpu().numpy()

    def sync_agents_actor(self) -> None:
        for slot, agent in enumerate(self.slots):
            self.agents_actor.load_member_state_dict(agent, self.actor.member_state_dict(slot))

    def evaluate_now(self) -> None:
        t0 = time.perf_counter()
        returns = self.deterministic_returns(self.config.eval_episodes, EVAL_SEED_OFFSET, learning_only=True)
        self.add_time("eval", time.perf_counter() - t0)
        elapsed, stop = self.elapsed_s(), self.config.stop_at_return
        stopping, reasons = [], {}
        for slot, agent in enumerate(self.slots):
            mean = float(returns[slot].mean())
            self.note_evaluation(agent, mean, float(returns[slot].std()), elapsed)
            if stop is not None and mean >= stop:
                stopping.append(slot)
                reasons[slot] = f"deterministic evaluation mean {mean:.1f} >= stop_at_return {stop}"
        if self.n_agents > 1:
            self._log_shared({"batch/eval_return_mean": float(returns.mean()), "batch/agents_learning": float(len(self.slots))})
        self.record_training_videos(self.actor.member_state_dict)
        if self.pruned_by_tuner():
            stopping = list(range(len(self.slots)))
            reasons = dict.fromkeys(stopping, "pruned by the tuner")
        if stopping:
            self.stop_agents(stopping, reasons)

    def agent_env_steps(self, i: int) -> int:
        return self.stop_step[i] if self.stop_step[i] is not None else self.env_steps

    def total_env_steps(self) -> int:
        return sum(self.agent_env_steps(i) for i in range(self.n_agents))

    def log_progress(self) -> None:
        t0 = time.perf_counter()
        elapsed = max(self.elapsed_s(), 1e-9)
        recent = {k: v.cpu().tolist() for k, v in self._recent.items()}
        for slot, agent in enumerate(self.slots):
            row = {"perf/env_steps_per_s": self.env_steps / elapsed}
            if self.episode_returns[agent]:
                row["train/episodic_return"] = float(np.mean(self.episode_returns[agent][-10:]))
            row.update({k: float(v[slot]) for k, v in recent.items()})
            self._agent_row(agent, row)
        if self.n_agents > 1:
            self._log_shared({"batch/env_steps_per_s": self.total_env_steps() / elapsed})
        self.last_log_step = self.env_steps
        self.add_time("log", time.perf_counter() - t0)

    def on_train_end(self) -> None:
        self._train_seconds = self.elapsed_s()
        if self.slots and self.env_steps != self.last_log_step:
            self.log_progress()
        self.sync_agents_actor()
        if self.checkpoint_hook is not None:
            self.checkpoint_hook(final=True)

    # ---- checkpoints ----------------------------------------------------------------------------
    def _replay_worth_saving(self) -> bool:
        if self.config.save_replay == "auto":
            held = self.buffer.n_agents * len(self.buffer) * self.replay_bytes_per_transition
            return held <= self.config.replay_save_max_mb * 2**20
        return bool(self.config.save_replay)

    def checkpoint_state(self) -> dict:
        """Everything needed to continue exactly where the run is (plain values: weights_only loads)."""
        return {
            "format": self.checkpoint_format, "agent_seeds": self.agent_seeds, "config": asdict(self.config),
            "slots": list(self.slots), "progress": copy.deepcopy({f.name: getattr(self, f.name) for f in fields(OffPolicyProgress)}),
            "recent": {k: v.cpu() for k, v in self._recent.items()},
            "elapsed_s": self.elapsed_s(), "time_breakdown_s": dict(self.time_breakdown_s),
            "nets": {name: getattr(self, name).state_dict() for name in (*self._nets(), "agents_actor")},
            "optimizers": [opt.state_dict() for opt in self._optimizers()],
            "algorithm": self.algorithm_state(),
            "generators": [g.get_state() for g in self.generators], "rng": rng_state(),
            "env": self.env.state_dict(), "obs": self.obs.cpu(), "episode_return": self.episode_return.cpu(),
            "replay": self.buffer.state_dict() if self._replay_worth_saving() else None,
        }

    @property
    def resume_step(self) -> int:
        return self.env_steps

    def load_checkpoint_state(self, state: dict) -> int:
        """Before fit: which agents still learn, the weights and counters; optimizers, RNGs, envs and replay at train start."""
        self.check_checkpoint(state, self.checkpoint_format)
        slots = [int(s) for s in state["slots"]]
        if slots and slots != self.slots:
            self._keep_slots([self.slots.index(s) for s in slots], training=False)
        self.slots = slots
        for name in (*self._nets(), "agents_actor") if slots else ("agents_actor",):
            try:
                getattr(self, name).load_state_dict(state["nets"][name])
            except RuntimeError as exc:
                raise ValueError(f"checkpoint weights do not fit this model (changed model.* since?): {str(exc).splitlines()[0]}") from None
        for f in fields(OffPolicyProgress):
            setattr(self, f.name, copy.deepcopy(state["progress"][f.name]))
        self._recent = {k: v.to(self.device) for k, v in state["recent"].items()}
        if slots:
            self.load_algorithm_state(state["algorithm"])
        self._elapsed_before = float(state["elapsed_s"])
        self.time_breakdown_s = dict(state.get("time_breakdown_s") or {})
        self._resume = state
        return self.env_steps

    def _restore_training_state(self, state: dict) -> None:
        for opt, saved in zip(self._optimizers(), state["optimizers"], strict=True):
            opt.load_state_dict(saved)
        if self.slots:
            for g, s in zip(self.generators, state["generators"], strict=True):
                g.set_state(s)
            self.env.load_state_dict(state["env"])
            self.obs = state["obs"].to(self.device)
            self.episode_return = state["episode_return"].to(self.device)
            self.replay_restored = state["replay"] is not None
            if self.replay_restored:
                self.buffer.load_state_dict(state["replay"])
        set_rng_state(state["rng"])

    # ---- the contract with the lifecycle ----------------------------------------------------------
    def fit_and_evaluate(self, trainer, datamodule, ckpt_path) -> list[dict[str, float]]:
        if self.env_steps < self.config.total_steps and self.slots:
            trainer.fit(self)
        t0 = time.perf_counter()
        returns = self.deterministic_returns(self.config.final_eval_episodes, FINAL_EVAL_SEED_OFFSET)
        self.add_time("final_eval", time.perf_counter() - t0)
        self.final_metrics = []
        for i in range(self.n_agents):
            final = {"eval/return_mean": float(returns[i].mean()), "eval/return_std": float(returns[i].std())}
            self._agent_row(i, {f"final_{k}": v for k, v in final.items()}, step=self.agent_env_steps(i))
            updates = self.stop_updates[i] if self.stop_updates[i] is not None else self.updates
            self.final_metrics.append({**final, "train/episodes": float(len(self.episode_returns[i])), "train/updates": float(updates)})
        if self.n_agents > 1:
            self._log_shared({"batch/final_eval_return_mean": float(returns.mean())})
        if hasattr(self, "env"):
            self.env.close()
        return self.final_metrics

    def agent_record(self, i: int) -> dict:
        seconds = self.stop_time_s[i] if self.stop_time_s[i] is not None else self._train_seconds
        extras = self.rl_record(i, self.agent_env_steps(i), seconds)
        extras.update(early_stop=self.early_stop[i], replay_bytes_per_transition=self.replay_bytes_per_transition)
        if self.n_agents > 1:
            extras["batch_env_steps_per_s"] = round(self.total_env_steps() / self._train_seconds, 1) if self._train_seconds else None
        if self.replay_restored is not None:
            extras["replay_restored_on_resume"] = self.replay_restored
        return extras

    def agent_state_dict(self, i: int) -> dict[str, torch.Tensor]:
        """Agent i's policy as the plain actor's state_dict (what model.pt holds; `python -m pipeline.eval` plays it)."""
        state = self.actor.member_state_dict(self.slots.index(i)) if i in self.slots else self.agents_actor.member_state_dict(i)
        return {k: v.detach().cpu() for k, v in state.items()}


class SACTask(OffPolicyActorCriticTask):
    """SAC: a squashed-Gaussian actor, twin soft Q critics, and (autotune) a temperature per agent."""

    Config = SACConfig
    name = "sac"
    actor_class = SquashedGaussianActor
    model_option = "squashed_gaussian_actor"
    checkpoint_format = "pipeline.sac/1"

    def __init__(self, config: SACConfig, parts: TaskParts):
        super().__init__(config, parts)
        hp = self.config
        if hp.autotune and hp.alpha <= 0:
            raise ValueError(f"task.alpha={hp.alpha} is autotune's start value and must be > 0; e.g. task.alpha=1.0")
        start = math.log(hp.alpha) if hp.alpha > 0 else -math.inf
        # One temperature per agent; a plain tensor when it is not tuned.
        self.log_alpha = nn.Parameter(torch.full((self.n_agents,), start), requires_grad=bool(hp.autotune))
        self.target_entropy = float(hp.target_entropy) if hp.target_entropy is not None else -float(self.action_dim)

    def algorithm_optimizers(self) -> list[torch.optim.Optimizer]:
        if not self.config.autotune:
            return []
        if getattr(self, "alpha_opt", None) is None:
            self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=self.config.q_lr)
        return [self.alpha_opt]

    def configure_optimizers(self):
        self.alpha_opt = None
        return super().configure_optimizers()

    def behaviour_actions(self, obs: torch.Tensor) -> torch.Tensor:
        mean, log_std = self.actor.distribution(obs)
        return squashed_gaussian_sample(mean, log_std, self.generators)[0]

    def learn_step(self, batch: Transitions) -> None:
        hp = self.config
        alpha = self.log_alpha.detach().exp()
        with torch.no_grad():
            next_actions, next_log_prob = squashed_gaussian_sample(*self.actor.distribution(batch.next_obs), self.generators)
            next_q1, next_q2 = self.critic_target(batch.next_obs, next_actions)
            target = twin_q_target(batch.rewards, batch.dones, next_q1, next_q2, hp.gamma, next_log_prob, alpha)
        self.critic_step(batch, target)
        if self.updates % hp.policy_frequency == 0:
            # Delayed, as CleanRL: policy_frequency actor (and temperature) steps every policy_frequency critic steps.
            for _ in range(hp.policy_frequency):
                with self.critics_frozen():
                    actions, log_prob = squashed_gaussian_sample(*self.actor.distribution(batch.obs), self.generators)
                    self.actor_step(sac_actor_loss(*self.critic(batch.obs, actions), log_prob, alpha))
                log_prob = log_prob.detach()
                if hp.autotune:
                    alpha_loss = temperature_loss(self.log_alpha, log_prob, self.target_entropy)
                    self.alpha_opt.zero_grad(set_to_none=True)
                    alpha_loss.sum().backward()
                    self.alpha_opt.step()
                    alpha = self.log_alpha.detach().exp()
            self._recent["train/entropy"] = -log_prob.mean(-1)
        self._recent["train/alpha"] = alpha
        if self.updates % hp.target_network_frequency == 0:
            soft_update(self.critic_target, self.critic, hp.tau)

    def _keep_own_(self, keep: torch.Tensor, n_before: int, training: bool) -> None:
        old = self.log_alpha
        self.log_alpha = nn.Parameter(old.detach().index_select(0, keep), requires_grad=old.requires_grad)
        if training and self.config.autotune:
            keep_optimizer_members_(self.alpha_opt, [(old, self.log_alpha)], keep, n_before)

    def algorithm_state(self) -> dict:
        return {"log_alpha": self.log_alpha.detach().cpu().clone()}

    def load_algorithm_state(self, state: dict) -> None:
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])

    def agent_record(self, i: int) -> dict:
        extras = super().agent_record(i)
        if i in self.slots:
            extras["alpha"] = float(self.log_alpha.detach()[self.slots.index(i)].exp())
        return extras

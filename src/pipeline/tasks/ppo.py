"""Proximal Policy Optimization (Schulman et al. 2017) for K agents at once (K = 1 is an ordinary run).

Reads top to bottom like CleanRL's ppo.py / ppo_continuous_action.py, with a leading agent axis on
every tensor: agent i is seed `seed + i` with its own actor-critic (member i of an
`EnsembleActorCritic`, or of a `StackedActorCritic` for a module of the user's own meeting
`pipeline.nets.contracts.PPO`, initialised as the single run of its seed), Adam state (one optimizer over the
stacked weights is K optimizers: the loss is the SUM over agents of each agent's own loss and
gradients are clipped per agent), envs (rows i*E ... of one vector env), minibatch shuffles (a
generator seeded with `seed + i`) and, where asked, running observation and return statistics. Agent
i of a K-agent run therefore trains like the single run of seed `seed + i`, in distribution (the
action noise comes from the process's global generator, so not bitwise).

One Lightning step is one PPO iteration: `num_steps` lockstep steps of every agent's
`envs_per_agent` envs, GAE(lambda) over the rollout (a truncated step bootstraps from the value of
its final observation, a terminated one from nothing: `pipeline.rl.ppo`), then `update_epochs`
passes over `num_minibatches` shuffled minibatches. The run is `total_steps // (num_steps *
envs_per_agent)` iterations, with the learning rate annealed linearly over them when `anneal_lr`.
Every `eval_every` env steps each agent plays deterministic episodes (the most likely action, or the
Gaussian's mean clipped to the bounds) on separately seeded envs; RLTask's stop rule takes an agent out of
the batch once its evaluation shows `stop_at_return`.

Everything around the algorithm (the K-agent batch, evaluation and the stop rule, logging, checkpoints, records)
is `pipeline.tasks.rl_task.RLTask`'s; this file is the algorithm: a rollout (`Rollout`), its advantages and the
update, through RLTask's hooks. A checkpoint adds the observation and return statistics to RLTask's.
"""

from __future__ import annotations

import functools
import gc
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from pipeline.nets import contracts
from pipeline.nets.actor_critic import (
    categorical_log_prob,
    categorical_log_prob_and_entropy,
    categorical_sample_given,
    gaussian_entropy,
    gaussian_log_prob,
    gaussian_sample_given,
)
from pipeline.nets.actor_critic_cnn import ActorCriticCNN, EnsembleActorCriticCNN
from pipeline.nets.ensemble import (
    EnsembleActorCritic,
    clip_grad_norm_per_member_,
    compile_over_members,
    compiled_graphs,
    make_ensemble,
    stacked_optimizer,
)
from pipeline.nets.stacked import StackedActorCritic, check_outputs
from pipeline.rl.policies import ActorCriticPolicy
from pipeline.rl.ppo import (
    RewardScaler,
    RunningMeanStd,
    annealed_lr,
    bootstrap_values,
    clipped_surrogate_loss,
    gae,
    minibatch_indices,
    normalize_advantages,
    ppo_loss,
    ratio_diagnostics,
    value_loss,
)
from pipeline.rl.tensor_env import TensorClock, TensorEnv
from pipeline.rl.vector import TensorVectorEnv
from pipeline.store.layout import OBS_NORM
from pipeline.tasks.base import TaskParts, check_finite
from pipeline.tasks.configs import PPOConfig
from pipeline.tasks.rl_task import RLProgress, RLTask


def check_action_space(env_id: str, act_space: gym.spaces.Space) -> None:
    """Action spaces PPO cannot act in, each refused in one line that says what to change."""
    if isinstance(act_space, gym.spaces.Box):
        low, high = np.asarray(act_space.low, dtype=np.float64), np.asarray(act_space.high, dtype=np.float64)
        if not (np.isfinite(low).all() and np.isfinite(high).all()):
            raise ValueError(
                f"task=ppo clips Gaussian actions to the action bounds, and {env_id}'s are not finite ({act_space}); "
                "rescale its actions to a bounded Box (gymnasium.wrappers.RescaleAction) or choose another env"
            )
        if len(act_space.shape) != 1:
            raise ValueError(f"task=ppo takes flat Box actions (shape (D,)); {env_id} has {act_space}")
    elif not isinstance(act_space, gym.spaces.Discrete):
        raise ValueError(f"task=ppo takes Discrete or Box action spaces; {env_id} has {act_space}")


def log_prob_and_entropy(net: nn.Module, continuous: bool, params: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(a) and the entropy [K, M] of the policy with parameters `params` [K, M, A] (a Gaussian's log-std: the net's)."""
    if continuous:
        log_std = net.log_std.value
        return gaussian_log_prob(params, log_std, actions), gaussian_entropy(params, log_std)
    return categorical_log_prob_and_entropy(params, actions)


def minibatch_losses(
    net: nn.Module, hp: PPOConfig, continuous: bool, idx: torch.Tensor | None, obs: torch.Tensor, actions: torch.Tensor,
    old_log_probs: torch.Tensor, advantages: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """One minibatch through the K-agent `net`: (loss, policy loss, value loss, entropy) per agent, [K] each, the new
    log-probabilities [K, M] and the old ones they are compared with. The loss summed over agents gives each agent its
    own gradient. `idx` [K, M]: each agent's minibatch rows of the rollout [K, N, ...] (None: all of it in order),
    gathered here so that a compiled update fuses the gathers.

    A plain function of its arguments (the networks among them), so that torch.compile sees the parameters as inputs
    whose member axis may shrink (`pipeline.nets.ensemble.compile_over_members`)."""
    if idx is not None:
        rows = torch.arange(idx.shape[0], device=idx.device).unsqueeze(1)
        obs, actions, old_log_probs, advantages, old_values, returns = (
            x[rows, idx] for x in (obs, actions, old_log_probs, advantages, old_values, returns))
    policy_params, new_values = net(obs)
    new_log_probs, entropy = log_prob_and_entropy(net, continuous, policy_params, actions)
    adv = normalize_advantages(advantages) if hp.norm_adv else advantages
    pg = clipped_surrogate_loss(new_log_probs, old_log_probs, adv, hp.clip_coef)
    vl = value_loss(new_values, old_values, returns, hp.clip_coef if hp.clip_value_loss else None)
    ent = entropy.mean(-1)
    return ppo_loss(pg, vl, ent, hp.vf_coef, hp.ent_coef), pg, vl, ent, new_log_probs, old_log_probs


def act(net: nn.Module, continuous: bool, obs: torch.Tensor, noise: torch.Tensor,
        bounds: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, ...]:
    """A rollout step's policy for K agents: (actions [K, E(, D)] as sampled, their log-probabilities [K, E], values
    [K, E], what the env is sent). `noise`: the draws to sample from (`PPOTask.action_noise`): actions are
    `categorical_sample_given(logits, noise)` or `gaussian_sample_given(mean, log_std, noise)`, a Gaussian's clipped to
    `bounds` (low, high) for the env (its log-probability stays the sample's)."""
    params, values = net(obs)
    actions, log_probs = sample_given(params, net.log_std.value if continuous else None, noise)
    if continuous:
        low, high = bounds
        return actions, log_probs, values, torch.maximum(torch.minimum(actions, high), low)
    return actions, log_probs, values, actions


def sample_given(params: torch.Tensor, log_std: torch.Tensor | None, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Actions of the policy with parameters `params` [K, N, A] (a Gaussian's mean with `log_std`, or logits when
    None) drawn from `noise`, and their log-probabilities [K, N]."""
    if log_std is not None:
        actions = gaussian_sample_given(params, log_std, noise)
        return actions, gaussian_log_prob(params, log_std, actions)
    actions = categorical_sample_given(params, noise)
    return actions, categorical_log_prob(params, actions)


# Steps of a tensor-env rollout per `lockstep_chunk` call (the largest divisor of num_steps up to this): one compiled
# call's fixed cost (guards, wrappers: ~150 us at K = 64) is paid once per chunk; PPO K = 64's compiled rollout step
# measured 415 us a step one at a time, 263 us in chunks of 4, 261 in chunks of 8 (compile 3.5 / 8.5 / 15.7 CPU s).
ROLLOUT_CHUNK = 4


def lockstep_chunk(
    net: nn.Module, env: TensorEnv, continuous: bool, obs: torch.Tensor, noises: torch.Tensor,
    bounds: tuple[torch.Tensor, torch.Tensor] | None,
    episode_return: torch.Tensor, rows: torch.Tensor, elapsed: torch.Tensor, episodes: torch.Tensor, keys: torch.Tensor,
    gate_resets: bool = False,
) -> tuple:
    """`noises.shape[0]` (S) successive rollout steps from `obs` [K, E, ...] as one function of tensors (one compiled
    graph with `device.compile=true`). A step: `act` on the draws `noises[s]`, the env's `transition` from the clock
    (rows, elapsed, episodes, keys) with auto-reset, the running episode returns [K * E] (float64). Returns (the steps'
    fields stacked [S, ...]: the observations the nets saw, actions, log_probs, values, and the env's reward, terminated,
    truncated, final_obs, done, the returns as they stand after each step; the env's observations after the last step
    [K * E, ...]; the running returns with finished episodes restarted; the next clock). Observations are fed from one
    step to the next as the env gives them: a caller that normalises them calls it with S = 1. Branch-free unless
    `gate_resets` (eager only), so torch.compile makes it one graph."""
    fields = []
    for s in range(noises.shape[0]):
        actions, log_probs, values, env_actions = act(net, continuous, obs, noises[s], bounds)
        clock, step = env.transition(TensorClock(rows, elapsed, episodes, keys), env_actions.reshape(rows.shape[1], *actions.shape[2:]), gate_resets)
        rows, elapsed, episodes = clock.rows, clock.elapsed, clock.episodes
        returns = episode_return + step.reward
        episode_return = returns.masked_fill(step.done, 0.0)
        fields.append((obs, actions, log_probs, values, step.reward, step.terminated, step.truncated, step.final_obs, step.done, returns))
        next_obs = step.obs
        obs = next_obs.reshape(obs.shape)
    stacked = tuple(torch.stack(field) for field in zip(*fields))
    return stacked, next_obs, episode_return, TensorClock(rows, elapsed, episodes, keys)


class Rollout(NamedTuple):
    """One rollout of the learning agents, time-major [T, K, E, ...] (K: the agents learning, E: envs per agent)."""

    obs: torch.Tensor  # what the networks saw (normalised where asked)
    actions: torch.Tensor  # as sampled (a Gaussian's unclipped)
    log_probs: torch.Tensor
    values: torch.Tensor
    rewards: torch.Tensor  # as learned from (scaled where asked)
    terminated: torch.Tensor
    truncated: torch.Tensor
    final_values: torch.Tensor  # V(final observation) where truncated, 0 elsewhere
    last_values: torch.Tensor  # [K, E]: V(observation after the rollout)


@dataclass
class PPOProgress(RLProgress):
    updates: int = 0  # iterations done (each one update of every learning agent)
    recent: dict[str, list[float]] = field(default_factory=dict)  # the last update's losses, per learning slot


class PPOTask(RLTask):
    Config = PPOConfig
    algorithm = "ppo"
    checkpoint_format = "pipeline.ppo/3"  # 3: RLTask's skeleton (progress as one dict)
    RunProgress = PPOProgress
    policy = ActorCriticPolicy
    frames_in = False  # the network takes uint8 frames (model=actor_critic_cnn)

    def __init__(self, config: PPOConfig, parts: TaskParts):
        super().__init__(config, parts)
        hp = self.config
        if self.continuous:
            self.register_buffer("action_low", torch.as_tensor(self.action_space.low, dtype=torch.float32), persistent=False)
            self.register_buffer("action_high", torch.as_tensor(self.action_space.high, dtype=torch.float32), persistent=False)
        self.batch_per_agent = hp.num_steps * hp.envs_per_agent
        self.n_updates = hp.total_steps // self.batch_per_agent
        K = self.n_agents
        self.obs_stats = RunningMeanStd(K, self.obs_shape) if hp.normalize_obs else None
        self.reward_scaler = RewardScaler(K, hp.envs_per_agent, hp.gamma, hp.reward_clip) if hp.normalize_reward else None
        self.base_lr: float | None = None
        self.compiled_losses = None  # `minibatch_losses` through torch.compile (device.compile=true), made on first use
        self.compile_s = 0.0  # seconds spent compiling the update so far
        self.compiled_rollout_step = None  # `lockstep_chunk` through torch.compile (device.compile=true, tensor envs)
        self.compile_rollout = True  # False: device.compile=true compiles the update only (benchmarks/bench_compile.py)

    # ---- RLTask's hooks ---------------------------------------------------------------------------
    def build_net(self, parts: TaskParts) -> nn.Module:
        net = parts.require("net", "ppo", "choose the network with model=actor_critic")
        act_space = self.action_space
        check_action_space(self.env_id, act_space)
        self.continuous = isinstance(act_space, gym.spaces.Box)
        self.action_shape = tuple(act_space.shape) if self.continuous else ()
        n_out = int(act_space.shape[0]) if self.continuous else int(act_space.n)
        kind = net.func if isinstance(net, functools.partial) and isinstance(net.func, type) else None
        factory = functools.partial(net, continuous=self.continuous)
        if kind is not None and issubclass(kind, ActorCriticCNN):
            if self.config.normalize_obs:
                raise ValueError("model=actor_critic_cnn scales uint8 frames by 1/255 itself; set task.normalize_obs=false")
            self.frames_in = True
            if kind is ActorCriticCNN:  # a subclass may change forward: stacked generically below
                return EnsembleActorCriticCNN.from_factory(factory, self.agent_seeds, self.obs_shape, n_out)
        # Our ActorCritic as a hand-written ensemble; any other module stacked generically (nets/stacked.py), under
        # the contract of `pipeline.nets.contracts.PPO`.
        duty = f"model=actor_critic or a model of your own: {contracts.PPO.describe()}"
        try:
            ensemble = make_ensemble(factory, self.agent_seeds, self.obs_shape, n_out, stacked=StackedActorCritic)
        except TypeError as exc:  # the model's constructor refused the task's keywords
            raise ValueError(f"task=ppo needs {duty}; building {getattr(net, 'func', net)} failed: {exc}") from None
        if not isinstance(ensemble, EnsembleActorCritic | StackedActorCritic):
            raise ValueError(f"task=ppo needs {duty}; got {type(ensemble).__name__} (no critic): use model=actor_critic")
        check_outputs(ensemble, "ppo", duty, self.obs_shape, [("N", n_out), ("N",)])
        if self.continuous and isinstance(ensemble, StackedActorCritic):
            log_std = ensemble.log_std
            if log_std is None or tuple(log_std.value.shape) != (ensemble.n_members, 1, n_out):
                raise ValueError(f"task=ppo needs {duty}; {type(ensemble.module).__name__} has no parameter log_std.value "
                                 f"of shape [{n_out}] for its continuous actions")
        return ensemble

    def configure_optimizers(self):
        optimizer = stacked_optimizer(self.optimizer_factory, self.net.parameters())
        self.base_lr = float(optimizer.param_groups[0]["lr"])
        return optimizer

    def on_fit_start(self) -> None:
        super().on_fit_start()
        if self._resume is None and self.obs_stats is not None:  # a fresh run: every agent learns
            self.obs_stats.update(self.agent_view(self.obs))

    def iterations_left(self) -> int:
        return self.n_updates - self.updates

    def iterate(self) -> None:
        compile_at_start = self.compile_s
        rollout = self.rollout()  # books its own compiling
        t0 = time.perf_counter()
        compile_before = self.compile_s
        self.learn(rollout)
        compiling = self.compile_s - compile_before
        self.add_time("learn", time.perf_counter() - t0 - compiling)
        if self.compile_s != compile_at_start:
            # Compiling leaves ~10^5 objects behind: collected now, as part of the compile, rather than by a full
            # collection later in the loop (~0.2 s once at K = 64).
            t1 = time.perf_counter()
            gc.collect()
            collecting = time.perf_counter() - t1
            self.compile_s += collecting
            compiling += collecting
        if compiling:
            self.add_time("compile", compiling)

    def keep_agents_(self, keep: torch.Tensor, keep_slots: list[int], training: bool) -> None:
        # The observation statistics stay for all K (a stopped agent's policy is scored with its own, frozen).
        if self.reward_scaler is not None:
            self.reward_scaler.keep_agents_(keep)
        self.recent = {k: [v[s] for s in keep_slots] for k, v in self.recent.items()}

    def train_metrics(self, slot: int, agent: int) -> dict[str, float]:
        return {key: float(values[slot]) for key, values in self.recent.items()}

    def algorithm_state(self) -> dict:
        return {"obs_stats": None if self.obs_stats is None else self.obs_stats.state_dict(),
                "reward_scaler": None if self.reward_scaler is None else self.reward_scaler.state_dict()}

    def load_algorithm_state(self, state: dict) -> None:
        if self.obs_stats is not None:
            self.obs_stats.load_state_dict(state["obs_stats"])
        if self.reward_scaler is not None:
            self.reward_scaler.load_state_dict(state["reward_scaler"])

    def final_agent_metrics(self, i: int) -> dict[str, float]:
        # Every iteration is one update of each learning agent: an agent's updates follow from its env steps.
        return {"train/updates": float(self.agent_env_steps(i) // self.batch_per_agent)}

    def agent_files(self, i: int) -> dict[str, dict[str, torch.Tensor]]:
        """With normalize_obs, agent i's observation statistics (`OBS_NORM`): its policy sees nothing without them."""
        if self.obs_stats is None:
            return {}
        return {OBS_NORM: self.obs_stats.agent_state(i, self.config.obs_clip)}

    # ---- the policy ----------------------------------------------------------------------------
    def net_input(self, obs: torch.Tensor, agents: torch.Tensor | None = None) -> torch.Tensor:
        """Observations [K, N, *obs_shape] as the networks see them: normalised by each agent's statistics, when asked
        (`agents`: whose rows these are, None for all K in order); a CNN's uint8 frames as they are."""
        if self.frames_in:  # uint8 frames, scaled inside the CNN: the rollout keeps them uint8
            return obs
        obs = obs.float()
        return obs if self.obs_stats is None else self.obs_stats.normalize(obs, self.config.obs_clip, agents=agents)

    def sample(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Actions drawn from the policy with parameters `params` [K, N, A], and their log-probabilities [K, N]."""
        noise = (torch.randn if self.continuous else torch.rand)(params.shape, device=params.device, dtype=params.dtype)
        return sample_given(params, self.net.log_std.value if self.continuous else None, noise)

    def action_noise(self, K: int, E: int) -> torch.Tensor:
        """The draws one rollout step samples its actions from (`act`): a uniform per logit, or a standard normal per
        action dimension, [K, E, A], from the process's global generator."""
        if self.continuous:
            return torch.randn(K, E, *self.action_shape, device=self.device)
        return torch.rand(K, E, int(self.action_space.n), device=self.device)

    # ---- the algorithm ---------------------------------------------------------------------
    @torch.no_grad()
    def rollout(self) -> Rollout:
        """`num_steps` lockstep steps of every learning agent's envs; returns the rollout, time-major [T, K, E, ...].
        A tensor env's rollout is `tensor_rollout`'s."""
        hp = self.config
        K, E, T = len(self.slots), hp.envs_per_agent, hp.num_steps
        agents = self.slot_index()
        if isinstance(self.env, TensorVectorEnv):
            return self.tensor_rollout(self.env.env)
        steps: list[tuple[torch.Tensor, ...]] = []  # a step's Rollout fields but the last
        finished_returns: list[torch.Tensor] = []
        finished: list[torch.Tensor] = []
        t_act = t_env = 0.0
        for _ in range(T):
            t0 = time.perf_counter()
            obs = self.net_input(self.agent_view(self.obs), agents)
            noise = self.action_noise(K, E)
            actions, log_probs, values, env_actions = act(self.net, self.continuous, obs, noise, self.action_low_high())
            t1 = time.perf_counter()
            step = self.env.step(env_actions.reshape(K * E, *self.action_shape))
            t2 = time.perf_counter()
            returns = self.add_rewards(step.reward, step.done)
            if self.obs_stats is not None:
                self.obs_stats.update(self.agent_view(step.obs), agents)
            rewards = self.agent_view(step.reward)
            learn_rewards = rewards if self.reward_scaler is None else self.reward_scaler(rewards, self.agent_view(step.done))
            truncated = self.agent_view(step.truncated)
            final_values = torch.zeros_like(values)
            if bool(truncated.any()):
                # Where the time limit cut an episode, its last step is worth V(where it really got to).
                _, final_values = self.net(self.net_input(self.agent_view(step.final_obs), agents))
            finished_returns.append(returns)
            finished.append(step.done)
            steps.append((obs, actions, log_probs, values, learn_rewards, self.agent_view(step.terminated), truncated, final_values))
            self.obs = step.obs
            t_act += t1 - t0
            t_env += t2 - t1 + time.perf_counter() - t2
        return self.rollout_done(torch.stack(finished), torch.stack(finished_returns), [torch.stack(f) for f in zip(*steps)], t_act, t_env)

    def rollout_done(self, ended: torch.Tensor, returns: torch.Tensor, fields: list[torch.Tensor], t_act: float, t_env: float) -> Rollout:
        """A rollout's end: its env steps counted, finished episodes ([T, slots * E] flags and returns) credited, its
        times booked; the Rollout of `fields` [T, K, E, ...] with V(observation after it)."""
        self.env_steps += self.config.num_steps * self.config.envs_per_agent
        self.credit_episodes(ended, returns)
        self.add_time("act", t_act)
        self.add_time("env", t_env)
        _, last_values = self.net(self.net_input(self.agent_view(self.obs), self.slot_index()))
        return Rollout(*fields, last_values=last_values)

    def action_low_high(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        return (self.action_low, self.action_high) if self.continuous else None

    def tensor_rollout(self, env: TensorEnv) -> Rollout:
        """The rollout on a tensor env: `lockstep_chunk` calls of S steps each (policy, sampling and env step as one
        function of tensors; with `device.compile=true` one compiled graph), S = `steps_per_call()`. The time limit's
        bootstrap values, reward normalisation and the episode bookkeeping follow each call, eagerly, step by step in
        order (observation normalisation between steps: S = 1 then), so every S gives the same rollout."""
        hp = self.config
        K, E, T = len(self.slots), hp.envs_per_agent, hp.num_steps
        agents = self.slot_index()
        S = self.steps_per_call()
        chunk_fn = self.rollout_step()
        chunks: list[tuple[torch.Tensor, ...]] = []  # per call: the Rollout fields but the last, [S, K, E, ...] each
        finished_returns: list[torch.Tensor] = []
        finished: list[torch.Tensor] = []
        t_act = t_env = 0.0
        for _ in range(T // S):
            t0 = time.perf_counter()
            obs = self.net_input(self.agent_view(self.obs), agents)
            noises = torch.stack([self.action_noise(K, E) for _ in range(S)])  # the generator's order of one step at a time
            graphs = compiled_graphs() if self.compile_updates else 0
            fields, self.obs, self.episode_return, clock = chunk_fn(
                self.net, env, self.continuous, obs, noises, self.action_low_high(), self.episode_return, *env.clock())
            env.set_clock(clock)
            t1 = time.perf_counter()
            if self.compile_updates and compiled_graphs() != graphs:  # this call compiled: its time is compile time
                self.compile_s += t1 - t0
                self.add_time("compile", t1 - t0)
                t0 = t1
            seen, actions, log_probs, values, reward, terminated, truncated, final_obs, done, returns = fields
            if self.obs_stats is not None:  # S = 1
                self.obs_stats.update(self.agent_view(self.obs), agents)
            rewards = reward.view(S, K, E)
            if self.reward_scaler is not None:
                dones = done.view(S, K, E)
                rewards = torch.stack([self.reward_scaler(rewards[s], dones[s]) for s in range(S)])
            truncated = truncated.view(S, K, E)
            final_values = torch.zeros_like(values)
            for s, cut in enumerate(truncated.flatten(1).any(1).tolist()):
                if cut:  # where the time limit cut an episode, its last step is worth V(where it really got to)
                    _, final_values[s] = self.net(self.net_input(self.agent_view(final_obs[s]), agents))
            finished_returns.append(returns)
            finished.append(done)
            chunks.append((seen, actions, log_probs, values, rewards, terminated.view(S, K, E), truncated, final_values))
            t_act += t1 - t0
            t_env += time.perf_counter() - t1
        return self.rollout_done(torch.cat(finished), torch.cat(finished_returns), [torch.cat(f) for f in zip(*chunks)], t_act, t_env)

    def steps_per_call(self) -> int:
        """Steps of a tensor-env rollout per `lockstep_chunk` call: the largest divisor of num_steps up to ROLLOUT_CHUNK,
        1 with observation normalisation (its statistics move between steps)."""
        if self.obs_stats is not None:
            return 1
        return max(s for s in range(1, ROLLOUT_CHUNK + 1) if self.config.num_steps % s == 0)

    def rollout_step(self):
        """`lockstep_chunk` with the tensor env's reset gate (eager), or through torch.compile with `device.compile=true`
        (compiled on first use: static shapes until agents first stop, then one symbolic-K graph; `compile_over_members`)."""
        if not (self.compile_updates and self.compile_rollout):
            return functools.partial(lockstep_chunk, gate_resets=self.env.env.gate_resets)
        if self.compiled_rollout_step is None:
            # The draws are [S, K, E, ...] and the clock's rows [state_size, B]: their member axis is the second.
            self.compiled_rollout_step = compile_over_members(lockstep_chunk, self.device, member_axes={4: 1, 7: 1}, cuda_graphs=False)
        return self.compiled_rollout_step

    def advantages(self, rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor]:
        """GAE advantages and value targets of a rollout, [T, K, E] each."""
        hp = self.config
        next_values = bootstrap_values(rollout.values, rollout.last_values, rollout.truncated, rollout.final_values)
        done = rollout.terminated | rollout.truncated
        return gae(rollout.rewards, rollout.values, next_values, rollout.terminated, done, hp.gamma, hp.gae_lambda)

    def update_losses(self):
        """`minibatch_losses`, or the same through torch.compile with `device.compile=true` (compiled on first use; see
        `rollout_step`)."""
        if not self.compile_updates:
            return minibatch_losses
        if self.compiled_losses is None:
            self.compiled_losses = compile_over_members(minibatch_losses, self.device)
        return self.compiled_losses

    def learn(self, rollout: Rollout) -> None:
        """`update_epochs` passes of minibatch updates over the rollout, every agent on its own samples."""
        hp = self.config
        K = len(self.slots)
        advantages, returns = self.advantages(rollout)

        def per_agent(x: torch.Tensor) -> torch.Tensor:
            # [T, K, E, ...] -> [K, T * E, ...]
            return x.transpose(0, 1).reshape(K, self.batch_per_agent, *x.shape[3:])

        obs, actions, old_log_probs, old_values = (per_agent(x) for x in rollout[:4])
        advantages, returns = per_agent(advantages), per_agent(returns)
        opt = self.optimizers().optimizer
        if hp.anneal_lr:
            for group in opt.param_groups:
                group["lr"] = annealed_lr(self.base_lr, self.updates, self.n_updates)
        params = list(self.net.parameters())
        clip = nn.utils.clip_grad_norm_ if K == 1 else clip_grad_norm_per_member_
        stats = []
        # One minibatch is the whole rollout, in any order the same losses up to float rounding: it is not shuffled
        # (at K = 16 the 6 gathers and K permutations per update were ~3% of the learning time).
        whole = hp.num_minibatches == 1

        losses, timed = self.update_losses(), self.compile_updates
        for _ in range(hp.update_epochs):
            order = [None] if whole else minibatch_indices(self.generators, self.batch_per_agent, hp.num_minibatches).to(self.device)
            for idx in order:
                graphs, t0 = (compiled_graphs(), time.perf_counter()) if timed else (0, 0.0)
                loss, pg, vl, ent, new_log_probs, mb_old_log_probs = losses(
                    self.net, hp, self.continuous, idx, obs, actions, old_log_probs, advantages, old_values, returns)
                check_finite(loss, self.env_steps)
                opt.zero_grad(set_to_none=True)
                loss.sum().backward()
                if hp.max_grad_norm is not None:
                    clip(params, hp.max_grad_norm)
                opt.step()
                if timed and compiled_graphs() != graphs:  # this minibatch compiled (forward and backward): its time is compile time
                    self.compile_s += time.perf_counter() - t0
            kl, clipped = ratio_diagnostics(new_log_probs, mb_old_log_probs, hp.clip_coef)
            stats.append(torch.stack((pg.detach(), vl.detach(), ent.detach(), kl, clipped)))
        self.updates += 1
        # The last epoch's last minibatch, as CleanRL logs it; one host transfer for all of it.
        last = stats[-1].cpu().tolist()
        self.recent = {
            "train/policy_loss": last[0], "train/value_loss": last[1], "train/entropy": last[2],
            "train/approx_kl": last[3], "train/clipfrac": last[4], "train/lr": [opt.param_groups[0]["lr"]] * K,
        }

"""Proximal Policy Optimization (Schulman et al. 2017) for K agents at once (K = 1 is an ordinary run).

Reads top to bottom like CleanRL's ppo.py / ppo_continuous_action.py, with a leading agent axis on
every tensor: agent i is seed `seed + i` with its own actor-critic (member i of an
`EnsembleActorCritic`, initialised as the single run of its seed), Adam state (one optimizer over the
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
Gaussian's mean clipped to the bounds) on separately seeded envs. An agent whose evaluation reaches
`stop_at_return` stops learning (as DQN's do): its weights go to `agents_net` (the record) and it leaves
the batch, so later iterations cost what the remaining agents cost; the run ends when all have stopped
or the budget is spent.

Durable: `checkpoint_state()` holds everything a resumed run needs to continue exactly (weights,
optimizer, counters, evaluations, which agents still learn, normalisers, every RNG, the envs
mid-episode); it is saved between iterations.
"""

from __future__ import annotations

import copy
import functools
import time
from dataclasses import asdict

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from pipeline.nets.actor_critic import (
    ActorCritic,
    categorical_log_prob,
    categorical_log_prob_and_entropy,
    categorical_sample,
    gaussian_entropy,
    gaussian_log_prob,
    gaussian_sample,
)
from pipeline.nets.ensemble import clip_grad_norm_per_member_, keep_optimizer_members_, make_ensemble
from pipeline.rl.envs import env_threshold, make_env
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
from pipeline.rl.targets import freeze
from pipeline.rl.vector import evaluate_agents, make_vector_env
from pipeline.store.checkpoint import rng_state, set_rng_state
from pipeline.store.layout import OBS_NORM
from pipeline.tasks.base import Task, TaskParts, check_finite
from pipeline.tasks.configs import PPOConfig
from pipeline.tasks.rl_agents import RLAgents

# Evaluation envs are seeded away from the training envs' streams (as DQN's are).
EVAL_SEED_OFFSET = 10_000
FINAL_EVAL_SEED_OFFSET = 20_000
CHECKPOINT_FORMAT = "pipeline.ppo/2"


def action_space_of(env_id: str, kwargs: dict) -> tuple[tuple[int, ...], gym.spaces.Space]:
    """The observation shape and action space of `env_id`, from one throwaway env."""
    probe = make_env(env_id, **kwargs)
    obs_space, act_space = probe.observation_space, probe.action_space
    probe.close()
    return tuple(obs_space.shape), act_space


def check_ppo_settings(hp: PPOConfig, env_id: str, act_space: gym.spaces.Space) -> None:
    """Settings PPO cannot run with, each refused in one line that says what to change."""
    for name in ("total_steps", "envs_per_agent", "num_steps", "num_minibatches", "update_epochs", "eval_every", "log_every"):
        if getattr(hp, name) <= 0:
            raise ValueError(f"task.{name}={getattr(hp, name)} must be positive")
    batch = hp.num_steps * hp.envs_per_agent
    if batch % hp.num_minibatches:
        raise ValueError(
            f"task.num_steps * task.envs_per_agent = {hp.num_steps} * {hp.envs_per_agent} = {batch} samples do not split into "
            f"task.num_minibatches={hp.num_minibatches} equal minibatches; choose a num_minibatches that divides {batch}"
        )
    if hp.total_steps < batch:
        raise ValueError(f"task.total_steps={hp.total_steps} is less than one rollout ({batch} = num_steps * envs_per_agent per agent)")
    if not 0.0 <= hp.gamma <= 1.0 or not 0.0 <= hp.gae_lambda <= 1.0:
        raise ValueError(f"task.gamma={hp.gamma} and task.gae_lambda={hp.gae_lambda} must lie in [0, 1]")
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


class PPOTask(RLAgents, Task):
    Config = PPOConfig
    uses = frozenset({"model", "optimizer", "env"})
    trains_seeds_together = True
    # The lifecycle hands this task one CurveLog per agent (its metrics.csv).
    writes_curves = True
    checkpointing = "state"
    primary_metric = "eval/return_mean"
    primary_curve = "eval/return_mean"
    monitorable_metrics = ()  # its curves go to metrics.csv, not to Lightning's callback metrics

    def __init__(self, config: PPOConfig, parts: TaskParts):
        super().__init__(config, parts)
        hp = self.config
        net = parts.require("net", "ppo", "choose the network with model=actor_critic")
        optimizer = parts.require("optimizer", "ppo", "choose one with optimizer=adam|sgd|...")
        env = parts.require("env", "ppo", "choose an environment with env=cartpole|pendulum|...")
        self.automatic_optimization = False
        self.env_cfg = dict(env)
        self.env_id = str(env["id"])
        self.obs_shape, act_space = action_space_of(self.env_id, dict(env.get("kwargs") or {}))
        check_ppo_settings(hp, self.env_id, act_space)
        self.continuous = isinstance(act_space, gym.spaces.Box)
        self.action_shape = tuple(act_space.shape) if self.continuous else ()
        n_out = int(act_space.shape[0]) if self.continuous else int(act_space.n)
        if not (isinstance(net, functools.partial) and isinstance(net.func, type) and issubclass(net.func, ActorCritic)):
            raise ValueError(f"task=ppo needs model=actor_critic (an actor and a critic); got {getattr(net, 'func', net)}")
        self.net = make_ensemble(functools.partial(net, continuous=self.continuous), self.agent_seeds, self.obs_shape, n_out)
        # `net` trains the agents still learning (member m is agent slots[m]); `agents_net` holds every agent's
        # weights for the record, each written when the agent stops or the run ends.
        self.agents_net = freeze(copy.deepcopy(self.net))
        self.slots = list(range(self.n_agents))
        if self.continuous:
            self.register_buffer("action_low", torch.as_tensor(act_space.low, dtype=torch.float32), persistent=False)
            self.register_buffer("action_high", torch.as_tensor(act_space.high, dtype=torch.float32), persistent=False)
        self.optimizer_factory = optimizer
        self.threshold = float(hp.threshold) if hp.threshold is not None else env_threshold(self.env_id)
        self.capture_video = bool(hp.capture_video)
        self.batch_per_agent = hp.num_steps * hp.envs_per_agent
        self.n_updates = hp.total_steps // self.batch_per_agent
        self.return_bounds: tuple[float, float] | None = None
        K = self.n_agents
        self.obs_stats = RunningMeanStd(K, self.obs_shape) if hp.normalize_obs else None
        self.reward_scaler = RewardScaler(K, hp.envs_per_agent, hp.gamma, hp.reward_clip) if hp.normalize_reward else None
        # Progress (all of it goes into checkpoints).
        self.env_steps = 0  # per agent (lockstep)
        self.updates = 0
        self.episode_returns: list[list[float]] = [[] for _ in range(K)]
        self.evaluations: list[list[tuple[int, float, float]]] = [[] for _ in range(K)]
        self.time_to_threshold_s: list[float | None] = [None] * K
        self.early_stop: list[dict | None] = [None] * K
        self.stop_step: list[int | None] = [None] * K
        self.stop_time_s: list[float | None] = [None] * K
        self.stop_updates: list[int | None] = [None] * K
        self.final_metrics: list[dict[str, float]] = []
        self._recent: dict[str, list[float]] = {}
        self._elapsed_before = 0.0
        self._t_train_start: float | None = None
        self._train_seconds = 0.0
        self._last_log_step = 0
        self._resume: dict | None = None
        self.base_lr: float | None = None

    # ---- Lightning plumbing -------------------------------------------------------------
    def configure_optimizers(self):
        optimizer = self.optimizer_factory(self.net.parameters())
        self.base_lr = float(optimizer.param_groups[0]["lr"])
        return optimizer

    def train_dataloader(self) -> DataLoader:
        # Each item is one PPO iteration; the data itself comes from the environment.
        return DataLoader(range(max(1, self.n_updates - self.updates)), batch_size=None, shuffle=False)

    def on_fit_start(self) -> None:
        E = self.config.envs_per_agent
        seeds = [self.agent_seeds[a] for a in self.slots]
        self.env = make_vector_env(self.env_cfg, seeds, E, device=self.device)
        self.return_bounds = self.env.return_bounds
        self.obs = self.env.reset()
        self.generators = [torch.Generator(device=self.device).manual_seed(s) for s in seeds]
        self.episode_return = torch.zeros(len(self.slots) * E, device=self.device, dtype=torch.float64)
        if self._resume is None and self.obs_stats is not None:  # a fresh run: every agent learns
            self.obs_stats.update(self.agent_view(self.obs))

    def on_train_start(self) -> None:
        if self._resume is not None:
            self._restore_training_state(self._resume)
            self._resume = None
        self._t_train_start = time.perf_counter()

    # ---- the policy ----------------------------------------------------------------------------
    def agent_view(self, x: torch.Tensor) -> torch.Tensor:
        """[K * E, ...] rows of the vector env -> [K, E, ...] (K: the agents still learning)."""
        return x.view(len(self.slots), -1, *x.shape[1:])

    def slot_index(self) -> torch.Tensor | None:
        """The learning agents' indices among all K (for the per-agent statistics); None while all of them learn."""
        if len(self.slots) == self.n_agents:
            return None
        return torch.tensor(self.slots, device=self.device)

    def net_input(self, obs: torch.Tensor, agents: torch.Tensor | None = None) -> torch.Tensor:
        """Observations [K, N, *obs_shape] as the networks see them: normalised by each agent's statistics, when asked
        (`agents`: whose rows these are, None for all K in order)."""
        obs = obs.float()
        return obs if self.obs_stats is None else self.obs_stats.normalize(obs, self.config.obs_clip, agents=agents)

    def sample(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Actions drawn from the policy with parameters `params` [K, N, A], and their log-probabilities [K, N]."""
        if self.continuous:
            log_std = self.net.log_std.value
            actions = gaussian_sample(params, log_std)
            return actions, gaussian_log_prob(params, log_std, actions)
        actions = categorical_sample(params)
        return actions, categorical_log_prob(params, actions)

    def log_prob_and_entropy(self, params: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.continuous:
            log_std = self.net.log_std.value
            return gaussian_log_prob(params, log_std, actions), gaussian_entropy(params, log_std)
        return categorical_log_prob_and_entropy(params, actions)

    def env_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """What the env is sent: a Gaussian's sample clipped to the action bounds (its log-probability stays the sample's)."""
        if not self.continuous:
            return actions
        return torch.maximum(torch.minimum(actions, self.action_high), self.action_low)

    def deterministic_actions(self, net: nn.Module, obs: torch.Tensor, agents: torch.Tensor | None = None) -> torch.Tensor:
        """The evaluation policy: the most likely action, or the Gaussian's mean clipped to the bounds. obs [K, n, ...]."""
        params, _ = net(self.net_input(obs, agents))
        return self.env_actions(params) if self.continuous else params.argmax(-1)

    # ---- the algorithm ---------------------------------------------------------------------
    @torch.no_grad()
    def rollout(self) -> dict[str, torch.Tensor]:
        """`num_steps` lockstep steps of every agent's envs; returns the rollout, time-major [T, K, E, ...]."""
        hp = self.config
        K, E, T = len(self.slots), hp.envs_per_agent, hp.num_steps
        agents = self.slot_index()
        keys = ("obs", "actions", "log_probs", "values", "rewards", "terminated", "truncated", "final_values")
        steps: dict[str, list[torch.Tensor]] = {k: [] for k in keys}
        finished_returns: list[torch.Tensor] = []
        finished: list[torch.Tensor] = []
        t_act = t_env = 0.0
        for _ in range(T):
            t0 = time.perf_counter()
            obs = self.net_input(self.agent_view(self.obs), agents)
            params, values = self.net(obs)
            actions, log_probs = self.sample(params)
            t1 = time.perf_counter()
            step = self.env.step(self.env_actions(actions).reshape(K * E, *self.action_shape))
            t2 = time.perf_counter()
            if self.obs_stats is not None:
                self.obs_stats.update(self.agent_view(step.obs), agents)
            rewards = self.agent_view(step.reward)
            learn_rewards = rewards if self.reward_scaler is None else self.reward_scaler(rewards, self.agent_view(step.done))
            truncated = self.agent_view(step.truncated)
            final_values = torch.zeros_like(values)
            if bool(truncated.any()):
                # Where the time limit cut an episode, its last step is worth V(where it really got to).
                _, final_values = self.net(self.net_input(self.agent_view(step.final_obs), agents))
            self.episode_return = self.episode_return + step.reward
            finished_returns.append(self.episode_return)
            finished.append(step.done)
            self.episode_return = self.episode_return.masked_fill(step.done, 0.0)
            for key, value in zip(keys, (obs, actions, log_probs, values, learn_rewards, self.agent_view(step.terminated),
                                         truncated, final_values)):
                steps[key].append(value)
            self.obs = step.obs
            t_act += t1 - t0
            t_env += t2 - t1 + time.perf_counter() - t2
        self.env_steps += T * E
        ended, returns = torch.stack(finished), torch.stack(finished_returns)
        for t, row in ended.nonzero().tolist():
            self.episode_returns[self.slots[row // E]].append(float(returns[t, row]))
        self.add_time("act", t_act)
        self.add_time("env", t_env)
        batch = {k: torch.stack(v) for k, v in steps.items()}
        _, last_values = self.net(self.net_input(self.agent_view(self.obs), agents))
        batch["last_values"] = last_values
        return batch

    def advantages(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """GAE advantages and value targets of a rollout, [T, K, E] each."""
        hp = self.config
        next_values = bootstrap_values(batch["values"], batch["last_values"], batch["truncated"], batch["final_values"])
        done = batch["terminated"] | batch["truncated"]
        return gae(batch["rewards"], batch["values"], next_values, batch["terminated"], done, hp.gamma, hp.gae_lambda)

    def learn(self, batch: dict[str, torch.Tensor]) -> None:
        """`update_epochs` passes of minibatch updates over the rollout, every agent on its own samples."""
        hp = self.config
        K = len(self.slots)
        advantages, returns = self.advantages(batch)

        def per_agent(x: torch.Tensor) -> torch.Tensor:
            # [T, K, E, ...] -> [K, T * E, ...]
            return x.transpose(0, 1).reshape(K, self.batch_per_agent, *x.shape[3:])

        obs, actions, old_log_probs, old_values = (per_agent(batch[k]) for k in ("obs", "actions", "log_probs", "values"))
        advantages, returns = per_agent(advantages), per_agent(returns)
        opt = self.optimizers().optimizer
        if hp.anneal_lr:
            for group in opt.param_groups:
                group["lr"] = annealed_lr(self.base_lr, self.updates, self.n_updates)
        params = list(self.net.parameters())
        clip = nn.utils.clip_grad_norm_ if K == 1 else clip_grad_norm_per_member_
        rows = torch.arange(K, device=self.device).unsqueeze(1)
        stats = []
        # One minibatch is the whole rollout, in any order the same losses up to float rounding: it is not shuffled
        # (at K = 16 the 6 gathers and K permutations per update were ~3% of the learning time).
        whole = hp.num_minibatches == 1

        def take(x: torch.Tensor, idx: torch.Tensor | None) -> torch.Tensor:
            return x if idx is None else x[rows, idx]

        for _ in range(hp.update_epochs):
            order = [None] if whole else minibatch_indices(self.generators, self.batch_per_agent, hp.num_minibatches).to(self.device)
            for idx in order:
                mb_old_log_probs = take(old_log_probs, idx)
                policy_params, new_values = self.net(take(obs, idx))
                new_log_probs, entropy = self.log_prob_and_entropy(policy_params, take(actions, idx))
                adv = take(advantages, idx)
                if hp.norm_adv:
                    adv = normalize_advantages(adv)
                pg = clipped_surrogate_loss(new_log_probs, mb_old_log_probs, adv, hp.clip_coef)
                vl = value_loss(new_values, take(old_values, idx), take(returns, idx), hp.clip_coef if hp.clip_value_loss else None)
                ent = entropy.mean(-1)
                loss = ppo_loss(pg, vl, ent, hp.vf_coef, hp.ent_coef)
                check_finite(loss, self.env_steps)
                opt.zero_grad(set_to_none=True)
                loss.sum().backward()
                if hp.max_grad_norm is not None:
                    clip(params, hp.max_grad_norm)
                opt.step()
            kl, clipped = ratio_diagnostics(new_log_probs, mb_old_log_probs, hp.clip_coef)
            stats.append(torch.stack((pg.detach(), vl.detach(), ent.detach(), kl, clipped)))
        self.updates += 1
        # The last epoch's last minibatch, as CleanRL logs it; one host transfer for all of it.
        last = stats[-1].cpu().tolist()
        self._recent = {
            "train/policy_loss": last[0], "train/value_loss": last[1], "train/entropy": last[2],
            "train/approx_kl": last[3], "train/clipfrac": last[4], "train/lr": [opt.param_groups[0]["lr"]] * K,
        }

    def training_step(self, batch, batch_idx):
        hp = self.config
        if self.updates >= self.n_updates or not self.slots:
            self.trainer.should_stop = True
            return None
        before = self.env_steps
        rollout = self.rollout()
        t0 = time.perf_counter()
        self.learn(rollout)
        self.add_time("learn", time.perf_counter() - t0)
        if self.env_steps - self._last_log_step >= hp.log_every:
            self.log_progress()
        if self.env_steps // hp.eval_every != before // hp.eval_every:
            self.evaluate_now()
        if not self.slots:
            self.trainer.should_stop = True
        if self.checkpoint_hook is not None:
            self.checkpoint_hook()  # saves when due, and stops the fit when a stop was requested
        return None

    # ---- evaluation and logging ---------------------------------------------------------------
    def deterministic_returns(self, n_episodes: int, seed_offset: int, learning_only: bool = False) -> np.ndarray:
        """[K, n_episodes] returns of every agent's deterministic policy now, on envs seeded apart from training
        (`learning_only`: only the agents still learning, [len(slots), n_episodes], in slot order)."""
        if learning_only:
            net, agents, index = self.net, list(self.slots), self.slot_index()
        else:
            self.sync_agents_net()
            net, agents, index = self.agents_net, list(range(self.n_agents)), None
        returns = evaluate_agents(
            functools.partial(self.deterministic_actions, net, agents=index), self.env_cfg,
            [self.agent_seeds[a] for a in agents], n_episodes, seed_offset, device=self.device,
        )
        return returns.double().cpu().numpy()

    def sync_agents_net(self) -> None:
        """The learning agents' current weights into `agents_net` (the stopped ones are there already)."""
        for slot, agent in enumerate(self.slots):
            self.agents_net.load_member_state_dict(agent, self.net.member_state_dict(slot))

    def evaluate_now(self) -> None:
        t0 = time.perf_counter()
        returns = self.deterministic_returns(self.config.eval_episodes, EVAL_SEED_OFFSET, learning_only=True)
        self.add_time("eval", time.perf_counter() - t0)
        elapsed = self.elapsed_s()
        stop = self.config.stop_at_return
        stopping, reasons = [], {}
        for slot, agent in enumerate(self.slots):
            mean = float(returns[slot].mean())
            self.note_evaluation(agent, mean, float(returns[slot].std()), elapsed)
            if stop is not None and mean >= stop:
                stopping.append(slot)
                reasons[slot] = f"deterministic evaluation mean {mean:.1f} >= stop_at_return {stop}"
        if self.n_agents > 1:
            self._log_shared({"batch/eval_return_mean": float(returns.mean()), "batch/agents_learning": float(len(self.slots))})
        self.record_training_videos(self.net.member_state_dict, self.agent_files)
        # A pruned trial stops every agent still learning, and their records say so (the tuner and the report count them).
        if self.pruned_by_tuner():
            stopping = list(range(len(self.slots)))
            reasons = dict.fromkeys(stopping, "pruned by the tuner")
        if stopping:
            self.stop_agents(stopping, reasons)

    def stop_agents(self, stopping: list[int], reasons: dict[int, str]) -> None:
        """The agents at slots `stopping` stop learning: their weights go to the record and they leave the batch
        (their weights, Adam moments, envs, generators and return statistics; the others are only re-indexed)."""
        elapsed = self.elapsed_s()
        for slot in stopping:
            agent = self.slots[slot]
            self.agents_net.load_member_state_dict(agent, self.net.member_state_dict(slot))
            self.stop_step[agent], self.stop_time_s[agent], self.stop_updates[agent] = self.env_steps, elapsed, self.updates
            self.early_stop[agent] = {"env_step": self.env_steps, "reason": reasons[slot]}
        keep = [s for s in range(len(self.slots)) if s not in stopping]
        if keep:
            self._keep_slots(keep)
        else:
            self.slots = []

    def _keep_slots(self, keep_slots: list[int], training: bool = True) -> None:
        """Shrink the batch to `keep_slots`; `training`: the optimizer, envs and generators exist and shrink too."""
        keep = torch.tensor(keep_slots, device=self.device)
        E = self.config.envs_per_agent
        n_before = len(self.slots)
        pairs = self.net.keep_members_(keep)
        if self.reward_scaler is not None:
            self.reward_scaler.keep_agents_(keep)
        if training:
            keep_optimizer_members_(self.optimizers().optimizer, pairs, keep, n_before)
            keep_envs = (keep.view(-1, 1) * E + torch.arange(E, device=self.device)).view(-1)
            self.env.keep_envs_(keep_envs)
            self.obs = self.obs.index_select(0, keep_envs)
            self.episode_return = self.episode_return.index_select(0, keep_envs)
            self.generators = [self.generators[s] for s in keep_slots]
            self._recent = {k: [v[s] for s in keep_slots] for k, v in self._recent.items()}
        self.slots = [self.slots[s] for s in keep_slots]

    def learning_agents(self) -> list[int]:
        return list(self.slots)

    def agent_env_steps(self, i: int) -> int:
        return self.stop_step[i] if self.stop_step[i] is not None else self.env_steps

    def total_env_steps(self) -> int:
        """Env steps over all agents: each stopped agent counts until its stop."""
        return sum(self.agent_env_steps(i) for i in range(self.n_agents))

    def log_progress(self) -> None:
        t0 = time.perf_counter()
        elapsed = max(self.elapsed_s(), 1e-9)
        for slot, agent in enumerate(self.slots):
            row = {"perf/env_steps_per_s": self.env_steps / elapsed}
            if self.episode_returns[agent]:
                row["train/episodic_return"] = float(np.mean(self.episode_returns[agent][-10:]))
            row.update({key: float(values[slot]) for key, values in self._recent.items()})
            self._agent_row(agent, row)
        if self.n_agents > 1:
            self._log_shared({"batch/env_steps_per_s": self.total_env_steps() / elapsed})
        self._last_log_step = self.env_steps
        self.add_time("log", time.perf_counter() - t0)

    def on_train_end(self) -> None:
        self._train_seconds = self.elapsed_s()
        if self.slots and self.env_steps != self._last_log_step:
            self.log_progress()
        self.sync_agents_net()
        if self.checkpoint_hook is not None:
            self.checkpoint_hook(final=True)

    # ---- checkpoints ---------------------------------------------------------------------------
    def checkpoint_state(self) -> dict:
        """Everything needed to continue this run exactly where it is (plain values: weights_only loads)."""
        return {
            "format": CHECKPOINT_FORMAT, "agent_seeds": self.agent_seeds, "config": asdict(self.config),
            "env_steps": self.env_steps, "updates": self.updates,
            "episode_returns": [list(r) for r in self.episode_returns],
            "evaluations": [[list(e) for e in ev] for ev in self.evaluations],
            "time_to_threshold_s": list(self.time_to_threshold_s), "recent": dict(self._recent),
            "slots": list(self.slots), "agents_net": self.agents_net.state_dict(),
            "stopped": {"early_stop": copy.deepcopy(self.early_stop), "stop_step": list(self.stop_step),
                        "stop_time_s": list(self.stop_time_s), "stop_updates": list(self.stop_updates)},
            "elapsed_s": self.elapsed_s(), "last_log_step": self._last_log_step, "time_breakdown_s": dict(self.time_breakdown_s),
            "net": self.net.state_dict(), "optimizer": self.optimizers().optimizer.state_dict(),
            "obs_stats": None if self.obs_stats is None else self.obs_stats.state_dict(),
            "reward_scaler": None if self.reward_scaler is None else self.reward_scaler.state_dict(),
            "generators": [g.get_state() for g in self.generators], "rng": rng_state(),
            "env": self.env.state_dict(), "obs": self.obs, "episode_return": self.episode_return,
        }

    @property
    def resume_step(self) -> int:
        return self.env_steps

    def load_checkpoint_state(self, state: dict) -> int:
        """Before fit: weights, counters and statistics; the optimizer, RNGs and envs at train start."""
        self.check_checkpoint(state, CHECKPOINT_FORMAT)
        slots = [int(s) for s in state["slots"]]
        if slots and slots != self.slots:
            self._keep_slots([self.slots.index(s) for s in slots], training=False)
        self.slots = slots
        # With every agent stopped, only the record's weights matter (the learning net is not used again).
        for name in ("net", "agents_net") if slots else ("agents_net",):
            try:
                getattr(self, name).load_state_dict(state[name])
            except RuntimeError as exc:
                raise ValueError(f"checkpoint weights do not fit this model (changed model.* since?): {str(exc).splitlines()[0]}") from None
        for name, value in state["stopped"].items():
            setattr(self, name, copy.deepcopy(list(value)))
        self.env_steps, self.updates = int(state["env_steps"]), int(state["updates"])
        self.episode_returns = [list(r) for r in state["episode_returns"]]
        self.evaluations = [[tuple(e) for e in ev] for ev in state["evaluations"]]
        self.time_to_threshold_s = list(state["time_to_threshold_s"])
        self._recent = dict(state["recent"])
        self._elapsed_before = float(state["elapsed_s"])
        self._last_log_step = int(state["last_log_step"])
        self.time_breakdown_s = dict(state.get("time_breakdown_s") or {})
        if self.obs_stats is not None:
            self.obs_stats.load_state_dict(state["obs_stats"])
        if self.reward_scaler is not None:
            self.reward_scaler.load_state_dict(state["reward_scaler"])
        self._resume = state
        return self.env_steps

    def _restore_training_state(self, state: dict) -> None:
        self.optimizers().optimizer.load_state_dict(state["optimizer"])
        if self.slots:
            for g, s in zip(self.generators, state["generators"]):
                g.set_state(s)
            self.env.load_state_dict(state["env"])
            self.obs = state["obs"].to(self.device)
            self.episode_return = state["episode_return"].to(self.device)
        set_rng_state(state["rng"])

    # ---- the contract with the lifecycle ------------------------------------------------------
    def fit_and_evaluate(self, trainer, datamodule, ckpt_path) -> list[dict[str, float]]:
        if trainer.precision not in ("32-true", "32"):
            raise ValueError(f"task=ppo runs in fp32; got device.precision={trainer.precision}, use device.precision=32-true")
        if self.updates < self.n_updates and self.slots:
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
        extras["early_stop"] = self.early_stop[i]
        if self.n_agents > 1:
            extras["batch_env_steps_per_s"] = round(self.total_env_steps() / self._train_seconds, 1) if self._train_seconds else None
        return extras

    def agent_files(self, i: int) -> dict[str, dict[str, torch.Tensor]]:
        """With normalize_obs, agent i's observation statistics (`OBS_NORM`): its policy sees nothing without them."""
        if self.obs_stats is None:
            return {}
        return {OBS_NORM: self.obs_stats.agent_state(i, self.config.obs_clip)}

    def agent_state_dict(self, i: int) -> dict[str, torch.Tensor]:
        """Agent i's weights now as the plain ActorCritic's state_dict (what model.pt holds)."""
        state = self.net.member_state_dict(self.slots.index(i)) if i in self.slots else self.agents_net.member_state_dict(i)
        return {k: v.detach().cpu() for k, v in state.items()}

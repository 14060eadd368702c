"""Deep Q-learning (Mnih et al. 2015) for K agents at once, as a Lightning module (K = 1 is an ordinary run).

Reads top to bottom like a single-file DQN, with every tensor given a leading agent axis: agent i is
seed `seed + i` with its own network (member i of an ensemble: `nets.ensemble.make_ensemble`), target
network, optimizer state (one optimizer over the stacked weights is K independent optimizers,
because the loss is the SUM over agents of each agent's MEAN TD loss and gradients are clipped per
agent), replay rows, epsilon schedule, envs (rows i*E ... of one vector env: `rl.vector`) and random
streams (a generator seeded with `seed + i` for its exploration and replay draws). Agent i of a
K-agent run therefore trains like the single run of seed `seed + i`, in distribution.

One Lightning step is one round of the classic loop: `train_frequency` env steps per agent of
epsilon-greedy acting (each agent stepping its `envs_per_agent` envs), then `gradient_steps` TD
updates on minibatches sampled in one draw, then (every `eval_every` env steps) a greedy evaluation
on separately seeded envs. An agent whose evaluation reaches `stop_at_return` stops learning: its
weights go to `agents_net` (the record) and it leaves the batch, so later steps and updates cost what
the remaining agents cost. The run ends when all have stopped or the budget is spent.

Durable: `checkpoint_state()` holds everything needed to continue in distribution (weights, target,
optimizer and scheduler, counters, evaluations, stop state, every RNG, the envs and, when small
enough, the replay buffer); run.py saves it periodically and on SIGINT/SIGTERM and resumes from it.
"""

from __future__ import annotations

import copy
import functools
import math
import time
from dataclasses import dataclass, field, fields

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from pipeline.nets.ensemble import clip_grad_norm_per_member_, keep_optimizer_members_, make_ensemble
from pipeline.nets.td_grad import loss_derivative, relu_mlp_forward, relu_mlp_layers, td_grads_
from pipeline.rl.envs import env_threshold, make_env
from pipeline.rl.replay import ReplayBuffer
from pipeline.rl.schedules import epsilon_at
from pipeline.rl.targets import freeze, hard_update, soft_update
from pipeline.rl.vector import GymVectorEnv, evaluate_agents, make_vector_env
from pipeline.store.checkpoint import rng_state, set_rng_state
from pipeline.tasks.base import Task, TaskParts, check_finite
from pipeline.tasks.configs import DQNConfig
from pipeline.tasks.rl_agents import RLAgents

# Evaluation envs are seeded away from the training envs' streams.
EVAL_SEED_OFFSET = 10_000
FINAL_EVAL_SEED_OFFSET = 20_000
CHECKPOINT_FORMAT = "pipeline.dqn/3"  # 3: progress as one dict (DQNProgress)


@torch.no_grad()
def td_targets(
    target_net: nn.Module,
    online_net: nn.Module,
    rewards: torch.Tensor,
    next_obs: torch.Tensor,
    dones: torch.Tensor,
    gamma: float,
    double: bool,
) -> torch.Tensor:
    """r + gamma * (1 - terminated) * Q_target(s', a*) for every agent: rewards/dones [K, N], next_obs [K, N, ...].

    a* is the target net's argmax, or the online net's for double DQN.
    """
    next_q = target_net(next_obs)
    if double:
        best = online_net(next_obs).argmax(-1, keepdim=True)
        next_value = next_q.gather(-1, best).squeeze(-1)
    else:
        next_value = next_q.max(-1).values
    return rewards + gamma * (1.0 - dones) * next_value


def elementwise(loss: nn.Module) -> nn.Module:
    """A copy of a torch loss that returns per-element values, so each agent's loss is averaged on its own."""
    if not hasattr(loss, "reduction"):
        raise ValueError(f"DQN needs a torch loss with a `reduction` (loss=huber or loss=mse); got {type(loss).__name__}")
    loss = copy.copy(loss)
    loss.reduction = "none"
    return loss


class GreedyPolicy(nn.Module):
    """The greedy actions of a Q-network (argmax over its last axis); its train/eval mode is the network's."""

    def __init__(self, q_net: nn.Module):
        super().__init__()
        self.q_net = q_net
        self.train(q_net.training)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.q_net(obs).argmax(-1)


@dataclass
class DQNProgress:
    """What a DQN run counts as it trains (per agent where a list), declared once: the task starts from
    `DQNProgress.start(K)` (each field becomes an attribute of the task), `checkpoint_state` saves these
    attributes as they are and `load_checkpoint_state` sets them back."""

    env_steps: int = 0  # shared: the agents step in lockstep
    updates: list[int] = field(default_factory=list)
    episode_returns: list[list[float]] = field(default_factory=list)
    evaluations: list[list[tuple[int, float, float]]] = field(default_factory=list)  # (env_step, mean, std)
    time_to_threshold_s: list[float | None] = field(default_factory=list)
    early_stop: list[dict | None] = field(default_factory=list)
    stop_step: list[int | None] = field(default_factory=list)
    stop_time_s: list[float | None] = field(default_factory=list)
    recent: list[dict[str, list[float]]] = field(default_factory=list)  # losses and Q-values since the last log row
    last_log_step: int = 0
    last_target_copy: int = -1

    @classmethod
    def start(cls, n_agents: int) -> DQNProgress:
        K = n_agents
        return cls(
            updates=[0] * K, episode_returns=[[] for _ in range(K)], evaluations=[[] for _ in range(K)],
            time_to_threshold_s=[None] * K, early_stop=[None] * K, stop_step=[None] * K, stop_time_s=[None] * K,
            recent=[{"loss": [], "q": []} for _ in range(K)],
        )


# The networks a checkpoint holds (state_dicts); with every agent stopped only agents_net is used again.
CHECKPOINTED_NETS = ("net", "target_net", "agents_net")


class DQNTask(RLAgents, Task):
    Config = DQNConfig
    uses = frozenset({"model", "loss", "optimizer", "scheduler", "env"})
    trains_seeds_together = True
    primary_metric = "eval/return_mean"
    primary_curve = "eval/return_mean"
    monitorable_metrics = ()  # it stops early by itself: task.stop_at_return
    # run.py hands this task one CurveLog per agent (its metrics.csv) instead of a CSV logger.
    writes_curves = True
    checkpointing = "state"

    def __init__(self, config: DQNConfig, parts: TaskParts):
        super().__init__(config, parts)
        hp = self.config
        net = parts.require("net", "dqn", "choose a network with model=mlp|dueling|noisy|atari_cnn")
        loss = parts.require("loss", "dqn", "use loss=huber or loss=mse")
        optimizer = parts.require("optimizer", "dqn", "choose one with optimizer=adam|sgd|...")
        env = parts.require("env", "dqn", "choose an environment with env=cartpole|acrobot|...")
        if hp.target_update not in ("hard", "soft"):
            raise ValueError(f"task.target_update={hp.target_update!r}; choose hard or soft")
        if hp.train_frequency <= 0 or hp.gradient_steps < 0 or hp.total_steps <= 0 or self.n_agents <= 0 or hp.envs_per_agent <= 0:
            raise ValueError(
                "task.train_frequency, task.total_steps, task.envs_per_agent and seeds_per_process must be positive, "
                "task.gradient_steps >= 0"
            )
        if hp.train_frequency % hp.envs_per_agent:
            raise ValueError(f"task.train_frequency={hp.train_frequency} must be a multiple of task.envs_per_agent={hp.envs_per_agent}")
        if not 0.0 <= float(hp.gamma) <= 1.0:
            raise ValueError(f"task.gamma={hp.gamma} must lie in [0, 1]")
        if hp.save_replay not in (True, False, "auto"):
            raise ValueError(f"task.save_replay={hp.save_replay!r}; choose true, false or auto")
        self.automatic_optimization = False
        self.env_cfg = dict(env)
        self.env_id = str(env["id"])
        self.envs_per_agent = int(hp.envs_per_agent)
        # The spaces, from one throwaway env (the vector env itself is made on the training device).
        probe = make_env(self.env_id, **dict(env.get("kwargs") or {}))
        obs_space, act_space = probe.observation_space, probe.action_space
        probe.close()
        if not hasattr(act_space, "n"):
            raise ValueError(f"DQN needs a discrete action space; {self.env_id} has {act_space}: use task=ppo for continuous actions")
        self.obs_shape = tuple(obs_space.shape)
        self.obs_dtype = torch.uint8 if obs_space.dtype == np.uint8 else torch.float32
        self.n_actions = int(act_space.n)
        # `net` trains the agents still learning (one member per slot); `agents_net` keeps every agent's
        # weights as of its stop (and, at the end, everyone's): what the run writes out.
        self.net = make_ensemble(net, self.agent_seeds, self.obs_shape, self.n_actions)
        self.target_net = freeze(copy.deepcopy(self.net))
        self.agents_net = freeze(copy.deepcopy(self.net))
        self.noisy = hasattr(self.net, "reset_noise")
        self.slots = list(range(self.n_agents))
        self.loss_fn = elementwise(loss)
        self.optimizer_factory, self.scheduler_factory = optimizer, parts.scheduler
        self.threshold = float(hp.threshold) if hp.threshold is not None else env_threshold(self.env_id)
        self.fast_acting = bool(hp.fast_acting)
        # A ReLU MLP's TD gradient written out by hand (nets/td_grad.py) when the net and loss allow it.
        beta = loss_derivative(self.loss_fn) if hp.hand_gradients and not self.noisy else None
        self.hand_beta = beta if beta is not None and relu_mlp_layers(self.net) is not None else None
        self.save_replay, self.replay_save_max_mb = hp.save_replay, float(hp.replay_save_max_mb)
        # run.py records one greedy episode of each agent's final policy as an MP4 (pipeline.eval's writer).
        self.capture_video = bool(hp.capture_video)
        self.replay_bytes_per_transition = ReplayBuffer.bytes_per_transition(self.obs_shape, self.obs_dtype)
        self.return_bounds: tuple[float, float] | None = None
        # Progress (DQNProgress's fields as attributes: env_steps, updates, evaluations, ...); all of it is checkpointed.
        for name, value in vars(DQNProgress.start(self.n_agents)).items():
            setattr(self, name, value)
        self.final_metrics: list[dict[str, float]] = []
        self._elapsed_before = 0.0  # training seconds of earlier segments (a resumed run)
        self._t_train_start: float | None = None
        self._train_seconds = 0.0
        self._resume: dict | None = None
        self.replay_restored: bool | None = None
        self.fast_greedy = None

    # ---- Lightning plumbing -------------------------------------------------------------
    def configure_optimizers(self):
        optimizer = self.optimizer_factory(self.net.parameters())
        if self.scheduler_factory is None:
            return optimizer
        # Stepped once per round (train_frequency env steps per agent).
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": self.scheduler_factory(optimizer), "interval": "step"}}

    def n_rounds(self) -> int:
        """Rounds left (all of them, or what a resumed run still has to do)."""
        return max(1, math.ceil((self.config.total_steps - self.env_steps) / self.config.train_frequency))

    def train_dataloader(self) -> DataLoader:
        # Each item is one round of the loop; the data itself comes from the environment.
        return DataLoader(range(self.n_rounds()), batch_size=None, shuffle=False)

    def on_fit_start(self) -> None:
        # The agents still learning: all of them, or fewer when resuming a run where some had stopped.
        seeds, E = [self.agent_seeds[a] for a in self.slots], self.envs_per_agent
        self.env = make_vector_env(self.env_cfg, seeds, E, device=self.device)
        self.return_bounds = getattr(self.env, "return_bounds", None)
        self.obs = self.env.reset()
        self.buffer = ReplayBuffer(self.config.buffer_size, self.obs_shape, len(seeds), obs_dtype=self.obs_dtype, device=self.device)
        self.generators = [torch.Generator(device=self.device).manual_seed(s) for s in seeds]
        self.episode_return = torch.zeros(len(seeds) * E, device=self.device, dtype=torch.float64)

    def on_train_start(self) -> None:
        if self._resume is not None:
            self._restore_training_state(self._resume)
            self._resume = None
        self._t_train_start = time.perf_counter()
        self.fast_greedy = None
        if self.device.type == "cpu" and self.fast_acting:
            from pipeline.rl.acting import NumpyGreedy

            self.fast_greedy = NumpyGreedy.for_net(self.net)

    # ---- the algorithm ---------------------------------------------------------------------
    def epsilon(self, env_steps: int | None = None) -> float:
        """Exploration rate at `env_steps` (default: now)."""
        if self.noisy:
            return 0.0
        hp = self.config
        return epsilon_at(self.env_steps if env_steps is None else env_steps, hp.eps_start, hp.eps_end, hp.eps_duration)

    def draw_exploration(self, n_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each learning agent's coin flips and random actions for the round, from its own generator: [n_steps, slots * E]."""
        E = self.envs_per_agent

        def per_agent(draw) -> torch.Tensor:
            return torch.stack([draw(g).view(n_steps, E) for g in self.generators], dim=1).view(n_steps, -1).to(self.device)

        coins = per_agent(lambda g: torch.rand(n_steps * E, generator=g, device=g.device))
        actions = per_agent(lambda g: torch.randint(0, self.n_actions, (n_steps * E,), generator=g, device=g.device))
        return coins, actions

    def greedy_actions(self, obs: torch.Tensor) -> torch.Tensor:
        K, E = len(self.slots), self.envs_per_agent
        if self.fast_greedy is not None:
            return torch.from_numpy(self.fast_greedy(obs.view(K, E, -1).to(torch.float32).numpy())).view(-1)
        with torch.inference_mode():
            return self.net(obs.view(K, E, *self.obs_shape)).argmax(2).view(-1)

    def collect(self, n_steps: int) -> None:
        """n_steps lockstep steps of epsilon-greedy acting (each agent steps its E envs), every agent into its own rows."""
        if isinstance(self.env, GymVectorEnv) and self.env.num_envs == 1 and self.device.type == "cpu":
            return self._collect_one_env(n_steps)
        K, E = len(self.slots), self.envs_per_agent
        coins, random_actions = self.draw_exploration(n_steps)
        # A step's tensors are only appended here and stacked once per round: every torch op in this
        # loop costs microseconds of overhead, for every one of the run's env steps.
        seen, taken, rewards, reached, terminal, ended, returns = [], [], [], [], [], [], []
        # A step where every env explores needs no greedy forward (most steps while epsilon is near 1,
        # e.g. Atari's first 250k): one comparison for the round says which, one host sync, not one a step.
        eps_at = [self.epsilon(self.env_steps + t * E) for t in range(n_steps)]
        eps_t = torch.tensor(eps_at, dtype=coins.dtype).to(coins.device)
        all_explore = (coins < eps_t.view(-1, 1)).all(1).tolist()
        t_act = t_env = 0.0
        for t in range(n_steps):
            t0 = time.perf_counter()
            eps = eps_at[t]
            if eps >= 1.0 or all_explore[t]:
                actions = random_actions[t]
            else:
                actions = self.greedy_actions(self.obs)
                if eps > 0.0:
                    actions = torch.where(coins[t] < eps, random_actions[t], actions)
            t1 = time.perf_counter()
            step = self.env.step(actions)
            self.episode_return = self.episode_return + step.reward
            seen.append(self.obs)
            taken.append(actions)
            rewards.append(step.reward)
            reached.append(step.final_obs)
            terminal.append(step.terminated)
            ended.append(step.done)
            returns.append(self.episode_return)
            self.episode_return = self.episode_return.masked_fill(step.done, 0.0)
            self.obs = step.obs
            self.env_steps += E
            t2 = time.perf_counter()
            t_act += t1 - t0
            t_env += t2 - t1
        t0 = time.perf_counter()

        def per_agent(steps: list[torch.Tensor]) -> torch.Tensor:
            # [T, K * E, ...] -> [T * E, K, ...]: agent k's transitions in step-then-env order.
            x = torch.stack(steps)
            return x.view(n_steps, K, E, *x.shape[2:]).transpose(1, 2).reshape(n_steps * E, K, *x.shape[2:])

        self.buffer.add(per_agent(seen), per_agent(taken), per_agent(rewards), per_agent(reached), per_agent(terminal))
        finished, returns_at_end = torch.stack(ended), torch.stack(returns)
        for t, env in finished.nonzero().tolist():
            self.episode_returns[self.slots[env // E]].append(float(returns_at_end[t, env]))
        self.add_time("act", t_act)
        self.add_time("env", t_env + time.perf_counter() - t0)

    def _collect_one_env(self, n_steps: int) -> None:
        """`collect` for one agent with one gymnasium env on CPU (the single-seed job), in numpy.

        The same steps, draws and records as the general loop, without its six small tensors per step
        (a tensor costs microseconds, a CartPole step about ten): a round's transitions are written to
        numpy arrays and become tensors once. The vector env is stepped through its one env and told
        where it is at the end of the round (its observation, its episode count: what it checkpoints).
        """
        vector, env = self.env, self.env.envs[0]
        coins, random_actions = (x.view(-1).numpy() for x in self.draw_exploration(n_steps))
        seen = np.empty((n_steps, *self.obs_shape), dtype=vector.np_dtype)
        reached = np.empty_like(seen)
        taken = np.empty(n_steps, dtype=np.int64)
        rewards = np.empty(n_steps, dtype=np.float32)
        terminal = np.empty(n_steps, dtype=bool)
        if self.fast_greedy is not None:
            mirror = self.fast_greedy

            def greedy(o: np.ndarray) -> int:
                return int(mirror(o.reshape(1, 1, -1).astype(np.float32, copy=False))[0, 0])
        else:

            def greedy(o: np.ndarray) -> int:
                return int(self.greedy_actions(torch.from_numpy(o[None]))[0])

        obs = self.obs.numpy()[0].copy()
        episode_return = float(self.episode_return[0])
        returns = self.episode_returns[self.slots[0]]
        finished = 0
        t_act = t_env = 0.0
        for t in range(n_steps):
            t0 = time.perf_counter()
            eps = self.epsilon()
            # The general loop's choice: random where eps >= 1 or the agent's coin falls under eps.
            action = int(random_actions[t]) if eps >= 1.0 or (eps > 0.0 and coins[t] < eps) else greedy(obs)
            t1 = time.perf_counter()
            final, reward, terminated, truncated, _ = env.step(action)
            seen[t], reached[t] = obs, final
            taken[t], rewards[t], terminal[t] = action, reward, terminated
            episode_return += float(rewards[t])
            if terminated or truncated:
                returns.append(episode_return)
                episode_return = 0.0
                finished += 1
                final = env.reset()[0]
            obs = np.array(final, dtype=vector.np_dtype)
            self.env_steps += 1
            t2 = time.perf_counter()
            t_act += t1 - t0
            t_env += t2 - t1
        t0 = time.perf_counter()
        self.obs = torch.from_numpy(obs[None])
        vector.set_position(self.obs, finished)
        self.episode_return = torch.tensor([episode_return], dtype=torch.float64)
        self.buffer.add(*(torch.from_numpy(x).unsqueeze(1) for x in (seen, taken, rewards, reached, terminal)))
        self.add_time("act", t_act)
        self.add_time("env", t_env + time.perf_counter() - t0)

    def learn(self) -> None:
        hp = self.config
        if hp.target_update == "hard":
            copies = self.env_steps // hp.target_update_interval
            if copies != self.last_target_copy:
                hard_update(self.target_net, self.net)
                self.last_target_copy = copies
        # The torch optimizer itself: Lightning's manual_backward and LightningOptimizer.step wrap every
        # update in hooks that cost as much as a small network's update, and a round has dozens of them.
        opt = self.optimizers().optimizer
        params = list(self.net.parameters())
        # One agent: torch's own clipping is the same arithmetic in fewer kernels (~1/4 of a small update).
        clip = nn.utils.clip_grad_norm_ if len(self.slots) == 1 else clip_grad_norm_per_member_
        G, B = hp.gradient_steps, hp.batch_size
        batches = self.buffer.sample(G, B, self.generators)
        # A hard-updated target is fixed for the whole round, so without double DQN (whose argmax uses
        # the changing online net) or noise, every TD target of the round comes from one batched forward.
        fixed = hp.target_update == "hard" and not hp.double_dqn and not self.noisy
        layers = relu_mlp_layers(self.net) if self.hand_beta is not None else None
        if fixed:
            K = len(self.slots)
            next_obs = batches.next_obs.transpose(0, 1).reshape(K, G * B, *self.obs_shape)
            target_layers = relu_mlp_layers(self.target_net) if layers is not None else None
            target_net = self.target_net if target_layers is None else functools.partial(relu_mlp_forward, target_layers)
            all_targets = td_targets(
                target_net, self.net, batches.rewards.transpose(0, 1).reshape(K, G * B), next_obs,
                batches.dones.transpose(0, 1).reshape(K, G * B), hp.gamma, double=False,
            ).view(K, G, B).transpose(0, 1)
        losses, qs, targets = [], [], []
        for g in range(G):
            obs, actions, rewards, next_obs, dones = (t[g] for t in batches)
            if self.noisy:
                self.net.reset_noise(self.generators)
                self.target_net.reset_noise(self.generators)
            if fixed:
                target = all_targets[g]
            else:
                target = td_targets(self.target_net, self.net, rewards, next_obs, dones, hp.gamma, hp.double_dqn)
            if layers is not None:
                # The same gradient as the autograd branch below, without the autograd engine.
                q = td_grads_(layers, obs, actions, target, self.hand_beta)
            else:
                q = self.net(obs).gather(2, actions.unsqueeze(2)).squeeze(2)
                # Mean within each agent, SUM across agents: each agent gets exactly its own gradient.
                per_agent = self.loss_fn(q, target).mean(1)
                opt.zero_grad(set_to_none=True)
                per_agent.sum().backward()
                losses.append(per_agent.detach())
            if hp.max_grad_norm:
                clip(params, hp.max_grad_norm)
            opt.step()
            if hp.target_update == "soft":
                soft_update(self.target_net, self.net, hp.tau)
            qs.append(q.detach())
            targets.append(target)
        if self.fast_greedy is not None:
            self.fast_greedy.refresh()
        # The round's Q-values [G, K, B]; the hand-written branch forms its loss values here, in one go.
        q_round = torch.stack(qs)
        if losses:
            round_loss = torch.stack(losses).mean(0)
        else:
            with torch.no_grad():
                round_loss = self.loss_fn(q_round, torch.stack(targets)).mean((0, 2))
        # One host sync per round, not per update.
        check_finite(round_loss, self.env_steps, hint="lower optimizer.lr, use loss=huber or set task.max_grad_norm")
        for slot, (loss, q) in enumerate(zip(round_loss.tolist(), q_round.mean((0, 2)).tolist())):
            agent = self.slots[slot]
            self.updates[agent] += G
            self.recent[agent]["loss"].append(loss)
            self.recent[agent]["q"].append(q)

    def stop_agents(self, stopping: list[int], reason: dict[int, str]) -> None:
        """Agents at slots `stopping` stop learning: their weights go to the record and they leave the batch.

        Dropping them (rather than masking their updates) makes every later step and update cheaper;
        the others keep their weights, optimizer moments, buffers, envs and generators, only re-indexed.
        """
        elapsed = self.elapsed_s()
        for slot in stopping:
            agent = self.slots[slot]
            self.agents_net.load_member_state_dict(agent, self.net.member_state_dict(slot))
            self.stop_step[agent] = self.env_steps
            self.stop_time_s[agent] = elapsed
            self.early_stop[agent] = {"env_step": self.env_steps, "reason": reason[slot]}
        keep_slots = [s for s in range(len(self.slots)) if s not in stopping]
        if not keep_slots:
            self.slots = []
            return
        self._keep_slots(keep_slots)

    def _keep_slots(self, keep_slots: list[int], optimizer: bool = True) -> None:
        keep = torch.tensor(keep_slots, device=self.device)
        E = self.envs_per_agent
        keep_envs = (keep.view(-1, 1) * E + torch.arange(E, device=self.device)).view(-1)
        n_before = len(self.slots)
        pairs = self.net.keep_members_(keep)
        if optimizer:
            keep_optimizer_members_(self.optimizers().optimizer, pairs, keep, n_before)
        self.target_net.keep_members_(keep)
        if hasattr(self, "buffer"):
            self.buffer.keep_agents_(keep)
            self.env.keep_envs_(keep_envs)
            self.obs = self.obs.index_select(0, keep_envs)
            self.episode_return = self.episode_return.index_select(0, keep_envs)
            self.generators = [self.generators[s] for s in keep_slots]
        self.slots = [self.slots[s] for s in keep_slots]
        if self.fast_greedy is not None:
            self.fast_greedy.refresh()

    def training_step(self, batch, batch_idx):
        hp = self.config
        steps = min(hp.train_frequency, hp.total_steps - self.env_steps)
        if steps <= 0 or not self.slots:
            self.trainer.should_stop = True
            return None
        before = self.env_steps
        self.collect(math.ceil(steps / self.envs_per_agent))
        if len(self.buffer) >= hp.learning_starts and hp.gradient_steps > 0:
            t0 = time.perf_counter()
            self.learn()
            self.add_time("learn", time.perf_counter() - t0)
            scheduler = self.lr_schedulers()
            if scheduler is not None:
                scheduler.step()
        if self.env_steps - self.last_log_step >= hp.log_every:
            self.log_progress()
        if self.env_steps // hp.eval_every != before // hp.eval_every:
            self.evaluate_now()
        if not self.slots:
            self.trainer.should_stop = True
        if self.checkpoint_hook is not None:
            self.checkpoint_hook()  # saves when due, and stops the fit when a stop was requested
        return None

    def learning_agents(self) -> list[int]:
        return list(self.slots)

    # ---- evaluation --------------------------------------------------------------------------
    def greedy_returns(self, net: nn.Module, agents: list[int], n_episodes: int, seed_offset: int) -> np.ndarray:
        """[len(agents), n_episodes] greedy returns of `net`'s members (member m plays for `agents[m]`)."""
        # A Module, so evaluate_agents runs the net in eval mode (noisy nets on their mean weights, no dropout)
        # under inference_mode, and puts it back in the mode it was in.
        returns = evaluate_agents(
            GreedyPolicy(net), self.env_cfg, [self.agent_seeds[i] for i in agents], n_episodes, seed_offset, device=self.device,
        )
        return returns.double().cpu().numpy()

    def evaluate_now(self) -> None:
        t0 = time.perf_counter()
        returns = self.greedy_returns(self.net, self.slots, self.config.eval_episodes, EVAL_SEED_OFFSET)
        self.add_time("eval", time.perf_counter() - t0)
        elapsed = self.elapsed_s()
        stop = self.config.stop_at_return
        stopping, reasons, means = [], {}, []
        for slot, agent in enumerate(self.slots):
            mean, std = float(returns[slot].mean()), float(returns[slot].std())
            means.append(mean)
            self.note_evaluation(agent, mean, std, elapsed)
            if stop is not None and mean >= stop:
                stopping.append(slot)
                reasons[slot] = f"greedy evaluation mean {mean:.1f} >= stop_at_return {stop}"
        if self.n_agents > 1:
            self._log_shared({"batch/eval_return_mean": float(np.mean(means)), "batch/agents_learning": float(len(self.slots))})
        self.record_training_videos(self.net.member_state_dict)
        # A pruned trial stops every agent still learning, and their records say so (the tuner and the report count them).
        if self.pruned_by_tuner():
            stopping = list(range(len(self.slots)))
            reasons = dict.fromkeys(stopping, "pruned by the tuner")
        if stopping:
            self.stop_agents(stopping, reasons)

    def log_progress(self) -> None:
        t0 = time.perf_counter()
        elapsed = max(self.elapsed_s(), 1e-9)
        for agent in self.slots:
            row = {"train/epsilon": self.epsilon(), "perf/env_steps_per_s": self.env_steps / elapsed}
            if self.episode_returns[agent]:
                row["train/episodic_return"] = float(np.mean(self.episode_returns[agent][-10:]))
            recent = self.recent[agent]
            if recent["loss"]:
                row["train/loss"] = float(np.mean(recent["loss"]))
                row["train/q_mean"] = float(np.mean(recent["q"]))
            self.recent[agent] = {"loss": [], "q": []}
            self._agent_row(agent, row)
        if self.n_agents > 1:
            self._log_shared({"batch/env_steps_per_s": self.total_env_steps() / elapsed})
        self.last_log_step = self.env_steps
        self.add_time("log", time.perf_counter() - t0)

    def on_train_end(self) -> None:
        self._train_seconds = self.elapsed_s()
        if self.slots:
            self.log_progress()
        for slot, agent in enumerate(self.slots):
            self.agents_net.load_member_state_dict(agent, self.net.member_state_dict(slot))
        if self.checkpoint_hook is not None:
            self.checkpoint_hook(final=True)

    # ---- checkpoints ---------------------------------------------------------------------------
    def _replay_worth_saving(self) -> bool:
        if self.save_replay == "auto":
            held = self.buffer.n_agents * len(self.buffer) * self.replay_bytes_per_transition
            return held <= self.replay_save_max_mb * 2**20
        return bool(self.save_replay)

    def checkpoint_state(self) -> dict:
        """Everything needed to continue this run where it is, in distribution (plain values: weights_only loads)."""
        opt = self.optimizers().optimizer
        scheduler = self.lr_schedulers()
        save_replay = self._replay_worth_saving()
        return {
            "format": CHECKPOINT_FORMAT,
            "n_agents": self.n_agents, "agent_seeds": self.agent_seeds, "slots": list(self.slots),
            "progress": copy.deepcopy({f.name: getattr(self, f.name) for f in fields(DQNProgress)}),
            "elapsed_s": self.elapsed_s(), "time_breakdown_s": dict(self.time_breakdown_s),
            **{name: getattr(self, name).state_dict() for name in CHECKPOINTED_NETS},
            # The training loop's objects (they exist from train start on: restored by _restore_training_state).
            "optimizer": opt.state_dict(), "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "generators": [g.get_state() for g in self.generators], "rng": rng_state(),
            "env": self.env.state_dict(), "obs": self.obs, "episode_return": self.episode_return,
            "replay": self.buffer.state_dict() if save_replay else None,
        }

    @property
    def resume_step(self) -> int:
        return self.env_steps

    def load_checkpoint_state(self, state: dict) -> int:
        """Before fit: the structure (which agents still learn) and the weights. The rest at train start."""
        self.check_checkpoint(state, CHECKPOINT_FORMAT)
        slots = [int(s) for s in state["slots"]]
        if slots and slots != self.slots:
            self._keep_slots([self.slots.index(s) for s in slots], optimizer=False)
        self.slots = slots
        # With every agent stopped, only the record's weights matter (the learning nets are not used again).
        for name in CHECKPOINTED_NETS if slots else ("agents_net",):
            try:
                getattr(self, name).load_state_dict(state[name])
            except RuntimeError as exc:
                raise ValueError(f"checkpoint weights do not fit this model (changed model.* since?): {str(exc).splitlines()[0]}") from None
        for f in fields(DQNProgress):
            setattr(self, f.name, copy.deepcopy(state["progress"][f.name]))
        self._elapsed_before = float(state["elapsed_s"])
        self.time_breakdown_s = dict(state.get("time_breakdown_s") or {})
        self._resume = state
        return self.env_steps

    def _restore_training_state(self, state: dict) -> None:
        opt = self.optimizers().optimizer
        opt.load_state_dict(state["optimizer"])
        scheduler = self.lr_schedulers()
        if scheduler is not None and state.get("scheduler") is not None:
            scheduler.load_state_dict(state["scheduler"])
        if self.slots:
            self.generators = [torch.Generator(device=self.device) for _ in self.slots]
            for g, s in zip(self.generators, state["generators"]):
                g.set_state(s)
            self.env.load_state_dict(state["env"])
            self.obs = state["obs"].to(self.device)
            self.episode_return = state["episode_return"].to(self.device)
            if state.get("replay") is not None:
                self.buffer.load_state_dict(state["replay"])
                self.replay_restored = True
            else:
                self.replay_restored = False  # too large to save: the resumed run refills it first
        set_rng_state(state["rng"])

    # ---- the contract with run.py ------------------------------------------------------------
    def fit_and_evaluate(self, trainer, datamodule, ckpt_path) -> list[dict[str, float]]:
        if trainer.precision not in ("32-true", "32"):
            raise ValueError(f"task=dqn runs in fp32; got device.precision={trainer.precision}, use device.precision=32-true")
        if self.env_steps < self.config.total_steps and self.slots:
            trainer.fit(self)
        t0 = time.perf_counter()
        agents = list(range(self.n_agents))
        returns = self.greedy_returns(self.agents_net, agents, self.config.final_eval_episodes, FINAL_EVAL_SEED_OFFSET)
        self.add_time("final_eval", time.perf_counter() - t0)
        self.final_metrics = []
        for i in agents:
            final = {"eval/return_mean": float(returns[i].mean()), "eval/return_std": float(returns[i].std())}
            self._agent_row(i, {f"final_{k}": v for k, v in final.items()}, step=self.agent_env_steps(i))
            self.final_metrics.append(
                {**final, "train/episodes": float(len(self.episode_returns[i])), "train/updates": float(self.updates[i])}
            )
        if self.n_agents > 1:
            self._log_shared({"batch/final_eval_return_mean": float(returns.mean())})
        if hasattr(self, "env"):
            self.env.close()
        return self.final_metrics

    def agent_env_steps(self, i: int) -> int:
        return self.stop_step[i] if self.stop_step[i] is not None else self.env_steps

    def total_env_steps(self) -> int:
        """Env steps over all agents: each stopped agent counts until its stop."""
        return sum(self.agent_env_steps(i) for i in range(self.n_agents))

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
        """Agent i's weights as the plain network's state_dict (what model.pt holds)."""
        return {k: v.detach().cpu() for k, v in self.agents_net.member_state_dict(i).items()}

"""Deep Q-learning (Mnih et al. 2015) for K agents at once, as a Lightning module (K = 1 is an ordinary run).

Reads top to bottom like a single-file DQN, with every tensor given a leading agent axis: agent i is
seed `seed + i` with its own network (member i of an ensemble: `nets.ensemble.make_ensemble`; any module built as
`model(in_features=..., out_features=n_actions)`, `pipeline.nets.contracts.DQN`), target
network, optimizer state (one optimizer over the stacked weights is K independent optimizers,
because the loss is the SUM over agents of each agent's MEAN TD loss and gradients are clipped per
agent), replay rows, epsilon schedule, envs (rows i*E ... of one vector env: `rl.vector`) and random
streams (a generator seeded with `seed + i` for its exploration and replay draws). Agent i of a
K-agent run therefore trains like the single run of seed `seed + i`, in distribution.

One Lightning step is one round of the classic loop: `train_frequency` env steps per agent of
epsilon-greedy acting (each agent stepping its `envs_per_agent` envs), then `gradient_steps` TD
updates on minibatches sampled in one draw, then (every `eval_every` env steps) a greedy evaluation
on separately seeded envs; RLTask's stop rule takes an agent out of the batch once its evaluation shows
`stop_at_return`.

Everything around the algorithm (the K-agent batch, evaluation and the stop rule, logging, checkpoints, records)
is `pipeline.tasks.rl_task.RLTask`'s, and the replay buffer (its rows per agent, its checkpoint when small enough, its
record fields) `pipeline.tasks.offpolicy.OffPolicyTask`'s; this file is the algorithm through their hooks. A
checkpoint adds the target network and the scheduler to theirs.
"""

from __future__ import annotations

import copy
import functools
import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from pipeline.nets import contracts
from pipeline.nets.ensemble import (
    clip_grad_norm_per_member_,
    compile_over_members,
    compiled_graphs,
    make_ensemble,
    stacked_optimizer,
)
from pipeline.nets.stacked import check_outputs
from pipeline.nets.td_grad import loss_derivative, relu_mlp_forward, relu_mlp_layers, td_grads_
from pipeline.rl.policies import QValuePolicy
from pipeline.rl.schedules import epsilon_at
from pipeline.rl.targets import freeze, hard_update, soft_update
from pipeline.rl.vector import GymVectorEnv
from pipeline.tasks.base import TaskParts, check_finite
from pipeline.tasks.configs import DQNConfig
from pipeline.tasks.offpolicy import OffPolicyProgress, OffPolicyTask
from pipeline.tasks.rl_task import per_agent


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


def td_loss(net: nn.Module, loss_fn: nn.Module, obs: torch.Tensor, actions: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each agent's mean TD loss [K] over its minibatch (obs [K, B, ...], actions and target [K, B]) and the taken
    actions' Q-values [K, B]. Summed over agents (mean within each, SUM across) it gives each agent its own gradient."""
    q = net(obs).gather(2, actions.unsqueeze(2)).squeeze(2)
    return loss_fn(q, target).mean(1), q


def hand_td_grads(net: nn.Module, beta: float, obs: torch.Tensor, actions: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """`td_grads_` (the TD gradient written out) into a ReLU ensemble MLP's `.grad`s; returns the taken Q-values [K, B].

    Like `td_loss`, a plain function of the networks it is given, so torch.compile sees their parameters as inputs whose
    member axis may shrink (`pipeline.nets.ensemble.compile_over_members`)."""
    return td_grads_(relu_mlp_layers(net), obs, actions, target, beta)


@dataclass
class DQNProgress(OffPolicyProgress):
    """DQN's own counters beside the off-policy layer's (`updates`: TD updates of each agent)."""

    recent: list[dict[str, list[float]]] = per_agent(lambda: {"loss": [], "q": []})  # since the last log row
    last_target_copy: int = -1


class DQNTask(OffPolicyTask):
    Config = DQNConfig
    algorithm = "dqn"
    checkpoint_format = "pipeline.dqn/4"  # 4: RLTask's skeleton
    RunProgress = DQNProgress
    policy = QValuePolicy
    checkpointed_nets = ("net", "target_net", "agents_net")
    evaluation_kind = "greedy"

    def __init__(self, config: DQNConfig, parts: TaskParts):
        loss = parts.require("loss", "dqn", "use loss=huber or loss=mse")
        super().__init__(config, parts)
        hp = self.config
        self.target_net = freeze(copy.deepcopy(self.net))
        self.noisy = hasattr(self.net, "reset_noise")
        self.loss_fn = elementwise(loss)
        self.scheduler_factory = parts.scheduler
        self.fast_acting = bool(hp.fast_acting)
        # A ReLU MLP's TD gradient written out by hand (nets/td_grad.py) when the net and loss allow it.
        beta = loss_derivative(self.loss_fn) if hp.hand_gradients and not self.noisy else None
        self.hand_beta = beta if beta is not None and relu_mlp_layers(self.net) is not None else None
        self.fast_greedy = None
        self.compiled_steps = None  # (hand_td_grads, td_loss) through torch.compile (device.compile=true), made on first use
        self.compile_s = 0.0  # seconds spent compiling the update so far

    # ---- RLTask's hooks ---------------------------------------------------------------------------
    def build_net(self, parts: TaskParts) -> nn.Module:
        net = parts.require("net", "dqn", "choose a network with model=mlp|dueling|noisy|atari_cnn")
        act_space = self.action_space
        if not hasattr(act_space, "n"):
            raise ValueError(f"DQN needs a discrete action space; {self.env_id} has {act_space}: use task=ppo for continuous actions")
        self.n_actions = int(act_space.n)
        # Our Q-networks as hand-written ensembles; any other module stacked generically (nets/stacked.py).
        ensemble = make_ensemble(net, self.agent_seeds, self.obs_shape, self.n_actions)
        check_outputs(ensemble, "dqn", f"model=mlp|dueling|noisy|atari_cnn or a model of your own: {contracts.DQN.describe()}", self.obs_shape, ("N", self.n_actions))
        return ensemble

    def configure_optimizers(self):
        optimizer = stacked_optimizer(self.optimizer_factory, self.net.parameters())
        if self.scheduler_factory is None:
            return optimizer
        # Stepped once per round (train_frequency env steps per agent).
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": self.scheduler_factory(optimizer), "interval": "step"}}

    def on_train_start(self) -> None:
        super().on_train_start()
        self.fast_greedy = None
        if self.device.type == "cpu" and self.fast_acting:
            from pipeline.rl.acting import NumpyGreedy

            self.fast_greedy = NumpyGreedy.for_net(self.net)

    def iterations_left(self) -> int:
        """Rounds left (all of them, or what a resumed run still has to do)."""
        return max(0, math.ceil((self.config.total_steps - self.env_steps) / self.config.train_frequency))

    def iterate(self) -> None:
        """One round: `train_frequency` env steps per agent of epsilon-greedy acting, then `gradient_steps` updates."""
        hp = self.config
        steps = min(hp.train_frequency, hp.total_steps - self.env_steps)
        self.collect(math.ceil(steps / self.envs_per_agent))
        if len(self.buffer) >= hp.learning_starts and hp.gradient_steps > 0:
            t0, compile_before = time.perf_counter(), self.compile_s
            self.learn()
            compiling = self.compile_s - compile_before
            self.add_time("learn", time.perf_counter() - t0 - compiling)
            if compiling:
                self.add_time("compile", compiling)
            scheduler = self.lr_schedulers()
            if scheduler is not None:
                scheduler.step()

    def keep_agents_(self, keep: torch.Tensor, keep_slots: list[int], training: bool) -> None:
        self.target_net.keep_members_(keep)
        super().keep_agents_(keep, keep_slots, training)
        if self.fast_greedy is not None:
            self.fast_greedy.refresh()

    def train_metrics(self, slot: int, agent: int) -> dict[str, float]:
        row = {"train/epsilon": self.epsilon()}
        recent = self.recent[agent]
        if recent["loss"]:
            row["train/loss"] = float(np.mean(recent["loss"]))
            row["train/q_mean"] = float(np.mean(recent["q"]))
        self.recent[agent] = {"loss": [], "q": []}
        return row

    def algorithm_state(self) -> dict:
        scheduler = self.lr_schedulers()
        return {**super().algorithm_state(), "scheduler": scheduler.state_dict() if scheduler is not None else None}

    def resume_algorithm_state(self, state: dict) -> None:
        scheduler = self.lr_schedulers()
        if scheduler is not None and state.get("scheduler") is not None:
            scheduler.load_state_dict(state["scheduler"])
        super().resume_algorithm_state(state)

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
        t_start = time.perf_counter()  # the round's exploration draws are acting too (~16% of a K = 16 round's time)
        coins, random_actions = self.draw_exploration(n_steps)
        # A step's tensors are only appended here and stacked once per round: every torch op in this
        # loop costs microseconds of overhead, for every one of the run's env steps.
        seen, taken, rewards, reached, terminal = [], [], [], [], []
        # A step where every env explores needs no greedy forward (most steps while epsilon is near 1,
        # e.g. Atari's first 250k): one comparison for the round says which, one host sync, not one a step.
        eps_at = [self.epsilon(self.env_steps + t * E) for t in range(n_steps)]
        eps_t = torch.tensor(eps_at, dtype=coins.dtype).to(coins.device)
        all_explore = (coins < eps_t.view(-1, 1)).all(1).tolist()
        self.add_time("act", time.perf_counter() - t_start)
        for t in range(n_steps):
            t0 = time.perf_counter()
            eps = eps_at[t]
            if eps >= 1.0 or all_explore[t]:
                actions = random_actions[t]
            else:
                actions = self.greedy_actions(self.obs)
                if eps > 0.0:
                    actions = torch.where(coins[t] < eps, random_actions[t], actions)
            seen.append(self.obs)
            taken.append(actions)
            step = self.step_envs(actions, acting_since=t0)
            rewards.append(step.reward)
            reached.append(step.final_obs)
            terminal.append(step.terminated)
        t0 = time.perf_counter()

        def per_agent(steps: list[torch.Tensor]) -> torch.Tensor:
            # [T, K * E, ...] -> [T * E, K, ...]: agent k's transitions in step-then-env order.
            x = torch.stack(steps)
            return x.view(n_steps, K, E, *x.shape[2:]).transpose(1, 2).reshape(n_steps * E, K, *x.shape[2:])

        self.buffer.add(per_agent(seen), per_agent(taken), per_agent(rewards), per_agent(reached), per_agent(terminal))
        self.add_time("env", time.perf_counter() - t0)

    def _collect_one_env(self, n_steps: int) -> None:
        """`collect` for one agent with one gymnasium env on CPU (the single-seed job), in numpy.

        The same steps, draws and records as the general loop, without its six small tensors per step
        (a tensor costs microseconds, a CartPole step about ten): a round's transitions are written to
        numpy arrays and become tensors once, and the bookkeeping of `step_envs` (observation, env steps,
        episode returns and their credit, timing) is done here on plain numbers. The vector env is stepped
        through its one env and told where it is at the end of the round (its observation, its episode
        count: what it checkpoints).
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

    def update_steps(self):
        """(`hand_td_grads`, `td_loss`), or the same through torch.compile with `device.compile=true` (compiled on first use)."""
        if not self.compile_updates:
            return hand_td_grads, td_loss
        if self.compiled_steps is None:
            self.compiled_steps = (compile_over_members(hand_td_grads, self.device), compile_over_members(td_loss, self.device))
        return self.compiled_steps

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
        hand_grads, td_loss = self.update_steps()
        timed = self.compile_updates
        for g in range(G):
            graphs, t0 = (compiled_graphs(), time.perf_counter()) if timed else (0, 0.0)
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
                q = hand_grads(self.net, self.hand_beta, obs, actions, target)
            else:
                per_agent, q = td_loss(self.net, self.loss_fn, obs, actions, target)
                opt.zero_grad(set_to_none=True)
                per_agent.sum().backward()
                losses.append(per_agent.detach())
            if hp.max_grad_norm:
                clip(params, hp.max_grad_norm)
            opt.step()
            if timed and compiled_graphs() != graphs:  # this update compiled: its time is compile time
                self.compile_s += time.perf_counter() - t0
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

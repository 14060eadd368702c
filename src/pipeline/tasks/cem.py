"""The cross-entropy method for RL, for K agents at once (K = 1 is an ordinary run), on `RLTask`.

Each Lightning step is one iteration of every learning agent: `episodes_per_batch` episodes of its stochastic policy
run side by side (one batched forward of the ensemble per env step for every agent's episodes), the episodes whose
return is at or above the `elite_percentile` of its batch are kept, and its policy is fitted to their
(observation, action) pairs with cross-entropy. RLTask runs everything around it (the K-agent batch, the stop rule,
logging, checkpoints and exact resume, records and model files); this file is the algorithm: its network, its
envs (CEM plays whole episodes, which the vector env cannot: `vector_env = False`), one iteration, and its state.

Agent i is seed `seed + i`: member i of the ensemble (initialised as the single run of its seed), its own envs
(episode j of iteration t resets with seed `(seed + i) * 1_000_003 + t * episodes_per_batch + j`), its own
sampling generator and Adam moments, and its own loss (the sum over agents of each agent's mean cross-entropy,
each agent's forward run on its own elite: its gradient is the one it gets alone). It therefore trains like the
single run of seed `seed + i`. Its stop rule screens each batch: a batch mean reaching `stop_at_return` is
confirmed on `stop_confirm_episodes` fresh greedy episodes (docs/rl.md#the-stop-rule) and the agent leaves the batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from pipeline.nets import contracts
from pipeline.nets.ensemble import make_ensemble
from pipeline.nets.stacked import check_outputs
from pipeline.rl.envs import make_env, obs_to_tensor
from pipeline.rl.policies import CategoricalPolicy
from pipeline.tasks.base import TaskParts, check_finite
from pipeline.tasks.configs import CEMConfig
from pipeline.tasks.rl_task import RLProgress, RLTask, per_agent

# Episode j of agent seed s's iteration t resets with seed s * EPISODE_SEED_STRIDE + t * episodes_per_batch + j.
EPISODE_SEED_STRIDE = 1_000_003


@dataclass
class CEMProgress(RLProgress):
    """CEM's counters beside RLTask's: env_steps is the longest-running learning agent's (the batch's x axis)."""

    iterations: int = 0
    agent_steps: list[int] = per_agent(int)  # each agent's own env steps (its batches differ in length)
    batch_means: list[list[float]] = per_agent(list)  # each iteration's batch mean return, per agent


class CEMTask(RLTask):
    """The cross-entropy method: play a batch of episodes per agent, keep the best, imitate them."""

    Config = CEMConfig
    primary_curve = "train/batch_return_mean"
    algorithm = "cem"
    checkpoint_format = "pipeline.cem/2"
    RunProgress = CEMProgress
    policy = CategoricalPolicy
    evaluation_kind = "greedy"
    vector_env = False

    def build_net(self, parts: TaskParts) -> nn.Module:
        if not isinstance(self.action_space, gym.spaces.Discrete):
            raise ValueError(f"CEM here needs a discrete action space; {self.env_id} has {self.action_space}")
        factory = parts.require("net", "cem", "choose a network with model=mlp")
        loss = parts.loss
        if loss is not None and not isinstance(loss, nn.CrossEntropyLoss):
            raise ValueError(f"task=cem fits the elite actions with cross-entropy; got {type(loss).__name__}: use loss=cross_entropy")
        self.loss_fn = loss if loss is not None else nn.CrossEntropyLoss()
        self.n_actions = int(self.action_space.n)
        self.env_kwargs = dict(self.env_cfg.get("kwargs") or {})
        # Each agent's envs, one per episode of a batch (indexed by agent: a stopped agent's are closed at the end).
        self.envs = [[make_env(self.env_cfg) for _ in range(self.config.episodes_per_batch)]
                     for _ in self.agent_seeds]
        # The sampling generators exist before a fit (a batch can be played by hand); the fit seeds them again.
        self.generators = [torch.Generator().manual_seed(s) for s in self.agent_seeds]
        self._recent: dict[str, list[float]] = {}  # the last iteration's numbers, per learning slot
        # Our MLP as a hand-written ensemble; any other module stacked generically (nets/stacked.py).
        ensemble = make_ensemble(factory, self.agent_seeds, self.obs_shape, self.n_actions)
        check_outputs(ensemble, "cem", f"model=mlp or a model of your own: {contracts.CEM.describe()}", self.obs_shape, ("N", self.n_actions))
        return ensemble

    # ---- RLTask's hooks ---------------------------------------------------------------------------
    def iterations_left(self) -> int:
        return max(0, self.config.max_iterations - self.iterations)

    def budget(self) -> tuple[int, int, str]:
        return self.iterations, self.config.max_iterations, "iterations"

    def agent_env_steps(self, i: int) -> int:
        return self.agent_steps[i]

    def confirmation_round(self) -> int:
        return self.iterations

    def iteration_screening(self) -> dict[int, float]:
        return {slot: self.batch_means[agent][-1] for slot, agent in enumerate(self.slots)}

    def train_metrics(self, slot: int, agent: int) -> dict[str, float]:
        return {k: v[slot] for k, v in self._recent.items()}

    def keep_agents_(self, keep: torch.Tensor, keep_slots: list[int], training: bool) -> None:
        self._recent = {k: [v[s] for s in keep_slots] for k, v in self._recent.items()}

    def final_agent_metrics(self, i: int) -> dict[str, float]:
        return {"train/iterations": float(len(self.batch_means[i]))}

    def close_envs(self) -> None:
        for envs in self.envs:
            for env in envs:
                env.close()

    def iterate(self) -> None:
        t0 = time.perf_counter()
        batches = self.play_batch()
        t1 = time.perf_counter()
        self.add_time("env_act", t1 - t0)
        xs, ys, cutoffs = [], [], []
        for (obs, actions, returns), agent in zip(batches, self.slots):
            cutoff = float(np.percentile(returns, self.config.elite_percentile))
            elite = [i for i, r in enumerate(returns) if r >= cutoff]
            # Only the elite episodes cross into torch.
            xs.append(obs_to_tensor(np.concatenate([obs[i] for i in elite]), self.device))
            ys.append(torch.tensor([a for i in elite for a in actions[i]], device=self.device))
            cutoffs.append(cutoff)
            self.batch_means[agent].append(float(returns.mean()))
            self.episode_returns[agent].extend(float(r) for r in returns)
        losses = self.fit_elite(xs, ys)
        check_finite(losses, self.iterations)
        self.add_time("learn", time.perf_counter() - t1)
        self.iterations += 1
        self.env_steps = max(self.agent_steps)
        self._recent = {"train/batch_return_mean": [self.batch_means[a][-1] for a in self.slots],
                        "train/elite_cutoff": cutoffs, "train/loss": losses.tolist()}

    # ---- the algorithm ----------------------------------------------------------------------------
    def play_batch(self) -> list[tuple[list[np.ndarray], list[list[int]], np.ndarray]]:
        """One batch per learning agent, in slot order: `episodes_per_batch` seeded episodes of its policy, actions
        sampled from its softmax with its generator. Each is (observations per episode [T, *obs], actions per
        episode, returns [episodes]); the agents' env steps are counted."""
        n, slots = self.config.episodes_per_batch, list(self.slots)
        first = [[env.reset(seed=self.agent_seeds[a] * EPISODE_SEED_STRIDE + self.iterations * n + j)[0]
                  for j, env in enumerate(self.envs[a])] for a in slots]
        current = np.stack([np.stack(o) for o in first])  # [slots, n, *obs]: a finished episode keeps its last one
        episode_obs = [[[] for _ in range(n)] for _ in slots]
        episode_act = [[[] for _ in range(n)] for _ in slots]
        returns = np.zeros((len(slots), n))
        alive = [list(range(n)) for _ in slots]
        with torch.inference_mode():
            while any(alive):
                probs = torch.softmax(self.net(obs_to_tensor(current, self.device)), dim=-1)
                for s, agent in enumerate(slots):
                    if not alive[s]:
                        continue
                    actions = torch.multinomial(probs[s, alive[s]], 1, generator=self.generators[s]).squeeze(1).tolist()
                    still = []
                    for i, action in zip(alive[s], actions):
                        episode_obs[s][i].append(current[s, i].copy())
                        episode_act[s][i].append(action)
                        current[s, i], reward, terminated, truncated, _ = self.envs[agent][i].step(action)
                        returns[s, i] += reward
                        self.agent_steps[agent] += 1
                        if not (terminated or truncated):
                            still.append(i)
                    alive[s] = still
        return [([np.stack(o) for o in episode_obs[s]], episode_act[s], returns[s]) for s in range(len(slots))]

    def fit_elite(self, xs: list[torch.Tensor], ys: list[torch.Tensor]) -> torch.Tensor:
        """`fit_epochs` optimizer steps of every learning agent's policy on its elite pairs (xs[s], ys[s]); the losses
        [slots] of the last. Agent s's loss comes from its own forward (its member's output for its elite, the
        ensemble's input holding only that), so its gradient, and its shapes, are the ones it has alone."""
        opt = self.optimizers().optimizer
        K = len(self.slots)
        for _ in range(self.config.fit_epochs):
            opt.zero_grad(set_to_none=True)
            losses = []
            for s, (x, y) in enumerate(zip(xs, ys)):
                loss = self.loss_fn(self.net(x.expand(K, *x.shape))[s], y)
                loss.backward()
                losses.append(loss.detach())
            opt.step()
        return torch.stack(losses)

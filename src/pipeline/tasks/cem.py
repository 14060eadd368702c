"""The cross-entropy method for RL: play a batch of episodes, keep the best, imitate them.

Each Lightning step is one iteration: `episodes_per_batch` episodes of the stochastic policy run side by
side (one batched forward per env step for all of them), the episodes whose return is at or above the
`elite_percentile` are kept, and the policy is fitted to their (observation, action) pairs with
cross-entropy. Training stops when a batch's mean return reaches `stop_at_return` and `stop_confirm_episodes` fresh
greedy episodes confirm it (their mean reaches it too: the stop rule of every RL task, docs/rl.md#the-stop-rule).

Durable: a batch's episodes start from seeds fixed by the seed and the iteration, so `checkpoint_state()` (the
network, Adam's moments, the counters, the sampling generator and the global RNG) is all a resumed run needs to go
on exactly; it is saved between iterations, periodically and on a stop request (SIGINT/SIGTERM).
"""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from pipeline.nets.factory import make_net
from pipeline.rl.envs import env_threshold, evaluate_greedy, obs_to_tensor
from pipeline.store.checkpoint import rng_state, set_rng_state
from pipeline.tasks.base import Task, TaskParts, check_finite
from pipeline.tasks.configs import CEMConfig

FINAL_EVAL_SEED_OFFSET = 20_000
CONFIRM_SEED_OFFSET = 30_000  # the stop rule's confirmation after iteration i plays from CONFIRM_SEED_OFFSET + n * i on
CHECKPOINT_FORMAT = "pipeline.cem/1"
# What a CEM run counts as it trains: saved in checkpoints as they are.
PROGRESS = ("env_steps", "iterations", "batch_means", "confirmations", "time_to_threshold_s", "early_stop")


class CEMTask(Task):
    Config = CEMConfig
    uses = frozenset({"model", "optimizer", "loss", "env"})
    primary_metric = "eval/return_mean"
    primary_curve = "train/batch_return_mean"
    monitorable_metrics = ()  # it stops early by itself: task.stop_at_return
    checkpointing = "state"

    def __init__(self, config: CEMConfig, parts: TaskParts):
        super().__init__(config, parts)
        net = parts.require("net", "cem", "choose a network with model=mlp")
        optimizer = parts.require("optimizer", "cem", "choose one with optimizer=adam|sgd|...")
        env = parts.require("env", "cem", "choose an environment with env=cartpole|acrobot")
        loss = parts.loss
        self.automatic_optimization = False
        self.env_id = env["id"]
        self.env_kwargs = dict(env.get("kwargs") or {})
        self.envs = [gym.make(self.env_id, **self.env_kwargs) for _ in range(int(config.episodes_per_batch))]
        probe = self.envs[0]
        if not hasattr(probe.action_space, "n"):
            raise ValueError(f"CEM here needs a discrete action space; {self.env_id} has {probe.action_space}")
        self.n_actions = int(probe.action_space.n)
        self.net = make_net(net, int(np.prod(probe.observation_space.shape)), self.n_actions)
        if loss is not None and not isinstance(loss, nn.CrossEntropyLoss):
            raise ValueError(f"task=cem fits the elite actions with cross-entropy; got {type(loss).__name__}: use loss=cross_entropy")
        self.loss_fn = loss if loss is not None else nn.CrossEntropyLoss()
        self.optimizer_factory = optimizer
        self.elite_percentile = float(config.elite_percentile)
        self.fit_epochs = int(config.fit_epochs)
        self.max_iterations = int(config.max_iterations)
        self.stop_at_return = config.stop_at_return
        self.stop_confirm_episodes = int(config.stop_confirm_episodes)
        self.final_eval_episodes = int(config.final_eval_episodes)
        self.threshold = config.threshold if config.threshold is not None else env_threshold(self.env_id)
        self.sample_gen = torch.Generator().manual_seed(self.seed)
        self.env_steps = 0
        self.iterations = 0
        self.batch_means: list[float] = []
        self.confirmations: list[tuple[int, float]] = []  # (env_step, mean) of each confirmation played
        self.time_to_threshold_s: float | None = None
        self.early_stop: dict | None = None
        self._t0: float | None = None
        self._elapsed_before = 0.0  # training seconds of earlier segments (a resumed run)
        self._train_seconds = 0.0
        self._resume: dict | None = None

    def configure_optimizers(self):
        return self.optimizer_factory(self.net.parameters())

    def train_dataloader(self) -> DataLoader:
        return DataLoader(range(max(1, self.max_iterations - self.iterations)), batch_size=None, shuffle=False)

    def on_fit_start(self) -> None:
        self.sample_gen = torch.Generator(device=self.device).manual_seed(self.seed)

    def on_train_start(self) -> None:
        if self._resume is not None:
            self.optimizers().optimizer.load_state_dict(self._resume["optimizer"])
            self.sample_gen.set_state(self._resume["sample_gen"])
            set_rng_state(self._resume["rng"])
            self._resume = None
        self._t0 = time.perf_counter()

    def elapsed_s(self) -> float:
        """Training seconds so far, over every segment of the run."""
        return self._elapsed_before + (time.perf_counter() - self._t0 if self._t0 is not None else 0.0)

    def play_batch(self) -> tuple[list[np.ndarray], list[list[int]], np.ndarray]:
        """One episode per env, side by side, actions sampled from the policy's softmax."""
        n = len(self.envs)
        base = self.seed * 1_000_003 + self.iterations * n
        obs = [env.reset(seed=base + i)[0] for i, env in enumerate(self.envs)]
        episode_obs: list[list[np.ndarray]] = [[] for _ in range(n)]
        episode_act: list[list[int]] = [[] for _ in range(n)]
        returns = np.zeros(n)
        alive = list(range(n))
        with torch.inference_mode():
            while alive:
                batch = obs_to_tensor(np.stack([obs[i] for i in alive]), self.device)
                probs = torch.softmax(self.net(batch), dim=1)
                actions = torch.multinomial(probs, 1, generator=self.sample_gen).squeeze(1).tolist()
                still = []
                for i, action in zip(alive, actions):
                    episode_obs[i].append(obs[i])
                    episode_act[i].append(action)
                    obs[i], reward, terminated, truncated, _ = self.envs[i].step(action)
                    returns[i] += reward
                    self.env_steps += 1
                    if not (terminated or truncated):
                        still.append(i)
                alive = still
        return [np.stack(o) for o in episode_obs], episode_act, returns

    def training_step(self, batch, batch_idx):
        if self.iterations >= self.max_iterations or self.early_stop is not None:
            self.trainer.should_stop = True
            return None
        t0 = time.perf_counter()
        obs, actions, returns = self.play_batch()
        t1 = time.perf_counter()
        self.add_time("env_act", t1 - t0)
        cutoff = np.percentile(returns, self.elite_percentile)
        elite = [i for i, r in enumerate(returns) if r >= cutoff]
        # Only the elite episodes cross into torch.
        x = obs_to_tensor(np.concatenate([obs[i] for i in elite]), self.device)
        y = torch.tensor([a for i in elite for a in actions[i]], device=self.device)
        opt = self.optimizers().optimizer
        for _ in range(self.fit_epochs):
            loss = self.loss_fn(self.net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        check_finite(loss, self.iterations)
        self.add_time("learn", time.perf_counter() - t1)
        self.iterations += 1
        mean = float(returns.mean())
        self.batch_means.append(mean)
        metrics = {
            "env_step": self.env_steps, "train/batch_return_mean": mean, "train/elite_cutoff": float(cutoff),
            "train/loss": loss.item(), "perf/env_steps_per_s": self.env_steps / max(self.elapsed_s(), 1e-9),
        }
        for logger in self.loggers:
            logger.log_metrics(metrics, step=self.env_steps)
        self.log("batch_return", mean, prog_bar=True, logger=False, on_step=True)
        if self.threshold is not None and mean >= self.threshold and self.time_to_threshold_s is None:
            self.time_to_threshold_s = self.elapsed_s()
        if self.stop_at_return is not None and mean >= self.stop_at_return and (confirmed := self.confirmed()) is not None:
            self.early_stop = {"iteration": self.iterations, "env_step": self.env_steps,
                               "reason": f"batch mean return {mean:.1f} >= stop_at_return {self.stop_at_return}{confirmed}"}
            self.trainer.should_stop = True
        self.safe_point()  # saves when due, and stops the fit when a stop was requested
        return None

    def confirmed(self) -> str | None:
        """The stop rule's confirmation: `stop_confirm_episodes` fresh greedy episodes; what the stop reason adds when
        their mean reaches stop_at_return, None when it does not ("" without a confirmation)."""
        n = self.stop_confirm_episodes
        if n == 0:
            return ""
        t0 = time.perf_counter()
        self.net.eval()
        returns = evaluate_greedy(lambda o: self.net(o).argmax(dim=1), self.env_id, n,
                                  self.seed + CONFIRM_SEED_OFFSET + n * self.iterations, self.device, self.env_kwargs)
        self.net.train()
        self.add_time("eval_confirm", time.perf_counter() - t0)
        mean = float(np.mean(returns))
        self.confirmations.append((self.env_steps, mean))
        for logger in self.loggers:
            logger.log_metrics({"env_step": self.env_steps, "eval/confirm_return_mean": mean}, step=self.env_steps)
        return f", confirmed on {n} fresh greedy episodes (mean {mean:.1f})" if mean >= self.stop_at_return else None

    def on_train_end(self) -> None:
        self._train_seconds = self.elapsed_s()
        self.safe_point(final=True)

    def checkpoint_state(self) -> dict:
        """Everything a resumed run needs to go on exactly (plain values: weights_only loads)."""
        return {
            "format": CHECKPOINT_FORMAT, "seed": self.seed, "progress": {name: getattr(self, name) for name in PROGRESS},
            "elapsed_s": self.elapsed_s(), "time_breakdown_s": dict(self.time_breakdown_s), "net": self.net.state_dict(),
            "optimizer": self.optimizers().optimizer.state_dict(), "sample_gen": self.sample_gen.get_state(), "rng": rng_state(),
        }

    @property
    def resume_step(self) -> int:
        return self.env_steps

    def load_checkpoint_state(self, state: dict) -> int:
        """Before fit: the weights and counters; the optimizer and the random streams at train start."""
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"checkpoint format {state.get('format')!r} is not {CHECKPOINT_FORMAT!r} (made by another version?)")
        if int(state["seed"]) != self.seed:
            raise ValueError(f"checkpoint holds seed {state['seed']}, this run has {self.seed}; resume with the same seed")
        try:
            self.net.load_state_dict(state["net"])
        except RuntimeError as exc:
            raise ValueError(f"checkpoint weights do not fit this model (changed model.* since?): {str(exc).splitlines()[0]}") from None
        for name in PROGRESS:
            setattr(self, name, state["progress"][name])
        self._elapsed_before = float(state["elapsed_s"])
        self.time_breakdown_s = dict(state.get("time_breakdown_s") or {})
        self._resume = state
        return self.env_steps

    def fit_and_evaluate(self, trainer, datamodule, ckpt_path) -> list[dict[str, float]]:
        if self.iterations < self.max_iterations and self.early_stop is None:
            trainer.fit(self)
        t0 = time.perf_counter()
        self.net.eval()
        returns = evaluate_greedy(lambda o: self.net(o).argmax(dim=1), self.env_id, self.final_eval_episodes,
                                  self.seed + FINAL_EVAL_SEED_OFFSET, self.device)
        self.net.train()
        self.add_time("final_eval", time.perf_counter() - t0)
        for env in self.envs:
            env.close()
        return [{"eval/return_mean": float(np.mean(returns)), "eval/return_std": float(np.std(returns)),
                 "train/iterations": float(self.iterations)}]

    def agent_record(self, i: int) -> dict:
        return {
            "env_id": self.env_id,
            "env_steps": self.env_steps,
            "env_steps_per_s": round(self.env_steps / self._train_seconds, 1) if self._train_seconds else None,
            "threshold": self.threshold,
            "time_to_threshold_s": None if self.time_to_threshold_s is None else round(self.time_to_threshold_s, 3),
            "early_stop": self.early_stop,
        }

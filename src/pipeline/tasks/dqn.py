"""Deep Q-learning (Mnih et al. 2015) over a gymnasium environment, as a Lightning module.

Reads top to bottom like a single-file DQN: one `training_step` is one round of the classic loop,
`train_frequency` environment steps of epsilon-greedy acting into the replay buffer, then
`gradient_steps` TD updates on minibatches sampled in one draw, then (every `eval_every` env steps)
a greedy evaluation on separately seeded envs. Lightning supplies the loop, checkpoints, loggers and
the progress bar; the work inside a round is batched so Lightning costs one call per round, not per step.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from pipeline.nets.factory import make_net
from pipeline.rl.acting import NumpyGreedy
from pipeline.rl.envs import env_threshold, evaluate_greedy, make_env
from pipeline.rl.replay import ReplayBuffer
from pipeline.rl.schedules import epsilon_at
from pipeline.rl.targets import freeze, hard_update, soft_update
from pipeline.tasks.base import Task, check_finite

# Evaluation envs are seeded away from the training env's stream.
EVAL_SEED_OFFSET = 10_000
FINAL_EVAL_SEED_OFFSET = 20_000


def q_of_actions(q_values: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """(B, A) Q-values and (B,) actions -> (B,) Q of the taken actions."""
    return q_values.gather(1, actions.long().unsqueeze(1)).squeeze(1)


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
    """r + gamma * (1 - terminated) * Q_target(s', a*), with a* from the online net for double DQN."""
    next_q = target_net(next_obs)
    if double:
        best = online_net(next_obs).argmax(dim=-1)
        next_value = next_q.gather(-1, best.unsqueeze(-1)).squeeze(-1)
    else:
        next_value = next_q.max(dim=-1).values
    return rewards + gamma * (1.0 - dones) * next_value


class DQNTask(Task):
    primary_metric = "eval/return_mean"
    primary_curve = "eval/return_mean"
    # What `seeds_per_process=K` trains instead: the same recipe for K seeds in one process.
    batched_variant = "pipeline.tasks.dqn_batched.BatchedDQNTask"

    def __init__(
        self,
        net: Callable[..., nn.Module],
        loss: nn.Module,
        optimizer: Callable[..., torch.optim.Optimizer],
        env: dict,
        seed: int = 0,
        scheduler: Callable | None = None,
        total_steps: int = 50_000,
        buffer_size: int = 100_000,
        batch_size: int = 64,
        gamma: float = 0.99,
        learning_starts: int = 1_000,
        train_frequency: int = 256,
        gradient_steps: int = 128,
        target_update: str = "hard",
        target_update_interval: int = 10,
        tau: float = 0.005,
        double_dqn: bool = False,
        max_grad_norm: float | None = 10.0,
        eps_start: float = 1.0,
        eps_end: float = 0.04,
        eps_duration: int = 8_000,
        eval_every: int = 2_500,
        eval_episodes: int = 10,
        final_eval_episodes: int = 20,
        stop_at_return: float | None = None,
        log_every: int = 1_000,
        threshold: float | None = None,
        fast_acting: bool = True,
    ):
        super().__init__()
        if target_update not in ("hard", "soft"):
            raise ValueError(f"task.target_update={target_update!r}; choose hard or soft")
        if train_frequency <= 0 or gradient_steps < 0 or total_steps <= 0:
            raise ValueError("task.train_frequency and task.total_steps must be positive, task.gradient_steps >= 0")
        self.automatic_optimization = False
        self.env_id = env["id"]
        self.env_kwargs = dict(env.get("kwargs") or {})
        self.seed = int(seed)
        self.env = make_env(self.env_id, seed=self.seed, **self.env_kwargs)
        obs_space, act_space = self.env.observation_space, self.env.action_space
        if not hasattr(act_space, "n"):
            raise ValueError(f"DQN needs a discrete action space; {self.env_id} has {act_space}")
        self.obs_shape = tuple(obs_space.shape)
        # Pixels stay uint8 in the buffer (4x smaller); the network scales them.
        self.obs_np_dtype = np.uint8 if obs_space.dtype == np.uint8 else np.float32
        self.obs_dtype = torch.uint8 if self.obs_np_dtype == np.uint8 else torch.float32
        self.n_actions = int(act_space.n)
        self.net = make_net(net, int(np.prod(self.obs_shape)), self.n_actions)
        self.memory_per_transition_bytes = 2 * int(np.prod(self.obs_shape)) * np.dtype(self.obs_np_dtype).itemsize + 8 + 4 + 4
        self.target_net = freeze(copy.deepcopy(self.net))
        self.loss_fn = loss
        self.optimizer_factory, self.scheduler_factory = optimizer, scheduler
        self.hp = dict(
            total_steps=int(total_steps), buffer_size=int(buffer_size), batch_size=int(batch_size), gamma=float(gamma),
            learning_starts=int(learning_starts), train_frequency=int(train_frequency), gradient_steps=int(gradient_steps),
            target_update=target_update, target_update_interval=int(target_update_interval), tau=float(tau),
            double_dqn=bool(double_dqn), max_grad_norm=max_grad_norm, eps_start=float(eps_start), eps_end=float(eps_end),
            eps_duration=int(eps_duration), eval_every=int(eval_every), eval_episodes=int(eval_episodes),
            final_eval_episodes=int(final_eval_episodes), stop_at_return=stop_at_return, log_every=int(log_every),
        )
        self.threshold = threshold if threshold is not None else env_threshold(self.env_id)
        self.rng = np.random.default_rng(self.seed)
        self.sample_gen = torch.Generator().manual_seed(self.seed)
        self.noisy = hasattr(self.net, "reset_noise")
        self.fast_acting = bool(fast_acting)
        self.fast_greedy: NumpyGreedy | None = None
        # Progress of the run (also what record_extras reports).
        self.env_steps = 0
        self.updates = 0
        self.episode_returns: list[float] = []
        self.evaluations: list[tuple[int, float, float]] = []
        self.time_to_threshold_s: float | None = None
        self.early_stop: dict | None = None
        self._t_train_start: float | None = None
        self._train_seconds = 0.0
        self._last_log_step = 0
        self._last_target_copy = -1
        self._recent = {"loss": [], "q": []}

    # ---- Lightning plumbing -------------------------------------------------------------
    def configure_optimizers(self):
        optimizer = self.optimizer_factory(self.net.parameters())
        if self.scheduler_factory is None:
            return optimizer
        # Stepped once per round (train_frequency env steps).
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": self.scheduler_factory(optimizer), "interval": "step"}}

    def n_rounds(self) -> int:
        return math.ceil(self.hp["total_steps"] / self.hp["train_frequency"])

    def train_dataloader(self) -> DataLoader:
        # Each item is one round of the loop; the data itself comes from the environment.
        return DataLoader(range(self.n_rounds()), batch_size=None, shuffle=False)

    def on_fit_start(self) -> None:
        self.buffer = ReplayBuffer(self.hp["buffer_size"], self.obs_shape, obs_dtype=self.obs_dtype, device=self.device)
        self.sample_gen = torch.Generator(device=self.device).manual_seed(self.seed)
        self.obs = self.to_obs(self.env.reset(seed=self.seed)[0])
        self.episode_return = 0.0
        self._t_train_start = time.perf_counter()
        # Numpy mirror of a plain MLP on CPU for one-observation acting; refreshed after every round.
        self.fast_greedy = NumpyGreedy.for_net(self.net) if self.device.type == "cpu" and self.fast_acting else None

    # ---- the algorithm ---------------------------------------------------------------------
    def epsilon(self) -> float:
        if self.noisy:
            return 0.0
        hp = self.hp
        return epsilon_at(self.env_steps, hp["eps_start"], hp["eps_end"], hp["eps_duration"])

    def to_obs(self, obs) -> np.ndarray:
        """The env boundary: observations become float32 (uint8 frames stay uint8) exactly once, here."""
        return np.asarray(obs, dtype=self.obs_np_dtype)

    def act(self, obs: np.ndarray, epsilon: float) -> int:
        if epsilon > 0 and self.rng.random() < epsilon:
            return int(self.rng.integers(self.n_actions))
        if self.fast_greedy is not None:
            return self.fast_greedy(obs)
        with torch.inference_mode():
            x = torch.from_numpy(obs).to(self.device).unsqueeze(0)
            return int(self.net(x).argmax(dim=1).item())

    def collect(self, n_steps: int) -> None:
        """n_steps of epsilon-greedy acting into the replay buffer."""
        t_act = t_env = 0.0
        for _ in range(n_steps):
            t0 = time.perf_counter()
            action = self.act(self.obs, self.epsilon())
            t1 = time.perf_counter()
            next_obs, reward, terminated, truncated, _ = self.env.step(action)
            next_obs = self.to_obs(next_obs)
            self.buffer.add(self.obs, action, reward, next_obs, terminated)
            self.env_steps += 1
            self.episode_return += float(reward)
            if terminated or truncated:
                self.episode_returns.append(self.episode_return)
                self.episode_return = 0.0
                next_obs = self.to_obs(self.env.reset()[0])
            self.obs = next_obs
            t2 = time.perf_counter()
            t_act += t1 - t0
            t_env += t2 - t1
        self.add_time("act", t_act)
        self.add_time("env", t_env)

    def learn(self) -> None:
        hp = self.hp
        if hp["target_update"] == "hard":
            copies = self.env_steps // hp["target_update_interval"]
            if copies != self._last_target_copy:
                hard_update(self.target_net, self.net)
                self._last_target_copy = copies
        # The torch optimizer itself: Lightning's manual_backward and LightningOptimizer.step wrap every
        # update in hooks that cost as much as a small network's update, and a round has 128 of them.
        # This path is fp32 on one device, where those wrappers add nothing else.
        opt = self.optimizers().optimizer
        batches = self.buffer.sample_many(hp["gradient_steps"], hp["batch_size"], generator=self.sample_gen)
        # A hard-updated target is fixed for the whole round, so without double DQN (whose argmax
        # uses the changing online net) or noise every TD target of the round comes from one
        # batched forward: the same numbers for a fraction of the calls.
        fixed_targets = hp["target_update"] == "hard" and not hp["double_dqn"] and not self.noisy
        if fixed_targets:
            g, b = hp["gradient_steps"], hp["batch_size"]
            all_targets = td_targets(
                self.target_net, self.net, batches.rewards.reshape(g * b), batches.next_obs.reshape(g * b, *self.obs_shape),
                batches.dones.reshape(g * b), hp["gamma"], double=False,
            ).view(g, b)
        losses, q_means = [], []
        for i in range(hp["gradient_steps"]):
            obs, actions = batches.obs[i], batches.actions[i]
            if self.noisy:
                self.net.reset_noise()
                self.target_net.reset_noise()
            if fixed_targets:
                target = all_targets[i]
            else:
                target = td_targets(self.target_net, self.net, batches.rewards[i], batches.next_obs[i], batches.dones[i],
                                    hp["gamma"], hp["double_dqn"])
            q = q_of_actions(self.net(obs), actions)
            loss = self.loss_fn(q, target)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if hp["max_grad_norm"]:
                nn.utils.clip_grad_norm_(self.net.parameters(), hp["max_grad_norm"])
            opt.step()
            if hp["target_update"] == "soft":
                soft_update(self.target_net, self.net, hp["tau"])
            losses.append(loss.detach())
            q_means.append(q.detach().mean())
        self.updates += hp["gradient_steps"]
        if self.fast_greedy is not None:
            self.fast_greedy.refresh()
        # One host sync per round, not per update.
        mean_loss = torch.stack(losses).mean()
        check_finite(mean_loss, self.env_steps, hint="lower optimizer.lr, use loss=huber or set task.max_grad_norm")
        self._recent["loss"].append(mean_loss.item())
        self._recent["q"].append(torch.stack(q_means).mean().item())

    def training_step(self, batch, batch_idx):
        hp = self.hp
        steps = min(hp["train_frequency"], hp["total_steps"] - self.env_steps)
        if steps <= 0:
            self.trainer.should_stop = True
            return None
        before = self.env_steps
        self.collect(steps)
        if len(self.buffer) >= hp["learning_starts"] and hp["gradient_steps"] > 0:
            t0 = time.perf_counter()
            self.learn()
            self.add_time("learn", time.perf_counter() - t0)
            scheduler = self.lr_schedulers()
            if scheduler is not None:
                scheduler.step()
        if self.env_steps // hp["eval_every"] != before // hp["eval_every"]:
            self.evaluate_now()
        if self.env_steps - self._last_log_step >= hp["log_every"]:
            self.log_progress()
        self.log("env_step", float(self.env_steps), prog_bar=True, logger=False, on_step=True)
        return None

    def greedy_returns(self, n_episodes: int, seed: int) -> list[float]:
        """Greedy episodes in eval() mode (noise off) under inference_mode, then back to train()."""
        was_training = self.net.training
        self.net.eval()
        try:
            return evaluate_greedy(lambda obs: self.net(obs).argmax(dim=1), self.env_id, n_episodes, seed, self.device,
                                   env_kwargs=self.env_kwargs)
        finally:
            self.net.train(was_training)

    def evaluate_now(self) -> None:
        t0 = time.perf_counter()
        returns = self.greedy_returns(self.hp["eval_episodes"], self.seed + EVAL_SEED_OFFSET)
        self.add_time("eval", time.perf_counter() - t0)
        mean, std = float(np.mean(returns)), float(np.std(returns))
        self.evaluations.append((self.env_steps, mean, std))
        self._log({"eval/return_mean": mean, "eval/return_std": std})
        if self.threshold is not None and mean >= self.threshold and self.time_to_threshold_s is None:
            self.time_to_threshold_s = time.perf_counter() - self._t_train_start
        stop = self.hp["stop_at_return"]
        if stop is not None and mean >= stop:
            self.early_stop = {"env_step": self.env_steps, "reason": f"greedy evaluation mean {mean:.1f} >= stop_at_return {stop}"}
            self.trainer.should_stop = True

    def log_progress(self) -> None:
        t0 = time.perf_counter()
        elapsed = time.perf_counter() - self._t_train_start
        metrics = {
            "train/epsilon": self.epsilon(),
            "perf/env_steps_per_s": self.env_steps / max(elapsed, 1e-9),
        }
        recent_returns = self.episode_returns[-10:]
        if recent_returns:
            metrics["train/episodic_return"] = float(np.mean(recent_returns))
        if self._recent["loss"]:
            metrics["train/loss"] = float(np.mean(self._recent["loss"]))
            metrics["train/q_mean"] = float(np.mean(self._recent["q"]))
            self._recent = {"loss": [], "q": []}
        self._log(metrics)
        self._last_log_step = self.env_steps
        self.add_time("log", time.perf_counter() - t0)

    def _log(self, metrics: dict[str, float]) -> None:
        # Straight to the loggers with env steps as the x axis: self.log per step is expensive.
        for logger in self.loggers:
            logger.log_metrics({"env_step": self.env_steps, **metrics}, step=self.env_steps)

    def on_train_end(self) -> None:
        self._train_seconds = time.perf_counter() - self._t_train_start
        self.log_progress()

    # ---- the contract with run.py ------------------------------------------------------------
    def fit_and_evaluate(self, trainer, datamodule, ckpt_path) -> dict[str, float]:
        if trainer.precision not in ("32-true", "32"):
            raise ValueError(f"task=dqn runs in fp32; got device.precision={trainer.precision}, use 32-true")
        trainer.fit(self, ckpt_path=ckpt_path)
        # Updates bypass LightningOptimizer, so Lightning's step-based checkpointing never fires: save here.
        trainer.save_checkpoint(str(Path(trainer.default_root_dir) / "checkpoints" / "last.ckpt"))
        t0 = time.perf_counter()
        returns = self.greedy_returns(self.hp["final_eval_episodes"], self.seed + FINAL_EVAL_SEED_OFFSET)
        self.add_time("final_eval", time.perf_counter() - t0)
        final = {"eval/return_mean": float(np.mean(returns)), "eval/return_std": float(np.std(returns))}
        self._log({f"final_{k}": v for k, v in final.items()})
        self.env.close()
        return {**final, "train/episodes": float(len(self.episode_returns)), "train/updates": float(self.updates)}

    def record_extras(self) -> dict:
        return {
            "env_id": self.env_id,
            "env_steps": self.env_steps,
            "replay_bytes_per_transition": self.memory_per_transition_bytes,
            "env_steps_per_s": round(self.env_steps / self._train_seconds, 1) if self._train_seconds else None,
            "threshold": self.threshold,
            "time_to_threshold_s": None if self.time_to_threshold_s is None else round(self.time_to_threshold_s, 3),
            "early_stop": self.early_stop,
            "evaluations": [{"env_step": s, "return_mean": m, "return_std": sd} for s, m, sd in self.evaluations],
        }

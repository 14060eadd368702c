"""An epsilon-greedy multi-armed bandit: the worked example of docs/add_an_algorithm.md (one file plus one YAML).

Each Lightning step pulls one arm: a random one with probability `epsilon`, else the arm with the highest
running mean so far. The reward of arm a is normal(arm_means[a], noise). The final metric says whether the
greedy arm at the end is the truly best one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from torch.utils.data import DataLoader

from pipeline.tasks.base import Task, TaskParts


@dataclass
class BanditConfig:
    """The hyperparameters: every key of conf/task/bandit.yaml, typed (a wrong type is refused at start-up)."""

    uses: ClassVar[frozenset[str]] = frozenset()  # no model, loss, optimizer, env or data group: each must be `none`

    arm_means: list[float] = field(default_factory=lambda: [0.0, 0.5, 1.0])
    noise: float = 0.1
    steps: int = 500
    epsilon: float = 0.1
    log_every: int = 50


class BanditTask(Task):
    Config = BanditConfig  # the typed hyperparameters and what the task declares for start-up
    writes_curves = True  # rows go to self.curves[0] (metrics.csv), given by the lifecycle
    primary_metric = "eval/best_arm"
    primary_curve = "train/reward_mean"

    def __init__(self, config: BanditConfig, parts: TaskParts):
        super().__init__(config, parts)  # sets self.config, self.seed, self.curves, self.time_breakdown_s, ...
        self.automatic_optimization = False
        self.means = np.asarray(config.arm_means, dtype=float)
        self.rng = np.random.default_rng(self.seed)
        self.pulls = np.zeros(len(self.means), dtype=int)
        self.estimates = np.zeros(len(self.means))
        self.recent: list[float] = []

    # ---- Lightning: one step = one pull ------------------------------------------------------------
    def train_dataloader(self) -> DataLoader:
        return DataLoader(range(self.config.steps), batch_size=None)

    def configure_optimizers(self):
        return []  # nothing to optimise by gradient (None makes Lightning warn "returned `None`")

    def training_step(self, batch, batch_idx):
        explore = self.rng.random() < self.config.epsilon
        arm = int(self.rng.integers(len(self.means))) if explore else int(np.argmax(self.estimates))
        reward = float(self.rng.normal(self.means[arm], self.config.noise))
        self.pulls[arm] += 1
        self.estimates[arm] += (reward - self.estimates[arm]) / self.pulls[arm]
        self.recent.append(reward)
        step = batch_idx + 1
        if step % self.config.log_every == 0:
            self.curves[0].log(step, {"train/reward_mean": float(np.mean(self.recent))})
            self.recent = []
        return None

    # ---- the contract with the lifecycle (pipeline.tasks.base.Task) ---------------------------------
    def fit_and_evaluate(self, trainer, datamodule, ckpt_path) -> list[dict[str, float]]:
        trainer.fit(self)
        best, greedy = int(np.argmax(self.means)), int(np.argmax(self.estimates))
        return [{"eval/best_arm": float(greedy == best), "eval/estimate_error": float(abs(self.estimates[best] - self.means[best]))}]

    def agent_record(self, i: int) -> dict:
        return {"pulls": self.pulls.tolist()}

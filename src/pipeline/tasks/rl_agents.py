"""What the RL tasks (DQN, PPO) share around their algorithms: K agents' curves and loggers, their evaluations,
the record fields every RL run has, and the identity check of a checkpoint.

A mixin of plain methods over attributes both tasks keep: `env_steps`, `n_agents`, `agent_seeds`, `curves`,
`evaluations` (per agent: (env_step, mean, std)), `episode_returns`, `threshold`, `time_to_threshold_s`,
`return_bounds`, `env_id`, `config.total_steps`, `config.video_every`, and the training clock (`_t_train_start`,
`_elapsed_before`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from pipeline.tasks.base import Progress


class RLAgents:
    def elapsed_s(self) -> float:
        """Training seconds so far, over every segment of the run."""
        running = time.perf_counter() - self._t_train_start if self._t_train_start is not None else 0.0
        return self._elapsed_before + running

    def _agent_row(self, agent: int, row: dict[str, float], step: int | None = None) -> None:
        step = self.env_steps if step is None else step
        if self.curves:
            self.curves[agent].log(step, row)
        if self.n_agents == 1:  # one agent: its curves also go to TensorBoard / W&B as they happen
            self._log_shared(row, step)

    def _log_shared(self, metrics: dict[str, float], step: int | None = None) -> None:
        # Straight to the loggers with env steps as the x axis: self.log per step is expensive.
        step = self.env_steps if step is None else step
        for logger in self.loggers:
            logger.log_metrics({"env_step": step, **metrics}, step=step)

    def learning_agents(self) -> list[int]:
        """The agents still training (DQN drops those that stopped early)."""
        return list(range(self.n_agents))

    def progress(self) -> Progress:
        """Env steps (per agent) against the budget, with the mean of the last 10 episodes' returns and the last
        evaluation (means over the agents still learning)."""
        agents, shown = self.learning_agents(), {}
        recent = [float(np.mean(self.episode_returns[a][-10:])) for a in agents if self.episode_returns[a]]
        if recent:
            shown["return"] = float(np.mean(recent))
        evaluated = [self.evaluations[a][-1][1] for a in agents if self.evaluations[a]]
        if evaluated:
            shown["eval"] = float(np.mean(evaluated))
        return Progress(self.env_steps, self.config.total_steps, "env steps", shown)

    def record_training_videos(self, member_state_dict: Callable[[int], dict],
                               agent_files: Callable[[int], dict] | None = None) -> None:
        """After an evaluation: every `config.video_every`-th one, a video of each learning agent's policy now
        (`member_state_dict(i)`: the i-th learning agent's plain network; `agent_files(agent)`: what else its policy
        needs, the task's `agent_files`) through the lifecycle's `video_hook`."""
        every = int(self.config.video_every)
        if self.video_hook is None or every <= 0:
            return
        t0 = time.perf_counter()
        for index, agent in enumerate(self.learning_agents()):
            if self.evaluations[agent] and len(self.evaluations[agent]) % every == 0:
                self.video_hook(agent, self.env_steps, {k: v.detach().cpu() for k, v in member_state_dict(index).items()},
                                {} if agent_files is None else agent_files(agent))
        self.add_time("video", time.perf_counter() - t0)

    def note_evaluation(self, agent: int, mean: float, std: float, elapsed_s: float) -> None:
        """Agent `agent`'s evaluation now: kept for the record, a curve row, and the first time it reached the threshold."""
        self.evaluations[agent].append((self.env_steps, mean, std))
        self._agent_row(agent, {"eval/return_mean": mean, "eval/return_std": std})
        if self.threshold is not None and mean >= self.threshold and self.time_to_threshold_s[agent] is None:
            self.time_to_threshold_s[agent] = elapsed_s

    def pruned_by_tuner(self) -> bool:
        """In an Optuna trial: report every agent's last evaluation (one that stopped early holds its last; dropping
        it would leave only the slow seeds in the trial's value and prune good trials). True when the trial is pruned."""
        if self.trial_reporter is None or not self.learning_agents():
            return False
        everyone = [self.evaluations[a][-1][1] for a in range(self.n_agents) if self.evaluations[a]]
        return bool(self.trial_reporter.report(self.env_steps, everyone))

    def rl_record(self, i: int, env_steps: int, seconds: float | None) -> dict:
        """The record fields of every RL agent: its env steps and their rate, the threshold and when it was reached,
        its evaluations, and the range its returns can take (when the env says)."""
        extras = {
            "env_id": self.env_id,
            "env_steps": env_steps,
            "env_steps_per_s": round(env_steps / seconds, 1) if seconds else None,
            "threshold": self.threshold,
            "time_to_threshold_s": None if self.time_to_threshold_s[i] is None else round(self.time_to_threshold_s[i], 3),
            "evaluations": [{"env_step": s, "return_mean": m, "return_std": sd} for s, m, sd in self.evaluations[i]],
        }
        if self.return_bounds is not None:
            lo, hi = self.return_bounds
            extras["metric_bounds"] = {"eval/return_mean": [lo, hi], "train/episodic_return": [lo, hi]}
        return extras

    def check_checkpoint(self, state: dict, checkpoint_format: str) -> None:
        """A checkpoint of this algorithm's format, made for these agents' seeds; otherwise one line that says what differs."""
        if state.get("format") != checkpoint_format:
            raise ValueError(f"checkpoint format {state.get('format')!r} is not {checkpoint_format!r} (made by another version?)")
        seeds = list(state["agent_seeds"])
        if seeds != self.agent_seeds:
            raise ValueError(
                f"checkpoint holds seeds {seeds[0]}..{seeds[-1]} ({len(seeds)} agents), "
                f"this run has {self.agent_seeds[0]}..{self.agent_seeds[-1]}; resume with the same seed and seeds_per_process"
            )

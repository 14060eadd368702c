"""pipeline.tasks.rl_agents.RLAgents on a stand-in task (the plain attributes the mixin reads, set by hand)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pipeline.tasks import rl_agents
from pipeline.tasks.base import Progress
from pipeline.tasks.rl_agents import RLAgents


class Curve:
    def __init__(self):
        self.rows = []

    def log(self, step, row):
        self.rows.append((step, row))


class Logger:
    def __init__(self):
        self.calls = []

    def log_metrics(self, metrics, step):
        self.calls.append((metrics, step))


class Agents(RLAgents):
    def __init__(self, n=2, threshold=None, video_every=0, bounds=None):
        self.env_steps, self.n_agents, self.agent_seeds = 100, n, list(range(3, 3 + n))
        self.curves = [Curve() for _ in range(n)]
        self.loggers = [Logger()]
        self.evaluations = [[] for _ in range(n)]
        self.episode_returns = [[] for _ in range(n)]
        self.threshold, self.time_to_threshold_s = threshold, [None] * n
        self.return_bounds, self.env_id = bounds, "CartPole-v1"
        self.config = SimpleNamespace(total_steps=1000, video_every=video_every)
        self._t_train_start, self._elapsed_before = None, 2.5
        self.video_hook, self.time_breakdown_s, self.videos = None, {}, []

    def add_time(self, phase, seconds):
        self.time_breakdown_s[phase] = self.time_breakdown_s.get(phase, 0.0) + seconds


def test_elapsed_is_the_segments_before_plus_the_running_one(monkeypatch):
    agents = Agents()
    assert agents.elapsed_s() == 2.5
    agents._t_train_start = 10.0
    monkeypatch.setattr(rl_agents.time, "perf_counter", lambda: 14.0)
    assert agents.elapsed_s() == 6.5


def test_rows_go_to_the_agents_curve_and_to_the_loggers_only_for_one_agent():
    two = Agents(n=2)
    two._agent_row(1, {"x": 1.0})
    two._agent_row(0, {"y": 2.0}, step=7)
    assert two.curves[1].rows == [(100, {"x": 1.0})] and two.curves[0].rows == [(7, {"y": 2.0})]
    assert two.loggers[0].calls == []
    one = Agents(n=1)
    one._agent_row(0, {"x": 1.0})
    one._agent_row(0, {"x": 2.0}, step=5)
    assert one.loggers[0].calls == [({"env_step": 100, "x": 1.0}, 100), ({"env_step": 5, "x": 2.0}, 5)]
    one.curves = []
    one._agent_row(0, {"z": 3.0})  # no curves (a run without records): loggers only
    assert one.loggers[0].calls[-1] == ({"env_step": 100, "z": 3.0}, 100)


def test_progress_is_the_mean_of_the_last_ten_returns_and_of_the_last_evaluations():
    agents = Agents(n=3)
    assert agents.progress() == Progress(100, 1000, "env steps", {})
    agents.episode_returns[0] = [100.0] * 5 + [1.0] * 10  # the last ten: mean 1
    agents.episode_returns[1] = [3.0]
    agents.evaluations[0] = [(50, 9.0, 0.0), (100, 4.0, 1.0)]
    agents.evaluations[2] = [(100, 8.0, 0.0)]
    assert agents.learning_agents() == [0, 1, 2]
    assert agents.progress() == Progress(100, 1000, "env steps", {"return": 2.0, "eval": 6.0})


def test_videos_every_nth_evaluation_of_each_learning_agent(monkeypatch):
    agents = Agents(n=2, video_every=2)
    agents.record_training_videos(lambda i: {"w": torch.ones(1)})  # no hook: nothing, no time
    assert agents.time_breakdown_s == {}
    agents.video_hook = lambda agent, step, state, files: agents.videos.append((agent, step, state["w"].tolist()))
    agents.evaluations = [[(1, 0.0, 0.0), (2, 0.0, 0.0)], [(1, 0.0, 0.0)]]
    ticks = iter([1.0, 1.75])
    monkeypatch.setattr(rl_agents.time, "perf_counter", lambda: next(ticks))
    agents.record_training_videos(lambda i: {"w": torch.full((1,), float(i))})
    assert agents.videos == [(0, 100, [0.0])] and agents.time_breakdown_s == {"video": 0.75}
    monkeypatch.undo()
    agents.config.video_every = 0
    agents.record_training_videos(lambda i: {"w": torch.ones(1)})
    assert len(agents.videos) == 1
    agents.config.video_every = 1
    agents.record_training_videos(lambda i: {"w": torch.full((1,), 5.0 + i)})
    assert agents.videos[1:] == [(0, 100, [5.0]), (1, 100, [6.0])]


def test_an_evaluation_is_kept_logged_and_marks_the_first_time_at_the_threshold():
    agents = Agents(n=2, threshold=10.0)
    agents.note_evaluation(0, 9.9, 1.0, elapsed_s=3.0)
    assert agents.time_to_threshold_s == [None, None]
    agents.note_evaluation(0, 10.0, 0.5, elapsed_s=4.0)
    agents.note_evaluation(0, 12.0, 0.5, elapsed_s=5.0)
    assert agents.time_to_threshold_s == [4.0, None]
    assert agents.evaluations[0] == [(100, 9.9, 1.0), (100, 10.0, 0.5), (100, 12.0, 0.5)]
    assert agents.curves[0].rows[0] == (100, {"eval/return_mean": 9.9, "eval/return_std": 1.0})
    no_threshold = Agents(n=1)
    no_threshold.note_evaluation(0, 1e9, 0.0, elapsed_s=1.0)
    assert no_threshold.time_to_threshold_s == [None]


def test_the_record_fields_of_an_agent():
    agents = Agents(n=2, threshold=5.0, bounds=(0.0, 500.0))
    agents.evaluations[1] = [(10, 1.5, 0.25)]
    agents.time_to_threshold_s = [None, 1.23456]
    assert agents.rl_record(1, 300, 4.0) == {
        "env_id": "CartPole-v1", "env_steps": 300, "env_steps_per_s": 75.0, "threshold": 5.0,
        "time_to_threshold_s": 1.235, "evaluations": [{"env_step": 10, "return_mean": 1.5, "return_std": 0.25}],
        "metric_bounds": {"eval/return_mean": [0.0, 500.0], "train/episodic_return": [0.0, 500.0]}}
    assert agents.rl_record(0, 100, 3.0)["env_steps_per_s"] == 33.3
    plain = Agents(n=1).rl_record(0, 100, None)
    assert plain["env_steps_per_s"] is None and plain["time_to_threshold_s"] is None and "metric_bounds" not in plain
    assert Agents(n=1).rl_record(0, 100, 0.0)["env_steps_per_s"] is None


def test_a_checkpoint_of_another_format_or_other_seeds_is_one_line():
    agents = Agents(n=2)
    agents.check_checkpoint({"format": "dqn-v2", "agent_seeds": [3, 4]}, "dqn-v2")
    with pytest.raises(ValueError) as info:
        agents.check_checkpoint({"format": "dqn-v1", "agent_seeds": [3, 4]}, "dqn-v2")
    assert str(info.value) == "checkpoint format 'dqn-v1' is not 'dqn-v2' (made by another version?)"
    with pytest.raises(ValueError) as info:
        agents.check_checkpoint({"agent_seeds": [3, 4]}, "dqn-v2")
    assert str(info.value) == "checkpoint format None is not 'dqn-v2' (made by another version?)"
    with pytest.raises(ValueError) as info:
        agents.check_checkpoint({"format": "dqn-v2", "agent_seeds": (0, 1, 2)}, "dqn-v2")
    assert str(info.value) == ("checkpoint holds seeds 0..2 (3 agents), this run has 3..4; "
                               "resume with the same seed and seeds_per_process")


def test_shared_metrics_default_to_the_current_env_step_and_seed_ranges_name_both_ends():
    agents = Agents(n=3)
    agents._log_shared({"a": 1.0})
    assert agents.loggers[0].calls == [({"env_step": 100, "a": 1.0}, 100)]
    with pytest.raises(ValueError, match=r"this run has 3\.\.5;"):
        agents.check_checkpoint({"format": "f", "agent_seeds": [0]}, "f")

"""RLTask's own pieces on the smallest algorithm that can stand on it (an ensemble of MLPs and nothing to iterate):
logging rows, the progress bar, training videos, evaluations and the threshold, record fields, checkpoint identity,
and the declared progress counters. The K-agent loop itself, the stop rule and resume run in tests/tasks/
test_ppo_units.py and test_dqn_units.py (PPO's and DQN's hooks on it)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import pytest
import torch

from pipeline.nets.ensemble import make_ensemble
from pipeline.nets.mlp import MLP
from pipeline.rl.policies import QValuePolicy
from pipeline.tasks import rl_task
from pipeline.tasks.base import Progress
from pipeline.tasks.configs import RLConfig
from pipeline.tasks.rl_task import RLProgress, RLTask, per_agent


@dataclass
class TinyConfig(RLConfig):
    _target_: str = "tests.tasks.test_rl_task_units.Tiny"


@dataclass
class TinyProgress(RLProgress):
    counts: list[int] = per_agent(lambda: 7)
    shared: int = 3


class Tiny(RLTask):
    Config = TinyConfig
    algorithm = "tiny"
    checkpoint_format = "tiny/1"
    RunProgress = TinyProgress
    policy = QValuePolicy

    def build_net(self, parts):
        return make_ensemble(parts.net, self.agent_seeds, self.obs_shape, int(self.action_space.n))

    def iterations_left(self) -> int:
        return 0

    def iterate(self) -> None:
        raise AssertionError("not run here")


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


def tiny(monkeypatch, n=2, threshold=None, video_every=0):
    task = Tiny.create(net=lambda in_features, out_features: MLP(in_features, out_features, hidden=(4,)),
                       optimizer=lambda p: torch.optim.SGD(p, lr=0.1), env={"id": "CartPole-v1"}, n_agents=n, seed=3,
                       total_steps=1000, threshold=threshold, video_every=video_every)
    logger = Logger()
    monkeypatch.setattr(Tiny, "loggers", property(lambda self: [logger]))
    task.curves = [Curve() for _ in range(n)]
    task.env_steps = 100
    return task, logger


def test_the_progress_counters_are_declared_once_per_agent_or_shared(monkeypatch):
    task, _ = tiny(monkeypatch, n=3)
    assert task.counts == [7, 7, 7] and task.shared == 3 and task.early_stop == [None] * 3
    assert task.episode_returns == [[], [], []] and task.episode_returns[0] is not task.episode_returns[1]
    assert {f.name for f in fields(TinyProgress)} >= {"env_steps", "last_log_step", "evaluations", "confirmations", "counts"}
    assert task.slots == [0, 1, 2] and task.obs_shape == (4,) and task.threshold == 475.0


def test_rows_go_to_the_agents_curve_and_to_its_own_loggers_and_batch_rows_to_the_trainers(monkeypatch):
    """As the lifecycle sets them: K = 1, agent 0's loggers are the trainer's; K > 1, each agent has its own list
    (its seed dir's TensorBoard / W&B runs) and the trainer's loggers get only the batch rows."""
    two, logger = tiny(monkeypatch, n=2)
    own = [Logger(), Logger()]
    two.agent_loggers = [[own[0]], [own[1]]]
    two._agent_row(1, {"x": 1.0})
    two._agent_row(0, {"y": 2.0}, step=7)
    assert two.curves[1].rows == [(100, {"x": 1.0})] and two.curves[0].rows == [(7, {"y": 2.0})] and logger.calls == []
    assert own[1].calls == [({"env_step": 100, "x": 1.0}, 100)] and own[0].calls == [({"env_step": 7, "y": 2.0}, 7)]
    two._log_shared({"a": 1.0})
    assert logger.calls == [({"env_step": 100, "a": 1.0}, 100)] and len(own[0].calls) == len(own[1].calls) == 1
    one, logger = tiny(monkeypatch, n=1)
    one.agent_loggers = [[logger]]
    one._agent_row(0, {"x": 1.0})
    one._agent_row(0, {"x": 2.0}, step=5)
    assert logger.calls == [({"env_step": 100, "x": 1.0}, 100), ({"env_step": 5, "x": 2.0}, 5)]
    one.curves = []
    one._agent_row(0, {"z": 3.0})  # no curves (a run without records): loggers only
    assert logger.calls[-1] == ({"env_step": 100, "z": 3.0}, 100)


def test_elapsed_is_the_segments_before_plus_the_running_one(monkeypatch):
    task, _ = tiny(monkeypatch)
    task._elapsed_before = 2.5
    assert task.elapsed_s() == 2.5
    task._t_train_start = 10.0
    monkeypatch.setattr(rl_task.time, "perf_counter", lambda: 14.0)
    assert task.elapsed_s() == 6.5


def test_progress_is_the_mean_of_the_last_ten_returns_and_of_the_last_evaluations_of_learning_agents(monkeypatch):
    task, _ = tiny(monkeypatch, n=3)
    assert task.progress() == Progress(100, 1000, "env steps", {})
    task.episode_returns[0] = [100.0] * 5 + [1.0] * 10  # the last ten: mean 1
    task.episode_returns[1] = [3.0]
    task.evaluations[0] = [(50, 9.0, 0.0), (100, 4.0, 1.0)]
    task.evaluations[2] = [(100, 8.0, 0.0)]
    assert task.progress() == Progress(100, 1000, "env steps", {"return": 2.0, "eval": 6.0})
    task.slots = [1, 2]  # agent 0 stopped: the bar shows the others
    assert task.progress().shown == {"return": 3.0, "eval": 8.0}


def test_videos_every_nth_evaluation_of_each_learning_agent(monkeypatch):
    task, _ = tiny(monkeypatch, video_every=2)
    videos = []
    task.record_training_videos()  # no hook: nothing, no time
    assert task.time_breakdown_s == {}
    task.video_hook = lambda agent, step, state, files: videos.append((agent, step, state["net.0.bias"].tolist(), files))
    task.evaluations = [[(1, 0.0, 0.0), (2, 0.0, 0.0)], [(1, 0.0, 0.0)]]
    task.record_training_videos()
    assert [(a, s, f) for a, s, _, f in videos] == [(0, 100, {})] and "video" in task.time_breakdown_s
    assert videos[0][2] == task.net.member_state_dict(0)["net.0.bias"].tolist()
    task.config.video_every = 1
    task.slots = [1]  # only learning agents are filmed, with their slot's weights
    task.net.keep_members_(torch.tensor([1]))
    task.record_training_videos()
    assert [v[0] for v in videos] == [0, 1] and videos[1][2] == task.net.member_state_dict(0)["net.0.bias"].tolist()


def test_an_evaluation_is_kept_logged_and_marks_the_first_time_at_the_threshold(monkeypatch):
    task, _ = tiny(monkeypatch, threshold=10.0)
    task.note_evaluation(0, 9.9, 1.0, elapsed_s=3.0)
    assert task.time_to_threshold_s == [None, None]
    task.note_evaluation(0, 10.0, 0.5, elapsed_s=4.0)
    task.note_evaluation(0, 12.0, 0.5, elapsed_s=5.0)
    assert task.time_to_threshold_s == [4.0, None]
    assert task.evaluations[0] == [(100, 9.9, 1.0), (100, 10.0, 0.5), (100, 12.0, 0.5)]
    assert task.curves[0].rows[0] == (100, {"eval/return_mean": 9.9, "eval/return_std": 1.0})


def test_the_record_fields_of_an_agent(monkeypatch):
    task, _ = tiny(monkeypatch, threshold=5.0)
    task.return_bounds = (0.0, 500.0)
    task.evaluations[1] = [(10, 1.5, 0.25)]
    task.time_to_threshold_s = [None, 1.23456]
    task.env_steps, task._train_seconds = 300, 4.0
    task.stop_step[0], task.stop_time_s[0], task.early_stop[0] = 100, 3.0, {"env_step": 100, "reason": "r"}
    assert task.agent_record(1) == {
        "env_id": "CartPole-v1", "env_steps": 300, "env_steps_per_s": 75.0, "threshold": 5.0,
        "time_to_threshold_s": 1.235, "evaluations": [{"env_step": 10, "return_mean": 1.5, "return_std": 0.25}],
        "early_stop": None, "batch_env_steps_per_s": 100.0,  # (300 + 100) / 4
        "policy": "pipeline.rl.policies.QValuePolicy",  # what a replay plays (the task's declaration)
        "metric_bounds": {"eval/return_mean": [0.0, 500.0], "train/episodic_return": [0.0, 500.0]}}
    stopped = task.agent_record(0)
    assert stopped["env_steps"] == 100 and stopped["env_steps_per_s"] == 33.3 and stopped["early_stop"]["reason"] == "r"
    plain, _ = tiny(monkeypatch, n=1)
    record = plain.agent_record(0)
    assert record["env_steps_per_s"] is None and record["time_to_threshold_s"] is None
    assert "metric_bounds" not in record and "batch_env_steps_per_s" not in record


def test_a_checkpoint_of_another_format_or_other_seeds_is_one_line(monkeypatch):
    task, _ = tiny(monkeypatch)
    task.check_checkpoint({"format": "tiny/1", "agent_seeds": [3, 4]})
    with pytest.raises(ValueError) as info:
        task.check_checkpoint({"format": "tiny/0", "agent_seeds": [3, 4]})
    assert str(info.value) == "checkpoint format 'tiny/0' is not 'tiny/1' (made by another version?)"
    with pytest.raises(ValueError) as info:
        task.check_checkpoint({"agent_seeds": [3, 4]})
    assert str(info.value) == "checkpoint format None is not 'tiny/1' (made by another version?)"
    with pytest.raises(ValueError) as info:
        task.check_checkpoint({"format": "tiny/1", "agent_seeds": (0, 1, 2)})
    assert str(info.value) == "checkpoint holds seeds 0..2 (3 agents), this run has 3..4; resume with the same seed and seeds_per_process"


def test_a_task_that_declares_no_policy_is_refused_when_built():
    class Silent(Tiny):
        policy = None

    with pytest.raises(TypeError, match=r"^Silent must declare policy = <a pipeline.rl.policies.Policy class>: how its network acts$"):
        Silent.create(net=lambda in_features, out_features: MLP(in_features, out_features), optimizer=torch.optim.SGD,
                      env={"id": "CartPole-v1"})


def test_a_task_without_its_algorithm_is_refused_when_built():
    class Half(RLTask):
        Config = TinyConfig

    with pytest.raises(TypeError, match="^Half must define build_net$"):
        Half.create(net=lambda in_features, out_features: MLP(in_features, out_features), optimizer=torch.optim.SGD,
                    env={"id": "CartPole-v1"})

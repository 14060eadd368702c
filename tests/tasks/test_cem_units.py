"""CEM's pieces by hand: what it refuses, how it seeds and plays a batch, how it fits the elite and stops."""

from __future__ import annotations

import functools

import gymnasium as gym
import lightning as L
import numpy as np
import pytest
import torch
from torch import nn

from pipeline.nets.mlp import MLP
from pipeline.tasks.cem import CEMTask


def _task(**values):
    values = {"net": functools.partial(MLP, hidden=(8,)), "optimizer": torch.optim.Adam, "env": {"id": "CartPole-v1"},
              "episodes_per_batch": 3, "max_iterations": 2, "final_eval_episodes": 2, **values}
    return CEMTask.create(**values)


def _trainer():
    return L.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)


def test_cem_refuses_a_continuous_env_and_a_loss_other_than_cross_entropy():
    with pytest.raises(ValueError, match=r"^CEM here needs a discrete action space; Pendulum-v1 has Box\("):
        _task(env={"id": "Pendulum-v1"})
    with pytest.raises(ValueError) as err:
        _task(loss=nn.MSELoss())
    assert str(err.value) == "task=cem fits the elite actions with cross-entropy; got MSELoss: use loss=cross_entropy"
    given = nn.CrossEntropyLoss(label_smoothing=0.1)
    assert _task(loss=given).loss_fn is given and isinstance(_task().loss_fn, nn.CrossEntropyLoss)


def test_cem_reads_its_config():
    task = _task(elite_percentile=50, fit_epochs=3, stop_at_return=None, env={"id": "CartPole-v1", "kwargs": {"max_episode_steps": 7}})
    assert (task.elite_percentile, task.fit_epochs, task.max_iterations, task.final_eval_episodes) == (50.0, 3, 2, 2)
    assert task.stop_at_return is None and task.threshold == 475.0  # CartPole-v1's registered threshold
    assert len(task.envs) == 3 and task.n_actions == 2 and task.env_kwargs == {"max_episode_steps": 7}
    assert task.net(torch.zeros(1, 4)).shape == (1, 2)  # 4 observations in, 2 actions out
    assert _task(threshold=100.0).threshold == 100.0
    assert len(task.train_dataloader()) == 2 and list(task.train_dataloader()) == [0, 1]
    assert task.env_steps == task.iterations == 0 and task.batch_means == [] and task.early_stop is None


def test_a_batch_plays_one_seeded_episode_per_env():
    task = _task(seed=2, env={"id": "CartPole-v1", "kwargs": {"max_episode_steps": 30}})
    task.iterations = 1
    obs, actions, returns = task.play_batch()
    # Episode i of iteration 1 resets with seed 2 * 1_000_003 + 1 * 3 + i.
    for i in range(3):
        first, _ = gym.make("CartPole-v1").reset(seed=2 * 1_000_003 + 3 + i)
        assert np.array_equal(obs[i][0], first)
        assert obs[i].shape == (len(actions[i]), 4) and set(actions[i]) <= {0, 1}
        assert returns[i] == len(actions[i]) <= 30  # CartPole pays 1 per step
    assert task.env_steps == sum(len(a) for a in actions)
    # Replaying the recorded actions in a fresh env with that seed gives the same observations.
    env = gym.make("CartPole-v1")
    o, _ = env.reset(seed=2 * 1_000_003 + 3)
    for t, a in enumerate(actions[0]):
        assert np.array_equal(o, obs[0][t])
        o, *_ = env.step(a)


def test_training_fits_the_elite_logs_and_stops_at_the_return_asked_for():
    task = _task(stop_at_return=1.0, threshold=2.0, max_iterations=5)
    (metrics,) = task.fit_and_evaluate(_trainer(), None, None)
    # Every CartPole episode returns at least 1: the first batch stops it.
    assert task.iterations == 1 and metrics["train/iterations"] == 1.0 and len(task.batch_means) == 1
    mean = task.batch_means[0]
    assert task.early_stop == {"iteration": 1, "env_step": task.env_steps,
                               "reason": f"batch mean return {mean:.1f} >= stop_at_return 1.0"}
    assert task.time_to_threshold_s is not None and task.time_to_threshold_s > 0
    record = task.agent_record(0)
    assert record["env_id"] == "CartPole-v1" and record["env_steps"] == task.env_steps > 0
    assert record["threshold"] == 2.0 and record["early_stop"] == task.early_stop
    assert record["time_to_threshold_s"] == round(task.time_to_threshold_s, 3)
    assert record["env_steps_per_s"] == round(task.env_steps / task._train_seconds, 1) > 0
    assert 8.0 <= metrics["eval/return_mean"] <= 500.0 and metrics["eval/return_std"] >= 0.0


def test_training_runs_every_iteration_when_the_return_is_never_reached():
    task = _task(stop_at_return=None, threshold=10_000.0, max_iterations=3)
    task.fit_and_evaluate(_trainer(), None, None)
    assert task.iterations == 3 and len(task.batch_means) == 3 and task.early_stop is None
    assert task.time_to_threshold_s is None and task.agent_record(0)["time_to_threshold_s"] is None
    high = _task(stop_at_return=10_000.0, threshold=None, max_iterations=2)
    high.fit_and_evaluate(_trainer(), None, None)
    assert high.iterations == 2 and high.early_stop is None and high.time_to_threshold_s is None


def test_a_record_before_training_has_no_rate():
    assert _task().agent_record(0)["env_steps_per_s"] is None

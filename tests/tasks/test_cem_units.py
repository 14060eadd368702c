"""CEM's pieces by hand: what it refuses, how it seeds and plays a batch, how it fits the elite and stops."""

from __future__ import annotations

import functools
import time

import gymnasium as gym
import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import Logger
from torch import nn

from pipeline.nets.mlp import MLP
from pipeline.tasks.base import NonFiniteLossError
from pipeline.tasks.cem import CEMTask
from pipeline.tasks.configs import CEMConfig


def _task(**values):
    values = {"net": functools.partial(MLP, hidden=(8,)), "optimizer": torch.optim.Adam, "env": {"id": "CartPole-v1"},
              "episodes_per_batch": 3, "max_iterations": 2, "final_eval_episodes": 2,
              "stop_confirm_episodes": 0, **values}  # the stop rule's confirmation: its own test below
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
    hp = task.config
    assert (hp.elite_percentile, hp.fit_epochs, hp.max_iterations, hp.final_eval_episodes) == (50.0, 3, 2, 2)
    assert hp.stop_at_return is None and task.threshold == 475.0  # CartPole-v1's registered threshold
    # One agent: its 3 envs (one per episode of a batch), each with the env's kwargs.
    assert len(task.envs) == 1 and len(task.envs[0]) == 3 and task.n_actions == 2 and task.env_kwargs == {"max_episode_steps": 7}
    assert all(env.spec.max_episode_steps == 7 for env in task.envs[0])
    assert task.net(torch.zeros(1, 1, 4)).shape == (1, 1, 2)  # [agents, batch, 4 observations] in, 2 actions out
    assert _task(threshold=100.0).threshold == 100.0
    assert len(task.train_dataloader()) == 2 and list(task.train_dataloader()) == [0, 1]
    assert task.env_steps == task.iterations == 0 and task.batch_means == [[]] and task.early_stop == [None]


def test_a_batch_plays_one_seeded_episode_per_env():
    task = _task(seed=2, env={"id": "CartPole-v1", "kwargs": {"max_episode_steps": 30}})
    task.iterations = 1
    ((obs, actions, returns),) = task.play_batch()  # one agent's batch
    # Episode i of iteration 1 resets with seed 2 * 1_000_003 + 1 * 3 + i.
    for i in range(3):
        first, _ = gym.make("CartPole-v1").reset(seed=2 * 1_000_003 + 3 + i)
        assert np.array_equal(obs[i][0], first)
        assert obs[i].shape == (len(actions[i]), 4) and set(actions[i]) <= {0, 1}
        assert returns[i] == len(actions[i]) <= 30  # CartPole pays 1 per step
    assert task.agent_steps == [sum(len(a) for a in actions)]
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
    assert task.iterations == 1 and metrics["train/iterations"] == 1.0 and len(task.batch_means[0]) == 1
    (mean,) = task.batch_means[0]
    assert task.early_stop == [{"env_step": task.env_steps, "reason": f"batch mean return {mean:.1f} >= stop_at_return 1.0"}]
    assert task.slots == [] and task.stop_step == [task.env_steps]  # it left the batch
    assert task.time_to_threshold_s[0] is not None and task.time_to_threshold_s[0] > 0
    record = task.agent_record(0)
    assert record["env_id"] == "CartPole-v1" and record["env_steps"] == task.env_steps > 0
    assert record["threshold"] == 2.0 and record["early_stop"] == task.early_stop[0]
    assert record["time_to_threshold_s"] == round(task.time_to_threshold_s[0], 3)
    assert record["env_steps_per_s"] == round(task.env_steps / task.stop_time_s[0], 1) > 0  # its steps over its time to the stop
    assert 8.0 <= metrics["eval/return_mean"] <= 500.0 and metrics["eval/return_std"] >= 0.0


def test_training_runs_every_iteration_when_the_return_is_never_reached():
    task = _task(stop_at_return=None, threshold=10_000.0, max_iterations=3)
    task.fit_and_evaluate(_trainer(), None, None)
    assert task.iterations == 3 and len(task.batch_means[0]) == 3 and task.early_stop == [None]
    assert task.time_to_threshold_s == [None] and task.agent_record(0)["time_to_threshold_s"] is None
    high = _task(stop_at_return=10_000.0, threshold=None, max_iterations=2)
    high.fit_and_evaluate(_trainer(), None, None)
    assert high.iterations == 2 and high.early_stop == [None] and high.time_to_threshold_s == [None]


def test_a_record_before_training_has_no_rate():
    assert _task().agent_record(0)["env_steps_per_s"] is None


# ---- what a fit logs, times and decides (episodes capped at 5 steps: CartPole cannot fall that soon, so every
# return is 5 and the elite cutoff, the mean and the stopping tests are known) -----------------------------------
FIVE = {"id": "CartPole-v1", "kwargs": {"max_episode_steps": 5}}


class Recorder(Logger):
    """A Lightning logger that keeps every log_metrics call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[dict, int | None]] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.calls.append((dict(metrics), step))


def _fit(task, logger=False):
    # log_every_n_steps=1: a value logged through Lightning would reach the loggers at once. The agent's rows go to its
    # own loggers (with one agent the lifecycle hands it the trainer's).
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, logger=logger, enable_checkpointing=False, log_every_n_steps=1,
                        enable_progress_bar=False, enable_model_summary=False)
    if logger:
        task.agent_loggers = [[logger]]
    t0 = time.perf_counter()
    (metrics,) = task.fit_and_evaluate(trainer, None, None)
    return trainer, metrics, time.perf_counter() - t0


def test_each_iteration_logs_its_metrics_at_its_env_step_and_the_bar_shows_the_batch_return():
    task = _task(env=FIVE, episodes_per_batch=3, max_iterations=2, stop_at_return=None, threshold=None)
    recorder = Recorder()
    trainer, metrics, wall = _fit(task, recorder)
    ours = [(m, step) for m, step in recorder.calls if "train/loss" in m]
    assert [step for _, step in ours] == [15, 30]  # 3 episodes of 5 steps per iteration
    keys = {"env_step", "train/batch_return_mean", "train/elite_cutoff", "train/loss", "perf/env_steps_per_s", "train/episodic_return"}
    for (m, _), steps in zip(ours, (15, 30)):
        assert set(m) == keys
        assert m["env_step"] == steps and m["train/batch_return_mean"] == 5.0 and m["train/elite_cutoff"] == 5.0
        assert m["train/episodic_return"] == 5.0  # the last 10 episodes
        assert 0.0 < m["train/loss"] < 10.0
        assert m["perf/env_steps_per_s"] >= steps / wall  # steps over the time since the fit began, a part of wall
    finals = [m for m, _ in recorder.calls if "final_eval/return_mean" in m]
    assert len(finals) == 1 and finals[0]["env_step"] == 30
    assert task.progress() == (2, 2, "iterations", {"return": 5.0})  # the bar: iterations, the last episodes' return
    assert task.batch_means == [[5.0, 5.0]] and metrics["train/iterations"] == 2.0 and metrics["train/episodes"] == 6.0
    assert set(task.time_breakdown_s) == {"env_act", "learn", "log", "final_eval"}
    assert all(0.0 < s <= wall for s in task.time_breakdown_s.values()), task.time_breakdown_s


def test_a_return_equal_to_the_threshold_and_to_stop_at_return_counts_as_reached():
    task = _task(env=FIVE, max_iterations=3, stop_at_return=5.0, threshold=5.0)
    _, _, wall = _fit(task)
    assert task.iterations == 1
    assert task.early_stop == [{"env_step": 15, "reason": "batch mean return 5.0 >= stop_at_return 5.0"}]
    assert 0.0 < task.time_to_threshold_s[0] <= wall


def test_the_elite_are_the_episodes_at_or_above_the_cutoff_so_equal_returns_all_count():
    """All returns equal: the cutoff is that return and every episode is elite (above it, none would be)."""
    task = _task(env=FIVE, episodes_per_batch=4, max_iterations=1, elite_percentile=90, stop_at_return=None)
    recorder = Recorder()
    _fit(task, recorder)
    (m,) = [m for m, _ in recorder.calls if "train/elite_cutoff" in m]
    assert m["train/elite_cutoff"] == 5.0 and task.iterations == 1


def test_sampling_follows_the_task_s_seed_not_the_global_generator():
    torch.manual_seed(0)  # the same initial net for both
    a = _task(seed=3, stop_at_return=None, max_iterations=2)
    torch.manual_seed(0)
    b = _task(seed=3, stop_at_return=None, max_iterations=2)
    torch.manual_seed(1)
    ((_, first_actions, _),) = a.play_batch()
    torch.manual_seed(2)
    ((_, again, _),) = b.play_batch()
    assert first_actions == again  # a batch played before any fit
    torch.manual_seed(11)
    _fit(a)
    torch.manual_seed(12)
    _fit(b)
    assert a.batch_means == b.batch_means and a.env_steps == b.env_steps
    assert all(torch.equal(p, q) for p, q in zip(a.net.parameters(), b.net.parameters()))


def test_a_fit_restarts_sampling_from_the_seed():
    """The batches played before a fit do not shift the fit's: on_fit_start seeds the sampler again."""
    torch.manual_seed(0)
    a = _task(seed=4, stop_at_return=None, max_iterations=1)
    torch.manual_seed(0)
    b = _task(seed=4, stop_at_return=None, max_iterations=1)
    b.play_batch()
    b.iterations, b.env_steps, b.agent_steps = 0, 0, [0]
    _fit(a)
    _fit(b)
    assert a.batch_means == b.batch_means and a.env_steps == b.env_steps


def test_a_batch_of_one_episode_works():
    task = _task(episodes_per_batch=1, max_iterations=1, stop_at_return=None)
    assert len(task.envs[0]) == 1 and task.n_actions == 2
    ((obs, actions, returns),) = task.play_batch()
    assert len(obs) == len(actions) == len(returns) == 1


def test_the_task_keeps_its_config_and_the_loader_yields_plain_iteration_numbers():
    task = _task(fit_epochs=3, elite_percentile=55)
    assert isinstance(task.config, CEMConfig)
    assert (task.config.fit_epochs, task.config.elite_percentile, task.config.episodes_per_batch) == (3, 55, 3)
    items = list(task.train_dataloader())
    assert items == [0, 1] and all(type(i) is int for i in items)  # not batched into tensors


@pytest.mark.parametrize("part, fix", [("net", "choose a network with model=mlp"),
                                       ("optimizer", "choose one with optimizer=adam|sgd|..."),
                                       ("env", "choose an environment with env=cartpole|pendulum|...")])
def test_a_missing_part_is_named_with_its_fix(part, fix):
    with pytest.raises(ValueError) as err:
        _task(**{part: None})
    assert str(err.value) == f"task=cem needs {part}: {fix}"


def test_a_non_finite_loss_names_the_iteration():
    class NaNLoss(nn.CrossEntropyLoss):
        def forward(self, x, y):
            return super().forward(x, y) * float("nan")

    task = _task(loss=NaNLoss(), max_iterations=2, stop_at_return=None)
    with pytest.raises(NonFiniteLossError, match=r"^loss became nan at step 0; "):
        _fit(task)


def test_the_policy_is_fitted_by_hand_fit_epochs_steps_per_iteration():
    steps = []

    class CountingSGD(torch.optim.SGD):
        def step(self, closure=None):
            steps.append(closure)
            return super().step(closure)

    task = _task(optimizer=lambda params: CountingSGD(params, lr=0.01), fit_epochs=3, max_iterations=2, stop_at_return=None)
    _fit(task)
    assert steps == [None] * 6  # 3 per iteration, ours: none through Lightning's automatic closure


def _through_a_file(state):
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_a_run_stopped_between_iterations_resumes_to_where_an_uninterrupted_run_ends():
    """#37 6b: a stop request (SIGINT/SIGTERM) ends the fit at the checkpoint hook after an iteration; the state saved
    there resumes (weights, Adam's moments, counters, the sampling generator) to the uninterrupted run's end."""
    hp = dict(seed=5, max_iterations=3, stop_at_return=None, threshold=None, episodes_per_batch=4)
    torch.manual_seed(0)  # the lifecycle seeds the process before it builds a task: the same initial weights
    full = _task(**hp)
    full.fit_and_evaluate(_trainer(), None, None)
    torch.manual_seed(0)
    stopped, saved = _task(**hp), []

    def hook(final=False):
        if not final and stopped.iterations == 2:  # a stop request after the second iteration: save, stop the fit
            saved.append(_through_a_file(stopped.checkpoint_state()))
            stopped.trainer.should_stop = True

    stopped.checkpoint_hook = hook
    stopped.fit_and_evaluate(_trainer(), None, None)
    (state,) = saved
    assert stopped.iterations == 2 and state["format"] == "pipeline.cem/2" and state["progress"]["iterations"] == 2
    resumed = _task(**hp)
    assert resumed.load_checkpoint_state(state) == stopped.resume_step == state["progress"]["env_steps"] > 0
    metrics = resumed.fit_and_evaluate(_trainer(), None, None)
    assert resumed.iterations == 3 and resumed.env_steps == full.env_steps and resumed.batch_means == full.batch_means
    assert all(torch.equal(a, b) for a, b in zip(resumed.net.state_dict().values(), full.net.state_dict().values()))
    assert metrics[0]["train/iterations"] == 3.0
    done = _task(**hp)  # a finished run's checkpoint: nothing is trained again
    done.load_checkpoint_state(_through_a_file({**state, "progress": {**state["progress"], "iterations": 3}}))
    done.fit_and_evaluate(SimpleTrainer(), None, None)
    with pytest.raises(ValueError, match=r"^checkpoint format 'x' is not 'pipeline.cem/2'"):
        _task(**hp).load_checkpoint_state({**state, "format": "x"})
    with pytest.raises(ValueError, match=r"^checkpoint holds seeds 5..5 \(1 agents\), this run has 6..6; resume with the same seed"):
        _task(**{**hp, "seed": 6}).load_checkpoint_state(state)


class SimpleTrainer:
    precision = "32-true"

    def fit(self, module):
        raise AssertionError("a finished run was fitted again")


def test_a_batch_that_reaches_stop_at_return_stops_only_when_fresh_greedy_episodes_confirm_it(monkeypatch):
    """The stop rule of every RL task: the batch mean reaching the bar is screened; the greedy policy then plays
    stop_confirm_episodes fresh episodes (other start states after every iteration) and training stops only when
    their mean reaches the bar too."""
    from pipeline.tasks import rl_task

    played = []

    def confirm(policy, env, agent_seeds, n, seed_offset, device="cpu"):
        played.append((agent_seeds, n, seed_offset))
        return torch.full((len(agent_seeds), n), 4.0 if len(played) == 1 else 5.0)  # the first falls short, the second agrees

    monkeypatch.setattr(rl_task, "evaluate_agents", confirm)
    task = _task(env=FIVE, seed=2, max_iterations=4, stop_at_return=5.0, threshold=None, stop_confirm_episodes=6)
    task.fit_and_evaluate(_trainer(), None, None)
    # after iterations 1 and 2 (agent seed 2's episode j from seed 2 + offset + j), then the final evaluation
    assert played == [([2], 6, 30_000 + 6 * 1), ([2], 6, 30_000 + 6 * 2), ([2], 2, 20_000)]
    assert task.iterations == 2 and task.confirmations == [[(15, 4.0), (30, 5.0)]]
    assert task.early_stop == [{"env_step": 30, "reason": "batch mean return 5.0 >= stop_at_return 5.0, "
                                "confirmed on 6 fresh episodes (mean 5.0)"}]

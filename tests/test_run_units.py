"""runtime/run.py's pure helpers, without a run: the task checks before anything is built, the exit code, the
checkpoint policy, segments closing. The lifecycle itself (run_job) is tested by the runs in the other files."""

import time

import pytest
from omegaconf import OmegaConf

from pipeline.config.checks import ConfigError
from pipeline.runtime import run as run_module
from pipeline.runtime.checkpointing import CheckpointPolicy
from pipeline.store.record import RunRecord
from pipeline.tasks.cem import CEMTask
from pipeline.tasks.dqn import DQNTask
from pipeline.tasks.gan import GANTask
from pipeline.tasks.supervised import SupervisedTask


def test_is_empty():
    assert run_module._is_empty(None) and run_module._is_empty(OmegaConf.create({}))
    assert not run_module._is_empty(OmegaConf.create({"a": 1})) and not run_module._is_empty("x")
    assert not run_module._is_empty({})  # a plain dict is no config node


def test_task_class_is_the_target_and_must_be_a_task():
    assert run_module.task_class(OmegaConf.create({"task": {"_target_": "pipeline.tasks.dqn.DQNTask"}})) is DQNTask
    with pytest.raises(ConfigError, match=r"^task\._target_=pipeline\.tasks\.nope\.Task: ImportError: Error loading 'pipeline\.tasks\.nope\.Task'$"):
        run_module.task_class(OmegaConf.create({"task": {"_target_": "pipeline.tasks.nope.Task"}}))
    with pytest.raises(ConfigError, match=r"^task\._target_=torch\.nn\.Linear is not a pipeline\.tasks\.base\.Task subclass$"):
        run_module.task_class(OmegaConf.create({"task": {"_target_": "torch.nn.Linear"}}))


def test_check_task_refuses_seeds_together_for_a_task_that_trains_one(make_cfg):
    cfg = make_cfg("experiment=gan_digits")
    assert run_module.check_task(cfg, 1) is GANTask
    with pytest.raises(ConfigError, match=r"^task GANTask trains one seed per process; seeds_per_process=2 works with "
                                          r"task=dqn, ppo, sac, td3, cem and supervised \(run the seeds as a sweep: -m seed='range\(0,N\)'\)$"):
        run_module.check_task(cfg, 2)
    assert run_module.check_task(make_cfg("experiment=supervised_digits"), 3) is SupervisedTask


def test_check_task_refuses_a_group_the_task_does_not_use(make_cfg):
    cfg = make_cfg("experiment=cem_cartpole", "scheduler=step")
    with pytest.raises(ConfigError, match=r"^task CEMTask does not use a scheduler; drop it with scheduler=none \(got "
                                          r"scheduler=torch\.optim\.lr_scheduler\.StepLR\)$"):
        run_module.check_task(cfg, 1)
    # data is never refused (the lifecycle builds it for the tasks that take it), an empty group is no group.
    assert run_module.check_task(make_cfg("experiment=cem_cartpole", "data=digits"), 1) is CEMTask


def test_check_task_checks_the_task_config_and_the_monitors(make_cfg):
    with pytest.raises(ConfigError, match=r"^task\.gamma: "):
        run_module.check_task(make_cfg("experiment=dqn_cartpole", "task.gamma=high"), 1)
    with pytest.raises(ConfigError, match="val_acc"):
        run_module.check_task(make_cfg("experiment=supervised_digits", "callbacks=early_stopping",
                                       "callbacks.early_stopping.monitor=val_acc"), 1)


def test_choice_hint_names_the_target_or_the_value():
    cfg = OmegaConf.create({"loss": {"_target_": "torch.nn.MSELoss"}, "env": "CartPole-v1", "data": {"x": 1}})
    assert run_module._choice_hint(cfg, "loss") == "torch.nn.MSELoss"
    assert run_module._choice_hint(cfg, "env") == "CartPole-v1"
    assert run_module._choice_hint(cfg, "data") == "{'x': 1}"


def test_task_config_is_typed_and_names_the_bad_key():
    config = run_module.task_config(DQNTask, OmegaConf.create({"_target_": "x", "gamma": 0.5}))
    assert isinstance(config, DQNTask.Config) and config.gamma == 0.5
    node = OmegaConf.create({"g": 0.25, "task": {"_target_": "x", "gamma": "${g}"}})
    assert run_module.task_config(DQNTask, node.task).gamma == 0.25  # interpolations resolved
    with pytest.raises(ConfigError, match=r"^task\.no_such_key: Key 'no_such_key' not in 'DQNConfig'$"):
        run_module.task_config(DQNTask, OmegaConf.create({"no_such_key": 1}))
    with pytest.raises(ConfigError) as err:
        run_module.task_config(DQNTask, OmegaConf.create({"gamma": "high"}))
    assert str(err.value).startswith("task.gamma: Value 'high' of type 'str' could not be converted") and "\n" not in str(err.value)


@pytest.mark.parametrize(("records", "code"), [
    ([], 1),
    ([{"status": "ok"}], 0),
    ([{"status": "ok"}, {"status": "ok"}], 0),
    ([{"status": "ok"}, {"status": "failed"}], 1),
    ([{"status": "failed"}], 1),
    ([{"status": "ok"}, {"status": "interrupted"}], 130),
    ([{"status": "interrupted", "interrupted": {"exit_code": 143}}], 143),
    ([{"status": "interrupted", "interrupted": {"exit_code": None}}], 130),
    ([{"status": "interrupted", "interrupted": None}], 130),
    ([{"status": "interrupted", "interrupted": {"exit_code": 0}}], 130),
])
def test_exit_code_of(records, code):
    assert run_module.exit_code_of(records) == code


def test_now_is_utc_to_the_second():
    now = run_module._now()
    assert now.endswith("+00:00") and len(now) == len("2026-12-04T16:00:00+00:00")


def test_check_start_refuses_bad_seeds_and_counts(make_cfg):
    cfg = make_cfg("experiment=gan_digits")
    run_module._check_start(cfg, 1)
    for seed in (True, "3", 1.5):
        bad = OmegaConf.merge(cfg, {"seed": seed})
        with pytest.raises(ConfigError, match=rf"^seed={seed!r} must be an integer, e\.g\. seed=3 \(a sweep: "):
            run_module._check_start(bad, 1)
    with pytest.raises(ConfigError, match=r"^seeds_per_process=0 must be >= 1$"):
        run_module._check_start(cfg, 0)
    with pytest.raises(ConfigError, match="trains one seed per process"):
        run_module._check_start(cfg, 2)
    with pytest.raises(ConfigError, match="task.gamma"):  # the value checks run too
        run_module._check_start(make_cfg("experiment=dqn_cartpole", "task.gamma=2.0"), 1)


@pytest.mark.parametrize(("spec", "expected"), [  # a run's policy saves at its first safe point too
    (None, CheckpointPolicy(enabled=True, every_s=None, every_steps=None, first=True)),
    ({"enabled": False, "every_s": 30, "every_steps": 0}, CheckpointPolicy(enabled=False, every_s=30.0, every_steps=None, first=True)),
    ({"every_s": None, "every_steps": 500}, CheckpointPolicy(enabled=True, every_s=None, every_steps=500, first=True)),
    ({"every_s": "2.5", "every_steps": "7"}, CheckpointPolicy(enabled=True, every_s=2.5, every_steps=7, first=True)),
])
def test_checkpoint_policy_from_config(spec, expected):
    policy = run_module._policy(OmegaConf.create({"checkpoint": spec}))
    assert policy == expected
    assert type(policy.every_s) in (float, type(None)) and type(policy.every_steps) in (int, type(None))


def test_close_segment_adds_up_the_segments(tmp_path):
    r = RunRecord(experiment="e", group="g", task="T", seed=0, run_dir=str(tmp_path), versions=None, git_commit=None,
                  segments=[{"wall_time_s": 1.5}, {"wall_time_s": None}, {"started": "now"}])
    empty = RunRecord(experiment="e", group="g", task="T", seed=1, run_dir=str(tmp_path), versions=None, git_commit=None)
    t_start = time.perf_counter() - 2.25
    run_module._close_segment([r, empty], t_start, "interrupted")
    last = r.segments[-1]
    assert last["end"] == "interrupted" and 2.25 <= last["wall_time_s"] < 60 and last["ended"].endswith("+00:00")
    # To the millisecond: not whole seconds.
    assert last["wall_time_s"] == round(last["wall_time_s"], 3) and last["wall_time_s"] != int(last["wall_time_s"])
    assert r.wall_time_s == pytest.approx(1.5 + last["wall_time_s"]) and r.segments[0] == {"wall_time_s": 1.5}
    assert empty.segments == [] and empty.wall_time_s == 0.0

"""runtime/run.py's pure helpers, without a run: the exit code, the checkpoint policy, segments closing. The checks
before anything is built are the start-up check's (tests/config/); the lifecycle itself (run_job) is tested by the
runs in the other files."""

import time

import pytest
from omegaconf import OmegaConf

from pipeline.config.startup import check_run
from pipeline.runtime import run as run_module
from pipeline.runtime.checkpointing import CheckpointPolicy
from pipeline.store.record import RunRecord


def test_is_empty():
    assert run_module._is_empty(None) and run_module._is_empty(OmegaConf.create({}))
    assert not run_module._is_empty(OmegaConf.create({"a": 1})) and not run_module._is_empty("x")
    assert not run_module._is_empty({})  # a plain dict is no config node


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


@pytest.mark.parametrize(("overrides", "expected"), [  # a run's policy saves at its first safe point too
    ((), CheckpointPolicy(enabled=True, every_s=60.0, every_steps=None, first=True)),
    (("checkpoint.enabled=false", "checkpoint.every_s=30", "checkpoint.every_steps=0"),
     CheckpointPolicy(enabled=False, every_s=30.0, every_steps=None, first=True)),
    (("checkpoint.every_s=null", "checkpoint.every_steps=500"), CheckpointPolicy(enabled=True, every_s=None, every_steps=500, first=True)),
    (("checkpoint.every_s=2.5",), CheckpointPolicy(enabled=True, every_s=2.5, every_steps=None, first=True)),
])
def test_checkpoint_policy_from_the_checked_config(make_cfg, overrides, expected):
    policy = run_module._policy(check_run(make_cfg("experiment=gan_digits", *overrides)).checkpoint)
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

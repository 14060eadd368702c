"""Durability in the fast suite: what the kill-and-resume tests (tests/test_durable.py, slow) check end to end,
pinned here in seconds, so `make test-fast` catches a record that loses a field, a resumed curve that loses the
checkpoint's row, a `wall_time_s` that is not the sum of its segments, or a resumed Lightning run off by a step.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from pipeline.runtime.run import run
from pipeline.store.curves import CurveLog, read_curve, read_run_curve
from pipeline.store.record import RunRecord, read_record

# A value for every field of a record, none of them its default: a field that a write or a read drops or
# renames comes back different. A field added to RunRecord must be added here (the first assert says so).
EVERY_FIELD = {
    "experiment": "dqn_cartpole", "group": "dqn_cartpole-abc", "task": "DQNTask", "seed": 7, "run_dir": "/runs/7",
    "status": "interrupted", "error": "stopped by SIGTERM", "primary_metric": "eval/return_mean",
    "primary_curve": "eval/return_mean", "higher_is_better": False, "metrics": {"eval/return_mean": 412.5},
    "wall_time_s": 12.25,
    "segments": [{"started": "2026-01-01T00:00:00+00:00", "from_step": None, "wall_time_s": 5.0, "end": "killed"},
                 {"started": "2026-01-01T00:01:00+00:00", "from_step": 4096, "wall_time_s": 7.25, "end": "interrupted"}],
    "time_breakdown_s": {"env": 3.5, "learn": 6.0}, "device": "cpu", "versions": {"python": "3.0.0", "torch": "0.1"},
    "git_commit": "0123456789abcdef", "config": {"task": {"gamma": 0.9}}, "seeds_per_process": 4, "agent": 3,
    "pid": 4242, "interrupted": {"signal": "SIGTERM", "step": 8192, "resume": "python -m pipeline ckpt_path=last"},
    "checkpoint": {"path": "/runs/7/checkpoints/last.ckpt", "step": 8192}, "env_id": "CartPole-v1",
    "env_steps": 8192, "env_steps_per_s": 950.5, "threshold": 475.0, "time_to_threshold_s": 9.75,
    "early_stop": {"env_step": 8000, "reason": "greedy evaluation mean 480.0 >= stop_at_return 475.0"},
    "evaluations": [{"env_step": 4096, "return_mean": 200.0, "return_std": 10.0}],
    "metric_bounds": {"eval/return_mean": [0.0, 500.0]}, "replay_bytes_per_transition": 48,
    "extras": {"coverage": 0.875, "choices": {"env": "cartpole"}}, "schema_version": 1,
}


def test_every_field_of_a_record_survives_a_write_and_a_read(tmp_path):
    fields = {f.name: f for f in dataclasses.fields(RunRecord)}
    assert set(EVERY_FIELD) == set(fields), "give the new field a non-default value in EVERY_FIELD"
    for name, f in fields.items():
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        assert EVERY_FIELD[name] != default, name
    record = RunRecord(**EVERY_FIELD)
    record.write(tmp_path)
    on_disk = json.loads((tmp_path / "result.json").read_text())
    for name, value in EVERY_FIELD.items():
        if name == "extras":  # written at the top level, next to the typed fields
            assert {k: on_disk[k] for k in value} == value
        else:
            assert on_disk[name] == value, name
    back = read_record(tmp_path)
    assert {name: getattr(back, name) for name in EVERY_FIELD} == EVERY_FIELD


def test_a_resumed_curve_keeps_every_row_up_to_the_checkpoints_step_and_redoes_the_rest(tmp_path):
    path = tmp_path / "metrics.csv"
    first = CurveLog(path)
    for step in (0, 10, 20, 30):
        first.log(step, {"loss": 1.0 / (step + 1)})
    first.flush()  # the killed process had written rows past its last checkpoint (step 20)
    resumed = CurveLog(path, resume_step=20)
    assert sorted(resumed.rows) == [0, 10, 20]  # the checkpoint's own row is kept; step 30 is redone
    resumed.log(30, {"loss": 0.5})
    resumed.log(40, {"loss": 0.25})
    resumed.flush()
    assert read_curve(path) == {0: {"loss": 1.0}, 10: {"loss": 1 / 11}, 20: {"loss": 1 / 21}, 30: {"loss": 0.5},
                                40: {"loss": 0.25}}


# Three short epochs of the digits classifier (no dropout and a constant learning rate: the run is then exact,
# and its budget can grow on resume).
SUPERVISED = ["experiment=supervised_digits", "scheduler=none", "model.dropout=0.0", "trainer.limit_train_batches=2",
              "trainer.limit_val_batches=1", "trainer.limit_test_batches=1", "trainer.enable_progress_bar=false"]


@pytest.fixture(scope="module")
def straight_and_resumed(tmp_path_factory):
    from hydra import compose, initialize_config_module

    def cfg(*overrides):
        with initialize_config_module("pipeline.conf", version_base="1.3"):
            return compose(config_name="config", overrides=[*SUPERVISED, *overrides])

    straight, resumed = tmp_path_factory.mktemp("straight"), tmp_path_factory.mktemp("resumed")
    (whole,) = run(cfg("trainer.max_epochs=3"), straight)
    (part,) = run(cfg("trainer.max_epochs=1"), resumed)
    part_curve = read_run_curve(resumed)
    (rest,) = run(cfg("trainer.max_epochs=3", "ckpt_path=last"), resumed)
    return {"whole": whole, "part": part, "rest": rest, "part_curve": part_curve,
            "whole_curve": read_run_curve(straight), "rest_curve": read_run_curve(resumed)}


def test_a_lightning_run_resumed_from_its_checkpoint_ends_where_a_straight_run_ends(straight_and_resumed):
    runs = straight_and_resumed
    assert [runs[k]["status"] for k in ("whole", "part", "rest")] == ["ok"] * 3
    whole, rest = runs["whole_curve"], runs["rest_curve"]
    # Every step logged, none twice or shifted: the resumed run picks up at the step after its checkpoint's.
    assert sorted(rest) == sorted(whole)
    assert len(whole) > len(runs["part_curve"])
    for step in whole:
        assert rest[step].keys() == whole[step].keys(), step
        for name, value in whole[step].items():
            # Without dropout the resumed run repeats the straight run's arithmetic; one step more or less
            # (a batch, an epoch) moves a loss or an accuracy by far more than float rounding.
            assert rest[step][name] == pytest.approx(value, rel=1e-5, abs=1e-7), (step, name)
    assert runs["rest"]["metrics"] == pytest.approx(runs["whole"]["metrics"], rel=1e-5)


def test_the_resumed_curve_keeps_the_checkpoints_rows(straight_and_resumed):
    runs = straight_and_resumed
    part, rest = runs["part_curve"], runs["rest_curve"]
    held = runs["rest"]["segments"][0]["to_step"]  # the step the first segment's checkpoint holds
    kept = {s: r for s, r in part.items() if s <= held}
    assert held in part and kept
    for step, row in kept.items():
        assert {k: rest[step][k] for k in row} == row, step  # rows the checkpoint covers are kept as written


def test_wall_time_is_the_sum_of_the_segments_and_they_chain(straight_and_resumed):
    runs = straight_and_resumed
    first, second = runs["rest"]["segments"]
    assert first["wall_time_s"] == runs["part"]["wall_time_s"] > 0 and second["wall_time_s"] > 0
    assert runs["rest"]["wall_time_s"] == pytest.approx(first["wall_time_s"] + second["wall_time_s"], abs=2e-3)
    assert second["from_step"] == first["to_step"]  # the second segment starts where the checkpoint left off

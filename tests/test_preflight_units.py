"""runtime/preflight.py on run dirs set up by hand: records, checkpoints and locks written here, each answer and
refusal written out by hand."""

from __future__ import annotations

import fcntl
import json
import logging
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipeline.runtime.preflight import (
    RESUME_FREE,
    RunRefused,
    StartPlan,
    plan_start,
    preflight,
    refuse_changed_config,
)

# The record's config is the semantic one: flat keys, without seed, resume, ckpt_path, ...
SEMANTIC = {"task.lr": 0.1, "task.total_steps": 100, "trainer.max_epochs": 3}


def cfg(**overrides):
    """A run's config: seed 5, no resume, no checkpoint; `overrides` as dotted keys."""
    config = OmegaConf.create({"seed": 5, "resume": False, "ckpt_path": None, "task": {"lr": 0.1, "total_steps": 100},
                               "trainer": {"max_epochs": 3}})
    for key, value in overrides.items():
        OmegaConf.update(config, key, value, force_add=True)
    return config


def record(d: Path, status: str, config: dict | None = SEMANTIC) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "result.json").write_text(json.dumps({"status": status, "config": config, "seed": 5}))


def checkpoint(d: Path) -> Path:
    (d / "checkpoints").mkdir(parents=True, exist_ok=True)
    (d / "checkpoints" / "last.ckpt").write_bytes(b"weights")
    return d / "checkpoints" / "last.ckpt"


@pytest.fixture(autouse=True)
def not_requeued(monkeypatch):
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)


def test_a_fresh_dir_starts_fresh(tmp_path):
    plan = plan_start(cfg(), tmp_path, [tmp_path])
    assert plan == StartPlan([None], None, False, False)
    assert plan.nothing_to_do is False


def test_a_fresh_dir_asked_to_resume_starts_fresh_even_with_a_checkpoint(tmp_path):
    checkpoint(tmp_path)
    assert plan_start(cfg(resume=True), tmp_path, [tmp_path]) == StartPlan([None], None, False, False)


def test_a_finished_run_asked_to_resume_has_nothing_to_do(tmp_path, caplog):
    record(tmp_path, "ok")
    with caplog.at_level(logging.INFO, logger="pipeline"):
        plan = plan_start(cfg(resume=True), tmp_path, [tmp_path])
    assert plan.nothing_to_do is True and plan.ckpt is None and plan.extending is True
    assert [p.status for p in plan.previous] == ["ok"]
    assert caplog.record_tuples == [("pipeline", logging.INFO, f"{tmp_path} already finished ok; nothing to continue")]


def test_a_finished_run_again_is_refused(tmp_path):
    record(tmp_path, "ok")
    checkpoint(tmp_path)
    with pytest.raises(RunRefused) as err:
        plan_start(cfg(), tmp_path, [tmp_path])
    assert str(err.value) == (
        f"{tmp_path} already holds a finished run (status ok); choose a new dir (hydra.run.dir=<dir>) to run it "
        "again, or continue it to a larger budget with ckpt_path=last"
    )


def test_a_finished_run_continued_from_its_checkpoint_to_a_larger_budget(tmp_path):
    record(tmp_path, "ok")
    last = checkpoint(tmp_path)
    plan = plan_start(cfg(ckpt_path="last", **{"task.total_steps": 500}), tmp_path, [tmp_path])
    assert plan.ckpt == last and plan.extending is True and plan.nothing_to_do is False


def test_a_finished_run_without_a_checkpoint_cannot_be_continued(tmp_path):
    record(tmp_path, "ok")
    with pytest.raises(RunRefused) as err:
        plan_start(cfg(ckpt_path="last"), tmp_path, [tmp_path])
    assert str(err.value) == (
        f"{tmp_path} finished ok and has no checkpoint to continue from; choose a new dir to run it again"
    )


def test_an_unfinished_run_resumes_from_its_checkpoint(tmp_path):
    record(tmp_path, "failed")
    last = checkpoint(tmp_path)
    plan = plan_start(cfg(resume=True), tmp_path, [tmp_path])
    assert plan.ckpt == last and plan.extending is False and plan.nothing_to_do is False


def test_k_seeds_extend_only_when_every_agent_finished(tmp_path):
    dirs = [tmp_path / "seed5", tmp_path / "seed6"]
    record(dirs[0], "ok")
    record(dirs[1], "failed")
    last = checkpoint(tmp_path)
    plan = plan_start(cfg(resume=True), tmp_path, dirs)
    assert plan.ckpt == last and plan.extending is False
    assert [p.status for p in plan.previous] == ["ok", "failed"]
    record(dirs[1], "ok")
    assert plan_start(cfg(resume=True), tmp_path, dirs).nothing_to_do is True
    (dirs[1] / "result.json").unlink()
    plan = plan_start(cfg(), tmp_path, dirs)
    assert plan.ckpt is None and plan.extending is False and plan.nothing_to_do is False


def test_a_resume_with_another_config_is_refused(tmp_path):
    record(tmp_path, "failed")
    checkpoint(tmp_path)
    with pytest.raises(RunRefused) as err:
        plan_start(cfg(resume=True, **{"task.lr": 0.2}), tmp_path, [tmp_path])
    assert str(err.value) == (
        f"cannot resume {tmp_path} with another config: task.lr (0.1 -> 0.2); resume with the run's own settings, or "
        "start a new run in a new dir (hydra.run.dir=<dir>)"
    )


def test_without_a_checkpoint_the_config_is_not_compared(tmp_path):
    record(tmp_path, "failed")
    plan = plan_start(cfg(resume=True, **{"task.lr": 0.2}), tmp_path, [tmp_path])
    assert plan.ckpt is None and plan.extending is False


def test_the_budget_and_the_ignored_keys_may_change(tmp_path):
    assert RESUME_FREE == ("task.total_steps", "task.max_iterations", "trainer.max_epochs", "trainer.max_steps")
    changed = cfg(seed=9, **{"task.total_steps": 1000, "trainer.max_epochs": 30, "trainer.max_steps": 7,
                             "device.num_threads": 4})
    refuse_changed_config(changed, tmp_path, [RunRecordLike(SEMANTIC)])


class RunRecordLike:
    def __init__(self, config):
        self.config = config


def test_keys_added_and_dropped_are_shown_and_more_than_five_counted(tmp_path):
    before = {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6, "g": 7, "task.lr": 0.1}
    now = OmegaConf.create({"task": {"lr": 0.1}, "h": 8})
    with pytest.raises(RunRefused) as err:
        refuse_changed_config(now, tmp_path, [RunRecordLike(before)])
    assert str(err.value) == (
        f"cannot resume {tmp_path} with another config: a (1 -> -), b (2 -> -), c (3 -> -), d (4 -> -), e (5 -> -) and "
        "3 more; resume with the run's own settings, or start a new run in a new dir (hydra.run.dir=<dir>)"
    )


def test_exactly_five_differences_are_all_shown(tmp_path):
    before = {"a": 1, "b": 2, "c": 3, "d": 4}
    now = OmegaConf.create({"e": 5})
    with pytest.raises(RunRefused) as err:
        refuse_changed_config(now, tmp_path, [RunRecordLike(before)])
    assert str(err.value) == (
        f"cannot resume {tmp_path} with another config: a (1 -> -), b (2 -> -), c (3 -> -), d (4 -> -), e (- -> 5); "
        "resume with the run's own settings, or start a new run in a new dir (hydra.run.dir=<dir>)"
    )


def test_the_first_record_with_a_config_is_the_one_compared(tmp_path):
    now = OmegaConf.create({"a": 1})
    refuse_changed_config(now, tmp_path, [None, RunRecordLike(None), RunRecordLike({}), RunRecordLike({"a": 1}),
                                          RunRecordLike({"a": 2})])
    with pytest.raises(RunRefused, match=r"a \(2 -> 1\)"):
        refuse_changed_config(now, tmp_path, [None, RunRecordLike({"a": 2}), RunRecordLike({"a": 1})])


def test_no_config_to_compare_with_refuses_nothing(tmp_path):
    refuse_changed_config(OmegaConf.create({"a": 1}), tmp_path, [None, RunRecordLike(None)])
    refuse_changed_config(OmegaConf.create({"a": 1}), tmp_path, [])


def test_interpolations_are_compared_resolved(tmp_path):
    now = OmegaConf.create({"base": 2, "a": "${base}"})
    refuse_changed_config(now, tmp_path, [RunRecordLike({"base": 2, "a": 2})])


# ---------------------------------------------------------------------------------------------------
# Which checkpoint


def test_ckpt_path_last_without_a_checkpoint_starts_from_scratch(tmp_path, caplog):
    record(tmp_path, "failed")
    with caplog.at_level(logging.INFO, logger="pipeline"):
        plan = plan_start(cfg(ckpt_path="last"), tmp_path, [tmp_path])
    assert plan.ckpt is None
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert caplog.record_tuples == [
        ("pipeline", logging.INFO, f"ckpt_path=last: no checkpoint at {last} yet, starting from scratch")
    ]


def test_ckpt_path_last_on_a_fresh_dir_with_a_checkpoint(tmp_path):
    last = checkpoint(tmp_path)
    assert plan_start(cfg(ckpt_path="last"), tmp_path, [tmp_path]).ckpt == last


def test_a_checkpoint_file_named_by_path(tmp_path):
    other = tmp_path / "elsewhere.ckpt"
    other.write_bytes(b"weights")
    plan = plan_start(cfg(ckpt_path=str(other)), tmp_path / "run", [tmp_path / "run"])
    assert plan.ckpt == other and isinstance(plan.ckpt, Path)


def test_a_missing_checkpoint_file_is_refused(tmp_path):
    with pytest.raises(RunRefused) as err:
        plan_start(cfg(ckpt_path=str(tmp_path / "nope.ckpt")), tmp_path, [tmp_path])
    assert str(err.value) == (
        f"ckpt_path={tmp_path / 'nope.ckpt'}: no such checkpoint file; pass a checkpoint path or `last`"
    )


def test_a_directory_is_not_a_checkpoint_file(tmp_path):
    (tmp_path / "checkpoints" / "last.ckpt").mkdir(parents=True)
    record(tmp_path, "failed")
    assert plan_start(cfg(ckpt_path="last"), tmp_path, [tmp_path]).ckpt is None
    with pytest.raises(RunRefused):
        plan_start(cfg(ckpt_path=str(tmp_path / "checkpoints")), tmp_path, [tmp_path])


@pytest.mark.parametrize("count, resumed", [("1", True), ("12", True), ("0", False), ("", False)])
def test_a_requeued_slurm_job_continues_its_run(tmp_path, monkeypatch, count, resumed):
    monkeypatch.setenv("SLURM_RESTART_COUNT", count)
    record(tmp_path, "failed")
    last = checkpoint(tmp_path)
    assert plan_start(cfg(), tmp_path, [tmp_path]).ckpt == (last if resumed else None)


def test_a_requeued_job_without_records_starts_fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    checkpoint(tmp_path)
    assert plan_start(cfg(), tmp_path, [tmp_path]).ckpt is None


# ---------------------------------------------------------------------------------------------------
# The CLI's check


def test_preflight_passes_a_fresh_dir_and_writes_nothing(tmp_path):
    preflight(cfg(), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_preflight_refuses_a_finished_run(tmp_path):
    record(tmp_path, "ok")
    with pytest.raises(RunRefused, match="already holds a finished run"):
        preflight(cfg(), tmp_path)


@pytest.mark.parametrize("k", [None, 0, -2, "2", 1])
def test_preflight_reads_one_agent_dir_unless_k_seeds(tmp_path, k):
    record(tmp_path, "ok")
    with pytest.raises(RunRefused, match="already holds a finished run"):
        preflight(cfg(seeds_per_process=k), tmp_path)


def test_preflight_reads_the_agent_dirs_of_k_seeds_from_the_seed(tmp_path):
    record(tmp_path / "seed5", "ok")
    record(tmp_path / "seed6", "ok")
    record(tmp_path / "seed7", "failed")
    with pytest.raises(RunRefused, match="already holds a finished run"):
        preflight(cfg(seeds_per_process=2), tmp_path)
    preflight(cfg(seeds_per_process=3), tmp_path)  # seed7 has not finished
    preflight(cfg(seeds_per_process=2, seed=6), tmp_path)


def test_preflight_refuses_a_dir_in_use(tmp_path):
    fd = os.open(tmp_path / ".lock", os.O_RDWR | os.O_CREAT)
    try:
        os.write(fd, json.dumps({"pid": 4242, "host": "node7"}).encode())
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(RunRefused) as err:
            preflight(cfg(), tmp_path)
    finally:
        os.close(fd)
    assert str(err.value) == (
        f"run dir {tmp_path} is in use by process 4242 on node7; wait for it, or choose another dir with "
        "hydra.run.dir=<dir>"
    )
    assert err.value.__cause__ is None and err.value.__suppress_context__ is True
    preflight(cfg(), tmp_path)  # the lock released: the dir is free


@pytest.mark.parametrize("k", [0, -2])
def test_preflight_reads_the_run_dir_when_k_is_not_a_positive_count(tmp_path, k):
    """No agent dirs at all would read as "every agent finished": a fresh dir must still pass."""
    preflight(cfg(seeds_per_process=k), tmp_path)


def test_six_differences_show_five_and_count_one(tmp_path):
    before = {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6}
    with pytest.raises(RunRefused) as err:
        refuse_changed_config(OmegaConf.create({}), tmp_path, [RunRecordLike(before)])
    assert str(err.value) == (
        f"cannot resume {tmp_path} with another config: a (1 -> -), b (2 -> -), c (3 -> -), d (4 -> -), e (5 -> -) and "
        "1 more; resume with the run's own settings, or start a new run in a new dir (hydra.run.dir=<dir>)"
    )

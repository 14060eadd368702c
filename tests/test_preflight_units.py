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
from pipeline.store.integrity import save_checkpoint

# The record's config is the semantic one: flat keys, without seed, resume, ckpt_path, ...
SEMANTIC = {"task.lr": 0.1, "task.total_steps": 100, "trainer.max_epochs": 3}


def cfg(**overrides):
    """A run's config: seed 5, no resume, no checkpoint; `overrides` as dotted keys."""
    config = OmegaConf.create({"seed": 5, "resume": False, "ckpt_path": None, "task": {"lr": 0.1, "total_steps": 100},
                               "trainer": {"max_epochs": 3}})
    for key, value in overrides.items():
        OmegaConf.update(config, key, value, force_add=True)
    return config


def record(d: Path, status: str, config: dict | None = SEMANTIC, seed: int | None = None, **fields) -> None:
    d.mkdir(parents=True, exist_ok=True)
    if seed is None:
        seed = int(d.name[4:]) if d.name.startswith("seed") and d.name[4:].isdigit() else 5
    (d / "result.json").write_text(json.dumps({"status": status, "config": config, "seed": seed, **fields}))


def checkpoint(d: Path, step: int | None = None) -> Path:
    """A checkpoint as the store writes one: with its digest."""
    save_checkpoint(d / "checkpoints" / "last.ckpt", lambda f: f.write(b"weights"), step=step)
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


def test_a_setting_added_since_at_its_empty_default_does_not_refuse_an_older_run(tmp_path):
    """A run recorded before env.imports / env.wrappers / env.kwargs existed resumes under code that has them empty;
    set to something, or a key that was set and is now gone, they refuse as any change does."""
    before = {"env": {"id": "CartPole-v1"}, "task": {"lr": 0.1}}
    now = OmegaConf.create({"env": {"id": "CartPole-v1", "imports": [], "wrappers": [], "kwargs": {}, "note": None},
                            "task": {"lr": 0.1}})
    refuse_changed_config(now, tmp_path, [RunRecordLike(before)])
    with pytest.raises(RunRefused, match=r"env.imports \(- -> \['my_envs'\]\)"):
        refuse_changed_config(OmegaConf.create({"env": {"id": "CartPole-v1", "imports": ["my_envs"]}, "task": {"lr": 0.1}}),
                              tmp_path, [RunRecordLike(before)])
    with pytest.raises(RunRefused, match=r"env.id \(CartPole-v1 -> -\)"):
        refuse_changed_config(OmegaConf.create({"env": {"imports": []}, "task": {"lr": 0.1}}), tmp_path, [RunRecordLike(before)])
    with pytest.raises(RunRefused, match=r"task.lr \(0.1 -> 0.2\)"):
        refuse_changed_config(OmegaConf.create({"env": {"id": "CartPole-v1", "imports": []}, "task": {"lr": 0.2}}),
                              tmp_path, [RunRecordLike(before)])


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
    save_checkpoint(other, lambda f: f.write(b"weights"))
    plan = plan_start(cfg(ckpt_path=str(other)), tmp_path / "run", [tmp_path / "run"])
    assert plan.ckpt == other and isinstance(plan.ckpt, Path)


def test_a_checkpoint_without_its_digest_is_refused_unless_accepted_knowingly(tmp_path, monkeypatch):
    monkeypatch.delenv("PIPELINE_ACCEPT_UNVERIFIED", raising=False)
    record(tmp_path, "interrupted")
    last = checkpoint(tmp_path)
    (tmp_path / "checkpoints" / "last.ckpt.sha256").unlink()
    with pytest.raises(RunRefused) as err:
        plan_start(cfg(ckpt_path="last"), tmp_path, [tmp_path])
    assert str(err.value) == (
        f"cannot resume {tmp_path}: checkpoint {last} has no digest (last.ckpt.sha256), so it cannot be checked "
        "(written before the pipeline kept digests, or copied without it); to use it knowingly, set "
        "PIPELINE_ACCEPT_UNVERIFIED=1")
    monkeypatch.setenv("PIPELINE_ACCEPT_UNVERIFIED", "1")
    assert plan_start(cfg(ckpt_path="last"), tmp_path, [tmp_path]).ckpt == last


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


@pytest.mark.parametrize("count", ["1", "12"])
def test_a_requeued_slurm_job_continues_its_run(tmp_path, monkeypatch, count):
    monkeypatch.setenv("SLURM_RESTART_COUNT", count)
    record(tmp_path, "failed")
    last = checkpoint(tmp_path)
    assert plan_start(cfg(), tmp_path, [tmp_path]).ckpt == last


@pytest.mark.parametrize("count", ["0", ""])
def test_a_job_that_is_not_requeued_does_not_start_over_a_failed_run_with_a_checkpoint(tmp_path, monkeypatch, count):
    monkeypatch.setenv("SLURM_RESTART_COUNT", count)
    record(tmp_path, "failed")
    checkpoint(tmp_path)
    with pytest.raises(RunRefused, match="holds a run that failed .*ckpt_path=last"):
        plan_start(cfg(), tmp_path, [tmp_path])


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
    preflight(cfg(seeds_per_process=3), tmp_path)  # seed7 has not finished (and left no checkpoint)
    # Two of the three seeds as a run of their own would overwrite finished records of the three-seed run.
    for k, seed in ((2, 5), (2, 6), (1, 5)):
        with pytest.raises(RunRefused, match=r"holds a run with seeds 5-7 together \(seed=5 seeds_per_process=3\) "
                                             r"\(failed/ok\); it is never taken over"):
            preflight(cfg(seeds_per_process=k, seed=seed), tmp_path)


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


# ---------------------------------------------------------------------------------------------------
# A run dir changes hands only to the run it holds


def killed_ppo_batch(run_dir: Path) -> Path:
    """What `experiment=ppo_cartpole seeds_per_process=4` leaves when kill -9 ends it after a checkpoint."""
    for seed in range(4):
        record(run_dir / f"seed{seed}", "running", {**SEMANTIC, "name": "ppo_cartpole"}, experiment="ppo_cartpole",
               choices={"experiment": "ppo_cartpole"})
    return checkpoint(run_dir, step=8192)


def test_a_killed_run_of_another_experiment_is_never_taken_over(tmp_path):
    last = killed_ppo_batch(tmp_path)
    dqn = cfg(name="dqn_cartpole", seed=0)
    with pytest.raises(RunRefused) as err:
        preflight(dqn, tmp_path)
    assert str(err.value) == (
        f"run dir {tmp_path} holds a run of experiment ppo_cartpole (running); it is never taken over: choose a new "
        f"dir for dqn_cartpole (hydra.run.dir=<dir>), or continue that run with: python -m pipeline "
        f"experiment=ppo_cartpole hydra.run.dir={tmp_path} ckpt_path=last"
    )
    assert last.read_bytes() == b"weights"


def test_a_resume_as_another_experiment_names_both(tmp_path):
    killed_ppo_batch(tmp_path)
    for resume in ({"ckpt_path": "last"}, {"resume": True}):
        with pytest.raises(RunRefused) as err:
            preflight(cfg(name="dqn_cartpole", seed=0, **resume), tmp_path)
        assert str(err.value).startswith(
            f"cannot resume {tmp_path} as dqn_cartpole: it holds a run of experiment ppo_cartpole (running); continue "
            "that run with its own command (python -m pipeline experiment=ppo_cartpole ")
        assert "start dqn_cartpole in a new dir (hydra.run.dir=<dir>)" in str(err.value)


def test_the_killed_runs_own_resume_goes_on_and_other_seeds_are_refused(tmp_path):
    last = killed_ppo_batch(tmp_path)
    ppo = cfg(name="ppo_cartpole", seed=0, seeds_per_process=4, ckpt_path="last")
    assert plan_start(ppo, tmp_path, [tmp_path / f"seed{s}" for s in range(4)]).ckpt == last
    with pytest.raises(RunRefused, match=r"cannot resume .* as seeds 0-1: it holds ppo_cartpole with seeds 0-3 together "
                                         r"\(seed=0 seeds_per_process=4\)"):
        preflight(cfg(name="ppo_cartpole", seed=0, seeds_per_process=2, ckpt_path="last"), tmp_path)


@pytest.mark.parametrize("status, said", [("running", "was killed"), ("interrupted", "was interrupted")])
def test_a_fresh_start_over_a_run_that_did_not_finish_is_refused_naming_its_resume(tmp_path, status, said):
    record(tmp_path, status, experiment="dqn_cartpole")
    last = checkpoint(tmp_path, step=300)
    with pytest.raises(RunRefused) as err:
        preflight(cfg(name="dqn_cartpole"), tmp_path)
    assert str(err.value) == (
        f"run dir {tmp_path} holds a run that {said} (its checkpoint holds step 300); continue it with: python -m "
        f"pipeline experiment=dqn_cartpole hydra.run.dir={tmp_path} ckpt_path=last; or start afresh in a new dir "
        "(hydra.run.dir=<dir>)"
    )
    assert last.read_bytes() == b"weights"


def test_the_refusal_repeats_the_resume_command_the_record_keeps(tmp_path):
    command = "python -m pipeline experiment=dqn_cartpole optimizer.lr=0.01 hydra.run.dir=x ckpt_path=last"
    record(tmp_path, "interrupted", experiment="dqn_cartpole", interrupted={"resume": command, "step": 3})
    with pytest.raises(RunRefused, match=f"continue it with: {command}; or start afresh"):
        preflight(cfg(name="dqn_cartpole"), tmp_path)


def test_a_killed_run_without_a_checkpoint_is_refused_too_and_a_failed_one_may_start_again(tmp_path):
    record(tmp_path, "running", experiment="e")
    with pytest.raises(RunRefused, match=r"holds a run that was killed \(no checkpoint yet\)"):
        preflight(cfg(name="e"), tmp_path)
    record(tmp_path, "failed", experiment="e")
    assert plan_start(cfg(name="e"), tmp_path, [tmp_path]).ckpt is None


def test_a_checkpoint_without_a_record_is_not_replaced_by_a_fresh_start(tmp_path):
    checkpoint(tmp_path)
    with pytest.raises(RunRefused, match=r"holds a checkpoint \(.*last.ckpt\) and no run record; continue from it with ckpt_path=last"):
        preflight(cfg(), tmp_path)

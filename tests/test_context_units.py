"""The run's context by hand: the exit status, the resume command word by word, path quoting, a sweep's saved
overrides, the thread cap under a parallel launcher, and JobContext read from a stand-in HydraConfig."""

from __future__ import annotations

import logging

import pytest
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

from pipeline.runtime import context
from pipeline.runtime.context import ExitStatus, JobContext, exit_status, path_override, threads_for_this_job


# ---- ExitStatus ----------------------------------------------------------------------------------------
def test_the_exit_status_starts_at_0_is_set_and_only_rises_with_at_least():
    status = ExitStatus()
    assert status.code == 0
    status.at_least(1)
    assert status.code == 1
    status.at_least("130")  # read as a number
    assert status.code == 130
    status.at_least(2)
    assert status.code == 130  # a milder outcome does not lower it
    status.set("2")
    assert status.code == 2 and isinstance(status.code, int)
    status.set(0)
    assert status.code == 0
    assert isinstance(exit_status, ExitStatus)


# ---- JobContext and its resume command ---------------------------------------------------------------------
def test_a_job_context_s_defaults_are_a_single_run_with_no_overrides():
    ctx = JobContext(run_dir="/r")
    assert (ctx.multirun, ctx.overrides, ctx.choices, ctx.num_threads) == (False, [], {}, None)
    assert (ctx.sweep_dir, ctx.job_num, ctx.isolated, ctx.sweep_overrides) == (None, None, False, [])
    other = JobContext(run_dir="/s")
    other.overrides.append("a=1")
    assert ctx.overrides == [] and ctx.choices == {} and ctx.sweep_overrides == []  # not shared lists


def test_a_single_run_s_resume_command_repeats_its_overrides_but_not_where_or_how_it_resumes():
    ctx = JobContext(
        run_dir="/runs/a",
        overrides=["experiment=dqn", "ckpt_path=/old.ckpt", "resume=true", "hydra.run.dir=/x", "hydra.sweep.dir=/y", "hydra.mode=RUN", "seed=3"],
    )
    assert ctx.resume_command() == "python -m pipeline experiment=dqn seed=3 hydra.run.dir=/runs/a ckpt_path=last"


def test_a_resume_command_without_overrides_has_single_spaces():
    assert JobContext(run_dir="/r").resume_command() == "python -m pipeline hydra.run.dir=/r ckpt_path=last"
    sweep = JobContext(run_dir="/s/0", multirun=True, sweep_dir="/s")
    assert sweep.resume_command() == "python -m pipeline -m hydra.sweep.dir=/s resume=true"


def test_an_override_with_shell_characters_is_quoted_for_the_shell():
    ctx = JobContext(run_dir="/r", overrides=["name=a b", "x=$HOME"])
    assert ctx.resume_command() == "python -m pipeline 'name=a b' 'x=$HOME' hydra.run.dir=/r ckpt_path=last"


def test_a_sweep_job_s_resume_command_finishes_the_sweep_with_the_sweep_s_own_overrides():
    ctx = JobContext(
        run_dir="/s/1_seed=1",
        multirun=True,
        overrides=["seed=1"],
        sweep_dir="/s",
        job_num=1,
        sweep_overrides=["hydra/launcher=joblib", "seed=0,1,2", "hydra.sweep.dir=/elsewhere"],
    )
    assert ctx.resume_command() == "python -m pipeline -m hydra/launcher=joblib seed=0,1,2 hydra.sweep.dir=/s resume=true"


def test_a_sweep_job_without_saved_sweep_overrides_repeats_its_own():
    ctx = JobContext(run_dir="/s/1", multirun=True, overrides=["seed=1"], sweep_dir="/s")
    assert ctx.resume_command() == "python -m pipeline -m seed=1 hydra.sweep.dir=/s resume=true"


def test_a_multirun_job_without_a_sweep_dir_resumes_as_a_single_run():
    ctx = JobContext(run_dir="/s/1", multirun=True, overrides=["seed=1"], sweep_overrides=["seed=0,1"])
    assert ctx.resume_command() == "python -m pipeline seed=0,1 hydra.run.dir=/s/1 ckpt_path=last"


def test_a_single_run_ignores_sweep_overrides():
    ctx = JobContext(run_dir="/r", overrides=["seed=1"], sweep_overrides=["seed=0,1"])
    assert ctx.resume_command() == "python -m pipeline seed=1 hydra.run.dir=/r ckpt_path=last"


# ---- path_override ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path, word",
    [
        ("/a-b_c.d/e+f:g@h%i/9", "k=/a-b_c.d/e+f:g@h%i/9"),  # plain for Hydra and for the shell: unquoted
        ("/~e", "'k=/~e'"),  # plain for Hydra, quoted for the shell only
        ("/s/0_seed=0", "\"k='/s/0_seed=0'\""),  # quoted for Hydra, then in double quotes for the shell
        ("/a b", "\"k='/a b'\""),
        ("/Xa b", "\"k='/Xa b'\""),  # X is an ordinary character for the shell
        ("/s/[1]", "\"k='/s/[1]'\""),
        ("/it's", r"""'k='"'"'/it\'"'"'s'"'"''"""),  # escaped for Hydra with a backslash: single quotes for the shell
        ("/$HOME", "'k='\"'\"'/$HOME'\"'\"''"),  # a `$`: single quotes for the shell
        ("/a\\b", "'k='\"'\"'/a\\\\b'\"'\"''"),  # a backslash, doubled for Hydra
        ("/a!b", "'k='\"'\"'/a!b'\"'\"''"),
        ("/a`b", "'k='\"'\"'/a`b'\"'\"''"),
        ('/a"b', "'k='\"'\"'/a\"b'\"'\"''"),
    ],
)
def test_path_override_quotes_by_hand(path, word):
    assert path_override("k", path) == word


def test_a_plain_path_must_be_plain_from_start_to_end():
    assert path_override("k", "a b/c") == "\"k='a b/c'\""  # a space at the start's side
    assert path_override("k", "/c d") == "\"k='/c d'\""
    assert path_override("k", "") == "\"k=''\""  # an empty path is quoted, not left as `k=`


# ---- _sweep_overrides ------------------------------------------------------------------------------------
def test_a_sweep_s_overrides_are_its_hydra_then_task_overrides_from_multirun_yaml(tmp_path):
    (tmp_path / "multirun.yaml").write_text(
        "hydra:\n  overrides:\n    hydra: [hydra/launcher=joblib, hydra.launcher.n_jobs=2]\n    task: [seed=0,1, lr=1]\n"
    )
    assert context._sweep_overrides(str(tmp_path)) == ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "seed=0", "1", "lr=1"]
    (tmp_path / "multirun.yaml").write_text("hydra:\n  overrides:\n    hydra: []\n    task: ['seed=0,1', 7]\n")
    assert context._sweep_overrides(str(tmp_path)) == ["seed=0,1", "7"]


@pytest.mark.parametrize("text", [None, "a: 1\n", "hydra:\n  overrides: {}\n", "- a list\n", "hydra:\n  overrides:\n    task: [seed=0,"])
def test_no_readable_multirun_yaml_gives_no_sweep_overrides(tmp_path, text):
    if text is not None:
        (tmp_path / "multirun.yaml").write_text(text)
    assert context._sweep_overrides(str(tmp_path)) == []


# ---- threads_for_this_job ---------------------------------------------------------------------------------
def _launcher(n_jobs):
    return OmegaConf.create({"launcher": {"n_jobs": n_jobs}})


@pytest.fixture
def cores(monkeypatch):
    def set_cores(n):
        monkeypatch.setattr(context.os, "cpu_count", lambda: n)

    return set_cores


def test_threads_are_left_as_asked_outside_a_parallel_sweep(cores):
    cores(4)
    assert threads_for_this_job(8, _launcher(4), multirun=False) == 8
    assert threads_for_this_job(8, OmegaConf.create({}), multirun=True) == 8  # no n_jobs: a serial launcher
    assert threads_for_this_job(8, _launcher("4"), multirun=True) == 8  # not an int: not a joblib count
    assert threads_for_this_job(None, _launcher(4), multirun=True) is None


@pytest.mark.parametrize(
    "n_cores, n_jobs, requested, expected",
    [
        (8, 2, 8, 4),  # 2 jobs on 8 cores: 4 threads each
        (8, 2, 3, 3),  # fewer asked than the cap: as asked
        (8, 3, 8, 2),  # 8 // 3
        (8, 16, 4, 1),  # more jobs than cores: still one thread
        (8, -1, 4, 1),  # -1: as many jobs as cores
        (8, -2, 4, 1),  # -2: cores - 1 = 7 jobs
        (8, -7, 8, 4),  # -7: 2 jobs
        (8, -8, 8, 8),  # -8: 1 job
        (8, 0, 8, 8),  # 0 jobs read as 1
        (8, -9, 8, 8),  # below -cores: no parallel jobs, read as 1
        (8, 4, "6", 2),  # a text count is read as a number
    ],
)
def test_threads_are_capped_at_cores_over_parallel_jobs(cores, n_cores, n_jobs, requested, expected):
    cores(n_cores)
    got = threads_for_this_job(requested, _launcher(n_jobs), multirun=True)
    assert got == expected and isinstance(got, int)


def test_an_unknown_core_count_is_one_core(cores):
    cores(None)
    assert threads_for_this_job(4, _launcher(1), multirun=True) == 1


def test_a_lowered_thread_count_is_logged(cores, caplog):
    cores(8)
    with caplog.at_level(logging.INFO, logger="pipeline"):
        threads_for_this_job(8, _launcher(2), multirun=True)
        threads_for_this_job(4, _launcher(2), multirun=True)  # not lowered: nothing said
    assert [r.getMessage() for r in caplog.records] == ["device.num_threads=8 lowered to 4: 2 parallel jobs on 8 cores"]


# ---- JobContext.from_hydra ---------------------------------------------------------------------------------
def _hydra(monkeypatch, **node):
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: OmegaConf.create(node)))


def test_a_single_run_s_context_from_hydra(monkeypatch, cores, tmp_path):
    cores(8)
    # A sweep's saved overrides where hydra.sweep.dir points: a single run does not read them.
    (tmp_path / "multirun.yaml").write_text("hydra:\n  overrides:\n    hydra: []\n    task: ['seed=0,1']\n")
    _hydra(
        monkeypatch,
        mode=RunMode.RUN,
        runtime={"output_dir": "/runs/a", "choices": {"task": "dqn", "hydra/launcher": None, "n": 3}},
        overrides={"task": ["task=dqn", "seed=1"]},
        sweep={"dir": str(tmp_path)},
        job={"num": 5},
        launcher={"n_jobs": 4},
    )
    ctx = JobContext.from_hydra(OmegaConf.create({"device": {"num_threads": 8}}))
    assert ctx == JobContext(
        run_dir="/runs/a",
        multirun=False,
        overrides=["task=dqn", "seed=1"],
        choices={"task": "dqn", "n": "3"},
        num_threads=8,  # a single run is not capped
        sweep_dir=None,
        job_num=None,
        sweep_overrides=[],
    )
    assert type(ctx.overrides) is list


def test_a_sweep_job_s_context_from_hydra(monkeypatch, cores, tmp_path):
    cores(8)
    (tmp_path / "multirun.yaml").write_text("hydra:\n  overrides:\n    hydra: []\n    task: ['seed=0,1']\n")
    _hydra(
        monkeypatch,
        mode=RunMode.MULTIRUN,
        runtime={"output_dir": str(tmp_path / "1"), "choices": {}},
        overrides={"task": ["seed=1"]},
        sweep={"dir": str(tmp_path)},
        job={"num": 1},
        launcher={"n_jobs": 2},
    )
    ctx = JobContext.from_hydra(OmegaConf.create({"device": {"num_threads": 8}}))
    assert ctx == JobContext(
        run_dir=str(tmp_path / "1"),
        multirun=True,
        overrides=["seed=1"],
        choices={},
        num_threads=4,
        sweep_dir=str(tmp_path),
        job_num=1,
        sweep_overrides=["seed=0,1"],
    )


def test_a_sweep_job_without_a_job_number_has_none(monkeypatch, tmp_path):
    _hydra(
        monkeypatch,
        mode=RunMode.MULTIRUN,
        runtime={"output_dir": "/s/0", "choices": {}},
        overrides={"task": []},
        sweep={"dir": str(tmp_path)},
        job={"num": None},
    )
    ctx = JobContext.from_hydra(OmegaConf.create({"device": {"num_threads": None}}))
    assert ctx.job_num is None and ctx.num_threads is None and ctx.sweep_overrides == []
    assert ctx.multirun is True and ctx.sweep_dir == str(tmp_path)

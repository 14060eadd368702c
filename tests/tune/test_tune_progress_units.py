"""What the tuner prints while it searches: "N of M" per trial, the jobs it plans (the sweep's line gets its N/M and
ETA from them), parameters rounded for reading, and no launcher line repeating every override per job."""

from __future__ import annotations

import logging

import pytest

from pipeline.sweep_progress import plan_jobs, read_snapshot, start_sweep
from pipeline.tune.progress import (
    launcher_logger,
    planned_jobs,
    quiet_launches,
    shown,
    trial_scored,
    trial_started,
)


def test_trial_lines_say_n_of_m_and_round_floats_for_reading_only():
    params = {"optimizer.lr": 0.012520653814999465, "model": "dueling", "task.gradient_steps": 32}
    assert shown(params) == "optimizer.lr=0.01252 model=dueling task.gradient_steps=32"
    assert trial_started(7, 3, 20, params, [0, 1, 2, 3, 4]) == (
        "[trial 7, 3 of 20] optimizer.lr=0.01252 model=dueling task.gradient_steps=32 on seeds 0-4")
    assert trial_started(0, 1, 1, {"x": 1.0}, [5]) == "[trial 0, 1 of 1] x=1 on seed 5"
    assert trial_scored(7, {"x": 0.5}, "iqm", 0.91806, 5, []) == "[trial 7] x=0.5 -> iqm=0.9181 over 5 seeds"
    assert trial_scored(2, {}, "iqm", float("-inf"), 3, [1]).endswith("-> iqm=-inf over 3 seeds, failed seeds [1] (worst value)")


@pytest.mark.parametrize(("left", "per_trial", "top", "n", "per_confirm", "jobs"), [
    (20, 1, 3, 20, 1, 20 + 4),      # K seeds in one process: a job per trial, then 3 candidates and the preset
    (20, 5, 3, 20, 10, 100 + 40),   # K jobs per trial, 10 confirmation seeds as 10 jobs per confirmed run
    (2, 1, 3, 2, 1, 2 + 3),         # no more candidates than trials
    (6, 1, 0, 6, 1, 6),             # confirm_top=0: no confirmation
    (-1, 1, 1, 4, 1, 2),            # a shared study already past its count: only the confirmation
])
def test_the_jobs_a_search_plans(left, per_trial, top, n, per_confirm, jobs):
    assert planned_jobs(left, per_trial, top, n, per_confirm) == jobs


def test_a_plan_made_once_the_sweeper_runs_gives_the_sweep_line_its_total(tmp_path):
    start_sweep(tmp_path, None, now=100.0)  # the tuner's count is not known when the sweep starts
    assert read_snapshot(tmp_path, now=101.0).total is None
    plan_jobs(tmp_path, 24)
    snap = read_snapshot(tmp_path, now=101.0)
    assert snap.total == 24 and snap.line().startswith("[0/24 done")
    plan_jobs(tmp_path / "no_sweep_here", 5)  # nothing started there: nothing written
    assert read_snapshot(tmp_path / "no_sweep_here") is None


def test_the_launchers_info_lines_are_off_while_the_tuner_launches_and_back_after(caplog):
    from hydra._internal.core_plugins.basic_launcher import BasicLauncher

    launcher = BasicLauncher()
    logger = launcher_logger(launcher)
    assert logger.name == "hydra._internal.core_plugins.basic_launcher"
    with caplog.at_level(logging.INFO):
        with quiet_launches(launcher):
            logger.info("\t#0 : experiment=x optimizer.lr=0.012520653814999465 trial={storage:'sqlite:///...'}")
            logger.warning("a launcher's warning")
        logger.info("Launching 1 jobs locally")
    assert [r.getMessage() for r in caplog.records] == ["a launcher's warning", "Launching 1 jobs locally"]


def test_a_plugin_launcher_is_quieted_by_its_package_logger():
    class Joblib:
        pass

    Joblib.__module__ = "hydra_plugins.hydra_joblib_launcher.joblib_launcher"  # it logs from the package's _core
    assert launcher_logger(Joblib()).name == "hydra_plugins.hydra_joblib_launcher"

"""Every figure a report draws, at 2, 5 and 12 groups with long names: nothing is cut off at the picture's edge."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from report_runs import write_run

from pipeline.report import build_report
from pipeline_testing import blank_border

# Group names as the report makes them: an experiment and the overrides that set a configuration apart.
NAMES = ["dqn_cartpole", "dqn_cartpole model=dueling", "dqn_cartpole model=dueling task.double_dqn=true task.target_update=soft",
         "dqn_cartpole optimizer.lr=0.001", "dqn_cartpole task.gradient_steps=64 task.train_frequency=32",
         "dqn_cartpole model=noisy", "dqn_cartpole env=cartpole_tensor task.envs_per_agent=16",
         "dqn_cartpole seeding=deterministic", "dqn_cartpole task.buffer_size=100000", "dqn_cartpole model.hidden=[256,256]",
         "dqn_cartpole task.gamma=0.999", "dqn_cartpole task.batch_size=256 optimizer=adamw"]
KINDS = {"learning_curves", "final_scores", "interval_estimates", "time_to_threshold", "performance_profile",
         "probability_of_improvement"}


def write_groups(root, n, rng):
    job = 0
    for g in range(n):
        for seed in range(4):
            stop = int(rng.integers(3, 6)) * 10_000
            top = 500 - 35 * g
            curve = [(s, float(np.clip(top * s / stop + rng.normal(0, 20), 0, 500))) for s in range(0, stop + 1, 10_000)]
            write_run(root / str(job), seed=seed, group=NAMES[g], value=float(np.clip(top + rng.normal(0, 10), 0, 500)),
                      curve=curve, rl={"env_steps": stop, "time_to_threshold_s": None if seed == 3 else 30.0 + seed + g,
                                       "threshold": 475.0},
                      extra={"metric_bounds": {"eval/return_mean": [0, 500]}})
            job += 1


# 2 groups in the fast suite; 5 and 12 (crowded legends and axis labels) on the slow one.
@pytest.mark.parametrize("n", [2, pytest.param(5, marks=pytest.mark.slow), pytest.param(12, marks=pytest.mark.slow)])
def test_no_figure_is_cut_off(tmp_path, n):
    write_groups(tmp_path / "sweep", n, np.random.default_rng(n))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fewer than 5 seeds per group
        report = build_report([tmp_path / "sweep"], tmp_path / "out", reps=30)
    assert {image["kind"] for image in report["images"]} == KINDS
    for image in report["images"]:
        assert blank_border(tmp_path / "out" / image["file"]), f"{image['file']} at {n} groups: something reaches the edge"


def test_the_border_check_sees_a_cut_label(tmp_path):
    """The check itself: a label that runs off the left edge leaves ink on the border."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 3))
    ax = fig.subplots()
    ax.set_yticks([0])
    ax.set_yticklabels(["a group name far too long to fit to the left of these axes"])
    fig.subplots_adjust(left=0.3)
    fig.savefig(tmp_path / "cut.png", dpi=80)
    assert not blank_border(tmp_path / "cut.png")

"""A trial's value over its seeds, from run records on disk (both layouts), checked by hand."""

import json
import math

import pytest

from pipeline.tune.objective import collect, curve_auc, trial_value


def _record(path, seed, value, status="ok", **extra):
    path.mkdir(parents=True, exist_ok=True)
    record = {"seed": seed, "status": status, "primary_metric": "test/acc", "metrics": {"test/acc": value} if value is not None else {},
              "higher_is_better": True, "error": None if status == "ok" else "NaN loss", **extra}
    (path / "result.json").write_text(json.dumps(record))


def test_iqm_over_seeds_in_the_batched_layout(tmp_path):
    for seed, value in zip(range(8), [0.1, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0]):
        _record(tmp_path / f"seed{seed}", seed, value)
    (tmp_path / "batch.json").write_text(json.dumps({"seed": "0-7", "status": "ok"}))  # not a run record
    dist = collect(tmp_path, list(range(8)), "iqm")
    # 8 values: trim 2 from each end -> mean(0.6, 0.7, 0.8, 0.9)
    assert trial_value(dist, "iqm", maximize_=True) == pytest.approx(0.75)
    assert trial_value(dist, "mean", maximize_=True) == pytest.approx(5.55 / 8)
    low = trial_value(dist, "ci_low", maximize_=True)
    assert 0.1 <= low < 0.75


def test_a_failed_or_missing_seed_makes_the_trial_worst(tmp_path):
    _record(tmp_path / "seed0", 0, 0.9)
    _record(tmp_path / "seed1", 1, None, status="failed")
    dist = collect(tmp_path, [0, 1, 2], "iqm")
    assert dist.failed == [1, 2]
    assert dist.errors == {1: "NaN loss", 2: "no run record"}
    assert trial_value(dist, "iqm", maximize_=True) == -math.inf
    assert trial_value(dist, "iqm", maximize_=False) == math.inf


def test_one_seed_per_job_layout_and_pruned_marker(tmp_path):
    _record(tmp_path, 4, 0.5, early_stop={"reason": "pruned by the tuner", "env_step": 7500})
    dist = collect(tmp_path, [4], "iqm")
    assert dist.scores == {4: 0.5}
    assert dist.pruned_at_step == 7500


def test_time_to_threshold_counts_never_as_infinite(tmp_path):
    for seed, t in [(0, 10.0), (1, 20.0), (2, None), (3, 30.0)]:
        _record(tmp_path / f"seed{seed}", seed, 500.0, time_to_threshold_s=t, threshold=475.0)
    dist = collect(tmp_path, [0, 1, 2, 3], "time_to_threshold")
    assert dist.scores[2] == math.inf
    # 4 values trim 1 each end: mean(20, 30)
    assert trial_value(dist, "time_to_threshold", maximize_=False) == pytest.approx(25.0)
    _record(tmp_path / "seed9", 9, 0.9, time_to_threshold_s=None, threshold=None)  # a task with no threshold
    assert collect(tmp_path, [9], "time_to_threshold").errors == {9: "no value for objective time_to_threshold"}


def test_area_under_the_evaluation_curve():
    evals = [{"env_step": 0, "return_mean": 10.0}, {"env_step": 100, "return_mean": 50.0}]
    # 10 over [0, 100), then 50 held until the horizon 400: (10*100 + 50*300) / 400
    assert curve_auc(evals, 400) == pytest.approx(40.0)
    assert curve_auc([], 400) == -math.inf

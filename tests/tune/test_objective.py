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


# ---- the objectives' numbers, pinned by hand (mutation testing found them untested) ------------------------


def _ok(**fields) -> dict:
    return {"status": "ok", "primary_metric": "eval/return_mean", "threshold": 475.0, **fields}


def test_aggregate_mean_iqm_and_the_pessimistic_end_of_the_ci():
    from pipeline.tune.objective import aggregate

    scores = [1.0, 2.0, 3.0, 10.0]
    assert aggregate(scores, "mean", True) == 4.0
    assert aggregate(scores, "iqm", True) == 2.5  # the middle half: 2 and 3
    spread = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 20.0]
    iqm = aggregate(spread, "iqm", True)
    low, high = aggregate(spread, "ci_low", True), aggregate(spread, "ci_low", False)
    assert low < iqm < high  # maximising takes the low end, minimising the high end
    assert aggregate([0.0, 10.0], "ci_low", True) < aggregate([0.0, 10.0], "iqm", True)  # two seeds have a CI
    assert aggregate([3.0], "ci_low", True) == 3.0  # one seed: no interval, its value
    assert aggregate([1.0, math.inf], "ci_low", False) == aggregate([1.0, math.inf], "iqm", False)  # no CI of inf


def test_seed_scores_for_each_objective():
    from pipeline.tune.objective import seed_score

    evals = [{"env_step": 0, "return_mean": 10.0}, {"env_step": 50, "return_mean": 475.0},
             {"env_step": 100, "return_mean": 480.0}]
    rec = _ok(evaluations=evals, time_to_threshold_s=12.5, metrics={"eval/return_mean": 470.0})
    assert seed_score(rec, "iqm") == 470.0
    assert seed_score(rec, "time_to_threshold") == 12.5
    assert seed_score(rec, "steps_to_threshold") == 50.0  # reaching the threshold exactly counts
    assert seed_score(rec, "auc", horizon=200) == (10 * 50 + 475 * 50 + 480 * 100) / 200
    assert seed_score(rec, "auc") == -math.inf  # no horizon: no area
    assert seed_score(_ok(evaluations=evals[:1]), "steps_to_threshold") == math.inf  # never reached
    assert seed_score(_ok(), "auc", horizon=100) is None  # no evaluations
    assert seed_score(_ok(threshold=None, evaluations=evals), "steps_to_threshold") is None
    for bad in (math.nan, math.inf, "470", None):
        assert seed_score(_ok(metrics={"eval/return_mean": bad}), "iqm") is None, bad
    assert seed_score({**rec, "status": "failed"}, "iqm") is None


def test_collect_scores_auc_up_to_the_longest_seed_and_reads_the_direction_and_pruning(tmp_path):
    # Seed 0 stopped at 50 steps holding 500; seed 1 ran to 100: both are scored over [0, 100].
    _record(tmp_path / "seed0", 0, 500.0, higher_is_better=False,
            evaluations=[{"env_step": 0, "return_mean": 100.0}, {"env_step": 50, "return_mean": 500.0}])
    _record(tmp_path / "seed1", 1, 300.0, evaluations=[{"env_step": 0, "return_mean": 100.0}, {"env_step": 100, "return_mean": 300.0}])
    dist = collect(tmp_path, [0, 1], "auc")
    assert dist.seeds == [0, 1]
    assert dist.scores == {0: (100 * 50 + 500 * 50) / 100, 1: 100.0}
    assert dist.higher_is_better is False  # from the first record that has one
    _record(tmp_path / "other" / "seed2", 2, 0.5, early_stop={"reason": "pruned by the tuner", "epoch": 3})
    pruned = collect(tmp_path / "other", [2], "iqm")
    assert pruned.pruned_at_step == 3  # supervised: pruned at an epoch
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "result.json").write_text(json.dumps({"seed": 5, "status": "ok", "primary_metric": "m", "metrics": {"m": 1.0}}))
    assert collect(tmp_path / "plain", [5], "iqm").higher_is_better is True  # a record without the key: higher is better


def test_which_way_each_objective_points():
    from pipeline.tune.objective import maximize

    for higher in (True, False):
        assert maximize("time_to_threshold", higher) is False and maximize("steps_to_threshold", higher) is False
        assert maximize("auc", higher) is True
        assert maximize("iqm", higher) is higher and maximize("ci_low", higher) is higher

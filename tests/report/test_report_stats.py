"""Statistics checked against numbers computed by hand and against rliable itself."""

from __future__ import annotations

import numpy as np
import pytest
from rliable import metrics

from pipeline.report import stats


def test_iqm_of_one_to_eight_is_mean_of_middle_half():
    values = [1, 2, 3, 4, 5, 6, 7, 8]
    # 8 values: drop the 2 lowest and the 2 highest, average the middle four.
    assert stats.iqm(values) == pytest.approx((3 + 4 + 5 + 6) / 4)
    assert stats.iqm([8, 1, 7, 2, 6, 3, 5, 4]) == pytest.approx(4.5)


def test_iqm_trims_an_outlier_seed():
    # 4 values: trim one from each end -> mean of 2 and 3, the 1000 has no effect.
    assert stats.iqm([1, 2, 3, 1000]) == pytest.approx(2.5)


@pytest.mark.parametrize("values", [[7.0], [1.0, 3.0], [1.0, 2.0, 9.0]])
def test_tiny_groups_do_not_crash_and_say_so(values):
    estimates = stats.interval_estimates(values, reps=500)
    # Fewer than 4 values: nothing is trimmed, so IQM == mean.
    assert estimates["iqm"] == pytest.approx(sum(values) / len(values))
    low, high = estimates["iqm_ci"]
    assert min(values) <= low <= estimates["iqm"] <= high <= max(values)
    assert estimates["ci_note"]
    if len(values) == 1:
        assert low == high == values[0]


def test_fast_statistics_match_rliable():
    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 5, 8, 13, 40):
        scores = rng.normal(size=(n, 1))
        assert stats.fast_iqm(scores) == pytest.approx(float(metrics.aggregate_iqm(scores)), rel=1e-12, abs=1e-12)
    for nx, ny in ((1, 1), (3, 7), (10, 10)):
        x = np.round(rng.normal(size=(nx, 1)), 1)  # rounding makes ties
        y = np.round(rng.normal(size=(ny, 1)), 1)
        assert stats.fast_probability_of_improvement(x, y) == pytest.approx(
            float(metrics.probability_of_improvement(x, y))
        )
    same = rng.normal(size=(5, 1))
    assert stats.fast_probability_of_improvement(same, same) == 0.5


def test_bootstrap_ci_contains_point_and_narrows_with_more_seeds():
    rng = np.random.default_rng(123)
    few, many = rng.normal(10.0, 2.0, size=5), rng.normal(10.0, 2.0, size=50)
    narrow, wide = stats.interval_estimates(many), stats.interval_estimates(few)
    for estimates in (narrow, wide):
        for key in ("iqm", "mean"):
            low, high = estimates[f"{key}_ci"]
            assert low <= estimates[key] <= high
    width = {name: e["iqm_ci"][1] - e["iqm_ci"][0] for name, e in (("few", wide), ("many", narrow))}
    assert width["many"] < width["few"]
    assert narrow["mean_ci"][1] - narrow["mean_ci"][0] < wide["mean_ci"][1] - wide["mean_ci"][0]


def test_bootstrap_is_deterministic_and_leaves_global_rng_alone():
    values = np.random.default_rng(1).normal(size=12)
    np.random.seed(5)
    expected_next = np.random.rand()
    np.random.seed(5)
    first = stats.interval_estimates(values, reps=300, seed=3)
    assert np.random.rand() == expected_next
    assert stats.interval_estimates(values, reps=300, seed=3) == first
    assert stats.interval_estimates(values, reps=300, seed=4)["iqm_ci"] != first["iqm_ci"]


def test_probability_of_improvement_separated_identical_and_same_distribution():
    rng = np.random.default_rng(0)
    better, worse = rng.normal(10.0, 1.0, size=10), rng.normal(0.0, 1.0, size=10)
    separated = stats.probability_of_improvement(better, worse, reps=1000)
    assert separated["p"] > 0.95
    assert separated["ci"][0] > 0.9

    identical = stats.probability_of_improvement(worse, worse, reps=1000)
    assert identical["p"] == 0.5

    a, b = rng.normal(size=40), rng.normal(size=40)
    same_distribution = stats.probability_of_improvement(a, b, reps=1000)
    assert 0.35 < same_distribution["p"] < 0.65
    assert same_distribution["ci"][0] < 0.5 < same_distribution["ci"][1]


def test_reverse_pair_is_the_complement_on_every_resample():
    from rliable import library

    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(6, 1)), rng.normal(0.5, size=(9, 1))
    forward = stats.probability_of_improvement(x, y, reps=300, seed=9)

    # Both directions on the same resamples, with rliable's own (slow) metric.
    def both_ways(a, b):
        return np.array([metrics.probability_of_improvement(a, b), metrics.probability_of_improvement(b, a)])

    with stats.seeded_global_numpy(9):
        points, intervals = library.get_interval_estimates({"pair": [x, y]}, both_ways, reps=300)
    assert forward["p"] == pytest.approx(points["pair"][0])
    assert forward["ci"] == pytest.approx(list(intervals["pair"][:, 0]))
    backward = stats.reverse(forward)
    assert backward["p"] == pytest.approx(points["pair"][1])
    assert backward["ci"] == pytest.approx(list(intervals["pair"][:, 1]))


def test_performance_profile_fractions():
    taus = np.array([0.0, 2.5, 10.0])
    profile = stats.performance_profile({"a": [1.0, 2.0, 3.0, 4.0]}, taus, reps=200)
    # Seeds above 0, 2.5 and 10: 4/4, 2/4, 0/4.
    assert profile["profiles"]["a"] == [1.0, 0.5, 0.0]
    lower = stats.performance_profile({"a": [1.0, 2.0, 3.0, 4.0]}, taus, higher_is_better=False, reps=200)
    assert lower["profiles"]["a"] == [0.0, 0.5, 1.0]


def test_describe_uses_sample_std():
    described = stats.describe([2.0, 4.0, 9.0])
    assert described["mean"] == pytest.approx(5.0)
    assert described["std"] == pytest.approx(((9 + 1 + 16) / 2) ** 0.5)
    assert described["median"] == 4.0
    assert stats.describe([3.0])["std"] == 0.0


def test_rliable_says_nothing_on_the_log(caplog):
    """rliable logs "Calculating estimates for ..." through absl at INFO; under Hydra (root at INFO) every
    bootstrap printed it as a [HYDRA] line. Nothing of it reaches the log, and absl's own level is left as it was."""
    import logging

    caplog.set_level(logging.INFO)
    before = logging.getLogger("absl").level
    stats.interval_estimates([1.0, 2.0, 3.0, 4.0], reps=20)
    stats.probability_of_improvement([1.0, 2.0], [0.5, 1.5], reps=20)
    stats.performance_profile({"a": [1.0, 2.0], "b": [0.0, 3.0]}, np.linspace(0, 3, 5), reps=20)
    assert [r.getMessage() for r in caplog.records if "Calculating estimates" in r.getMessage()] == []
    assert logging.getLogger("absl").level == before

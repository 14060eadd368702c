"""IQM and its bootstrap interval on generated score lists: invariances, rliable's own interval, a known answer."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rliable import library, metrics

from pipeline.report import stats

# Scores of a realistic size: returns and accuracies, not 1e300 (whose sums overflow for any IQM).
finite = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False)
scores = st.lists(finite, min_size=1, max_size=40)


def _close(a: float, b: float, scale: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, scale)


@given(values=scores, data=st.data())
def test_iqm_ignores_the_order_of_the_seeds(values, data):
    shuffled = data.draw(st.permutations(values))
    assert _close(stats.iqm(shuffled), stats.iqm(values), max(map(abs, values)))
    assert _close(stats.fast_iqm(np.array(shuffled)), stats.iqm(values), max(map(abs, values)))


@given(values=scores, shift=finite)
def test_iqm_moves_with_a_constant(values, shift):
    moved = [v + shift for v in values]
    scale = max(map(abs, values)) + abs(shift)
    assert _close(stats.iqm(moved), stats.iqm(values) + shift, scale)


@given(values=scores, factor=st.floats(1e-3, 1e3))
def test_iqm_scales_with_a_positive_factor(values, factor):
    scaled = [v * factor for v in values]
    assert _close(stats.iqm(scaled), stats.iqm(values) * factor, max(map(abs, scaled)))


@given(values=scores)
def test_iqm_lies_between_the_quartiles_and_matches_rliable(values):
    array = np.array(values)
    value = stats.iqm(values)
    assert value == pytest.approx(float(metrics.aggregate_iqm(array.reshape(-1, 1))), rel=1e-12, abs=1e-9)
    # The trimmed mean is a mean of the middle sorted values: between them, whatever the outliers.
    ordered = np.sort(array)
    cut = len(values) // 4
    middle = ordered[cut : len(values) - cut]
    assert middle.min() - 1e-9 <= value <= middle.max() + 1e-9


@given(values=st.lists(finite, min_size=2, max_size=25), shift=finite, factor=st.floats(0.01, 100.0))
def test_interval_is_equivariant_on_the_same_draws(values, shift, factor):
    # Same seed, same resampling indices: shifting or scaling the scores moves the interval exactly so.
    base = stats.interval_estimates(values, reps=200, seed=11)
    moved = stats.interval_estimates([factor * v + shift for v in values], reps=200, seed=11)
    scale = factor * max(map(abs, values)) + abs(shift)
    for key in ("iqm", "mean"):
        for got, want in zip(moved[f"{key}_ci"], base[f"{key}_ci"]):
            assert _close(got, factor * want + shift, scale)


@given(values=st.lists(finite, min_size=1, max_size=25), seed=st.integers(0, 2**31 - 1))
def test_interval_equals_rliables_on_the_same_draws(values, seed):
    """The report's IQM and mean intervals are what rliable gives with its own aggregate functions."""
    scores = np.array(values).reshape(-1, 1)
    ours = stats.interval_estimates(values, reps=100, seed=seed)

    def reference(s: np.ndarray) -> np.ndarray:
        return np.array([metrics.aggregate_iqm(s), metrics.aggregate_mean(s)])

    with stats.seeded_global_numpy(seed):
        points, intervals = library.get_interval_estimates({"g": scores}, reference, reps=100)
    scale = max(map(abs, values))
    assert _close(ours["iqm"], points["g"][0], scale) and _close(ours["mean"], points["g"][1], scale)
    (iqm_low, mean_low), (iqm_high, mean_high) = intervals["g"]
    assert _close(ours["iqm_ci"][0], iqm_low, scale) and _close(ours["iqm_ci"][1], iqm_high, scale)
    assert _close(ours["mean_ci"][0], mean_low, scale) and _close(ours["mean_ci"][1], mean_high, scale)


def test_iqm_interval_ignores_a_lone_outlier_that_drags_the_mean():
    """A known answer. 19 seeds score 1..19 and one scores 1e6. A resample's IQM averages its middle
    10 of 20 values, so it only sees the outlier when the outlier is drawn 6+ times (probability
    3e-4): the IQM interval stays inside [1, 19]. The mean's interval reaches 1e6 / 20 = 5e4 as soon as
    a resample holds the outlier once (probability 0.64), so a CI computed from the mean fails here."""
    values = [float(v) for v in range(1, 20)] + [1e6]
    estimates = stats.interval_estimates(values, reps=2000, seed=0)
    low, high = estimates["iqm_ci"]
    assert 1.0 <= low <= estimates["iqm"] <= high <= 19.0
    assert estimates["iqm"] == pytest.approx(np.mean(range(6, 16)))
    assert estimates["mean_ci"][1] >= 5e4


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
def test_ci_note_speaks_for_small_groups_only(n):
    note = stats.ci_note(n)
    if n == 1:
        assert "collapses" in note
    elif n < 4:
        assert f"{n} seeds" in note and "IQM equals the mean" in note
    else:
        assert note is None


def test_empty_lists_are_refused_with_a_reason():
    with pytest.raises(ValueError, match="empty"):
        stats.iqm([])
    with pytest.raises(ValueError, match="empty"):
        stats.interval_estimates([])
    with pytest.raises(ValueError, match="at least one score"):
        stats.probability_of_improvement([], [1.0])

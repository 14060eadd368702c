"""report/curves.py by hand: the step grid, the per-step IQM, the bootstrap band and a group's curve.

The runs here are stand-ins with the few things group_curve reads from a ReportedRun (its curve, its final
value, its env steps and bounds), so every number below is worked out on paper, without a report on disk.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.report.curves import align_held, final_on_curve, group_curve, iqm_curve, nan_iqm


class Run:
    def __init__(self, steps=None, ys=None, *, final=None, curve="r", metric="r", x="step", env_steps=None,
                 bounds=(None, None)):
        self._curve = None if steps is None else (x, np.asarray(steps, dtype=float), np.asarray(ys, dtype=float))
        self.primary_curve, self.primary_metric, self.primary_value = curve, metric, final
        self.counts_env_steps = env_steps is not None
        self._floats = {"env_steps": env_steps}
        self._bounds = {curve: bounds}

    def load_curve(self):
        return self._curve

    def get_float(self, key):
        return self._floats.get(key)

    def metric_bounds(self, metric):
        return self._bounds.get(metric, (None, None))


def test_nan_iqm_trims_a_quarter_of_the_finite_seeds_each_end():
    # 5 seeds: 5 // 4 = 1 trimmed each end -> mean(2, 3, 4).
    assert nan_iqm(np.array([[100.0], [1.0], [3.0], [2.0], [4.0]]))[0] == 3.0
    # 6 finite of 7 (one not started): 1 trimmed each end of 1, 2, 3, 4, 50, 60 -> mean(2, 3, 4, 50).
    assert nan_iqm(np.array([[1.0], [np.nan], [2.0], [3.0], [4.0], [50.0], [60.0]]))[0] == 14.75
    # 4 seeds: 1 trimmed each end -> mean(2, 3).
    assert nan_iqm(np.array([[100.0], [1.0], [3.0], [2.0]]))[0] == 2.5
    # 3 seeds: nothing trimmed; 2 seeds: their mean; 1 seed: itself; none: NaN.
    got = nan_iqm(np.array([[1.0, 1.0, np.nan, np.nan], [2.0, 3.0, 7.0, np.nan], [6.0, np.nan, np.nan, np.nan]]))
    assert got[:3].tolist() == [3.0, 2.0, 7.0] and math.isnan(got[3])


def test_align_held_interpolates_holds_finals_and_leaves_the_start_empty():
    grid, values, live = align_held(
        [(np.array([0.0, 10.0]), np.array([0.0, 10.0])), (np.array([5.0, 10.0]), np.array([4.0, 6.0])),
         (np.array([0.0, 5.0]), np.array([1.0, 2.0]))],
        finals=[None, None, 9.0],
    )
    assert grid.tolist() == [0.0, 5.0, 10.0]
    assert values[0].tolist() == [0.0, 5.0, 10.0]
    assert math.isnan(values[1][0]) and values[1][1:].tolist() == [4.0, 6.0]  # starts at its first step
    assert values[2].tolist() == [1.0, 2.0, 9.0]  # stopped at 5: holds its final 9, not its last 2
    assert live.tolist() == [[True, True, True], [False, True, True], [True, True, False]] and live.dtype == bool
    # Without finals a stopped seed holds its last value.
    _, held, _ = align_held([(np.array([0.0, 10.0]), np.array([0.0, 10.0])), (np.array([0.0, 5.0]), np.array([1.0, 2.0]))])
    assert held[1].tolist() == [1.0, 2.0, 2.0]


def test_align_held_keeps_up_to_200_distinct_steps_and_evens_out_more():
    squares = np.arange(200.0) ** 2  # irregular steps: an even grid would not hit them
    grid, values, _ = align_held([(squares, squares)])
    assert grid.tolist() == squares.tolist() and values[0].tolist() == squares.tolist()
    steps = np.arange(201.0) ** 2
    grid, values, _ = align_held([(steps, steps)])
    assert grid.size == 200 and grid[0] == 0.0 and grid[-1] == 200.0**2
    assert grid[1] == pytest.approx(40000 / 199)


def test_iqm_curve_band_of_two_seeds_spans_them_and_one_seed_has_no_band():
    # Two seeds: a resample is (a, a), (a, b) or (b, b), each end with chance 1/4 > 2.5%: the band is [min, max].
    values = np.array([[0.0, 2.0, 8.0], [1.0, 4.0, 3.0]])
    iqm, low, high = iqm_curve(values, reps=500)
    assert iqm.tolist() == [0.5, 3.0, 5.5]
    assert low.tolist() == [0.0, 2.0, 3.0] and high.tolist() == [1.0, 4.0, 8.0]
    # Two seeds at one step: still a band.
    iqm, low, high = iqm_curve(np.array([[0.0], [1.0]]), reps=500)
    assert (iqm.tolist(), low.tolist(), high.tolist()) == ([0.5], [0.0], [1.0])
    one = np.array([[3.0, 5.0]])
    iqm, low, high = iqm_curve(one)
    assert iqm.tolist() == low.tolist() == high.tolist() == [3.0, 5.0]
    low[0] = -1.0
    assert iqm[0] == 3.0 and high[0] == 3.0  # three separate arrays


def test_iqm_curve_band_at_a_step_some_seeds_have_not_reached_is_over_the_seeds_that_have():
    # Seeds 1 and 3 start late (NaN before their first step): at steps 0-1 only seeds 0 and 2 have values, at
    # step 2 only seed 0 (a point, no band), at step 3 all four. A resample of only missing seeds once made the
    # band NaN wherever a seed was missing.
    nan = np.nan
    values = np.array([
        [2.0, 6.0, 9.0, 1.0],
        [nan, nan, nan, 2.0],
        [4.0, 10.0, nan, 3.0],
        [nan, nan, nan, 4.0],
    ])
    iqm, low, high = iqm_curve(values, reps=2000, seed=7)
    assert iqm.tolist() == [3.0, 8.0, 9.0, 2.5]
    # Two seeds: the band is [min, max] of their values (see the test above).
    assert low[:2].tolist() == [2.0, 6.0] and high[:2].tolist() == [4.0, 10.0]
    assert low[2] == high[2] == 9.0
    # Four seeds: the band of those four values alone, as rliable's own IQM and bootstrap give it (numpy seeded 7).
    from rliable import library, metrics

    np.random.seed(7)
    _, expected = library.get_interval_estimates({"g": values[:, None, 3:4]}, lambda s: np.array([metrics.aggregate_iqm(s[:, 0, 0])]), reps=2000)
    assert (low[3], high[3]) == pytest.approx(tuple(np.asarray(expected["g"])[:, 0]), abs=1e-12)
    assert np.isfinite(low).all() and np.isfinite(high).all()
    # A step no seed has reached is NaN throughout.
    iqm, low, high = iqm_curve(np.array([[nan, 1.0], [nan, 2.0]]), reps=500)
    assert np.isnan([iqm[0], low[0], high[0]]).all() and (low[1], high[1]) == (1.0, 2.0)


def test_iqm_curve_is_seeded_and_its_band_is_95_percent():
    rng = np.random.default_rng(1)
    values = rng.normal(size=(12, 3))
    state = np.random.get_state()
    a = iqm_curve(values, reps=200, seed=3)
    assert all(np.array_equal(x, y) for x, y in zip(a, iqm_curve(values, reps=200, seed=3)))
    assert not np.array_equal(a[1], iqm_curve(values, reps=200, seed=4)[1])
    assert not np.array_equal(a[1], iqm_curve(values, reps=201, seed=3)[1])
    assert np.array_equal(np.random.get_state()[1], state[1])  # the caller's RNG untouched
    # Default: 2000 reps, seed 0.
    assert all(np.array_equal(x, y) for x, y in zip(iqm_curve(values), iqm_curve(values, reps=2000, seed=0)))
    # A 95% band is wider than a 50% one would be and narrower than the resamples' full range.
    _, low, high = a
    assert np.all(low < a[0]) and np.all(a[0] < high)


def test_final_on_curve_only_when_the_curve_is_the_tables_metric():
    assert final_on_curve(Run([0], [1], final=5.0, curve="r", metric="r")) == 5.0
    assert final_on_curve(Run([0], [1], final=5.0, curve="val/acc", metric="test/acc")) is None
    assert final_on_curve(Run([0], [1], final=5.0, curve=None, metric="r")) is None


def test_group_curve_of_rl_seeds_ends_at_the_table_and_clips_to_the_bounds():
    a = Run([0, 10, 20], [0, 4, 8], final=9.0, x="env_step", env_steps=30, bounds=(0.6, 6.8))
    b = Run([0, 10, 20, 30, 40], [1, 2, 3, 4, 5], final=6.0, x="env_step", env_steps=40, bounds=(0.7, 6.9))
    c = Run(final=7.0, env_steps=50)  # no curve: still one of the finals the table averages
    summary, seeds = group_curve([a, c, b], reps=300, seed=2)
    # a's final evaluation ran at its last env step 30, after its last curve point at 20.
    assert [s.tolist() for s, _, _ in seeds] == [[0, 10, 20, 30], [0, 10, 20, 30, 40]]
    assert [y.tolist() for _, y, _ in seeds] == [[0, 4, 8, 9], [1, 2, 3, 4, 5]] and [f for _, _, f in seeds] == [9.0, 6.0]
    assert summary["metric"] == "r" and summary["x"] == "env steps" and summary["bounds"] == [0.6, 6.9]
    assert summary["steps"].tolist() == [0, 10, 20, 30, 40, 40] and summary["last_point"] == "final"
    # a holds its final 9 at 40. Two seeds: IQM = mean, band = [min, max]; then clipped to [0.6, 6.9].
    # The final point: 9, 6, 7 -> IQM 22/3 clipped to 6.9; all three resampled 6 (chance 1/27 > 2.5%): low 6.
    assert summary["iqm"].tolist() == [0.6, 3.0, 5.5, 6.5, 6.9, 6.9]
    assert summary["ci_low"].tolist() == [0.6, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert summary["ci_high"].tolist() == [1.0, 4.0, 6.9, 6.9, 6.9, 6.9]
    assert summary["n_seeds"].tolist() == [2, 2, 2, 2, 2, 3] and summary["n_live"].tolist() == [2, 2, 2, 2, 1, 0]
    assert summary["n_live"].dtype.kind == summary["n_seeds"].dtype.kind == "i"  # counts, written as integers
    assert summary["held_from"] == [30.0, None]


def test_group_curve_final_point_is_rliables_seeded_bootstrap_of_the_finals():
    finals = [3.0, 7.5, 1.0, 9.0, 4.0, 6.5, 2.0, 8.0, 5.5]
    runs = [Run([0, 10], [0.0, 1.0], final=f, x="env_step", env_steps=10) for f in finals]
    summary, _ = group_curve(runs, reps=200, seed=5)
    from rliable import library, metrics

    np.random.seed(5)
    _, expected = library.get_interval_estimates(
        {"g": np.array(finals)[:, None]}, lambda x: np.array([metrics.aggregate_iqm(x)]), reps=200
    )
    assert summary["iqm"][-1] == pytest.approx(5.3)  # the middle five of nine: (3 + 4 + 5.5 + 6.5 + 7.5) / 5
    assert (summary["ci_low"][-1], summary["ci_high"][-1]) == pytest.approx(tuple(np.asarray(expected["g"]).ravel()), abs=1e-12)


def test_group_curve_of_supervised_seeds_holds_the_last_values():
    a = Run([1, 2, 3], [0.1, 0.2, 0.3], final=0.9, curve="val/acc", metric="test/acc")
    b = Run([1, 2], [0.5, 0.6], final=0.8, curve="val/acc", metric="test/acc", bounds=(0.0, 1.0))
    summary, seeds = group_curve([a, b], reps=100)
    assert summary["metric"] == "val/acc" and summary["x"] == "training step" and summary["last_point"] == "held"
    assert summary["bounds"] == [0.0, 1.0]
    assert summary["steps"].tolist() == [1, 2, 3]
    assert summary["iqm"].tolist() == pytest.approx([0.3, 0.4, 0.45], abs=1e-15)
    assert summary["n_seeds"].tolist() == [2, 2, 2] and summary["n_live"].tolist() == [2, 2, 1]
    assert summary["held_from"] == [None, 2.0] and [f for _, _, f in seeds] == [None, None]
    # Only a lower bound, or only an upper one: the other side stays open.
    low_only = group_curve([Run([0, 1], [-5.0, 3.0], bounds=(0.0, None))], reps=10)[0]
    assert low_only["bounds"] == [0.0, None] and low_only["iqm"].tolist() == [0.0, 3.0]
    high_only = group_curve([Run([0, 1], [-5.0, 3.0], bounds=(None, 1.0))], reps=10)[0]
    assert high_only["bounds"] == [None, 1.0] and high_only["iqm"].tolist() == [-5.0, 1.0]
    assert group_curve([Run([0, 1], [-5.0, 3.0])], reps=10)[0]["bounds"] is None


def test_group_curve_holds_a_final_only_where_there_is_one_and_names_its_x_axis():
    # a's final is on its curve, b's run has none: no final point, but a still holds its final after it stops.
    a = Run([0, 10], [1.0, 2.0], final=5.0)
    b = Run([0, 10, 20], [1.0, 3.0, 5.0], final=None)
    summary, _ = group_curve([a, b], reps=50)
    assert summary["last_point"] == "held" and summary["steps"].tolist() == [0, 10, 20]
    assert summary["iqm"].tolist() == [1.0, 2.5, 5.0]
    # The final evaluation is appended only for env-step curves that stopped after their last point.
    stepped = Run([0, 10], [1.0, 2.0], final=5.0, x="step", env_steps=30)
    assert group_curve([stepped], reps=10)[1][0][0].tolist() == [0, 10]
    env = Run([0, 10], [1.0, 2.0], final=None, x="env_step", env_steps=30)
    assert group_curve([env], reps=10)[1][0][0].tolist() == [0, 10]
    rows = group_curve([Run([0, 1], [1.0, 2.0], x="row"), Run([0, 1], [1.0, 2.0], x="row")], reps=10)[0]
    assert rows["x"] == "logged row"
    mixed = group_curve([Run([0, 1], [1.0, 2.0], x="row"), Run([0, 1], [1.0, 2.0], x="step")], reps=10)[0]
    assert mixed["x"] == "training step"
    some_env = group_curve([Run([0, 1], [1.0, 2.0], x="env_step", env_steps=1), Run([0, 1], [1.0, 2.0])], reps=10)[0]
    assert some_env["x"] == "training step"
    assert group_curve([Run(final=1.0), Run(final=2.0)]) is None


def test_group_curve_passes_its_reps_and_seed_to_both_bootstraps():
    rng = np.random.default_rng(5)
    runs = [Run([0, 1, 2], rng.normal(size=3), final=float(rng.normal())) for _ in range(6)]
    by_default, _ = group_curve(runs)
    chosen, _ = group_curve(runs, reps=150, seed=9)
    again, _ = group_curve(runs, reps=150, seed=9)
    assert np.array_equal(chosen["ci_low"], again["ci_low"])
    # The curve's band (first 3 points) and the final point's (the table's) both move with reps and seed.
    for other in (by_default, group_curve(runs, reps=150, seed=10)[0], group_curve(runs, reps=151, seed=9)[0]):
        band = np.concatenate([chosen["ci_low"] != other["ci_low"], chosen["ci_high"] != other["ci_high"]])
        assert band[[0, 1, 2, 4, 5, 6]].any() and band[[3, 7]].any()

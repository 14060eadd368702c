"""IQM and its bootstrap interval on generated score lists (invariances, rliable's own interval, a known
answer), then the group statistics the report is built from, against numbers worked out by hand."""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rliable import library, metrics

from pipeline.report import stats
from pipeline.report.collect import ReportedRun
from pipeline.report.summary import summarize

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
    assert estimates["iqm"] == pytest.approx(10.5)  # mean of 6..15, by hand
    # The interval brackets 10.5 and stays among the ordinary seeds' scores, 1-19 ...
    assert low > 1.0 and high < 19.0 and low < 10.5 < high
    # ... while the mean's reaches the outlier's share, 1e6 / 20.
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


# ---- Known answers for the parts the report builds on: exact values, keys and messages. ----

def test_messages_are_exact():
    for call, message in (
        (lambda: stats.iqm([]), "IQM of an empty list is undefined"),
        (lambda: stats.interval_estimates([]), "interval estimates of an empty list are undefined"),
        (lambda: stats.probability_of_improvement([1.0], []), "probability of improvement needs at least one score on each side"),
    ):
        with pytest.raises(ValueError) as error:
            call()
        assert str(error.value) == message
    assert stats.ci_note(1) == (
        "1 seed: every bootstrap resample is that seed, so the CI collapses to the point; it says nothing"
    )
    assert stats.ci_note(3) == (
        "3 seeds: nothing is trimmed, so the IQM equals the mean, and the bootstrap CI only mixes 3 values; "
        "treat it as indicative"
    )


def test_integer_scores_are_averaged_as_floats():
    # int64 sums of these overflow; the statistics must convert to float first.
    big = [2**62, 2**62, 2**62, 2**62, 2**62]
    assert stats.fast_iqm(np.array(big)) == pytest.approx(2.0**62)
    assert stats.iqm(big) == pytest.approx(2.0**62)
    estimates = stats.interval_estimates(big, reps=20)
    assert estimates["iqm_ci"] == pytest.approx([2.0**62, 2.0**62]) and estimates["mean_ci"] == pytest.approx([2.0**62] * 2)
    assert stats.describe(big)["mean"] == pytest.approx(2.0**62) and stats.describe(big)["min"] == pytest.approx(2.0**62)
    assert stats.describe(["1.5", "2.5"])["mean"] == 2.0  # numbers read from text
    assert stats.probability_of_improvement([2**62, 2**62], [1.0], reps=20) == {"p": 1.0, "ci": [1.0, 1.0]}


def test_probability_of_improvement_on_several_tasks_is_rliables():
    x = np.array([[1.0, 5.0], [2.0, 6.0], [3.0, 7.0]])
    y = np.array([[2.0, 0.0], [2.0, 9.0]])
    assert stats.fast_probability_of_improvement(x, y) == pytest.approx(float(metrics.probability_of_improvement(x, y)))
    # Against a single score on one side (one pair per task): 3 > 2 wins, 2 = 2 ties, 1 loses.
    assert stats.probability_of_improvement([1.0, 2.0, 3.0], [2.0], reps=20)["p"] == pytest.approx(0.5)


def test_describe_known_values_and_empty():
    assert stats.describe([1.0, 3.0]) == {"mean": 2.0, "std": pytest.approx(2**0.5), "median": 2.0, "min": 1.0, "max": 3.0}
    assert stats.describe([]) == {"mean": None, "std": None, "median": None, "min": None, "max": None}


def test_performance_profile_counts_ties_as_not_better_and_matches_rliable():
    taus = np.array([1.0, 2.0, 4.0])
    values = [1.0, 2.0, 3.0, 4.0]
    up = stats.performance_profile({"a": values}, taus, reps=50, seed=3)
    down = stats.performance_profile({"a": values}, taus, higher_is_better=False, reps=50, seed=3)
    # Strictly better than tau: a seed equal to tau does not count, in either direction.
    assert up["profiles"] == {"a": [0.75, 0.5, 0.0]} and up["direction"] == "score > tau"
    assert down["profiles"] == {"a": [0.0, 0.25, 0.75]} and down["direction"] == "score < tau"
    assert up["taus"] == [1.0, 2.0, 4.0] and set(up) == {"taus", "direction", "profiles", "ci_low", "ci_high"}
    # The bands are rliable's, on the same draws.
    with stats.seeded_global_numpy(3):
        _, cis = library.create_performance_profile({"a": np.array(values).reshape(-1, 1)}, taus, reps=50)
    assert up["ci_low"]["a"] == pytest.approx(list(cis["a"][0])) and up["ci_high"]["a"] == pytest.approx(list(cis["a"][1]))
    assert stats.performance_profile({"a": values}, taus, reps=50, seed=3) == up


def test_profile_thresholds_span_all_scores_and_pad_a_constant():
    assert stats.profile_thresholds([[3.0, 1.0], [2.0, 5.0]], points=5).tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert stats.profile_thresholds([[100.0], [100.0]], points=3).tolist() == [95.0, 100.0, 105.0]
    assert stats.profile_thresholds([[0.0]], points=3).tolist() == [-1.0, 0.0, 1.0]
    assert len(stats.profile_thresholds([[0.0, 1.0]])) == stats.PROFILE_POINTS == 101


ROOT = Path("/sweep")


def _run(name: str, seed, value=None, status="ok", metric="test/acc", group="a", **result) -> ReportedRun:
    metrics_ = {} if value is None else {metric: value}
    return ReportedRun(
        dir=ROOT / name, input_root=ROOT,
        result={"group": group, "experiment": f"exp_{group}", "task": "supervised", "seed": seed, "status": status,
                "primary_metric": metric, "metrics": metrics_, **result},
    )


def test_group_stats_of_a_mixed_group_by_hand():
    runs = [
        _run("a/2", 2, 0.5, wall_time_s=10.0),
        _run("a/1b", 1, 0.9, wall_time_s=40.0),
        _run("a/0", 0, 0.7, wall_time_s=20.0, primary_curve="val/acc"),
        _run("a/1a", 1, 0.6, wall_time_s=30.0),
        _run("a/3", 3, status="failed", error="boom"),
        _run("a/4", 4),  # ok, but no value
        _run("a/5", 5, 0.1, metric="test/loss"),
        _run("a/x", "x", status="failed"),
    ]
    g = stats.group_stats("a", runs, reps=50, seed=1)
    # Seeds in numeric order, ties by directory, non-numeric seeds last; a repeated seed gets #2.
    assert list(g["per_seed"]) == ["0", "1", "1#2", "2"]
    assert g["per_seed"]["1#2"] == {"seed": 1, "value": 0.9, "wall_time_s": 40.0, "seed_cost_s": 40.0, "dir": "/sweep/a/1b", "relative_dir": "a/1b"}
    assert g["values"] == [0.7, 0.6, 0.9, 0.5]
    assert (g["n_runs"], g["n_ok"], g["n_failed"], g["n_excluded"]) == (8, 4, 2, 2)
    assert (g["group"], g["experiment"], g["task"], g["primary_metric"]) == ("a", "exp_a", "supervised", "test/acc")
    assert g["higher_is_better"] is True and g["threshold"] is None and g["primary_curve"] == "val/acc"
    assert g["mean"] == pytest.approx(0.675) and g["median"] == pytest.approx(0.65)
    assert (g["min"], g["max"]) == (0.5, 0.9) and g["std"] == pytest.approx(np.std([0.7, 0.6, 0.9, 0.5], ddof=1))
    assert g["iqm"] == pytest.approx(0.65)  # 4 seeds: drop 0.5 and 0.9
    estimates = stats.interval_estimates([0.7, 0.6, 0.9, 0.5], reps=50, seed=1)
    assert (g["iqm_ci"], g["mean_ci"], g["ci_note"]) == (estimates["iqm_ci"], estimates["mean_ci"], None)
    assert g["seed_cost_s_mean"] == pytest.approx(25.0) and g["batch_wall_time_s_mean"] is None and g["seeds_per_process"] == [1]
    assert g["failed"] == [
        {"seed": 3, "error": "boom", "dir": "/sweep/a/3", "relative_dir": "a/3"},
        {"seed": "x", "error": "status='failed' and no error message", "dir": "/sweep/a/x", "relative_dir": "a/x"},
    ]
    assert g["excluded"] == [
        {"seed": 4, "reason": "ok run without a finite value for test/acc", "dir": "/sweep/a/4", "relative_dir": "a/4"},
        {"seed": 5, "reason": "primary metric test/loss differs from the group's test/acc", "dir": "/sweep/a/5",
         "relative_dir": "a/5"},
    ]
    assert g["warnings"] == [
        "group a mixes primary metrics ['test/acc', 'test/loss']; only test/acc (the most common) is summarised",
        "group a has seed 1 2 times (a/1a, a/1b); each counts as a sample, so the spread is understated if they are re-runs",
        "group a, seed 4 (a/4) excluded: ok run without a finite value for test/acc",
        "group a, seed 5 (a/5) excluded: primary metric test/loss differs from the group's test/acc",
        "group a has only 4 ok seeds; with fewer than 5 the CIs are wide and a comparison is anecdotal, "
        "run more seeds (e.g. seed='range(0,10)')",
        "group a has 2 failed runs",
    ]


def test_group_stats_of_one_seed_and_of_nothing():
    one = stats.group_stats("b", [_run("b/0", 0, 3.0, higher_is_better=False)], reps=20)
    assert one["higher_is_better"] is False and one["iqm_ci"] == [3.0, 3.0] and one["ci_note"] == stats.ci_note(1)
    assert one["warnings"] == [
        "group b has only 1 ok seed; with fewer than 5 the CIs are wide and a comparison is anecdotal, "
        "run more seeds (e.g. seed='range(0,10)')"
    ]
    none = stats.group_stats("c", [_run("c/0", 0, status="failed", error="x")], reps=20)
    assert (none["values"], none["iqm"], none["iqm_ci"], none["mean"], none["primary_metric"]) == ([], None, None, None, "test/acc")
    assert none["warnings"][-1] == "group c has 1 failed run" and none["seed_cost_s_mean"] is None
    five = stats.group_stats("d", [_run(f"d/{s}", s, float(s)) for s in range(5)], reps=20)
    assert five["warnings"] == [] and five["n_ok"] == 5


def test_threshold_stats_count_seeds_that_never_reached_it():
    rl = dict(threshold=475.0, env_steps=1000, env_steps_per_s=50.0)
    runs = [_run(f"r/{s}", s, 500.0, time_to_threshold_s=t, **rl) for s, t in ((0, 10.0), (1, None), (2, 30.0))]
    t = stats.threshold_stats(runs)
    assert t == {
        "threshold": 475.0, "n_seeds": 3, "n_reached": 2, "reached_fraction": pytest.approx(2 / 3),
        "per_seed_s": {"0": 10.0, "1": None, "2": 30.0}, "median_reached_s": 20.0, "min_reached_s": 10.0,
        "max_reached_s": 30.0, "median_all_s": 30.0,  # [10, 30, never]: the middle seed took 30 s
    }
    mostly_never = stats.threshold_stats(runs[1:2] * 2 + runs[:1])
    assert mostly_never["median_all_s"] is None and mostly_never["median_reached_s"] == 10.0
    assert stats.threshold_stats([runs[0], _run("r/9", 9, 1.0, time_to_threshold_s=1.0, threshold=200.0)])["threshold"] == [
        200.0, 475.0]
    assert stats.threshold_stats([_run("r/8", 8, 1.0, time_to_threshold_s=1.0)])["threshold"] is None
    never = stats.threshold_stats([runs[1]])
    assert never["median_reached_s"] is None and never["min_reached_s"] is None and never["max_reached_s"] is None
    g = stats.group_stats("r", runs, reps=20)
    assert g["threshold"] == t
    assert g["per_seed"]["1"] == {"seed": 1, "value": 500.0, "wall_time_s": None, "seed_cost_s": None, "dir": "/sweep/r/1",
                                  "relative_dir": "r/1", "time_to_threshold_s": None, "env_steps": 1000.0,
                                  "env_steps_per_s": 50.0}


def test_compare_groups_and_summarize_by_hand():
    runs = [_run(f"a/{s}", s, v, group="a") for s, v in enumerate([3.0, 4.0, 5.0])]
    runs += [_run(f"b/{s}", s, v, group="b") for s, v in enumerate([1.0, 2.0, 3.0])]
    runs += [_run("c/0", 0, 0.1, group="c", metric="test/loss")]
    report = summarize(runs, reps=50, seed=2)
    assert list(report["groups"]) == ["a", "b", "c"]
    assert list(report["comparisons"]) == ["test/acc"]  # c has no partner on its metric
    comparison = report["comparisons"]["test/acc"]
    assert comparison["groups"] == ["a", "b"] and comparison["higher_is_better"] is True
    forward, backward = comparison["probability_of_improvement"]
    # a beats b in 8 of 9 pairs and ties one (3 vs 3): (8 + 0.5) / 9.
    assert (forward["x"], forward["y"], forward["p"]) == ("a", "b", pytest.approx(8.5 / 9))
    assert (backward["x"], backward["y"], backward["p"]) == ("b", "a", pytest.approx(0.5 / 9))
    assert backward["ci"] == pytest.approx([1 - forward["ci"][1], 1 - forward["ci"][0]])
    profile = comparison["performance_profile"]
    assert profile["taus"] == pytest.approx(np.linspace(1.0, 5.0, stats.PROFILE_POINTS).tolist())
    assert profile == stats.performance_profile(
        {"a": [3.0, 4.0, 5.0], "b": [1.0, 2.0, 3.0]}, np.linspace(1.0, 5.0, stats.PROFILE_POINTS), reps=50, seed=2
    )
    expected_warnings = [w for name in ("a", "b", "c") for w in report["groups"][name]["warnings"]]
    assert report["warnings"] == expected_warnings and len(expected_warnings) == 3


def test_compare_groups_turns_lower_is_better_around_and_notes_disagreement():
    low = {"primary_metric": "loss", "values": [1.0, 2.0], "higher_is_better": False}
    high = {"primary_metric": "loss", "values": [3.0, 4.0], "higher_is_better": False}
    comparisons, notes = stats.compare_groups({"low": low, "high": high}, reps=20)
    first = comparisons["loss"]["probability_of_improvement"][0]
    assert (first["x"], first["p"]) == ("low", 1.0) and notes == []
    assert comparisons["loss"]["higher_is_better"] is False
    assert comparisons["loss"]["performance_profile"]["direction"] == "score < tau"
    mixed, notes = stats.compare_groups({"low": low, "high": {**high, "higher_is_better": True}}, reps=20)
    assert notes == ["groups on loss disagree on higher_is_better; comparing as higher is better"]
    assert mixed["loss"]["probability_of_improvement"][0]["p"] == 0.0
    empty = {"primary_metric": "loss", "values": [], "higher_is_better": True}
    assert stats.compare_groups({"low": low, "empty": empty}, reps=20) == ({}, [])


def test_seeds_sort_numerically_then_as_text_then_by_directory():
    runs = [
        _run("z", 10, 1.0), _run("y", 2, 1.0), _run("t", "b", 1.0), _run("w2", "a", 1.0), _run("w1", "a", 1.0),
        _run("v", True, 1.0), _run("u", 2.5, 1.0),
    ]
    g = stats.group_stats("a", runs, reps=20)
    # Booleans are not numbers here; text seeds sort as text, not by directory ("b" lives in t/);
    # "#2" marks the second run of seed "a" (directory w2 after w1).
    assert list(g["per_seed"]) == ["2", "2.5", "10", "True", "a", "a#2", "b"]
    assert [e["relative_dir"] for e in g["per_seed"].values()] == ["y", "u", "z", "v", "w1", "w2", "t"]


def test_group_without_a_primary_metric_and_an_empty_threshold_list():
    bare = ReportedRun(dir=ROOT / "n/0", input_root=ROOT, result={"group": "n", "seed": 0, "status": "ok"})
    g = stats.group_stats("n", [bare], reps=20)
    assert g["primary_metric"] is None and g["values"] == [] and g["n_excluded"] == 1
    assert (g["iqm"], g["iqm_ci"], g["mean_ci"], g["ci_note"]) == (None, None, None, None)
    assert stats.threshold_stats([]) == {
        "threshold": None, "n_seeds": 0, "n_reached": 0, "reached_fraction": None, "per_seed_s": {},
        "median_reached_s": None, "min_reached_s": None, "max_reached_s": None, "median_all_s": None,
    }


def test_summarize_passes_its_reps_and_seed_everywhere_and_skips_lone_metrics():
    runs = [_run(f"a/{s}", s, v, group="a") for s, v in enumerate([3.0, 4.0, 5.0, 9.0, 1.0])]
    runs += [_run(f"b/{s}", s, v, group="b") for s, v in enumerate([1.0, 2.0, 3.0, 0.0, 2.5])]
    runs += [_run("c/0", 0, 0.1, group="c", metric="a/loss")]  # sorts before test/acc and has no partner
    report = summarize(runs, reps=40, seed=5)
    assert list(report["comparisons"]) == ["test/acc"]
    a = report["groups"]["a"]
    assert a["group"] == "a"
    estimates = stats.interval_estimates([3.0, 4.0, 5.0, 9.0, 1.0], reps=40, seed=5)
    assert (a["iqm_ci"], a["mean_ci"]) == (estimates["iqm_ci"], estimates["mean_ci"])
    forward = report["comparisons"]["test/acc"]["probability_of_improvement"][0]
    direct = stats.probability_of_improvement([3.0, 4.0, 5.0, 9.0, 1.0], [1.0, 2.0, 3.0, 0.0, 2.5], reps=40, seed=5)
    assert (forward["p"], forward["ci"]) == (direct["p"], direct["ci"])
    lower = [_run(f"l/{s}", s, v, group=g, higher_is_better=False) for g, vals in (("p", [1.0, 2.0, 6.0]), ("q", [3.0, 4.0, 5.0]))
             for s, v in enumerate(vals)]
    flipped = summarize(lower, reps=40, seed=5)["comparisons"]["test/acc"]["probability_of_improvement"][0]
    direct = stats.probability_of_improvement([-1.0, -2.0, -6.0], [-3.0, -4.0, -5.0], reps=40, seed=5)
    assert (flipped["p"], flipped["ci"]) == (direct["p"], direct["ci"])


def test_rl_per_seed_entries_carry_time_to_threshold():
    # An RL record is one with env_steps (pipeline.store.record.ReportedRun.is_rl), as every DQN/CEM record has.
    runs = [_run(f"r/{s}", s, 500.0, time_to_threshold_s=t, threshold=475.0, env_steps=40_000) for s, t in ((0, 12.5), (1, None))]
    per_seed = stats.group_stats("r", runs, reps=20)["per_seed"]
    assert per_seed["0"]["time_to_threshold_s"] == 12.5 and per_seed["1"]["time_to_threshold_s"] is None
    assert per_seed["0"]["env_steps"] == 40_000
    # Without env_steps the record is not an RL run, whatever else it carries: no RL columns.
    plain = stats.group_stats("p", [_run("p/0", 0, 1.0, threshold=475.0)], reps=20)["per_seed"]
    assert "time_to_threshold_s" not in plain["0"]


def test_summarize_draws_the_curve_from_the_groups_valid_runs_only(tmp_path):
    from pipeline.report.curves import group_curve

    def write(name, seed, status, ys):
        run_dir = tmp_path / name
        run_dir.mkdir()
        rows = "\n".join(f"{10 * (i + 1)},{y}" for i, y in enumerate(ys))
        (run_dir / "metrics.csv").write_text("step,val/acc\n" + rows + "\n")
        return ReportedRun(dir=run_dir, input_root=tmp_path, result={
            "group": "a", "seed": seed, "status": status, "primary_metric": "test/acc", "primary_curve": "val/acc",
            "metrics": {"test/acc": 0.5} if status == "ok" else {}, "error": None if status == "ok" else "boom"})

    ok = [write(f"s{s}", s, "ok", [0.1 * s, 0.2 + 0.1 * s, 0.4]) for s in range(3)]
    failed = write("bad", 9, "failed", [50.0, 60.0, 70.0])
    report = summarize([*ok, failed], reps=30, seed=4)
    expected, seeds = group_curve(ok, reps=30, seed=4)
    curve = report["groups"]["a"]["curve"]
    assert curve is not None and set(curve) == set(expected)
    for key, value in expected.items():
        assert np.array_equal(np.asarray(curve[key], dtype=object), np.asarray(value, dtype=object)), key
    assert max(np.asarray(curve["iqm"], dtype=float)) < 1.0  # the failed run's 50-70 stayed out
    assert len(report["curve_seeds"]["a"]) == len(seeds) == 3
    no_curve = summarize([_run("x/0", 0, 1.0, group="x")], reps=20)
    assert no_curve["groups"]["x"]["curve"] is None and no_curve["curve_seeds"] == {"x": []}

"""The report's figures from groups and comparisons written by hand: which figures, under which file names, and
what a reader relies on in each (series, labels, limits, legends). Figures are captured instead of rendered,
except where the file itself is the point."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
from matplotlib.collections import LineCollection, PathCollection, PolyCollection
from matplotlib.figure import Figure

from pipeline.report import plots
from pipeline_testing import blank_border


@pytest.fixture
def figures(monkeypatch):
    saved = {}
    monkeypatch.setattr(plots, "_save", lambda fig, out_dir, name: saved.__setitem__(name, fig))
    return saved


COLORS = {"a": "tab:blue", "b": "tab:orange", "c": "tab:green", "d": "tab:red", "e": "tab:purple", "f": "tab:brown"}


def test_group_colors_and_names():
    assert plots.group_colors(["x", "y"]) == {"x": matplotlib.colormaps["tab10"](0), "y": matplotlib.colormaps["tab10"](1)}
    many = [str(i) for i in range(11)]
    assert plots.group_colors(many)["10"] == matplotlib.colormaps["tab20"](10)
    assert len(set(plots.group_colors([str(i) for i in range(10)]).values())) == 10
    assert plots._slug("eval/return mean") == "eval_return_mean" and plots._slug("//") == "metric"
    assert plots._file_name("k", "a/b", True) == "k-a_b.png"
    assert plots._file_name("k", "a/b", False) == "k.png" and plots._file_name("k", None, True) == "k.png"
    assert plots.wrap("aaaa bbbb-cccc dddd", 9) == "aaaa\nbbbb-cccc\ndddd"
    assert plots.wrap("x " * 30) == "x " * 21 + "x\n" + ("x " * 8).strip()
    assert plots._label("g", 3) == "g (n=3)"


def _curve_group(metric="eval/r", steps=(0.0, 100.0, 200.0), final=True, bounds=None, x="env step"):
    return {"curve": {"metric": metric, "x": x, "steps": list(steps), "iqm": [0.0, 5.0, 8.0], "ci_low": [0.0, 4.0, 9.0],
                      "ci_high": [0.0, 6.0, 7.5], "bounds": bounds, "last_point": "final" if final else "last"}}


def test_learning_curves_one_figure_per_metric(figures, tmp_path):
    seeds = [(np.array([0.0, 100.0, 200.0]), np.array([0.0, 4.0, 8.0]), None),
             (np.array([0.0, 100.0]), np.array([1.0, 6.0]), 7.0)]  # stopped at 100, holds its final 7
    groups = {"a": _curve_group(), "b": _curve_group(metric="loss", final=False, x="step"), "c": {"curve": None}}
    images = plots.plot_learning_curves(groups, {"a": seeds, "b": seeds[:1]}, COLORS, tmp_path)
    assert images == [
        {"kind": "learning_curves", "file": "learning_curves-eval_r.png", "title": "Learning curves (eval/r)", "metric": "eval/r"},
        {"kind": "learning_curves", "file": "learning_curves-loss.png", "title": "Learning curves (loss)", "metric": "loss"},
    ]
    (ax,) = figures["learning_curves-eval_r.png"].axes
    lines = [(line.get_xdata().tolist(), line.get_ydata().tolist(), line.get_linestyle()) for line in ax.lines]
    assert ([0.0, 100.0, 200.0], [0.0, 4.0, 8.0], "-") in lines
    assert ([100.0, 200.0], [7.0, 7.0], "--") in lines  # held at its final evaluation to the curve's end
    assert ([0.0, 100.0], [0.0, 5.0], "-") in lines  # the IQM without its final point
    iqm_line = next(line for line in ax.lines if line.get_label().endswith(" IQM"))
    assert iqm_line.get_label() == "a (n=2) IQM" and iqm_line.get_linewidth() == 2.2
    # The final point: a diamond with the table's CI, the CI clamped where it does not hold the point.
    (bars,) = ax.containers
    marker = bars.lines[0]
    assert marker.get_marker() == "D" and marker.get_xdata().tolist() == [200.0] and marker.get_ydata().tolist() == [8.0]
    (caps_segments,) = [c.get_segments() for c in bars.lines[2]]
    assert caps_segments[0].tolist() == [[200.0, 8.0], [200.0, 8.0]]  # low 9 > 8 (clamped to 0), high 7.5 < 8 (to 0)
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 1  # two seeds: a band
    assert ax.get_xlabel() == "env step" and ax.get_ylabel() == "eval/r"
    assert ax.get_title() == ("Learning curves: eval/r\nIQM over seeds, 95% stratified bootstrap band, thin lines = seeds\n"
                              "diamond = final evaluation (the table's IQM and CI)\n"
                              "dashed = a seed that stopped early, held at its final evaluation")
    assert ax.get_legend() is not None and [t.get_text() for t in ax.get_legend().get_texts()] == ["a (n=2) IQM"]
    (ax,) = figures["learning_curves-loss.png"].axes
    assert ax.get_title() == "Learning curves: loss\nIQM over seeds, 95% stratified bootstrap band, thin lines = seeds"
    assert not [c for c in ax.collections if isinstance(c, PolyCollection)]  # one seed: no band
    assert not ax.containers
    assert ([0.0, 100.0, 200.0], [0.0, 5.0, 8.0]) in [(ln.get_xdata().tolist(), ln.get_ydata().tolist()) for ln in ax.lines]
    assert ax.get_xlabel() == "step"


def test_a_held_seed_under_a_last_value_curve(figures, tmp_path):
    seeds = [(np.array([0.0, 200.0]), np.array([0.0, 8.0]), None), (np.array([0.0, 100.0]), np.array([1.0, 6.0]), None)]
    plots.plot_learning_curves({"a": _curve_group(final=False)}, {"a": seeds}, COLORS, tmp_path)
    (ax,) = figures["learning_curves.png"].axes
    assert ax.get_title().endswith("\ndashed = a seed that stopped early, held at its last evaluation")
    assert ([100.0, 200.0], [6.0, 6.0]) in [(ln.get_xdata().tolist(), ln.get_ydata().tolist()) for ln in ax.lines]


@pytest.mark.parametrize(("bounds", "expected"), [((0.0, 10.0), (-0.3, 10.3)), ((0.0, None), None), ((None, 10.0), None)])
def test_learning_curves_axis_limits_follow_the_metric_bounds(figures, tmp_path, bounds, expected):
    seeds = [(np.array([0.0, 200.0]), np.array([2.0, 8.0]), None)]
    plots.plot_learning_curves({"a": _curve_group(bounds=list(bounds))}, {"a": seeds}, COLORS, tmp_path)
    (ax,) = figures["learning_curves.png"].axes
    low, high = ax.get_ylim()
    if expected is not None:
        assert (low, high) == pytest.approx(expected)
    elif bounds[0] is None:
        assert high == pytest.approx(10.0 + 0.03 * (10.0 - low)) and low < 0.0
    else:
        assert low == pytest.approx(-0.03 * high) and high > 8.0


def test_legends_move_beside_the_axes_past_four_entries(figures, tmp_path):
    seeds = [(np.array([0.0, 200.0]), np.array([2.0, 8.0]), None)]
    groups = {n: _curve_group() for n in "abcde"}
    plots.plot_learning_curves(groups, {n: seeds for n in groups}, COLORS, tmp_path)
    legend = figures["learning_curves.png"].axes[0].get_legend()
    assert legend._loc == 2 and tuple(legend.get_bbox_to_anchor()._bbox.bounds[:2]) == pytest.approx((1.01, 1.0))
    fig = Figure()
    ax = fig.subplots()
    for i in range(4):
        ax.plot([0, 1], [i, i], label=str(i))
    plots._legend(ax, 4)
    assert ax.get_legend()._loc == 0  # "best", inside


def _score_group(values, metric="m", higher=True, mean=None, iqm=None, n_ok=None, ci=None, threshold=None):
    return {"primary_metric": metric, "values": values, "higher_is_better": higher, "mean": mean if mean is not None
            else float(np.mean(values)) if values else None, "iqm": iqm if iqm is not None else (float(np.median(values))
            if values else None), "n_ok": len(values) if n_ok is None else n_ok, "iqm_ci": ci or [0.0, 1.0],
            "mean_ci": ci or [0.0, 1.0], "threshold": threshold}


def test_final_scores_one_row_per_group(figures, tmp_path):
    groups = {"a": _score_group([1.0, 2.0, 3.0]), "b": _score_group([5.0]), "c": _score_group([]),
              "d": _score_group([4.0], metric="other", higher=False), "e": _score_group([1.0], metric=None)}
    images = plots.plot_final_scores(groups, COLORS, tmp_path)
    assert [(i["file"], i["title"], i["metric"]) for i in images] == [
        ("final_scores-m.png", "Final m per seed", "m"), ("final_scores-other.png", "Final other per seed", "other")]
    assert {i["kind"] for i in images} == {"final_scores"}
    (ax,) = figures["final_scores-m.png"].axes
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a (n=3)", "b (n=1)"]
    assert ax.get_ylim() == (1.6, -0.6)  # inverted: the first group on top
    assert ax.get_xlabel() == "final m" and ax.get_title() == "Final m per seed (higher is better)"
    points = [c for c in ax.collections if isinstance(c, PathCollection)]
    seeds_a, iqm_a, seeds_b, iqm_b = (p.get_offsets() for p in points)
    assert seeds_a[:, 0].tolist() == [1.0, 2.0, 3.0] and np.all(np.abs(seeds_a[:, 1]) <= plots.JITTER)
    assert np.ptp(seeds_a[:, 1]) > 0  # jittered
    assert seeds_b.tolist() == [[5.0, 1.0]]  # one seed: on its row
    assert iqm_a.tolist() == [[2.0, 0.34]] and iqm_b.tolist() == [[5.0, 1.34]]
    means = [c.get_segments()[0].tolist() for c in ax.collections if isinstance(c, LineCollection)]
    assert means == [[[2.0, -0.3], [2.0, 0.3]], [[5.0, 0.7], [5.0, 1.3]]]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["seed", "mean", "IQM"]
    assert figures["final_scores-other.png"].axes[0].get_title() == "Final other per seed (lower is better)"


def test_interval_estimates_clamp_a_ci_that_misses_the_point(figures, tmp_path):
    groups = {"a": _score_group([1.0, 2.0], iqm=1.5, mean=1.5, ci=[1.7, 3.0]), "b": _score_group([4.0], ci=[3.0, 3.5])}
    images = plots.plot_interval_estimates(groups, COLORS, tmp_path)
    assert images == [{"kind": "interval_estimates", "file": "interval_estimates.png",
                       "title": "IQM and mean of m with 95% CIs", "metric": "m"}]
    fig = figures["interval_estimates.png"]
    left, right = fig.axes
    assert left.get_title() == "IQM, 95% bootstrap CI" and right.get_title() == "Mean, 95% bootstrap CI"
    assert left.get_xlabel() == right.get_xlabel() == "m"
    assert [t.get_text() for t in left.get_yticklabels()] == ["a (n=2)", "b (n=1)"] and left.get_ylim() == (1.6, -0.6)
    bars = left.containers
    assert [b.lines[0].get_xdata().tolist() + b.lines[0].get_ydata().tolist() for b in bars] == [[1.5, 0], [4.0, 1]]
    # a: low 1.7 above the point 1.5 -> no left arm; b: high 3.5 below 4 -> no right arm.
    assert [b.lines[2][0].get_segments()[0][:, 0].tolist() for b in bars] == [[1.5, 3.0], [3.0, 4.0]]
    assert fig._suptitle.get_text() == "Aggregate m over seeds (stratified bootstrap, percentile CI)"


def _threshold(per_seed, n_reached=None, threshold=475.0):
    return {"per_seed_s": per_seed, "n_seeds": len(per_seed), "threshold": threshold,
            "n_reached": sum(t is not None for t in per_seed.values()) if n_reached is None else n_reached}


def test_time_to_threshold(figures, tmp_path):
    groups = {"a": _score_group([1.0], threshold=_threshold({"0": 10.0, "1": 30.0, "2": None})),
              "b": _score_group([1.0], threshold=_threshold({"0": None}, threshold=400.0)),
              "c": _score_group([1.0], threshold=_threshold({})), "d": _score_group([1.0])}
    assert plots.plot_time_to_threshold(groups, COLORS, tmp_path) == [
        {"kind": "time_to_threshold", "file": "time_to_threshold.png", "title": "Time to threshold per seed", "metric": None}]
    (ax,) = figures["time_to_threshold.png"].axes
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a (2/3 reached)", "b (0/1 reached)"]
    never_x = 30.0 * 1.15
    assert ax.get_xlim() == pytest.approx((0.0, never_x * 1.08)) and ax.get_ylim() == (1.8, -0.6)
    reached, never_a, never_b = (c.get_offsets() for c in ax.collections if isinstance(c, PathCollection))
    assert reached[:, 0].tolist() == [10.0, 30.0] and never_a[:, 0].tolist() == [never_x]
    assert never_b[:, 0].tolist() == [never_x] and abs(never_b[0, 1] - 1) <= plots.JITTER
    medians = [c.get_segments()[0].tolist() for c in ax.collections if isinstance(c, LineCollection)]
    assert medians == [[[20.0, -0.3], [20.0, 0.3]]]
    (divider,) = ax.lines
    assert divider.get_xdata() == [30.0 * 1.075] * 2 and divider.get_linestyle() == "--"
    (never_text,) = ax.texts
    assert never_text.get_text() == "never" and never_text.get_position() == (never_x, 2 - 0.45)
    assert ax.get_title() == "Time to threshold per seed (threshold 400.0, 475.0)"
    assert ax.get_xlabel() == "wall-clock seconds to reach the threshold"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["seed reached threshold", "median of reached",
                                                                  "never reached"]
    assert plots.plot_time_to_threshold({"c": groups["c"], "d": groups["d"]}, COLORS, tmp_path) == []


def test_time_to_threshold_when_no_seed_reached_it(figures, tmp_path):
    plots.plot_time_to_threshold({"a": _score_group([1.0], threshold=_threshold({"0": None, "1": None}))}, COLORS, tmp_path)
    (ax,) = figures["time_to_threshold.png"].axes
    assert ax.get_xlim() == pytest.approx((0.0, 1.15 * 1.08))  # top 1: never at 1.15
    assert ax.lines[0].get_xdata() == [1.075] * 2
    plots.plot_time_to_threshold({"a": _score_group([1.0], threshold=_threshold({"0": 0.0, "1": None}))}, COLORS, tmp_path)
    (ax,) = figures["time_to_threshold.png"].axes
    assert ax.get_xlim() == pytest.approx((0.0, 1.08)) and ax.lines[0].get_xdata() == [0.5] * 2


def _comparison(names, pairs, higher=True, taus=(1.0, 2.0)):
    profile = {"taus": list(taus), "profiles": {n: [1.0, 0.5] for n in names},
               "ci_low": {n: [0.9, 0.4] for n in names}, "ci_high": {n: [1.0, 0.6] for n in names}}
    return {"groups": names, "higher_is_better": higher, "performance_profile": profile,
            "probability_of_improvement": [{"x": x, "y": y, "p": p, "ci": ci} for x, y, p, ci in pairs]}


def test_performance_profiles(figures, tmp_path):
    comparisons = {"m": _comparison(["a", "b"], [], higher=False), "n/x": _comparison(list("abcde"), [])}
    images = plots.plot_performance_profiles(comparisons, COLORS, tmp_path)
    assert [(i["kind"], i["file"], i["title"], i["metric"]) for i in images] == [
        ("performance_profile", "performance_profile-m.png", "Performance profile (m)", "m"),
        ("performance_profile", "performance_profile-n_x.png", "Performance profile (n/x)", "n/x")]
    (ax,) = figures["performance_profile-m.png"].axes
    assert ax.get_title() == "Performance profile of m (95% bootstrap bands)"
    assert ax.get_xlabel() == r"m threshold $\tau$" and ax.get_ylabel() == r"fraction of seeds with m < $\tau$"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a", "b"] and ax.get_legend()._loc == 0
    assert [ln.get_ydata().tolist() for ln in ax.lines] == [[1.0, 0.5], [1.0, 0.5]]
    assert [matplotlib.colors.to_hex(ln.get_color()) for ln in ax.lines] == [
        matplotlib.colors.to_hex(COLORS[n]) for n in "ab"]
    (ax,) = figures["performance_profile-n_x.png"].axes
    assert ax.get_ylabel() == r"fraction of seeds with n/x > $\tau$" and ax.get_legend()._loc == 2


def test_probability_of_improvement_bars_show_each_pair_once_the_better_first(figures, tmp_path):
    pairs = [("a", "b", 0.25, [0.1, 0.4]), ("b", "a", 0.75, [0.6, 0.9]), ("a", "c", 1.0, [1.0, 1.0]),
             ("c", "a", 0.0, [0.0, 0.0])]
    images = plots.plot_probability_of_improvement({"m": _comparison(["a", "b", "c"], pairs, higher=False)}, tmp_path)
    assert images == [{"kind": "probability_of_improvement", "file": "probability_of_improvement.png",
                       "title": "Probability of improvement (m)", "metric": "m"}]
    ax, values = figures["probability_of_improvement.png"].axes
    assert [t.get_text() for t in ax.get_yticklabels()] == ["b\n  vs  a", "a\n  vs  c"]
    assert [t.get_text() for t in values.get_yticklabels()] == ["0.75 [0.60, 0.90]", "1.00 [1.00, 1.00]"]
    assert values.get_ylabel() == "P [95% CI]" and values.get_ylim() == ax.get_ylim() == (1.6, -0.6)
    bars = [(p.get_x(), p.get_width(), matplotlib.colors.to_hex(p.get_facecolor()[:3]))
            for p in ax.patches]
    # b vs a: the CI 0.6-0.9 (all above 0.5: blue); a vs c: P = 1 on every resample, a sliver ending at 1.
    assert bars[0][:2] == pytest.approx((0.6, 0.3)) and bars[0][2] == matplotlib.colors.to_hex("tab:blue")
    assert bars[1][:2] == pytest.approx((1.0 - 0.006, 0.006))
    ticks = [c.get_segments()[0].tolist() for c in ax.collections if isinstance(c, LineCollection)]
    assert ticks == [[[0.75, -0.3], [0.75, 0.3]], [[1.0, 0.7], [1.0, 1.3]]]
    assert ax.get_xlim() == (-0.02, 1.02)
    assert ax.lines[0].get_xdata() == [0.5, 0.5]
    assert ax.get_xlabel() == "P(X better than Y): chance that a seed of X has lower m"
    assert ax.get_title() == ("Probability of improvement on m\nbar = 95% bootstrap CI (blue: all above 0.5), tick = "
                              "estimate, dashed = no difference")


def test_a_ci_touching_one_half_is_grey(figures, tmp_path):
    pairs = [("a", "b", 0.6, [0.5, 0.7]), ("b", "a", 0.4, [0.3, 0.5])]
    plots.plot_probability_of_improvement({"m": _comparison(["a", "b"], pairs)}, tmp_path)
    (patch,) = figures["probability_of_improvement.png"].axes[0].patches
    assert matplotlib.colors.to_hex(patch.get_facecolor()[:3]) == matplotlib.colors.to_hex("tab:gray")
    assert (patch.get_x(), patch.get_width()) == pytest.approx((0.5, 0.2))


def test_probability_of_improvement_past_five_groups_is_a_matrix(figures, tmp_path):
    names = list("abcdef")
    pairs = [("a", "b", 0.9, [0.8, 1.0]), ("b", "a", 0.1, [0.0, 0.2]), ("c", "d", 0.5, [0.4, 0.6])]
    comparisons = {"m": _comparison(names, pairs), "n": _comparison(["a", "b"], [("a", "b", 0.5, [0.4, 0.6])])}
    images = plots.plot_probability_of_improvement(comparisons, tmp_path)
    assert [i["file"] for i in images] == ["probability_of_improvement-m.png", "probability_of_improvement-n.png"]
    fig = figures["probability_of_improvement-m.png"]
    ax, bar = fig.axes
    matrix = np.ma.filled(ax.images[0].get_array().astype(float), np.nan)
    assert matrix[0, 1] == 0.9 and matrix[1, 0] == 0.1 and matrix[2, 3] == 0.5 and np.isnan(matrix[0, 0])
    assert np.isnan(matrix).sum() == 33
    assert ax.images[0].get_clim() == (0.0, 1.0)
    assert [(t.get_text(), t.get_position(), t.get_color()) for t in ax.texts] == [
        ("0.90", (1, 0), "white"), ("0.10", (0, 1), "white"), ("0.50", (3, 2), "black")]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "3", "4", "5", "6"]
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"{n}  {i + 1}" for i, n in enumerate(names)]
    assert ax.get_xlabel() == "Y (numbered as the rows)" and ax.get_ylabel() == "X"
    assert bar.get_ylabel() == "P(X better than Y): X has higher m"
    assert ax.get_title() == ("Probability of improvement on m\nrow X against column Y; 0.5 = no difference; the 95% CIs "
                              "are in report.md")
    assert figures["probability_of_improvement-n.png"].axes[0].patches  # two groups: bars


def test_make_plots_draws_every_kind_in_the_default_style(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(plots, "_save", lambda fig, out_dir, name: seen.append(
        (name, out_dir, matplotlib.rcParams["axes.facecolor"])))
    seeds = [(np.array([0.0, 200.0]), np.array([2.0, 8.0]), None)]
    groups = {"a": {**_score_group([1.0, 2.0], threshold=_threshold({"0": 1.0})), **_curve_group()},
              "b": {**_score_group([3.0]), "curve": None}}
    summary = {"groups": groups, "curve_seeds": {"a": seeds, "b": []},
               "comparisons": {"m": _comparison(["a", "b"], [("a", "b", 0.5, [0.4, 0.6])])}}
    with matplotlib.rc_context({"axes.facecolor": "black"}):
        images = plots.make_plots(summary, tmp_path)
        assert matplotlib.rcParams["axes.facecolor"] == "black"
    assert [i["kind"] for i in images] == ["learning_curves", "final_scores", "interval_estimates", "time_to_threshold",
                                           "performance_profile", "probability_of_improvement"]
    assert [name for name, _, _ in seen] == [i["file"] for i in images]
    assert all(out == tmp_path and face == "white" for _, out, face in seen)


def test_save_lays_out_long_labels_inside_the_picture(tmp_path):
    fig = Figure(figsize=(3, 2))
    ax = fig.subplots()
    ax.set_yticks([0])
    ax.set_yticklabels(["a group name far too long to fit to the left of these axes at all"])
    plots._save(fig, tmp_path, "long.png")
    assert blank_border(tmp_path / "long.png")
    width, height = fig.get_size_inches()
    assert width > 3.0
    from PIL import Image

    assert Image.open(tmp_path / "long.png").size == (round(width * plots.DPI), round(height * plots.DPI))
    box = fig.get_tightbbox(fig.canvas.get_renderer())
    assert box.x0 >= -0.01 and box.x1 <= width + 0.01 and box.y0 >= -0.01 and box.y1 <= height + 0.01


def test_fit_to_text_leaves_a_figure_that_fits_alone():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = Figure(figsize=(4, 3))
    FigureCanvasAgg(fig)
    fig.subplots().plot([0, 1], [0, 1])
    plots.fit_to_text(fig)
    assert tuple(fig.get_size_inches()) == (4.0, 3.0)
    wide = Figure(figsize=(2, 2))
    FigureCanvasAgg(wide)
    wide.subplots().set_title("a title much wider than two inches of figure, surely")
    plots.fit_to_text(wide, margin=0.5, rounds=1)  # one round: grown once, by the overhang and both margins
    box_width = wide.get_size_inches()[0]
    assert box_width > 3.0

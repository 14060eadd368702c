"""What a reader sees in the report's figures beyond their data: sizes in inches, the saved resolution, line widths,
marker sizes, colours, alphas, drawing order, legend and title placement and font sizes, each a documented
expectation of the figure written out by hand. Also the cases test_plots_units leaves open: the final diamond's CI
arms when the CI holds the point, two groups on one metric, a seed stopped early after several points, the layout's
growth margin, file names with two metrics."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
from matplotlib.collections import LineCollection, PathCollection, PolyCollection
from matplotlib.colors import to_hex, to_rgba
from matplotlib.figure import Figure

from pipeline.report import plots

SMALL, MEDIUM, X_SMALL = 10 * 0.833, 10.0, 10 * 0.694  # matplotlib's default font.size 10 and its named scalings
# Colours off matplotlib's default cycle: a series drawn without its group's colour would not match by chance.
BLUE, ORANGE = "#123456", "#a05010"
COLORS = {"a": BLUE, "b": ORANGE, "c": "#307020", "d": "#601060", "e": "#40a0a0", "f": "#909000"}


@pytest.fixture
def figures(monkeypatch):
    saved = {}
    monkeypatch.setattr(plots, "_save", lambda fig, out_dir, name: saved.__setitem__(name, fig))
    return saved


def _hex(color):
    return to_hex(color, keep_alpha=False)


def _size(fig):
    return tuple(float(v) for v in fig.get_size_inches())


def _grid(axis):
    """(visible, alpha) of an axis' grid lines."""
    line = axis.get_gridlines()[0]
    return line.get_visible(), line.get_alpha()


def _curve(metric="m", steps=(0.0, 100.0, 200.0), iqm=(0.0, 5.0, 8.0), low=(0.0, 4.0, 7.0), high=(0.0, 6.0, 9.5),
           final=True):
    return {"curve": {"metric": metric, "x": "step", "steps": list(steps), "iqm": list(iqm), "ci_low": list(low),
                      "ci_high": list(high), "bounds": None, "last_point": "final" if final else "last"}}


TWO_SEEDS = [(np.array([0.0, 100.0, 200.0]), np.array([0.0, 4.0, 8.0]), None),
             (np.array([0.0, 100.0]), np.array([1.0, 6.0]), 7.0)]


def test_learning_curve_style(figures, tmp_path):
    plots.plot_learning_curves({"a": _curve()}, {"a": TWO_SEEDS}, COLORS, tmp_path)
    fig = figures["learning_curves.png"]
    assert _size(fig) == (8.0, 5.0)
    (ax,) = fig.axes
    seed, stopped, held, iqm = ax.lines[:4]
    for line in (seed, stopped):  # thin, faint seed lines in the group's colour
        assert (_hex(line.get_color()), line.get_alpha(), line.get_linewidth(), line.get_linestyle()) == (BLUE, 0.3, 0.8, "-")
    assert held.get_xdata().tolist() == [100.0, 200.0]
    assert (_hex(held.get_color()), held.get_alpha(), held.get_linewidth(), held.get_linestyle()) == (BLUE, 0.5, 0.9, "--")
    assert (_hex(iqm.get_color()), iqm.get_alpha(), iqm.get_linewidth()) == (BLUE, None, 2.2)
    (band,) = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert _hex(band.get_facecolor()[0]) == BLUE and band.get_alpha() == 0.2 and band.get_linewidth()[0] == 0.0
    # Between the CI's low and high ends over the steps before the final point: (0, 0 to 0), (100, 4 to 6).
    corners = {tuple(v) for v in band.get_paths()[0].vertices.tolist()}
    assert corners == {(0.0, 0.0), (100.0, 4.0), (100.0, 6.0)}
    (bars,) = ax.containers
    marker = bars.lines[0]
    assert (marker.get_marker(), _hex(marker.get_color()), marker.get_markersize()) == ("D", BLUE, 7.0)
    assert to_rgba(marker.get_markeredgecolor()) == (0.0, 0.0, 0.0, 1.0)
    assert bars.lines[2][0].get_zorder() == 5 and marker.get_zorder() == pytest.approx(5.1)  # above the curves
    caps = bars.lines[1]
    assert [c.get_markersize() for c in caps] == [8.0, 8.0]  # capsize 4 points: caps 8 points wide
    # The CI 7 to 9.5 holds the point 8: arms down to 7 and up to 9.5.
    (arms,) = bars.lines[2]
    assert arms.get_segments()[0].tolist() == [[200.0, 7.0], [200.0, 9.5]]
    assert sorted(c.get_ydata()[0] for c in caps) == [7.0, 9.5]
    assert ax.title.get_fontsize() == MEDIUM
    assert _grid(ax.xaxis) == (True, 0.3) and _grid(ax.yaxis) == (True, 0.3)
    legend = ax.get_legend()
    assert legend.get_texts()[0].get_fontsize() == pytest.approx(SMALL) and legend._loc == 0


def test_two_groups_on_one_metric_the_first_with_a_final_point(figures, tmp_path):
    seeds = [(np.array([0.0, 100.0, 200.0]), np.array([0.0, 4.0, 8.0]), None)]
    plots.plot_learning_curves({"a": _curve(), "b": _curve(final=False)}, {"a": seeds, "b": seeds}, COLORS, tmp_path)
    assert list(figures) == ["learning_curves.png"]
    (ax,) = figures["learning_curves.png"].axes
    assert "\ndiamond = final evaluation (the table's IQM and CI)" in ax.get_title()
    (bars,) = ax.containers
    assert _hex(bars.lines[0].get_color()) == BLUE
    iqm_lines = [ln for ln in ax.lines if ln.get_label().endswith(" IQM")]
    assert [(ln.get_label(), _hex(ln.get_color()), ln.get_xdata().tolist()) for ln in iqm_lines] == [
        ("a (n=1) IQM", BLUE, [0.0, 100.0]), ("b (n=1) IQM", ORANGE, [0.0, 100.0, 200.0])]


def test_a_seed_stopped_after_several_points_is_held_from_its_last(figures, tmp_path):
    seeds = [(np.array([0.0, 200.0]), np.array([0.0, 8.0]), None),
             (np.array([0.0, 50.0, 100.0, 150.0]), np.array([1.0, 2.0, 3.0, 4.0]), None),
             (np.array([0.0, 50.0, 120.0]), np.array([1.0, 2.0, 3.0]), 6.5)]
    plots.plot_learning_curves({"a": _curve(final=False)}, {"a": seeds}, COLORS, tmp_path)
    (ax,) = figures["learning_curves.png"].axes
    dashed = [(ln.get_xdata().tolist(), ln.get_ydata().tolist()) for ln in ax.lines if ln.get_linestyle() == "--"]
    assert dashed == [([150.0, 200.0], [4.0, 4.0]), ([120.0, 200.0], [6.5, 6.5])]
    assert ax.get_title().endswith("held at its last evaluation")


def test_learning_curve_file_names_and_many_groups(figures, tmp_path):
    seeds = [(np.array([0.0, 200.0]), np.array([0.0, 8.0]), None)]
    groups = {**{n: _curve() for n in "abcde"}, "f": _curve(metric="loss")}
    images = plots.plot_learning_curves(groups, {n: seeds for n in groups}, COLORS, tmp_path)
    assert [i["file"] for i in images] == ["learning_curves-loss.png", "learning_curves-m.png"]
    legend = figures["learning_curves-m.png"].axes[0].get_legend()
    assert legend._loc == 2 and legend.borderaxespad == 0.0
    assert legend.get_texts()[0].get_fontsize() == pytest.approx(SMALL)


def _scores(values, metric="m", iqm=None, mean=None, ci=None, mean_ci=None, threshold=None):
    return {"primary_metric": metric, "values": values, "higher_is_better": True,
            "mean": float(np.mean(values)) if mean is None else mean,
            "iqm": float(np.median(values)) if iqm is None else iqm, "n_ok": len(values),
            "iqm_ci": ci or [0.0, 10.0], "mean_ci": mean_ci or ci or [0.0, 10.0], "threshold": threshold}


def test_final_scores_style(figures, tmp_path):
    groups = {"a": _scores([1.0, 2.0, 3.0]), "b": _scores([5.0, 6.0]), "c": _scores([4.0])}
    plots.plot_final_scores(groups, COLORS, tmp_path)
    fig = figures["final_scores.png"]
    assert _size(fig) == pytest.approx((9.0, 1.4 + 0.7 * 3))
    (ax,) = fig.axes
    points = [c for c in ax.collections if isinstance(c, PathCollection)]
    seeds, iqms = points[0::2], points[1::2]
    for name, seed in zip("abc", seeds):
        assert _hex(seed.get_facecolor()[0]) == COLORS[name] and seed.get_alpha() == 0.8
        assert seed.get_sizes().tolist() == [36.0] and seed.get_linewidths().tolist() == [0.4]
        assert to_rgba(seed.get_edgecolor()[0]) == (0.0, 0.0, 0.0, 0.8) and seed.get_zorder() == 3
    # The same figure for the same data: the jitter is numpy's default_rng(0), drawn row by row.
    rng = np.random.default_rng(0)
    assert seeds[0].get_offsets()[:, 1].tolist() == pytest.approx(rng.uniform(-0.12, 0.12, 3).tolist())
    assert seeds[1].get_offsets()[:, 1].tolist() == pytest.approx((1 + rng.uniform(-0.12, 0.12, 2)).tolist())
    assert iqms[0].get_label() == "IQM" and all(p.get_label().startswith("_") for p in iqms[1:])  # the first row's
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["seed", "mean", "IQM"]
    for iqm in iqms:
        assert _hex(iqm.get_facecolor()[0]) == to_hex("crimson") and iqm.get_sizes().tolist() == [50.0]
        assert iqm.get_zorder() == 4 and iqm.get_paths()[0] != seeds[0].get_paths()[0]  # a diamond, not a dot
    means = [c for c in ax.collections if isinstance(c, LineCollection)]
    for mean in means:
        assert to_rgba(mean.get_color()[0]) == (0.0, 0.0, 0.0, 1.0) and mean.get_linewidth()[0] == 2.0
        assert mean.get_zorder() == 4
    assert _grid(ax.xaxis) == (True, 0.3) and not _grid(ax.yaxis)[0]
    legend = ax.get_legend()
    assert legend._loc == 2 and tuple(legend.get_bbox_to_anchor()._bbox.bounds[:2]) == pytest.approx((1.01, 1.0))
    assert legend.borderaxespad == 0.0 and legend.get_texts()[0].get_fontsize() == pytest.approx(SMALL)


def test_interval_estimates_style_and_two_metrics(figures, tmp_path):
    groups = {"a": _scores([1.0, 3.0], iqm=2.0, mean=2.5, ci=[1.0, 4.0], mean_ci=[2.0, 3.5]), "b": _scores([5.0]),
              "c": _scores([4.0], metric="other")}
    images = plots.plot_interval_estimates(groups, COLORS, tmp_path)
    assert [(i["file"], i["title"]) for i in images] == [
        ("interval_estimates-m.png", "IQM and mean of m with 95% CIs"),
        ("interval_estimates-other.png", "IQM and mean of other with 95% CIs")]
    fig = figures["interval_estimates-m.png"]
    assert _size(fig) == pytest.approx((10.0, 1.2 + 0.7 * 2))
    assert _size(figures["interval_estimates-other.png"]) == pytest.approx((10.0, 1.2 + 0.7))
    left, right = fig.axes
    assert right.get_shared_y_axes().joined(left, right)
    assert right.get_yticks().tolist() == [0, 1] and right.get_ylim() == (1.6, -0.6)  # shared: set once on the left
    for ax in (left, right):
        for name, bars in zip("ab", ax.containers):
            point = bars.lines[0]
            assert (point.get_marker(), _hex(point.get_color()), point.get_markersize()) == ("o", COLORS[name], 7.0)
            assert [c.get_markersize() for c in bars.lines[1]] == [10.0, 10.0]  # capsize 5
            assert bars.lines[2][0].get_linewidth()[0] == 2.0
        assert _grid(ax.xaxis) == (True, 0.3) and not _grid(ax.yaxis)[0]
    # The mean panel draws the mean and its own CI.
    arms = right.containers[0].lines[2][0].get_segments()[0]
    assert right.containers[0].lines[0].get_xdata().tolist() == [2.5] and arms[:, 0].tolist() == [2.0, 3.5]
    left_arms = left.containers[0].lines[2][0].get_segments()[0]
    assert left.containers[0].lines[0].get_xdata().tolist() == [2.0] and left_arms[:, 0].tolist() == [1.0, 4.0]
    assert figures["interval_estimates-other.png"]._suptitle.get_text().startswith("Aggregate other over seeds")


def _threshold(per_seed, threshold=475.0):
    return {"per_seed_s": per_seed, "n_seeds": len(per_seed), "threshold": threshold,
            "n_reached": sum(t is not None for t in per_seed.values())}


def test_time_to_threshold_style(figures, tmp_path):
    groups = {"a": _scores([1.0], threshold=_threshold({"0": 10.0, "1": 30.0, "2": None})),
              "b": _scores([1.0], threshold=_threshold({"0": 20.0, "1": None, "2": None})),
              "c": _scores([1.0], threshold=_threshold({"0": 5.0}))}
    plots.plot_time_to_threshold(groups, COLORS, tmp_path)
    fig = figures["time_to_threshold.png"]
    assert _size(fig) == pytest.approx((9.0, 1.4 + 0.6 * 3))
    (ax,) = fig.axes
    points = [c for c in ax.collections if isinstance(c, PathCollection)]
    reached_a, never_a, reached_b, never_b, reached_c = points
    for name, reached in (("a", reached_a), ("b", reached_b), ("c", reached_c)):
        assert _hex(reached.get_facecolor()[0]) == COLORS[name] and reached.get_sizes().tolist() == [36.0]
        assert to_rgba(reached.get_edgecolor()[0]) == (0.0, 0.0, 0.0, 1.0)
        assert reached.get_linewidths().tolist() == [0.4] and reached.get_zorder() == 3
    for never in (never_a, never_b):
        assert _hex(never.get_facecolor()[0]) == to_hex("crimson") or _hex(never.get_edgecolor()[0]) == to_hex("crimson")
        assert never.get_sizes().tolist() == [50.0] and never.get_zorder() == 3
    assert never_b.get_offsets().shape == (2, 2)
    # The same figure for the same data: one default_rng(0) jitters every row in turn.
    rng = np.random.default_rng(0)
    expected = [rng.uniform(-0.12, 0.12, 2), rng.uniform(-0.12, 0.12, 1), 1 + rng.uniform(-0.12, 0.12, 1),
                1 + rng.uniform(-0.12, 0.12, 2), 2 + rng.uniform(-0.12, 0.12, 1)]
    assert [p.get_offsets()[:, 1].tolist() for p in points] == [pytest.approx(e.tolist()) for e in expected]
    for median in (c for c in ax.collections if isinstance(c, LineCollection)):
        assert to_rgba(median.get_color()[0]) == (0.0, 0.0, 0.0, 1.0) and median.get_linewidth()[0] == 2.0
    (divider,) = ax.lines
    assert _hex(divider.get_color()) == to_hex("grey") and divider.get_linewidth() == 1.0
    (never,) = ax.texts
    assert (never.get_ha(), never.get_va(), _hex(never.get_color())) == ("center", "bottom", to_hex("crimson"))
    assert never.get_fontsize() == pytest.approx(SMALL)
    assert ax.get_ylim() == (2.8, -0.6)
    assert _grid(ax.xaxis) == (True, 0.3) and not _grid(ax.yaxis)[0]
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["seed reached threshold", "median of reached", "never reached"]
    assert legend._loc == 0 and legend.get_texts()[0].get_fontsize() == pytest.approx(SMALL)


def _comparison(names, pairs=(), higher=True):
    profile = {"taus": [1.0, 2.0], "profiles": {n: [1.0, 0.5] for n in names},
               "ci_low": {n: [0.9, 0.4] for n in names}, "ci_high": {n: [1.0, 0.6] for n in names}}
    return {"groups": names, "higher_is_better": higher, "performance_profile": profile,
            "probability_of_improvement": [{"x": x, "y": y, "p": p, "ci": ci} for x, y, p, ci in pairs]}


def test_performance_profile_style(figures, tmp_path):
    long = "optimizer.lr=0.001 optimizer.weight_decay=0.0001 model.hidden=256"
    colors = {**COLORS, long: BLUE}
    plots.plot_performance_profiles({"m": _comparison([long, "b"]), "n": _comparison(list("abcde"))}, colors, tmp_path)
    fig = figures["performance_profile-m.png"]
    assert _size(fig) == (8.0, 5.0)
    (ax,) = fig.axes
    assert ax.xaxis.label.get_fontsize() == MEDIUM and ax.yaxis.label.get_fontsize() == MEDIUM
    assert ax.get_xticklabels()[0].get_fontsize() == MEDIUM
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == [
        "optimizer.lr=0.001\noptimizer.weight_decay=0.0001\nmodel.hidden=256", "b"]  # wrapped at 44
    assert legend.get_texts()[0].get_fontsize() == pytest.approx(SMALL)
    legend = figures["performance_profile-n.png"].axes[0].get_legend()
    assert legend._loc == 2 and tuple(legend.get_bbox_to_anchor()._bbox.bounds[:2]) == pytest.approx((1.01, 1.0))
    assert legend.borderaxespad == 0.0 and legend.get_texts()[0].get_fontsize() == pytest.approx(SMALL)


def test_probability_of_improvement_bars_style(figures, tmp_path):
    pairs = [("a", "b", 0.8, [0.6, 0.9]), ("b", "a", 0.2, [0.1, 0.4]), ("a", "c", 0.55, [0.4, 0.7]),
             ("c", "a", 0.45, [0.3, 0.6])]
    plots.plot_probability_of_improvement({"m": _comparison(["a", "b", "c"], pairs)}, tmp_path)
    fig = figures["probability_of_improvement.png"]
    assert _size(fig) == pytest.approx((9.0, 1.8 + 0.7 * 2))
    ax, values = fig.axes
    for patch, color in zip(ax.patches, ("tab:blue", "tab:gray")):
        assert patch.get_height() == pytest.approx(0.6) and patch.get_alpha() == 0.6
        assert _hex(patch.get_facecolor()) == to_hex(color)
    assert [p.get_y() for p in ax.patches] == pytest.approx([-0.3, 0.7])
    for tick in (c for c in ax.collections if isinstance(c, LineCollection)):
        assert to_rgba(tick.get_color()[0]) == (0.0, 0.0, 0.0, 1.0) and tick.get_linewidth()[0] == 2.0
    (half,) = ax.lines
    assert (_hex(half.get_color()), half.get_linestyle(), half.get_linewidth()) == (to_hex("grey"), "--", 1.0)
    assert ax.get_yticklabels()[0].get_fontsize() == pytest.approx(SMALL)
    assert values.get_yticklabels()[0].get_fontsize() == pytest.approx(SMALL)
    assert [t for t in values.get_yticks()] == [0, 1]
    assert _grid(ax.xaxis) == (True, 0.3) and not _grid(ax.yaxis)[0]
    assert ax.title.get_fontsize() == MEDIUM
    assert ax.get_xlabel() == "P(X better than Y): chance that a seed of X has higher m"


def test_probability_of_improvement_matrix_style(figures, tmp_path):
    names = list("abcdef")
    pairs = [("a", "b", 0.9, [0.8, 1.0]), ("b", "a", 0.1, [0.0, 0.2]), ("c", "d", 0.86, [0.7, 0.9]),
             ("d", "c", 0.14, [0.1, 0.3]), ("e", "f", 0.85, [0.7, 0.9]), ("f", "e", 0.15, [0.1, 0.3])]
    plots.plot_probability_of_improvement({"m": _comparison(names, pairs)}, tmp_path)
    fig = figures["probability_of_improvement.png"]
    assert _size(fig) == pytest.approx((3.0 + 0.55 * 6, 2.5 + 0.5 * 6))
    ax, bar = fig.axes
    assert ax.images[0].get_cmap().name == "RdBu"
    # Past 0.35 from one half the cell is dark: white text; up to 0.35 (0.85 and 0.15 included), black.
    assert [(t.get_text(), t.get_color()) for t in ax.texts] == [
        ("0.90", "white"), ("0.10", "white"), ("0.86", "white"), ("0.14", "white"), ("0.85", "black"),
        ("0.15", "black")]
    for text in ax.texts:
        assert (text.get_ha(), text.get_va()) == ("center", "center")
        assert text.get_fontsize() == pytest.approx(X_SMALL)
    assert ax.get_xticklabels()[0].get_fontsize() == pytest.approx(SMALL)
    assert ax.get_yticklabels()[0].get_fontsize() == pytest.approx(SMALL)
    assert ax.title.get_fontsize() == MEDIUM
    long = "x" * 18 + " " + "y" * 18
    plots.plot_probability_of_improvement({"m": _comparison([long, long[:-1], *"cdef"], [])}, tmp_path)
    ax = figures["probability_of_improvement.png"].axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()[:2]] == [  # names wrap past 36 characters
        "x" * 18 + "\n" + "y" * 18 + "  1", long[:-1] + "  2"]
    # The colour bar: a slim bar (4% of the axes' width, 2% away) just right of the matrix.
    axes_box, bar_box = ax.get_position(original=True), bar.get_position(original=True)
    assert bar_box.width == pytest.approx(0.04 * 0.775) and bar_box.x0 == pytest.approx(axes_box.x1 + 0.02 * 0.775)


def _reference_fit(margin, title="a title much wider than two inches of figure, surely", above=False):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = Figure(figsize=(2, 2))
    FigureCanvasAgg(fig)
    fig.subplots().set_title(title)
    if above:  # text past the top and the bottom edges, where no layout moves it
        fig.text(0.5, 1.0, "above\nthe top", va="bottom")
        fig.text(0.5, 0.0, "below", va="top")
    return fig


def test_fit_to_text_grows_by_the_overhang_and_a_margin_each_side():
    plain, wide, default = _reference_fit(0.0), _reference_fit(0.5), _reference_fit(0.0)
    plots.fit_to_text(plain, margin=0.0, rounds=1)
    plots.fit_to_text(wide, margin=0.5, rounds=1)
    assert tuple(wide.get_size_inches() - plain.get_size_inches()) == pytest.approx((1.0, 1.0))
    plots.fit_to_text(default, rounds=1)
    assert tuple(default.get_size_inches() - plain.get_size_inches()) == pytest.approx((0.16, 0.16))
    assert plain.get_size_inches()[0] > 2.0
    # Without rounds given, it goes on until the text fits.
    fitted = _reference_fit(0.0)
    plots.fit_to_text(fitted)
    box = fitted.get_tightbbox(fitted.canvas.get_renderer())
    width, height = fitted.get_size_inches()
    assert box.x0 >= -0.01 and box.x1 <= width + 0.01 and box.y0 >= -0.01 and box.y1 <= height + 0.01


def test_saved_at_110_dpi(tmp_path, monkeypatch):
    seen = []
    original = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, path, **kw: (seen.append((path, kw)), original(self, path, **kw)))
    fig = Figure(figsize=(2, 1))
    fig.subplots().plot([0, 1], [0, 1])
    plots._save(fig, tmp_path, "x.png")
    assert seen == [(tmp_path / "x.png", {"dpi": 110})]
    from PIL import Image

    width, height = fig.get_size_inches()
    assert Image.open(tmp_path / "x.png").size == (round(width * 110), round(height * 110))


def test_colors_are_matplotlib_tab10_then_tab20():
    assert [to_hex(c) for c in plots.group_colors(["x", "y", "z"]).values()] == ["#1f77b4", "#ff7f0e", "#2ca02c"]
    ten = plots.group_colors([str(i) for i in range(10)])
    assert to_hex(ten["1"]) == "#ff7f0e" and to_hex(ten["9"]) == "#17becf"  # ten groups: still tab10
    many = plots.group_colors([str(i) for i in range(21)])
    assert to_hex(many["0"]) == "#1f77b4" and to_hex(many["1"]) == "#aec7e8"  # tab20's light blue second
    assert to_hex(many["19"]) == "#9edae5" and many["20"] == many["0"]  # past 20 the colours come round again
    assert matplotlib.colormaps["tab20"].N == 20


def _marker_path(marker):
    from matplotlib.markers import MarkerStyle

    style = MarkerStyle(marker)
    return style.get_path().transformed(style.get_transform()).vertices.tolist()


def test_names_in_file_names_and_wrapped_labels():
    assert plots._slug("Eval/Return") == "Eval_Return" and plots._slug("X/aX_") == "X_aX"
    assert plots.wrap("x" * 50) == "x" * 50  # an override longer than a line is never cut
    assert plots.wrap("lr=1 net=res-net-fifty-layers-deep", 12) == "lr=1\nnet=res-net-fifty-layers-deep"


def test_x_labels_of_groups_on_different_axes_are_joined(figures, tmp_path):
    seeds = [(np.array([0.0, 200.0]), np.array([0.0, 8.0]), None)]
    b = _curve()
    b["curve"]["x"] = "env step"
    plots.plot_learning_curves({"a": _curve(), "b": b}, {"a": seeds, "b": seeds}, COLORS, tmp_path)
    assert figures["learning_curves.png"].axes[0].get_xlabel() == "env step / step"


def test_markers_band_and_file_names_of_single_figures(figures, tmp_path):
    plots.plot_final_scores({"a": _scores([1.0, 2.0])}, COLORS, tmp_path)
    seeds, iqm = [c for c in figures["final_scores.png"].axes[0].collections if isinstance(c, PathCollection)]
    assert iqm.get_paths()[0].vertices.tolist() == _marker_path("D")
    assert seeds.get_paths()[0].vertices.tolist() == _marker_path("o")
    plots.plot_time_to_threshold({"a": _scores([1.0], threshold=_threshold({"0": 1.0, "1": None}))}, COLORS, tmp_path)
    _, never = [c for c in figures["time_to_threshold.png"].axes[0].collections if isinstance(c, PathCollection)]
    assert never.get_paths()[0].vertices.tolist() == _marker_path("x")
    images = plots.plot_performance_profiles({"m": _comparison(list("abcd"))}, COLORS, tmp_path)
    assert images[0]["file"] == "performance_profile.png"
    (ax,) = figures["performance_profile.png"].axes
    assert ax.get_legend()._loc == 0  # four entries: inside
    assert len([c for c in ax.collections if isinstance(c, PolyCollection)]) == 4  # each profile's CI band
    plots.plot_probability_of_improvement({"m": _comparison(list("abcde"))}, tmp_path)
    assert not figures["probability_of_improvement.png"].axes[0].images  # five groups: still bars



def test_fit_to_text_grows_by_exactly_the_text_past_each_edge():
    fig = _reference_fit(0.0, above=True)
    fig.tight_layout()
    fig.canvas.draw()
    box = fig.get_tightbbox(fig.canvas.get_renderer())  # done by hand: the overhang after one layout
    expected = (2.0 + max(0.0, -box.x0) + max(0.0, box.x1 - 2.0), 2.0 + max(0.0, -box.y0) + max(0.0, box.y1 - 2.0))
    assert expected[0] > 2.5 and box.y1 > 2.2 and box.y0 < -0.1  # past both sides, the top and the bottom
    grown = _reference_fit(0.0, above=True)
    plots.fit_to_text(grown, margin=0.0, rounds=1)
    assert tuple(grown.get_size_inches()) == pytest.approx(expected)


def test_fit_to_text_is_quiet_about_axes_tight_layout_cannot_place():
    import warnings

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = Figure(figsize=(3, 2))
    FigureCanvasAgg(fig)
    fig.add_axes((0.1, 0.1, 0.8, 0.8)).set_title("free-standing axes")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plots.fit_to_text(fig)
    assert caught == []

"""pipeline.games.plots on tables written by hand: what the revenue-vs-reserve figure draws, and coverage's counts."""

from __future__ import annotations

import struct

import matplotlib
import matplotlib.colors as mcolors
import numpy as np
import pytest
from cycler import cycler
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

import pipeline.games.plots as plots
from pipeline.games.plots import coverage, plot_revenue_vs_reserve


def _table(points, lower=None, upper=None, truth=None, prefix="cf", eps="0.01"):
    """points etc. keyed by reserve; rules written out of reserve order on purpose."""
    t = {}
    for r in (1.0, 0.0, 0.5):
        name = f"second_price_r{r}"
        t[f"{prefix}/{name}/point"] = points[r]
        if lower is not None:
            t[f"{prefix}/{name}/lower_eps{eps}"] = lower[r]
            t[f"{prefix}/{name}/upper_eps{eps}"] = upper[r]
        if truth is not None:
            t[f"{prefix}/{name}/truth"] = truth[r]
    return t


@pytest.fixture
def figures(monkeypatch):
    made = []

    class Capture(Figure):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(plots, "Figure", Capture)
    return made


def _png_size(path):
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def _fills(ax):
    return [c for c in ax.collections if isinstance(c, PolyCollection)]


def _y_range_at(collection, x):
    v = collection.get_paths()[0].vertices
    ys = v[np.isclose(v[:, 0], x), 1]
    return ys.min(), ys.max()


def test_one_seed_point_line_sorted_by_reserve_and_labels(tmp_path, figures):
    t = _table({0.0: 0.3, 0.5: 0.4, 1.0: 0.1})
    out = plot_revenue_vs_reserve([t], tmp_path / "a" / "b" / "rev.png")
    assert out == tmp_path / "a" / "b" / "rev.png"
    assert _png_size(out) == (768, 528)  # 6.4 x 4.4 inches at 120 dpi
    (fig,) = figures
    (ax,) = fig.axes
    (line,) = ax.lines
    assert list(line.get_xdata()) == [0.0, 0.5, 1.0]
    assert list(line.get_ydata()) == [0.3, 0.4, 0.1]
    assert mcolors.same_color(line.get_color(), "tab:blue") and line.get_linewidth() == 2
    assert line.get_label() == "point estimate (eps=0)"
    assert _fills(ax) == []  # one seed, no bounds: nothing shaded
    assert ax.get_xlabel() == "reserve price (second price)"
    assert ax.get_ylabel() == "expected revenue"
    assert ax.get_title() == "Counterfactual revenue vs reserve"
    legend = ax.get_legend()
    assert [x.get_text() for x in legend.get_texts()] == ["point estimate (eps=0)"]
    assert legend.get_texts()[0].get_fontsize() == 8
    gridlines = ax.xaxis.get_gridlines()
    assert gridlines[0].get_visible() and gridlines[0].get_alpha() == 0.3


def test_several_seeds_mean_line_range_band_bounds_and_truth(tmp_path, figures):
    truth = {0.0: 0.33, 0.5: 0.41, 1.0: 0.0}
    a = _table({0.0: 0.2, 0.5: 0.4, 1.0: 0.1}, {0.0: 0.1, 0.5: 0.3, 1.0: 0.0}, {0.0: 0.5, 0.5: 0.6, 1.0: 0.2}, truth)
    b = _table({0.0: 0.4, 0.5: 0.6, 1.0: 0.3}, {0.0: 0.3, 0.5: 0.1, 1.0: 0.2}, {0.0: 0.7, 0.5: 0.8, 1.0: 0.4}, truth)
    # a second, wider epsilon with its own bounds
    for t, lo, hi in ((a, -1.0, 2.0), (b, -3.0, 4.0)):
        for r in (0.0, 0.5, 1.0):
            t[f"cf/second_price_r{r}/lower_eps0.1"] = lo
            t[f"cf/second_price_r{r}/upper_eps0.1"] = hi
    plot_revenue_vs_reserve([a, b], tmp_path / "rev.png", title="My title")
    (ax,) = figures[0].axes
    point, dashed = ax.lines
    assert np.allclose(point.get_ydata(), [0.3, 0.5, 0.2])  # the seeds' mean
    assert list(dashed.get_xdata()) == [0.0, 0.5, 1.0] and list(dashed.get_ydata()) == [0.33, 0.41, 0.0]
    assert dashed.get_linestyle() == "--" and mcolors.same_color(dashed.get_color(), "k")
    assert dashed.get_linewidth() == 1.5 and dashed.get_label() == "truth"
    wide, narrow, seeds = _fills(ax)
    assert wide.get_label() == "bounds, eps=0.1" and narrow.get_label() == "bounds, eps=0.01"
    assert (wide.get_alpha(), narrow.get_alpha()) == (0.12, 0.35)  # the widest epsilon palest
    assert _y_range_at(wide, 0.5) == pytest.approx((-2.0, 3.0))
    # mean lower to mean upper per reserve
    for x, lo, hi in ((0.0, 0.2, 0.6), (0.5, 0.2, 0.7), (1.0, 0.1, 0.3)):
        assert _y_range_at(narrow, x) == pytest.approx((lo, hi))
    for band in (wide, narrow):
        assert mcolors.same_color(band.get_facecolor()[0][:3], mcolors.to_rgb("tab:blue"))
        assert band.get_linewidth()[0] == 0
    assert seeds.get_label() == "point, range over 2 seeds"
    assert seeds.get_alpha() == 0.35 and seeds.get_linewidth()[0] == 0
    assert mcolors.same_color(seeds.get_facecolor()[0][:3], mcolors.to_rgb("tab:orange"))
    for x, lo, hi in ((0.0, 0.2, 0.4), (0.5, 0.4, 0.6), (1.0, 0.1, 0.3)):
        assert _y_range_at(seeds, x) == pytest.approx((lo, hi))
    assert ax.get_title() == "My title"
    assert [x.get_text() for x in ax.get_legend().get_texts()] == [
        "bounds, eps=0.1", "bounds, eps=0.01", "point estimate (eps=0)", "point, range over 2 seeds", "truth",
    ]


def test_three_epsilons_are_shaded_palest_to_darkest_by_width(tmp_path, figures):
    t = _table({0.0: 0.3, 0.5: 0.4, 1.0: 0.1})
    for eps in ("10", "0.02", "2"):
        for r in (0.0, 0.5, 1.0):
            t[f"cf/second_price_r{r}/lower_eps{eps}"] = 0.0
            t[f"cf/second_price_r{r}/upper_eps{eps}"] = 1.0
    plot_revenue_vs_reserve([t], tmp_path / "rev.png")
    fills = _fills(figures[0].axes[0])
    assert [f.get_label() for f in fills] == ["bounds, eps=10", "bounds, eps=2", "bounds, eps=0.02"]
    assert [f.get_alpha() for f in fills] == pytest.approx([0.12, 0.235, 0.35])
    for f in fills:
        assert mcolors.same_color(f.get_facecolor()[0][:3], mcolors.to_rgb("tab:blue"))


def test_the_figure_keeps_its_colours_widths_and_legend_place_whatever_the_style(tmp_path, figures):
    truth = {0.0: 0.33, 0.5: 0.41, 1.0: 0.0}
    a = _table({0.0: 0.2, 0.5: 0.4, 1.0: 0.1}, {0.0: 0.1, 0.5: 0.3, 1.0: 0.0}, {0.0: 0.5, 0.5: 0.6, 1.0: 0.2}, truth)
    b = _table({0.0: 0.4, 0.5: 0.6, 1.0: 0.3}, {0.0: 0.3, 0.5: 0.1, 1.0: 0.2}, {0.0: 0.7, 0.5: 0.8, 1.0: 0.4},
               {0.0: 9.0, 0.5: 9.0, 1.0: 9.0})
    style = {"axes.prop_cycle": cycler(color=["red", "green", "purple"]), "lines.linewidth": 3.0,
             "legend.loc": "upper left"}
    with matplotlib.rc_context(style):
        plot_revenue_vs_reserve([a, b], tmp_path / "rev.png")
    (ax,) = figures[0].axes
    point, dashed = ax.lines
    assert mcolors.same_color(point.get_color(), "tab:blue") and point.get_linewidth() == 2
    assert dashed.get_linewidth() == 1.5
    assert list(dashed.get_ydata()) == [0.33, 0.41, 0.0]  # the first table's truth
    bounds, seeds = _fills(ax)
    assert mcolors.same_color(bounds.get_facecolor()[0][:3], mcolors.to_rgb("tab:blue"))
    assert mcolors.same_color(seeds.get_facecolor()[0][:3], mcolors.to_rgb("tab:orange"))
    assert ax.get_legend()._loc == 0  # "best"


def test_truth_is_drawn_only_when_every_table_has_it(tmp_path, figures):
    truth = {0.0: 0.33, 0.5: 0.41, 1.0: 0.0}
    a = _table({0.0: 0.2, 0.5: 0.4, 1.0: 0.1}, truth=truth)
    b = _table({0.0: 0.2, 0.5: 0.4, 1.0: 0.1}, truth=truth)
    del b["cf/second_price_r0.5/truth"]
    plot_revenue_vs_reserve([a, b], tmp_path / "rev.png")
    assert len(figures[0].axes[0].lines) == 1


def test_welfare_tables_under_cfw_and_other_prefixes_ignored(tmp_path, figures):
    t = _table({0.0: 0.5, 0.5: 0.6, 1.0: 0.2}, prefix="cfw")
    t |= _table({0.0: 9.0, 0.5: 9.0, 1.0: 9.0}, {0.0: 0, 0.5: 0, 1.0: 0}, {0.0: 1, 0.5: 1, 1.0: 1})  # cf/ keys
    t["cfw/first_price_n3/point"] = 7.0
    t["cfw/second_price_r0.5/extra/point"] = 7.0
    plot_revenue_vs_reserve([t], tmp_path / "w.png", prefix="cfw")
    (ax,) = figures[0].axes
    assert list(ax.lines[0].get_ydata()) == [0.5, 0.6, 0.2]
    assert _fills(ax) == []
    assert ax.get_ylabel() == "expected welfare"
    assert ax.get_title() == "Counterfactual welfare vs reserve"


def test_refusals(tmp_path):
    with pytest.raises(ValueError) as err:
        plot_revenue_vs_reserve([], tmp_path / "x.png")
    assert str(err.value) == "plot_revenue_vs_reserve needs at least one table"
    with pytest.raises(ValueError) as err:
        plot_revenue_vs_reserve([{"cf/first_price_n2/point": 1.0}], tmp_path / "x.png", prefix="cfw")
    assert str(err.value) == "no 'cfw/second_price_r<reserve>/point' keys in the first table"
    with pytest.raises(ValueError) as err:
        coverage([], ["second_price_r0.5"], [0.01])
    assert str(err.value) == "coverage needs at least one table"
    with pytest.raises(KeyError) as err:
        coverage([{}], ["second_price_r0.5"], [0.01], prefix="cfw")
    assert err.value.args[0] == "cfw/second_price_r0.5/truth missing: merge truth_table(...) into each table first"


def test_coverage_counts_bounds_that_hold_the_truth_edges_included():
    def t(lo, hi, truth, prefix="cf"):
        return {f"{prefix}/second_price_r0.5/lower_eps0.01": lo, f"{prefix}/second_price_r0.5/upper_eps0.01": hi,
                f"{prefix}/second_price_r0.5/truth": truth,
                f"{prefix}/second_price_r0.5/lower_eps0.1": lo - 1, f"{prefix}/second_price_r0.5/upper_eps0.1": hi + 1}

    tables = [t(0.0, 1.0, 0.0), t(0.0, 1.0, 1.0), t(0.0, 1.0, 1.5), t(0.0, 1.0, -0.5)]
    assert coverage(tables, ["second_price_r0.5"], [0.01, 0.1]) == {"second_price_r0.5": {0.01: 0.5, 0.1: 1.0}}
    welfare = [t(0.0, 1.0, 2.5, "cfw")]
    assert coverage(welfare, ["second_price_r0.5"], [0.01, 0.1], prefix="cfw") == {
        "second_price_r0.5": {0.01: 0.0, 0.1: 0.0}
    }

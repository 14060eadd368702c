"""The tuner's figures: which are drawn, under which names, what the confirmation plot shows, and what a failed
draw leaves behind."""

from __future__ import annotations

import matplotlib
import optuna
import pytest
from optuna.visualization import matplotlib as ovm

import pipeline.tune.plots as plots


def _study(n_complete: int, n_other: int = 0):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    dist = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}
    for i in range(n_complete):
        study.add_trial(optuna.trial.create_trial(params={"x": i / 20}, distributions=dist, value=float(i % 3)))
    for _ in range(n_other):
        study.add_trial(optuna.trial.create_trial(params={"x": 0.5}, distributions=dist,
                                                  state=optuna.trial.TrialState.FAIL))
    return study


@pytest.fixture
def saved(monkeypatch):
    """The figures handed to _save, by file name (still written to disk)."""
    figures = {}
    original = plots._save

    def save(ax_or_fig, path):
        figures[path.name] = ax_or_fig.figure if hasattr(ax_or_fig, "figure") and not hasattr(ax_or_fig, "savefig") \
            else ax_or_fig
        original(ax_or_fig, path)

    monkeypatch.setattr(plots, "_save", save)
    return figures


def test_one_completed_trial_draws_the_history_only_and_says_why(tmp_path, saved):
    warnings: list[str] = []
    made = plots.write_plots(_study(1, n_other=12), [], None, tmp_path, warnings)
    assert made == {"optimization history": "optimization_history.png"}
    assert (tmp_path / "optimization_history.png").stat().st_size > 0
    assert warnings == ["no parameter importance plot: 1 completed trial; importances fitted to fewer than 10 are noise"]


def test_ten_completed_trials_draw_the_importances_too(tmp_path, saved):
    made = plots.write_plots(_study(10), [], None, tmp_path, warnings := [])
    assert made == {"optimization history": "optimization_history.png",
                    "parameter importances": "parameter_importances.png"}
    assert warnings == [] and (tmp_path / "parameter_importances.png").is_file()
    assert all(not matplotlib.pyplot.fignum_exists(f.number) for f in saved.values())  # closed after saving


def test_nine_completed_trials_are_too_few_for_importances(tmp_path):
    warnings: list[str] = []
    made = plots.write_plots(_study(9), [], None, tmp_path, warnings)
    assert list(made) == ["optimization history"]
    assert warnings == ["no parameter importance plot: 9 completed trials; importances fitted to fewer than 10 are noise"]


def test_a_failed_draw_is_a_warning_with_its_first_line_and_the_rest_is_written(tmp_path, monkeypatch):
    def broken(study):
        raise ValueError("cannot draw this\nsecond line")

    monkeypatch.setattr(ovm, "plot_optimization_history", broken)
    monkeypatch.setattr(ovm, "plot_param_importances", lambda study: (_ for _ in ()).throw(KeyError()))
    warnings: list[str] = []
    made = plots.write_plots(_study(10), [], {"primary_scores": [1.0], "primary_metric": "m"}, tmp_path, warnings)
    assert made == {"confirmed scores": "confirmed.png"}
    assert warnings == ["no optimization history plot: cannot draw this", "no parameter importances plot: KeyError"]


def test_the_confirmation_plot_draws_the_iqm_and_interval_the_table_shows(tmp_path, saved):
    """The line is the IQM tune.md's table shows (it was drawn as a "median" at the upper middle value: 4 of 1, 3,
    4, 5 where the IQM is 3.5), the bar its 95% interval; a candidate without scores draws neither."""
    from pipeline.tune.summary import markdown

    stats = {"iqm": 3.5, "iqm_ci": [2.0, 4.5], "n": 4}  # the IQM of 1, 3, 4, 5: the mean of the middle two
    candidates = [{"label": "trial3", "primary_scores": [5.0, 1.0, 3.0, 4.0], "primary": stats},
                  {"label": "trial8", "primary_scores": [], "primary": None}]
    preset = {"primary_scores": [2.0, 7.0, 6.0], "primary_metric": "eval/return_mean",
              "primary": {"iqm": 5.0, "iqm_ci": [2.0, 7.0], "n": 3}}
    made = plots.write_plots(_study(2), candidates, preset, tmp_path, [])
    assert made["confirmed scores"] == "confirmed.png" and (tmp_path / "confirmed.png").stat().st_size > 0
    (ax,) = saved["confirmed.png"].axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["trial3", "trial8", "preset"]
    assert list(ax.get_xticks()) == [0, 1, 2]
    assert ax.get_ylabel() == "eval/return_mean"
    assert ax.get_title() == "confirmed on fresh seeds (line: IQM, bar: its 95% CI)"
    points = [c.get_offsets().tolist() for c in ax.collections if c.get_offsets().size and c.get_paths()
              and not isinstance(c, matplotlib.collections.LineCollection)]
    assert points == [[[0, 5.0], [0, 1.0], [0, 3.0], [0, 4.0]], [[2, 2.0], [2, 7.0], [2, 6.0]]]
    lines = [seg.tolist() for c in ax.collections if isinstance(c, matplotlib.collections.LineCollection)
             for seg in c.get_segments()]
    assert lines == [[[-0.25, 3.5], [0.25, 3.5]], [[0.3, 2.0], [0.3, 4.5]], [[1.75, 5.0], [2.25, 5.0]], [[2.3, 2.0], [2.3, 7.0]]]
    table = markdown({"experiment": "e", "warnings": [], "study_name": "s", "storage": "x", "sampler": "tpe",
                      "pruner": "none", "objective": "iqm", "direction": "maximize", "tuning_seeds": [0],
                      "trials": {"total": 1, "completed": 1, "pruned": 0, "failed": 0}, "best_params": None,
                      "confirm_seeds": [1, 2, 3, 4], "tie_break": None, "verdict": "v",
                      "candidates": [{**candidates[0], "value": 3.5}], "preset": {**preset, "value": 5.0,
                                                                                   "time_to_threshold_s": None}},
                     tmp_path)
    assert "| 3.5 [2, 4.5] |" in table and "| 5 [2, 7] |" in table  # the numbers the lines are drawn at
    assert [c.get_alpha() for c in ax.collections if not isinstance(c, matplotlib.collections.LineCollection)] == [0.6] * 3
    assert saved["confirmed.png"].get_size_inches() == pytest.approx([1.6 * 3 + 2, 3.5])


def test_the_confirmation_plot_without_a_metric_name(tmp_path, saved):
    plots.write_plots(_study(2), [], {"primary_scores": [1.0, 2.0], "primary_metric": None}, tmp_path, [])
    (ax,) = saved["confirmed.png"].axes
    assert ax.get_ylabel() == "primary metric"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["preset"]


def test_figures_are_saved_at_100_dpi_whatever_the_settings(tmp_path, monkeypatch, saved):
    from PIL import Image

    monkeypatch.setitem(matplotlib.rcParams, "savefig.dpi", 50)
    monkeypatch.setitem(matplotlib.rcParams, "figure.dpi", 50)
    plots.write_plots(_study(2), [], {"primary_scores": [1.0], "primary_metric": "m"}, tmp_path, [])
    for name in ("optimization_history.png", "confirmed.png"):
        width, height = saved[name].get_size_inches()
        # To the pixel: Agg truncates a fractional size (5.8555 inches: 585 pixels), round() would say 586.
        assert Image.open(tmp_path / name).size == pytest.approx((width * 100, height * 100), abs=1), name

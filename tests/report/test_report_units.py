"""Fast unit tests of the report's pieces (grouping, counterfactual coverage, summary, JSON cleaning), on records
built by hand; the expected groups, names, fractions and counts are worked out by hand in each test."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from pipeline.config.grouping import config_id
from pipeline.report.build import default_out_dir, status_counts, to_strict_json
from pipeline.report.collect import ReportedRun, ReportInputError
from pipeline.report.counterfactual import counterfactual_markdown, counterfactual_sections
from pipeline.report.groups import group_runs


def _run(name: str, **result) -> ReportedRun:
    return ReportedRun(dir=Path("/runs") / name, input_root=Path("/runs"), result=result)


# --- groups.py ---------------------------------------------------------------------------------------------


def test_seeds_of_one_config_are_one_group_named_by_what_differs():
    a0 = _run("a0", seed=0, experiment="dqn", config={"lr": 0.1, "gamma": 0.9, "seed": 0})
    a1 = _run("a1", seed=1, experiment="dqn", config={"lr": 0.1, "gamma": 0.9, "seed": 1})
    b0 = _run("b0", seed=0, experiment="dqn", config={"lr": 0.2, "gamma": 0.9, "seed": 0})
    groups = group_runs([b0, a0, a1])
    assert list(groups) == ["dqn lr=0.1", "dqn lr=0.2"]
    assert groups["dqn lr=0.1"] == [a0, a1]
    assert groups["dqn lr=0.2"] == [b0]
    assert (a0.report_group, a1.report_group, b0.report_group) == ("dqn lr=0.1", "dqn lr=0.1", "dqn lr=0.2")
    assert a0.group == "dqn lr=0.1"


def test_a_config_alone_in_its_experiment_is_named_by_the_experiment():
    one = _run("x", experiment="dqn", config={"lr": 0.1})
    other = _run("y", experiment="ppo", config={"lr": 0.5})
    assert group_runs([one, other]) == {"dqn": [one], "ppo": [other]}


def test_the_experiment_name_comes_from_the_config_then_the_record():
    named = _run("a", experiment="rec", task="t", config={"name": "from_config", "x": 1})
    experiment = _run("b", experiment="rec", task="t", config={"x": 2})
    task = _run("c", task="sometask", config={"x": 3})
    bare = _run("d", config={"x": 4})
    empty_name = _run("e", experiment="rec2", config={"name": "", "x": 5})
    assert set(group_runs([named, experiment, task, bare, empty_name])) == {
        "from_config", "rec", "sometask", "run", "rec2"}


def test_hydra_choices_name_a_differing_config_group():
    a = _run("a", experiment="dqn", config={"model": {"kind": "mlp", "h": 64}},
             choices={"model": "mlp", "logger": "csv"})
    b = _run("b", experiment="dqn", config={"model": {"kind": "dueling", "h": 64}},
             choices={"model": "dueling", "logger": "wandb"})
    # A `choices` that is not a mapping is no choices at all: the differing keys name the group.
    c = _run("c", experiment="ppo", config={"model": {"kind": "mlp"}, "lr": 1}, choices="model=mlp")
    d = _run("d", experiment="ppo", config={"model": {"kind": "mlp"}, "lr": 2}, choices=["x"])
    assert set(group_runs([a, b, c, d])) == {"dqn model=mlp", "dqn model=dueling", "ppo lr=1", "ppo lr=2"}


def test_names_cut_short_that_coincide_are_told_apart_by_the_config_id():
    x = {"a": 1, "b": 1, "c": 1, "d": 1, "e": 1}
    y = {"a": 1, "b": 1, "c": 1, "d": 1, "e": 2}
    z = {"a": 2, "b": 2, "c": 2, "d": 2, "e": 2}
    rx, ry, rz = (_run(n, experiment="exp", config=c) for n, c in (("x", x), ("y", y), ("z", z)))
    groups = group_runs([rx, ry, rz])
    short = "exp a=1 b=1 c=1 d=1 +1 more"
    assert groups == {short: [rx], f"{short} #{config_id(y)}": [ry], "exp a=2 b=2 c=2 d=2 +1 more": [rz]}
    # The first one met keeps the short name, whichever config id sorts first.
    rx, ry, rz = (_run(n, experiment="exp", config=c) for n, c in (("x", x), ("y", y), ("z", z)))
    assert group_runs([ry, rz, rx]) == {short: [ry], f"{short} #{config_id(x)}": [rx], "exp a=2 b=2 c=2 d=2 +1 more": [rz]}


def test_records_without_a_config_keep_their_own_group():
    old = _run("old", group="legacy", seed=0)
    old2 = _run("old2", group="legacy", seed=1, config={})
    odd = _run("odd", group="other", config="not a dict")
    # Same name as a config group: the record without config is told apart.
    clash = _run("clash", group="dqn")
    new = _run("new", experiment="dqn", config={"lr": 0.1})
    groups = group_runs([old, new, clash, odd, old2])
    assert groups == {"dqn": [new], "dqn (record without config)": [clash], "legacy": [old, old2], "other": [odd]}
    assert list(groups) == sorted(groups)
    assert clash.report_group == "dqn (record without config)"
    assert old2.report_group == "legacy"


def test_config_keys_that_do_not_change_results_do_not_split_or_name_groups():
    a = _run("a", experiment="dqn", config={"lr": 0.1, "seed": 0, "logger": {"name": "csv"}})
    b = _run("b", experiment="dqn", config={"lr": 0.1, "seed": 5, "logger": {"name": "wandb"}})
    assert group_runs([a, b]) == {"dqn": [a, b]}


# --- counterfactual.py -------------------------------------------------------------------------------------


def _cf_table(truth: float, bounds: dict[str, tuple[float, float]], rule: str = "second_price_r0.5") -> dict:
    table = {f"cf/{rule}/truth": truth, f"cf/{rule}/point": truth, "other/metric": 1.0}
    for eps, (lo, hi) in bounds.items():
        table[f"cf/{rule}/lower_eps{eps}"] = lo
        table[f"cf/{rule}/upper_eps{eps}"] = hi
    return table


def test_coverage_counts_the_seeds_whose_bounds_hold_the_truth(tmp_path):
    # Seed 0: eps 0.01 misses (0.40 > 0.35), eps 0.1 holds. Seed 1: both hold. Seed 2: both hold.
    # Seed 3: eps 0.01 misses, eps 0.1 misses too (upper 0.30 < truth 0.35).
    tables = [
        _cf_table(0.35, {"0.01": (0.40, 0.50), "0.1": (0.30, 0.50)}),
        _cf_table(0.35, {"0.01": (0.30, 0.40), "0.1": (0.20, 0.50)}),
        _cf_table(0.35, {"0.01": (0.35, 0.35), "0.1": (0.20, 0.50)}),
        _cf_table(0.35, {"0.01": (0.10, 0.20), "0.1": (0.10, 0.30)}),
    ]
    runs = [_run(f"s{i}", group="auction", status="ok", metrics=t) for i, t in enumerate(tables)]
    # Not counted: a failed run, an ok run without cf/ truths, an ok run without metrics.
    runs += [_run("f", group="auction", status="failed", metrics=tables[0]),
             _run("n", group="auction", status="ok", metrics={"cf/x/point": 1.0}),
             _run("m", group="auction", status="ok", metrics=None)]
    sections = counterfactual_sections(runs, tmp_path)
    assert list(sections) == ["auction"]
    section = sections["auction"]
    assert section["n_seeds"] == 4
    assert section["coverage"] == {"second_price_r0.5": {"0.01": 0.5, "0.1": 0.75}}
    assert section["figure"] == "revenue_vs_reserve_0.png"
    assert (tmp_path / "revenue_vs_reserve_0.png").stat().st_size > 0


def test_first_price_only_groups_get_no_figure_and_figures_are_numbered_by_group(tmp_path):
    first = [_run(f"a{i}", group="a first", status="ok",
                  metrics=_cf_table(0.4, {"0.05": (0.3, 0.5)}, rule="first_price_n2")) for i in range(2)]
    second = [_run("b", group="b second", status="ok", metrics=_cf_table(0.4, {"0.05": (0.5, 0.6)}))]
    sections = counterfactual_sections(second + first, tmp_path)
    assert list(sections) == ["a first", "b second"]
    assert sections["a first"] == {"n_seeds": 2, "coverage": {"first_price_n2": {"0.05": 1.0}}}
    assert sections["b second"]["coverage"] == {"second_price_r0.5": {"0.05": 0.0}}
    assert sections["b second"]["figure"] == "revenue_vs_reserve_1.png"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["revenue_vs_reserve_1.png"]


def test_the_figure_title_names_the_group_and_its_seeds(tmp_path, monkeypatch):
    import pipeline.games.plots as games_plots

    calls = []
    monkeypatch.setattr(games_plots, "plot_revenue_vs_reserve",
                        lambda tables, path, title=None: calls.append((len(tables), Path(path), title)))
    runs = [_run(f"s{i}", group="g", status="ok", metrics=_cf_table(0.3, {"0.1": (0.2, 0.4)})) for i in range(3)]
    counterfactual_sections(runs, tmp_path)
    assert calls == [(3, tmp_path / "revenue_vs_reserve_0.png", "g: revenue vs reserve over 3 seed(s)")]


def test_several_rules_and_epsilons_are_read_from_the_keys(tmp_path):
    table = {**_cf_table(0.4, {"0.001": (0.39, 0.41), "0.2": (0.1, 0.9)}, rule="second_price_r0.0"),
             **_cf_table(0.5, {"0.001": (0.6, 0.7), "0.2": (0.1, 0.9)}, rule="first_price_n3")}
    (section,) = counterfactual_sections([_run("s", group="g", status="ok", metrics=table)], tmp_path).values()
    assert section["coverage"] == {"first_price_n3": {"0.001": 0.0, "0.2": 1.0},
                                   "second_price_r0.0": {"0.001": 1.0, "0.2": 1.0}}


def test_counterfactual_markdown_is_a_table_per_group():
    sections = {
        "g1": {"n_seeds": 4, "coverage": {"second_price_r0.5": {"0.01": 0.5, "0.1": 0.75},
                                          "first_price_n2": {"0.1": 1.0}}, "figure": "revenue_vs_reserve_0.png"},
        "g2": {"n_seeds": 1, "coverage": {"first_price_n2": {"0.05": 0.0}}},
    }
    assert counterfactual_markdown(sections) == [
        "## Counterfactual coverage: g1",
        "",
        "Fraction of the 4 seed(s) whose robust bounds contain the true value.",
        "",
        "| rule | eps 0.01 | eps 0.1 |",
        "|---|---|---|",
        "| second_price_r0.5 | 0.50 | 0.75 |",
        "| first_price_n2 | nan | 1.00 |",
        "",
        "![revenue vs reserve](revenue_vs_reserve_0.png)",
        "",
        "## Counterfactual coverage: g2",
        "",
        "Fraction of the 1 seed(s) whose robust bounds contain the true value.",
        "",
        "| rule | eps 0.05 |",
        "|---|---|",
        "| first_price_n2 | 0.00 |",
        "",
    ]
    assert counterfactual_markdown({}) == []


def test_epsilon_columns_are_in_numeric_order():
    section = {"n_seeds": 2, "coverage": {"r": {"0.1": 1.0, "0.05": 0.5, "1e-3": 0.0}}}
    assert counterfactual_markdown({"g": section})[4] == "| rule | eps 1e-3 | eps 0.05 | eps 0.1 |"


# --- build.py helpers -------------------------------------------------------------------------------------


def test_to_strict_json_leaves_only_plain_json_types():
    value = {
        1: np.float32(0.5), "nan": float("nan"), "inf": np.float64(np.inf), "ninf": -math.inf,
        "ints": (np.int64(3), 4), "arr": np.array([[1.5, np.nan]]), "flag": np.bool_(True), "b": False,
        "path": Path("/a/b"), "s": "text", "none": None,
    }
    out = to_strict_json(value)
    assert out == {"1": 0.5, "nan": None, "inf": None, "ninf": None, "ints": [3, 4], "arr": [[1.5, None]],
                   "flag": True, "b": False, "path": "/a/b", "s": "text", "none": None}
    assert type(out["ints"][0]) is int and type(out["1"]) is float and type(out["flag"]) is bool
    assert type(out["b"]) is bool and type(out["arr"][0][0]) is float
    assert to_strict_json(np.int32(7)) == 7 and type(to_strict_json(np.int32(7))) is int


class _RunDir:
    """An os.PathLike that is not a pathlib.Path (str() of it is its repr, not the path)."""

    def __fspath__(self):
        return "/runs/seed3"


def test_to_strict_json_writes_any_pathlike_as_its_path():
    assert to_strict_json({"dir": _RunDir(), "dirs": [_RunDir()]}) == {"dir": "/runs/seed3", "dirs": ["/runs/seed3"]}


def test_status_counts_lists_every_status_then_the_unknown_ones():
    groups = {"a": {"status_counts": {"ok": 2, "failed": 1}}, "b": {"status_counts": {"ok": 3, "weird": 2}}}
    counts = status_counts(groups)
    assert counts == {"ok": 5, "failed": 1, "interrupted": 0, "pruned": 0, "running": 0, "weird": 2}
    assert list(counts) == ["ok", "failed", "interrupted", "pruned", "running", "weird"]


def test_default_out_dir_is_inside_the_one_input(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_out_dir(["~/sweep"]) == tmp_path / "sweep" / "report"
    assert default_out_dir([Path("x")]) == Path("x/report")
    for inputs in ([], ["a", "b"]):
        with pytest.raises(ReportInputError, match=rf"^{len(inputs)} input dirs given and no output dir; pass --out"):
            default_out_dir(inputs)



# --- summary.py -------------------------------------------------------------------------------------------


def test_summarize_groups_curves_and_comparisons_with_the_given_resampling(tmp_path):
    from report_runs import write_run

    from pipeline.report import collect_runs, stats
    from pipeline.report.summary import summarize

    for s, v in [(2, 30.0), (0, 10.0), (1, 50.0), (3, 20.0), (4, 70.0)]:
        write_run(tmp_path / f"g{s}", seed=s, group="g", value=v, curve=[(0, 0.0), (100, v)])
    write_run(tmp_path / "gf", seed=9, group="g", value=None, status="failed")
    # Lower is better here, higher in g: the comparison notes the disagreement; h has no curve.
    write_run(tmp_path / "h0", seed=0, group="h", value=3.0, extra={"higher_is_better": False})
    runs = collect_runs([tmp_path])[::-1]  # the table sorts by seed; the curve must follow the table's order
    out = summarize(runs, reps=20, seed=3)
    g, h = out["groups"]["g"], out["groups"]["h"]
    assert list(out["groups"]) == ["g", "h"]
    assert g["values"] == [10.0, 50.0, 30.0, 20.0, 70.0] and g["iqm"] == pytest.approx(100 / 3)
    members = [r for r in runs if r.group == "g"]
    assert g["iqm_ci"] == stats.group_stats("g", members, reps=20, seed=3)["iqm_ci"]
    assert g["iqm_ci"] != stats.group_stats("g", members)["iqm_ci"]
    # The curve's final point is the table's IQM and CI, to the last digit.
    assert g["curve"]["iqm"][-1] == g["iqm"]
    assert [g["curve"]["ci_low"][-1], g["curve"]["ci_high"][-1]] == g["iqm_ci"]
    assert len(out["curve_seeds"]["g"]) == 5
    assert h["curve"] is None and out["curve_seeds"]["h"] == []
    assert out["comparisons"] == stats.compare_groups(out["groups"], reps=20, seed=3)[0]
    assert out["comparisons"] != stats.compare_groups(out["groups"])[0]
    assert out["warnings"][0] == "group g has 1 failed run"
    assert out["warnings"][1].startswith("group h has only 1 ok seed")
    assert out["warnings"][2:] == ["groups on eval/return_mean disagree on higher_is_better; comparing as higher is better"]


# --- build.py ---------------------------------------------------------------------------------------------


def test_build_report_writes_the_json_and_markdown_it_returns(tmp_path, monkeypatch):
    import json

    from report_runs import write_run

    from pipeline.report import build_report
    from pipeline.report.collect import RunRecordWarning

    sweep = tmp_path / "sweep"
    write_run(sweep / "0", seed=0, group="a", value=1.0)
    write_run(sweep / "1", seed=1, group="a", value=2.0)
    for seed, value in ((2, 7.0), (3, 3.0), (4, 10.0)):
        write_run(sweep / f"a{seed}", seed=seed, group="a", value=value)
    write_run(sweep / "2", seed=0, group="b", value=None, status="interrupted")
    (sweep / "bad").mkdir()
    (sweep / "bad" / "result.json").write_text("{not json")
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.warns(RunRecordWarning, match="bad") as caught:
        report = build_report(str(sweep), out_dir="~/new/nested/out", reps=30, seed=4)
    skipped = [w for w in caught if issubclass(w.category, RunRecordWarning)]
    # Re-emitted for the caller, not from inside build_report (under mutmut a trampoline frame sits between).
    assert len(skipped) == 1 and not skipped[0].filename.endswith("build.py")
    out = tmp_path / "new" / "nested" / "out"
    # The numbers come from the given resampling (a summary with the defaults has another CI).
    from pipeline.report import collect_runs
    from pipeline.report.summary import summarize

    with pytest.warns(RunRecordWarning):
        runs = collect_runs([sweep])
    assert report["groups"]["a"]["iqm_ci"] == summarize(runs, reps=30, seed=4)["groups"]["a"]["iqm_ci"]
    assert report["groups"]["a"]["iqm_ci"] != summarize(runs, reps=30)["groups"]["a"]["iqm_ci"]
    assert report["groups"]["a"]["iqm_ci"] != summarize(runs, seed=4)["groups"]["a"]["iqm_ci"]
    assert report["inputs"] == [str(sweep.resolve())] and report["out_dir"] == str(out.resolve())
    assert (report["n_runs"], report["n_groups"]) == (6, 2)
    assert report["status_counts"] == {"ok": 5, "failed": 0, "interrupted": 1, "pruned": 0, "running": 0}
    assert report["partial"] is False
    assert report["settings"] == {"bootstrap_reps": 30, "seed": 4, "confidence": 0.95}
    assert len(report["warnings"]) >= 2 and "bad" in report["warnings"][0]
    assert all("bad" not in w for w in report["warnings"][1:])
    assert report["counterfactual"] == {}
    assert report["files"] == {"markdown": "report.md", "json": "report.json"}
    assert report["images"] and all((out / image["file"]).is_file() for image in report["images"])
    on_disk = (out / "report.json").read_text(encoding="utf-8")
    assert json.loads(on_disk) == report and on_disk.endswith("}\n") and '\n  "inputs"' in on_disk
    markdown = (out / "report.md").read_text(encoding="utf-8")
    assert markdown.startswith("#") and "| a |" in markdown.replace("`", "")


def test_build_report_defaults_to_a_report_dir_in_the_one_input_and_says_when_runs_still_train(tmp_path):
    from report_runs import write_run

    from pipeline.report import build_report

    write_run(tmp_path / "0", seed=0, group="a", value=1.0)
    write_run(tmp_path / "1", seed=1, group="a", value=None, status="running")
    cf = _cf_table(0.35, {"0.1": (0.3, 0.4)})
    write_run(tmp_path / "2", seed=0, group="auction", value=None, extra={"metrics": cf})
    (tmp_path / "report").mkdir()  # a report dir left by an earlier build is written over
    report = build_report([tmp_path], reps=10)
    assert report["counterfactual"]["auction"]["figure"] == "revenue_vs_reserve_0.png"
    assert (tmp_path / "report" / "revenue_vs_reserve_0.png").is_file()
    assert report["out_dir"] == str((tmp_path / "report").resolve())
    assert (tmp_path / "report" / "report.json").is_file() and (tmp_path / "report" / "report.md").is_file()
    assert report["partial"] is True
    assert report["status_counts"]["running"] == 1
    assert report["settings"] == {"bootstrap_reps": 10, "seed": 0, "confidence": 0.95}
    assert build_report([tmp_path], reps=10)["n_runs"] == 3  # and again, into the report dir it wrote


@pytest.fixture
def ascii_locale():
    """A process whose default text encoding is ASCII (the C locale without UTF-8 mode)."""
    import locale

    before = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        yield
    finally:
        locale.setlocale(locale.LC_CTYPE, before)


def test_report_md_is_utf8_whatever_the_locale(tmp_path, ascii_locale):
    from report_runs import write_run

    from pipeline.report import build_report

    for seed, value in enumerate((1.0, 2.0)):
        write_run(tmp_path / str(seed), seed=seed, group="a", value=value)
    build_report([tmp_path], reps=10)
    assert "1.5 ± 0.7071" in (tmp_path / "report" / "report.md").read_text(encoding="utf-8")

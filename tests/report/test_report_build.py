"""A report built from synthetic run records, checked against hand-computed numbers."""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path

import numpy as np
import pytest
from report_runs import (
    OTHER_GROUP,
    OTHER_VALUES,
    RL_ERROR,
    RL_FAILED_SEED,
    RL_GROUP,
    RL_TIMES,
    RL_VALUES,
    THRESHOLD,
    write_run,
)

from pipeline.report import ReportInputError, build_report, collect_runs
from pipeline.report.collect import RunRecordWarning
from pipeline.report.plots import align_curves, mean_and_band


def _strict_json(path: Path) -> dict:
    def reject(constant: str) -> None:
        raise AssertionError(f"{path} holds non-strict JSON constant {constant}")

    return json.loads(path.read_text(), parse_constant=reject)


def test_collect_skips_reports_wandb_corrupt_and_duplicates(two_group_sweep):
    with pytest.warns(RunRecordWarning, match=r"corrupt.*result\.json"):
        runs = collect_runs([two_group_sweep, two_group_sweep / "nested", two_group_sweep / "0"])
    assert len(runs) == len(RL_VALUES) + 1 + len(OTHER_VALUES)
    assert {run.group for run in runs} == {RL_GROUP, OTHER_GROUP}


def test_collect_errors_name_the_path(tmp_path):
    missing = tmp_path / "no_such_sweep"
    with pytest.raises(ReportInputError, match="no_such_sweep.*does not exist"):
        collect_runs([missing])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ReportInputError, match=r"no run records \(result\.json\) found under .*empty"):
        collect_runs([empty])
    with pytest.raises(ReportInputError, match="--out"):
        build_report([empty, missing])


def test_group_numbers_match_hand_computation(two_group_report):
    rl = two_group_report["groups"][RL_GROUP]
    values = list(RL_VALUES.values())  # 480, 500, 450
    mean = (480.0 + 500.0 + 450.0) / 3
    assert rl["n_ok"] == 3 and rl["n_failed"] == 1
    assert rl["mean"] == pytest.approx(mean)
    assert rl["median"] == 480.0
    assert rl["std"] == pytest.approx(math.sqrt(sum((v - mean) ** 2 for v in values) / 2))
    assert (rl["min"], rl["max"]) == (450.0, 500.0)
    # 3 seeds: nothing trimmed.
    assert rl["iqm"] == pytest.approx(mean)
    assert {k: v["value"] for k, v in rl["per_seed"].items()} == {str(s): v for s, v in RL_VALUES.items()}
    assert rl["failed"][0]["seed"] == RL_FAILED_SEED
    assert rl["failed"][0]["error"] == RL_ERROR
    assert rl["failed"][0]["dir"].endswith("/3")

    threshold = rl["threshold"]
    assert threshold["threshold"] == THRESHOLD
    assert threshold["n_seeds"] == 3 and threshold["n_reached"] == 2
    assert threshold["per_seed_s"] == {str(s): t for s, t in RL_TIMES.items()}
    assert threshold["median_reached_s"] == pytest.approx((90.0 + 120.0) / 2)
    assert (threshold["min_reached_s"], threshold["max_reached_s"]) == (90.0, 120.0)
    # Sorted with never = infinity: [90, 120, inf] -> 120.
    assert threshold["median_all_s"] == 120.0

    other = two_group_report["groups"][OTHER_GROUP]
    assert other["n_ok"] == 6 and other["n_failed"] == 0
    assert other["mean"] == pytest.approx(sum(OTHER_VALUES.values()) / 6)
    assert other["median"] == pytest.approx((310.0 + 320.0) / 2)
    # 6 values, floor(6/4) = 1 trimmed each end: mean of 300, 310, 320, 330.
    assert other["iqm"] == pytest.approx(315.0)
    assert other["iqm_ci"][0] <= 315.0 <= other["iqm_ci"][1]
    assert other["threshold"] is None


def test_comparison_of_separated_groups(two_group_report):
    comparison = two_group_report["comparisons"]["eval/return_mean"]
    pairs = {(p["x"], p["y"]): p for p in comparison["probability_of_improvement"]}
    # Every RL seed beats every other seed: P = 1 and P(reverse) = 0 on every resample.
    assert pairs[(RL_GROUP, OTHER_GROUP)]["p"] == 1.0
    assert pairs[(RL_GROUP, OTHER_GROUP)]["ci"] == [1.0, 1.0]
    assert pairs[(OTHER_GROUP, RL_GROUP)]["p"] == 0.0
    profile = comparison["performance_profile"]
    assert len(profile["taus"]) == len(profile["profiles"][RL_GROUP])
    assert profile["profiles"][OTHER_GROUP][0] == pytest.approx(5 / 6)  # tau = min score, strict >


def test_warnings_and_counts(two_group_report, two_group_sweep):
    assert two_group_report["n_runs"] == 10
    assert two_group_report["inputs"] == [str(two_group_sweep.resolve())]
    warnings = two_group_report["warnings"]
    assert any(f"group {RL_GROUP} has only 3 ok seeds" in w for w in warnings)
    assert not any(f"group {OTHER_GROUP} has only" in w for w in warnings)
    assert any("corrupt" in w for w in warnings)


def test_files_written(two_group_report, two_group_sweep):
    out = two_group_sweep / "report"
    assert Path(two_group_report["out_dir"]) == out.resolve()
    on_disk = _strict_json(out / "report.json")
    assert on_disk == two_group_report
    kinds = {image["kind"] for image in two_group_report["images"]}
    assert kinds == {
        "learning_curves", "final_scores", "interval_estimates", "time_to_threshold",
        "performance_profile", "probability_of_improvement",
    }
    for image in two_group_report["images"]:
        png = out / image["file"]
        assert png.stat().st_size > 5000
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    markdown = (out / "report.md").read_text()
    assert f"> **Warning:** group {RL_GROUP} has only 3 ok seeds" in markdown
    # The failed seed's reason, on one line with its pipe escaped so the table holds.
    assert "RuntimeError: replay buffer \\| exploded" in markdown
    for image in two_group_report["images"]:
        assert f"]({image['file']})" in markdown
    assert "| dqn_cartpole | eval/return_mean | 3 | 1 | 476.7 ± 25.17 | 480 |" in markdown
    assert "2/3" in markdown  # seeds that reached the threshold


def test_single_run_dir_and_single_seed(tmp_path):
    run = write_run(tmp_path / "one", seed=0, group="solo", value=0.9, curve=[(0, 0.1), (10, 0.9)])
    report = build_report([run], reps=200)
    group = report["groups"]["solo"]
    assert (group["n_ok"], group["iqm"], group["iqm_ci"]) == (1, 0.9, [0.9, 0.9])
    assert group["std"] == 0.0
    assert "collapses" in group["ci_note"]
    assert report["comparisons"] == {}
    assert (run / "report" / "report.md").is_file()


def test_ok_run_without_finite_value_is_excluded_not_averaged(tmp_path):
    for seed in range(5):
        write_run(tmp_path / str(seed), seed=seed, group="g", value=float(seed))
    write_run(tmp_path / "nan", seed=5, group="g", value=float("nan"))
    report = build_report([tmp_path], tmp_path / "out", reps=200)
    group = report["groups"]["g"]
    assert group["n_ok"] == 5 and group["n_excluded"] == 1
    assert group["mean"] == pytest.approx(2.0)
    assert any("seed 5" in w and "excluded" in w for w in report["warnings"])
    _strict_json(tmp_path / "out" / "report.json")


def test_curve_alignment_exact_and_interpolated():
    grid, matrix = align_curves([(np.array([0.0, 10.0]), np.array([0.0, 1.0])),
                                 (np.array([0.0, 10.0]), np.array([2.0, 3.0]))])
    assert grid.tolist() == [0.0, 10.0]
    assert matrix.tolist() == [[0.0, 1.0], [2.0, 3.0]]
    mean, low, high = mean_and_band(matrix)
    assert mean.tolist() == [1.0, 2.0]
    # Two seeds 2 apart: std = sqrt(2), half-width = t(0.975, 1) * sqrt(2) / sqrt(2) = 12.706.
    assert high[0] - mean[0] == pytest.approx(12.7062, abs=1e-3)

    grid, matrix = align_curves([(np.array([0.0, 10.0]), np.array([0.0, 10.0])),
                                 (np.array([0.0, 5.0]), np.array([1.0, 2.0]))])
    assert grid.tolist() == [0.0, 5.0, 10.0]
    assert matrix[0].tolist() == [0.0, 5.0, 10.0]
    assert matrix[1][:2].tolist() == [1.0, 2.0] and math.isnan(matrix[1][2])
    mean, low, _ = mean_and_band(matrix)
    assert mean.tolist() == [0.5, 3.5, 10.0]
    assert math.isnan(low[2])  # one seed left: no band


def test_hundred_runs(tmp_path):
    rng = np.random.default_rng(0)
    for job in range(100):
        group = f"dqn_cartpole model=variant{job % 4}"
        value = float(rng.normal(400 + 20 * (job % 4), 30))
        steps = range(0, 10001, 500)
        write_run(tmp_path / "sweep" / str(job), seed=job // 4, group=group, value=value,
                  curve=[(s, value * s / 10000 + float(rng.normal(0, 5))) for s in steps],
                  rl={"env_steps": 10000, "env_steps_per_s": 1500.0,
                      "time_to_threshold_s": float(rng.uniform(20, 60)) if value > 420 else None,
                      "threshold": 420.0})
    start = time.perf_counter()
    report = build_report([tmp_path / "sweep"])
    elapsed = time.perf_counter() - start
    print(f"\n100 runs, 4 groups, 2000 bootstrap reps: report built in {elapsed:.2f} s")
    assert report["n_runs"] == 100
    assert sum(g["n_ok"] for g in report["groups"].values()) == 100
    assert len(report["comparisons"]["eval/return_mean"]["probability_of_improvement"]) == 4 * 3
    medians = {name: statistics.median(g["values"]) for name, g in report["groups"].items()}
    assert all(g["median"] == pytest.approx(medians[name]) for name, g in report["groups"].items())


def test_all_failed_group_lower_is_better_and_duplicate_seeds(tmp_path):
    sweep = tmp_path / "sweep"
    for seed in range(2):
        write_run(sweep / f"crash{seed}", seed=seed, group="crashes", value=None, status="failed",
                  error=f"ValueError: bad lr {seed}")
    for seed, loss in enumerate([0.1, 0.2, 0.3, 0.4, 0.5]):
        write_run(sweep / f"low{seed}", seed=seed, group="low", value=loss)
    for seed, loss in enumerate([0.6, 0.7, 0.8, 0.9, 1.0]):
        write_run(sweep / f"high{seed}", seed=seed, group="high", value=loss)
    write_run(sweep / "low_rerun", seed=0, group="low", value=0.1)
    for path in sweep.glob("*/result.json"):
        result = json.loads(path.read_text())
        result["higher_is_better"] = False
        path.write_text(json.dumps(result))

    report = build_report([sweep], reps=300)

    crashes = report["groups"]["crashes"]
    assert (crashes["n_ok"], crashes["n_failed"], crashes["iqm"]) == (0, 2, None)
    assert [f["error"] for f in crashes["failed"]] == ["ValueError: bad lr 0", "ValueError: bad lr 1"]
    assert any("group crashes has only 0 ok seeds" in w for w in report["warnings"])
    # Seed 0 of "low" appears twice: both kept, under distinct keys, and the report says so.
    low = report["groups"]["low"]
    assert sorted(low["per_seed"]) == ["0", "0#2", "1", "2", "3", "4"]
    assert any("group low has seed 0 2 times" in w for w in report["warnings"])
    # Lower is better: every "low" seed beats every "high" seed.
    comparison = report["comparisons"]["eval/return_mean"]
    assert comparison["groups"] == ["high", "low"] and comparison["higher_is_better"] is False
    pairs = {(p["x"], p["y"]): p["p"] for p in comparison["probability_of_improvement"]}
    assert pairs[("low", "high")] == 1.0 and pairs[("high", "low")] == 0.0
    assert comparison["performance_profile"]["direction"] == "score < tau"
    markdown = (sweep / "report" / "report.md").read_text()
    assert "| crashes | eval/return_mean | 0 | 2 | — |" in markdown
    assert "ValueError: bad lr 1" in markdown
    _strict_json(sweep / "report" / "report.json")

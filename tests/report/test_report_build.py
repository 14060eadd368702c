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
from pipeline.report.curves import align_held, iqm_curve, nan_iqm


def _strict_json(path: Path) -> dict:
    def reject(constant: str) -> None:
        raise AssertionError(f"{path} holds non-strict JSON constant {constant}")

    return json.loads(path.read_text(), parse_constant=reject)


def _assert_png(path: Path) -> None:
    """A real figure: a PNG that decodes to a picture with something drawn on it, not just a file."""
    from matplotlib import image as mpimg

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    pixels = mpimg.imread(path)
    assert pixels.shape[0] > 200 and pixels.shape[1] > 300, (path, pixels.shape)
    assert pixels[..., :3].std() > 0.05, path  # axes, text and lines, not a blank canvas


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
        _assert_png(out / image["file"])

    markdown = (out / "report.md").read_text()
    assert f"> **Warning:** group {RL_GROUP} has only 3 ok seeds" in markdown
    # The failed seed's reason, on one line with its pipe escaped so the table holds.
    assert "RuntimeError: replay buffer \\| exploded" in markdown
    for image in two_group_report["images"]:
        assert f"]({image['file']})" in markdown
    assert "| dqn_cartpole | eval/return_mean | 3 | 1 | 0 | 0 | 0 | 476.7 ± 25.17 | 480 |" in markdown
    assert "2/3" in markdown  # seeds that reached the threshold


def test_single_run_dir_and_single_seed(tmp_path):
    run = write_run(tmp_path / "one", seed=0, group="solo", value=0.9, curve=[(0, 0.1), (10, 0.9)])
    report = build_report([run], reps=200)
    group = report["groups"]["solo"]
    assert (group["n_ok"], group["iqm"], group["iqm_ci"]) == (1, 0.9, [0.9, 0.9])
    assert group["std"] == 0.0
    assert "collapses" in group["ci_note"]
    assert report["comparisons"] == {}
    markdown = (run / "report" / "report.md").read_text()
    assert "| solo | eval/return_mean | 1 | 0 | 0 | 0 | 0 | 0.9 ± 0 | 0.9 |" in markdown
    assert json.loads((run / "report" / "report.json").read_text())["groups"]["solo"]["iqm"] == 0.9


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


def test_curves_align_interpolate_and_hold_after_a_seed_stops():
    grid, values, live = align_held([(np.array([0.0, 10.0]), np.array([0.0, 10.0])),
                                     (np.array([0.0, 5.0]), np.array([1.0, 2.0])),
                                     (np.array([5.0, 10.0]), np.array([4.0, 6.0]))])
    assert grid.tolist() == [0.0, 5.0, 10.0]
    assert values[0].tolist() == [0.0, 5.0, 10.0]
    assert values[1].tolist() == [1.0, 2.0, 2.0]  # stopped at 5: holds 2 at 10
    assert math.isnan(values[2][0]) and values[2][1:].tolist() == [4.0, 6.0]  # nothing before its start
    assert live.tolist() == [[True, True, True], [True, True, False], [False, True, True]]


def test_iqm_per_step_matches_rliable_and_ignores_missing_seeds():
    from rliable import metrics

    rng = np.random.default_rng(3)
    scores = rng.normal(size=(9, 5))
    scores[7:, 0] = np.nan  # two seeds not started at the first step
    got = nan_iqm(scores)
    for step in range(5):
        column = scores[:, step][np.isfinite(scores[:, step])]
        assert got[step] == pytest.approx(metrics.aggregate_iqm(column.reshape(-1, 1)))
    # By hand: 8 seeds, 2 trimmed from each end.
    assert nan_iqm(np.array([[1.0], [2.0], [3.0], [4.0], [5.0], [6.0], [7.0], [100.0]]))[0] == pytest.approx(4.5)


def test_iqm_band_is_a_bootstrap_over_seeds():
    values = np.array([[0.0, 10.0], [0.0, 20.0], [0.0, 30.0], [0.0, 40.0]])
    iqm, low, high = iqm_curve(values, reps=500)
    assert iqm.tolist() == [0.0, 25.0]
    assert (low[0], high[0]) == (0.0, 0.0)  # every seed equal: no spread
    # A resample's IQM lies between the smallest and largest seed, and the band is not degenerate.
    assert 10.0 <= low[1] < 25.0 < high[1] <= 40.0


def test_seeds_that_stop_early_hold_and_the_band_stays_inside_the_bounds(tmp_path):
    """16 seeds solve CartPole at different steps and stop: the IQM curve ends at 500, not one seed's value."""
    rng = np.random.default_rng(0)
    stops = [20_000, 30_000, 30_000, 40_000, 40_000, 40_000, 50_000, 50_000, 50_000, 50_000, 60_000, 60_000, 70_000,
             70_000, 80_000, 100_000]
    for seed, stop in enumerate(stops):
        steps = list(range(0, stop + 1, 10_000))
        # Noisy rise that reaches 500 at the seed's last evaluation.
        curve = [(s, float(np.clip(500 * s / stop + rng.normal(0, 120), 0, 500))) for s in steps[:-1]] + [(stop, 500.0)]
        write_run(tmp_path / "sweep" / str(seed), seed=seed, group="dqn_cartpole", value=500.0, curve=curve,
                  rl={"env_steps": stop, "time_to_threshold_s": 10.0, "threshold": 475.0},
                  extra={"metric_bounds": {"eval/return_mean": [0, 500]}})
    report = build_report([tmp_path / "sweep"], tmp_path / "out", reps=300)
    curve = report["groups"]["dqn_cartpole"]["curve"]
    assert curve["x"] == "env steps" and curve["metric"] == "eval/return_mean" and curve["bounds"] == [0.0, 500.0]
    # The evaluation grid, then the final point (every seed's final evaluation) at the last step.
    assert curve["steps"] == [float(s) for s in range(0, 100_001, 10_000)] + [100_000.0]
    assert curve["last_point"] == "final"
    # Every seed contributes at every step; only the seed stopping at 100k is still running at the end.
    assert curve["n_seeds"] == [16] * 12
    assert curve["n_live"][-2] == 1 and curve["n_live"][3] == 15  # at 30k only the seed stopped at 20k is held
    assert curve["iqm"][-1] == 500.0 and curve["ci_low"][-1] == 500.0
    assert all(0.0 <= lo <= m <= hi <= 500.0 for lo, m, hi in zip(curve["ci_low"], curve["iqm"], curve["ci_high"]))
    assert sorted(h for h in curve["held_from"] if h is not None) == [float(s) for s in stops[:-1]]
    on_disk = _strict_json(tmp_path / "out" / "report.json")["groups"]["dqn_cartpole"]["curve"]
    assert on_disk["iqm"] == curve["iqm"] and len(on_disk["ci_high"]) == 12
    _assert_png(tmp_path / "out" / "learning_curves.png")
    assert "15 of 16 seeds stopped earlier and hold their final evaluation" in (tmp_path / "out" / "report.md").read_text()


def test_the_curve_ends_at_the_number_the_table_reports(tmp_path):
    """K-seed DQN: a seed stopped by a 10-episode evaluation of 500 has a lower 20-episode final evaluation.
    The curve holds that final evaluation after the stop and ends at the table's IQM and CI, not at 500."""
    # (stop step, in-training evaluations every 10k, final evaluation): by hand, not from the code.
    seeds = {0: (20_000, [10.0, 200.0, 500.0], 423.8), 1: (30_000, [9.0, 150.0, 300.0, 500.0], 480.0),
             2: (40_000, [12.0, 100.0, 250.0, 400.0, 460.0], 455.0), 3: (40_000, [8.0, 90.0, 200.0, 350.0, 430.0], 441.0),
             4: (40_000, [11.0, 50.0, 150.0, 300.0, 410.0], 399.0)}
    for seed, (stop, evals, final) in seeds.items():
        write_run(tmp_path / "sweep" / f"seed{seed}", seed=seed, group="dqn_cartpole", value=final,
                  curve=list(zip(range(0, stop + 1, 10_000), evals)),
                  rl={"env_steps": stop, "time_to_threshold_s": None, "threshold": 475.0},
                  extra={"metric_bounds": {"eval/return_mean": [0, 500]},
                         "config": {"task.final_eval_episodes": 20, "task.eval_episodes": 10}})
    report = build_report([tmp_path / "sweep"], tmp_path / "out", reps=300)
    group = report["groups"]["dqn_cartpole"]
    curve = group["curve"]
    # The table: 5 finals, one trimmed each end -> mean(423.8, 441, 455).
    assert group["iqm"] == pytest.approx((423.8 + 441.0 + 455.0) / 3, rel=1e-12)
    assert curve["iqm"][-1] == group["iqm"] and [curve["ci_low"][-1], curve["ci_high"][-1]] == group["iqm_ci"]
    assert curve["steps"][-2:] == [40_000.0, 40_000.0] and curve["last_point"] == "final"
    # At 30k seed 0 holds its final 423.8 (not the 500 that stopped it): values 423.8, 500, 400, 350, 300.
    at_30k = curve["steps"].index(30_000.0)
    assert curve["iqm"][at_30k] == pytest.approx((350.0 + 400.0 + 423.8) / 3, rel=1e-12)
    # At 40k (the evaluation grid) seeds 0 and 1 hold their finals; 2-4 show their in-training evaluations.
    # Values 423.8, 480, 460, 430, 410: one trimmed each end -> mean(423.8, 430, 460).
    assert curve["iqm"][-2] == pytest.approx((423.8 + 430.0 + 460.0) / 3, rel=1e-12)
    text = (tmp_path / "out" / "report.md").read_text()
    assert "final evaluation after training (20 greedy episodes" in text
    assert "in-training evaluations (10 episodes each)" in text
    assert "ends at the final evaluation, the table's IQM" in text


@pytest.mark.slow
def test_hundred_runs(tmp_path):
    rng = np.random.default_rng(0)
    written: dict[str, list[float]] = {}
    for job in range(100):
        group = f"dqn_cartpole model=variant{job % 4}"
        value = float(rng.normal(400 + 20 * (job % 4), 30))
        written.setdefault(group, []).append(value)
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
    # Checked against the values written, not against the report's own list of them.
    assert sorted(report["groups"]) == sorted(written)
    for name, values in written.items():
        assert report["groups"][name]["median"] == pytest.approx(statistics.median(values))
        assert report["groups"][name]["mean"] == pytest.approx(statistics.fmean(values))


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
    assert "| crashes | eval/return_mean | 0 | 2 | 0 | 0 | 0 | — |" in markdown
    assert "ValueError: bad lr 1" in markdown
    _strict_json(sweep / "report" / "report.json")


def test_report_groups_by_resolved_config_and_names_the_difference(tmp_path):
    base = {"name": "dqn_cartpole", "seed": 0, "seeding": {"deterministic": False}, "optimizer": {"lr": 0.0023},
            "trainer": {"enable_progress_bar": True}}
    quiet = {**base, "trainer": {"enable_progress_bar": False}}  # typed differently, same run
    deterministic = {**base, "seeding": {"deterministic": True}}
    runs = [(base, "dqn_cartpole"), (quiet, "dqn_cartpole trainer.enable_progress_bar=false"), (base, "dqn_cartpole"),
            (deterministic, "dqn_cartpole"), (deterministic, "dqn_cartpole")]
    for i, (config, typed_group) in enumerate(runs):
        write_run(tmp_path / "sweep" / str(i), seed=i, group=typed_group, value=100.0 + i,
                  extra={"config": {**config, "seed": i}})
    write_run(tmp_path / "sweep" / "old", seed=9, group="dqn_cartpole old", value=1.0)  # before records had a config
    report = build_report([tmp_path / "sweep"], tmp_path / "out", reps=200)
    groups = report["groups"]
    assert sorted(groups) == ["dqn_cartpole old", "dqn_cartpole seeding.deterministic=false",
                              "dqn_cartpole seeding.deterministic=true"]
    assert sorted(groups["dqn_cartpole seeding.deterministic=false"]["values"]) == [100.0, 101.0, 102.0]
    assert sorted(groups["dqn_cartpole seeding.deterministic=true"]["values"]) == [103.0, 104.0]
    assert groups["dqn_cartpole old"]["values"] == [1.0]
    assert "### dqn_cartpole seeding.deterministic=true" in (tmp_path / "out" / "report.md").read_text()


def test_a_seeds_per_process_report_shows_the_cost_per_seed_and_the_batch_wall_time(tmp_path):
    """Two batches of 16 seeds (each seed's record holds its batch's wall time): 91.2 s and 96.0 s per batch is
    5.7 s and 6.0 s per seed, not 'a run' of 93.6 s."""
    for job, wall in ((0, 91.2), (1, 96.0)):
        for agent in range(16):
            seed = 16 * job + agent
            write_run(tmp_path / "sweep" / str(job) / f"seed{seed}", seed=seed, group="dqn_cartpole", value=400.0 + seed,
                      extra={"wall_time_s": wall, "seeds_per_process": 16, "agent": agent})
    report = build_report([tmp_path / "sweep"], tmp_path / "out", reps=100)
    g = report["groups"]["dqn_cartpole"]
    assert g["seeds_per_process"] == [16] and g["n_batches"] == 2
    assert g["seed_cost_s_mean"] == pytest.approx((91.2 / 16 + 96.0 / 16) / 2, rel=1e-12)
    assert g["batch_wall_time_s_mean"] == pytest.approx((91.2 + 96.0) / 2, rel=1e-12)
    assert g["per_seed"]["0"]["seed_cost_s"] == pytest.approx(5.7) and g["per_seed"]["0"]["wall_time_s"] == 91.2
    text = (tmp_path / "out" / "report.md").read_text()
    assert "- cost per seed: mean 5.85 s (a process's wall time / the seeds it trained, seeds_per_process=16)" in text
    assert "- wall time per batch of 16 seeds (one process): mean 93.6 s over 2 batches" in text
    assert "wall time per run" not in text
    assert "| seed | eval/return_mean | seed cost s (batch / K) |" in text and "| 0 | 400 | 5.7 |" in text

"""Which configuration the tuner names best, and how it says so: hand-made studies and records with known answers,
for both directions. Ties in the objective are broken by the declared secondary objective."""

from __future__ import annotations

import json
import math

import matplotlib
import numpy as np
import optuna
import pytest

from pipeline.tune.objective import collect, rank, rank_trials, secondary_value, tie_breaker, ties
from pipeline.tune.plots import MIN_IMPORTANCE_TRIALS, write_plots
from pipeline.tune.space import TuneError
from pipeline.tune.summary import confirm_outcome
from pipeline_testing import blank_border

SEEDS = [10, 11, 12, 13]


def _records(run_dir, returns, times=None, higher_is_better=True, metric="eval/return_mean", threshold=475.0):
    """One record per seed in the seeds_per_process layout: final returns, and seconds to the threshold."""
    for i, (seed, value) in enumerate(zip(SEEDS, returns)):
        d = run_dir / f"seed{seed}"
        d.mkdir(parents=True)
        t = None if times is None else times[i]
        record = {"seed": seed, "status": "ok", "error": None, "primary_metric": metric, "metrics": {metric: value},
                  "higher_is_better": higher_is_better, "threshold": threshold, "time_to_threshold_s": t,
                  "evaluations": [{"env_step": 1000, "return_mean": value / 2}, {"env_step": 2000, "return_mean": value}]}
        (d / "result.json").write_text(json.dumps(record))
    return run_dir


def _trial(number, value, **params):
    trial = optuna.trial.create_trial(
        params=params, distributions={k: optuna.distributions.FloatDistribution(1e-5, 1.0) for k in params}, value=value)
    trial.number = number
    return trial


def test_rank_breaks_ties_by_the_secondary_objective_in_its_own_direction():
    entries = [{"n": 0, "v": 500.0, "t": 97.0}, {"n": 1, "v": 480.0, "t": 5.0}, {"n": 2, "v": 500.0, "t": 61.0},
               {"n": 3, "v": None, "t": 1.0}]
    # Maximize returns; ties at 500 go to the faster (time to threshold: lower wins); the missing value is last.
    assert [e["n"] for e in rank(entries, lambda e: e["v"], lambda e: e["t"], True, "time_to_threshold")] == [2, 0, 1, 3]
    # No tie-break: ties keep their order.
    assert [e["n"] for e in rank(entries, lambda e: e["v"], lambda e: e["t"], True, None)] == [0, 2, 1, 3]
    # Minimize seconds to threshold; ties at 30 s go to the larger area under the curve (auc: higher wins).
    timed = [{"n": 0, "v": 30.0, "a": 200.0}, {"n": 1, "v": 40.0, "a": 900.0}, {"n": 2, "v": 30.0, "a": 300.0}]
    assert [e["n"] for e in rank(timed, lambda e: e["v"], lambda e: e["a"], False, "auc")] == [2, 0, 1]
    # An IQM of equal scores that differs in the last bit is still a tie.
    assert ties(500.0, 500.0 * (1 + 1e-15)) and not ties(500.0, 499.9)


def test_the_tuner_names_the_faster_of_two_trials_that_tie(tmp_path):
    """Trials 3 and 7 both reach an IQM of 500; trial 7 gets there in 61 s, trial 3 in 97 s: trial 7 is best."""
    trials_dir = tmp_path / "trials"
    _records(trials_dir / "3", [500.0] * 4, times=[90.0, 97.0, 97.0, 120.0])
    _records(trials_dir / "7", [500.0] * 4, times=[50.0, 61.0, 61.0, 70.0])
    _records(trials_dir / "5", [480.0] * 4, times=[10.0] * 4)
    trials = [_trial(3, 500.0, lr=0.01), _trial(5, 480.0, lr=0.02), _trial(7, 500.0, lr=0.03)]
    assert [t.number for t in rank_trials(trials, True, trials_dir, SEEDS, "iqm", "auto")] == [7, 3, 5]
    assert [t.number for t in rank_trials(trials, True, trials_dir, SEEDS, "iqm", "none")] == [3, 7, 5]
    # Steps to threshold: the first evaluation at 475 or more is at env step 2000 for every seed: no winner there.
    assert secondary_value(trials_dir / "7", SEEDS, "steps_to_threshold") == 2000.0
    # A minimizing study (seconds to threshold) whose trials tie breaks the tie by the area under the curve.
    assert tie_breaker("auto", "time_to_threshold", [trials_dir / "3"]) == "auc"
    with pytest.raises(TuneError, match="tie_break=fastest: choose one of"):
        tie_breaker("fastest", "iqm", [])


def test_a_never_reached_seed_counts_as_infinitely_slow(tmp_path):
    _records(tmp_path / "r", [500.0, 500.0, 400.0, 500.0], times=[10.0, 20.0, None, 30.0])
    assert collect(tmp_path / "r", SEEDS, "time_to_threshold").scores[12] == math.inf
    assert secondary_value(tmp_path / "r", SEEDS, "time_to_threshold") == pytest.approx(25.0)  # mean(20, 30)


@pytest.mark.parametrize("direction", ["maximize", "minimize"])
def test_confirmation_names_the_winner_and_the_improvement_points_the_metrics_way(tmp_path, direction):
    """Maximize: IQM of returns (higher is better), two candidates tie at 500. Minimize: IQM of a loss (lower is
    better), two tie at 0.1. Either way the faster to the threshold (61 s vs 97 s) is named, and it beats the preset."""
    if direction == "maximize":
        win, tie, preset = [500.0] * 4, [500.0] * 4, [470.0, 480.0, 490.0, 495.0]
        higher = True
    else:
        win, tie, preset = [0.1] * 4, [0.1] * 4, [0.3, 0.4, 0.5, 0.6]
        higher = False
    dirs = {"preset": _records(tmp_path / "preset", preset, times=[80.0] * 4, higher_is_better=higher),
            "trial3": _records(tmp_path / "trial3", tie, times=[97.0] * 4, higher_is_better=higher),
            "trial7": _records(tmp_path / "trial7", win, times=[61.0] * 4, higher_is_better=higher)}
    trials = {"trial3": _trial(3, win[0], lr=0.01), "trial7": _trial(7, win[0], lr=0.03)}
    out = confirm_outcome(dirs, trials, SEEDS, "iqm", direction == "maximize", higher, "time_to_threshold")
    assert out["winner"]["label"] == "trial7" and out["winner"]["secondary"] == 61.0
    assert out["tie"]["with"] == ["trial3"] and out["tie"]["broken_by"] == "time_to_threshold"
    assert "the tie is broken by time_to_threshold: trial7 61, trial3 97" in out["tie"]["note"]
    seen = "iqm 500 vs 485" if direction == "maximize" else "iqm 0.1 vs 0.45"
    assert out["preset_wins"] is False and out["verdict"] == (
        f"trial7 beats the preset's iqm on fresh seeds: {seen}, P(trial7 does better on a seed) 1.00 [1.00, 1.00].")
    assert out["winner"]["evidence"]["better"] == "candidate"
    # Every seed of the winner is better than every preset seed, in the metric's direction: P = 1.
    assert out["winner"]["probability_of_improvement_over_preset"]["p"] == 1.0
    assert out["winner"]["params"] == {"lr": 0.03} and isinstance(out["winner"]["params"]["lr"], float)


def test_the_improvement_over_the_preset_is_in_the_metrics_direction_when_the_study_minimizes_time(tmp_path):
    """A study minimizing seconds to threshold: trial 2 is faster but ends with lower returns than the preset.
    It wins the study's objective; P(better than preset) is about returns, higher is better: 0."""
    dirs = {"preset": _records(tmp_path / "preset", [500.0] * 4, times=[80.0] * 4),
            "trial2": _records(tmp_path / "trial2", [480.0] * 4, times=[40.0] * 4)}
    out = confirm_outcome(dirs, {"trial2": _trial(2, 40.0, lr=0.1)}, SEEDS, "time_to_threshold", False, True, "auc")
    assert out["winner"]["value"] == 40.0 and out["preset"]["value"] == 80.0
    assert out["verdict"] == ("trial2 beats the preset's time_to_threshold on fresh seeds: time_to_threshold 40 vs 80, "
                              "P(trial2 does better on a seed) 1.00 [1.00, 1.00].")
    assert out["winner"]["probability_of_improvement_over_preset"]["p"] == 0.0


def test_a_tie_with_the_preset_goes_to_the_better_secondary(tmp_path):
    dirs = {"preset": _records(tmp_path / "preset", [500.0] * 4, times=[50.0] * 4),
            "trial1": _records(tmp_path / "trial1", [500.0] * 4, times=[70.0] * 4)}
    out = confirm_outcome(dirs, {"trial1": _trial(1, 500.0, lr=0.1)}, SEEDS, "iqm", True, True, "time_to_threshold")
    assert out["preset_wins"] is True
    assert out["verdict"] == ("trial1 ties the preset's iqm on fresh seeds (500); the preset is better on time_to_threshold "
                              "(50 vs 70, P(trial1 does better on a seed) 0.00 [0.00, 0.00]): keep it.")
    assert out["winner"]["evidence"]["tie_break"]["better"] == "preset" and out["winner"]["evidence"]["better"] is None
    assert out["tie"] is None  # one candidate: no tie among candidates
    out = confirm_outcome(dirs, {"trial1": _trial(1, 500.0, lr=0.1)}, SEEDS, "iqm", True, True, None)
    assert out["preset_wins"] is False and out["beats_preset"] is False
    assert out["verdict"] == ("Cannot tell trial1 from the preset on 4 fresh seeds: iqm 500 vs 500, P(trial1 does better on "
                              "a seed) 0.50 [0.50, 0.50] includes 0.5; at P = 0.5 no number of seeds would tell them apart.")


def test_no_importance_plot_from_a_handful_of_trials(tmp_path):
    def study_of(n):
        study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
        for i in range(n):
            study.add_trial(optuna.trial.create_trial(
                params={"lr": 0.01 * (i + 1), "gamma": 0.9 + 0.001 * i},
                distributions={"lr": optuna.distributions.FloatDistribution(0.001, 1.0),
                               "gamma": optuna.distributions.FloatDistribution(0.8, 1.0)}, value=float(i % 5)))
        return study

    warnings: list[str] = []
    made = write_plots(study_of(4), [], None, tmp_path, warnings)
    assert "parameter importances" not in made and "optimization history" in made
    assert warnings == [f"no parameter importance plot: 4 completed trials; importances fitted to fewer than "
                        f"{MIN_IMPORTANCE_TRIALS} are noise"]
    warnings = []
    made = write_plots(study_of(MIN_IMPORTANCE_TRIALS), [], None, tmp_path, warnings)
    assert "parameter importances" in made and warnings == []


@pytest.mark.parametrize("n", [2, 5, 12])
def test_no_tuning_plot_is_cut_off(tmp_path, n):
    """The tuner's figures at 2, 5 and 12 confirmed candidates (and 14 trials: importances drawn)."""
    rng = np.random.default_rng(n)
    dists = {"optimizer.lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True),
             "task.gradient_steps": optuna.distributions.CategoricalDistribution([16, 32, 64]),
             "task.target_update_every": optuna.distributions.IntDistribution(100, 2000)}
    study = optuna.create_study(direction="maximize")
    for _ in range(14):
        params = {"optimizer.lr": float(10 ** rng.uniform(-4, -2)), "task.gradient_steps": int(rng.choice([16, 32, 64])),
                  "task.target_update_every": int(rng.integers(100, 2000))}
        study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=float(rng.uniform(100, 500))))
    candidates = [{"label": f"trial{7 * i}", "primary_scores": list(rng.uniform(300, 500, 10))} for i in range(n)]
    preset = {"primary_scores": list(rng.uniform(300, 500, 10)), "primary_metric": "eval/return_mean"}
    warnings: list[str] = []
    style = matplotlib.rcParams["axes.facecolor"]
    made = write_plots(study, candidates, preset, tmp_path, warnings)
    assert matplotlib.rcParams["axes.facecolor"] == style  # Optuna's ggplot style stays inside the call
    assert set(made) == {"optimization history", "parameter importances", "confirmed scores"} and warnings == []
    for file in made.values():
        assert blank_border(tmp_path / file), f"{file} with {n} candidates: something reaches the edge"


def test_a_candidate_within_the_confirmation_s_noise_is_not_said_to_beat_the_preset(tmp_path):
    """The issue's case: a higher IQM on 4 fresh seeds whose seeds interleave with the preset's (P(better) 0.56, its
    interval wide across 0.5). Not "beats": not distinguishable, with the seeds a clear answer would take."""
    dirs = {"preset": _records(tmp_path / "preset", [300.0, 420.0, 480.0, 200.0]),
            "trial1": _records(tmp_path / "trial1", [310.0, 450.0, 500.0, 190.0])}
    out = confirm_outcome(dirs, {"trial1": _trial(1, 500.0, lr=0.1)}, SEEDS, "iqm", True, True, None)
    proof = out["winner"]["evidence"]
    # P(trial1's seed > preset's seed) over the 16 pairs, by hand: 9 of 16.
    assert proof["p"] == pytest.approx(9 / 16) and proof["ci"][0] < 0.5 < proof["ci"][1]
    assert proof["distinguishable"] is False and out["beats_preset"] is False and out["preset_wins"] is False
    assert out["verdict"].startswith("Cannot tell trial1 from the preset on 4 fresh seeds: iqm 380 vs 360, P(trial1 does "
                                     f"better on a seed) 0.56 [{proof['ci'][0]:.2f}, {proof['ci'][1]:.2f}] includes 0.5; ")
    assert "includes 0.5" in out["verdict"] and "beats" not in out["verdict"]
    # The interval's half-width towards 0.5 over the distance to 0.5, squared, times the 4 seeds.
    half = proof["p"] - proof["ci"][0]
    assert proof["seeds_needed"] == math.ceil(4 * (half / (proof["p"] - 0.5)) ** 2) > 4
    assert f"about {proof['seeds_needed']} seeds each" in out["verdict"]


def test_seed_for_seed_equal_scores_are_not_told_apart_by_any_number_of_seeds():
    from pipeline.tune.summary import evidence

    same = {"objective_scores": [500.0, 400.0, 300.0, 200.0]}
    proof = evidence(same, dict(same), "iqm", True)
    assert proof["p"] == 0.5 and proof["distinguishable"] is False and proof["seeds_needed"] is None


def test_a_minimised_objective_s_evidence_points_its_way(tmp_path):
    """Times to threshold (lower is better; never = inf): 40 s on every seed against 80 s, one preset seed never.
    Every pair favours the candidate: P = 1, beats."""
    dirs = {"preset": _records(tmp_path / "preset", [500.0] * 4, times=[80.0, 80.0, None, 80.0]),
            "trial2": _records(tmp_path / "trial2", [500.0] * 4, times=[40.0] * 4)}
    out = confirm_outcome(dirs, {"trial2": _trial(2, 40.0, lr=0.1)}, SEEDS, "time_to_threshold", False, True, None)
    assert out["winner"]["evidence"]["p"] == 1.0 and out["beats_preset"] is True
    assert out["verdict"] == ("trial2 beats the preset's time_to_threshold on fresh seeds: time_to_threshold 40 vs 80, "
                              "P(trial2 does better on a seed) 1.00 [1.00, 1.00].")


@pytest.mark.parametrize(("trial", "preset"), [([190.0, 260.0, 390.0, 270.0], [300.0, 200.0, 380.0, 250.0]),
                                               ([300.0, 200.0, 380.0, 250.0], [190.0, 260.0, 390.0, 270.0])])
def test_a_higher_point_estimate_on_either_side_decides_nothing_when_the_interval_holds_half(tmp_path, trial, preset):
    """Seeds that interleave: whichever side's IQM is higher, P(better) is 0.5 and its interval holds 0.5, so neither
    "keep the preset" nor "beats" (the preset's higher IQM was read as "the preset still wins: keep it")."""
    dirs = {"preset": _records(tmp_path / "preset", preset), "trial1": _records(tmp_path / "trial1", trial)}
    out = confirm_outcome(dirs, {"trial1": _trial(1, 300.0, lr=0.1)}, SEEDS, "iqm", True, True, None)
    proof = out["winner"]["evidence"]
    # By hand over the 16 pairs: 8 wins for each side.
    assert proof["p"] == 0.5 and proof["ci"][0] < 0.5 < proof["ci"][1] and proof["better"] is None
    assert out["preset_wins"] is False and out["beats_preset"] is False
    assert out["verdict"].startswith("Cannot tell trial1 from the preset on 4 fresh seeds: iqm ")


def test_the_preset_is_kept_only_when_the_interval_lies_below_half(tmp_path):
    """Every preset seed above every candidate seed: P = 0 with its interval, "keep it" from that interval."""
    dirs = {"preset": _records(tmp_path / "preset", [400.0, 410.0, 420.0, 430.0]),
            "trial1": _records(tmp_path / "trial1", [300.0, 310.0, 320.0, 330.0])}
    out = confirm_outcome(dirs, {"trial1": _trial(1, 450.0, lr=0.1)}, SEEDS, "iqm", True, True, None)
    assert out["winner"]["evidence"]["better"] == "preset" and out["winner"]["evidence"]["ci"] == [0.0, 0.0]
    assert out["preset_wins"] is True and out["verdict"].startswith("The preset does better than trial1 on fresh seeds: ")
    assert out["verdict"].endswith("P(trial1 does better on a seed) 0.00 [0.00, 0.00]: keep it.")

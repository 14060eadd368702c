"""What a search leaves in tune/: tune.md from a summary written by hand, best.yaml from a stand-in search, the
tie notes, the metric's direction, the W&B run against a stand-in wandb, and write_tune end to end on hand-made
trials (no training)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import optuna
import pytest
from omegaconf import OmegaConf

from pipeline.tune import summary as tune_summary
from pipeline.tune.summary import best_yaml, log_tune_to_wandb, markdown, metric_direction, tie_of
from pipeline_testing import StandInWandbRun, stand_in_wandb


def _summary(**over):
    s = {
        "experiment": "dqn_cartpole", "warnings": ["few seeds", "preset wins"],
        "study_name": "st", "storage": "sqlite:///o.db", "trials": {"total": 5, "completed": 3, "pruned": 1, "failed": 1},
        "sampler": "tpe", "pruner": "median", "objective": "iqm", "direction": "maximize",
        "tuning_seeds": [0, 1, 2], "confirm_seeds": [100, 101, 102, 103],
        "best_params": {"optimizer.lr": 0.001, "model": "dueling"},
        "tie": {"note": "trial3 ties trial5 on iqm (500) on fresh seeds; the tie is broken by auc: trial3 9, trial5 8"},
        "tie_break": "auc",
        "candidates": [
            {"label": "trial3", "params": {"optimizer.lr": 0.001, "model": "dueling"}, "tuned_value": 510.0,
             "value": 500.0, "optimism_gap": 10.0, "primary": {"iqm": 500.0, "iqm_ci": [490.0, 505.5], "n": 4},
             "probability_of_improvement_over_preset": {"p": 0.875, "ci": [0.5, 1.0]}, "secondary": 9.0,
             "time_to_threshold_s": {"iqm": 61.0, "iqm_ci": [50.0, 70.0], "reached": 4, "of": 4}},
            {"label": "trial5", "params": {}, "tuned_value": None, "value": 480.0, "optimism_gap": None,
             "primary": None, "probability_of_improvement_over_preset": None, "secondary": None,
             "time_to_threshold_s": None},
        ],
        "preset": {"primary_metric": "eval/return", "value": 470.0, "primary": {"iqm": None},
                   "secondary": float("inf"), "time_to_threshold_s": {"iqm": None, "reached": 0, "of": 4}},
        "verdict": "trial3 beats the preset's iqm on fresh seeds.",
        "plots": {"optimization history": "optimization_history.png", "confirmed scores": "confirmed.png"},
    }
    s.update(over)
    return s


def test_tune_md_by_hand():
    assert markdown(_summary(), Path("/sw/tune")) == "\n".join([
        "# Tuning dqn_cartpole",
        "",
        "> **warning:** few seeds",
        "> **warning:** preset wins",
        "",
        "Study `st` in `sqlite:///o.db`: 5 trials (3 completed, 1 pruned, 1 failed); sampler tpe, pruner median; "
        "objective iqm (maximize) over tuning seeds 0-2.",
        "",
        "## Best configuration",
        "",
        "- `optimizer.lr=0.001`",
        "- `model=dueling`",
        "",
        "Run it: `python -m pipeline --config-dir /sw/tune experiment=best`",
        "",
        "**A tie:** trial3 ties trial5 on iqm (500) on fresh seeds; the tie is broken by auc: trial3 9, trial5 8.",
        "",
        "## Confirmed on fresh seeds 100-103",
        "",
        "| candidate | tuned value | confirmed value | optimism gap | IQM eval/return [95% CI] | P(better than preset) "
        "[95% CI] | tie-break: auc (IQM) | time to threshold IQM [95% CI] (reached) |",
        "|---|---|---|---|---|---|---|---|",
        "| trial3 (optimizer.lr=0.001, model=dueling) | 510 | 500 | 10 | 500 [490, 505.5] | 0.88 [0.50, 1.00] | 9 "
        "| 61 [50, 70] (4/4) |",
        "| trial5 | - | 480 | - | - | - | - | - (None/None) |",
        "| preset | - | 470 | - | - | - | never | - (0/4) |",
        "",
        "trial3 beats the preset's iqm on fresh seeds.",
        "",
        "![optimization history](optimization_history.png)",
        "![confirmed scores](confirmed.png)",
    ]) + "\n"


def test_tune_md_without_confirmation_tie_break_or_threshold():
    summary = _summary(warnings=[], best_params=None, tie=None, candidates=[], plots=None)
    assert markdown(summary, Path("/x")) == "\n".join([
        "# Tuning dqn_cartpole", "", "",
        "Study `st` in `sqlite:///o.db`: 5 trials (3 completed, 1 pruned, 1 failed); sampler tpe, pruner median; "
        "objective iqm (maximize) over tuning seeds 0-2.", "",
    ]) + "\n"
    summary = _summary(tie_break=None, tie=None, plots={})
    summary["preset"]["time_to_threshold_s"] = None
    lines = markdown(summary, Path("/x")).splitlines()
    assert not any(line.startswith("**A tie") for line in lines)
    assert ("| candidate | tuned value | confirmed value | optimism gap | IQM eval/return [95% CI] | "
            "P(better than preset) [95% CI] |") in lines
    assert "|---|---|---|---|---|---|" in lines
    assert "| preset | - | 470 | - | - | - |" in lines
    assert lines[-1] == "trial3 beats the preset's iqm on fresh seeds." or lines[-2].startswith("trial3 beats")


def _entry(label, value, secondary):
    return {"label": label, "value": value, "secondary": secondary}


def test_tie_notes():
    assert tie_of([_entry("a", 5.0, 1.0), _entry("b", 4.0, 2.0)], "iqm", "auc", "here") is None
    tie = tie_of([_entry("a", 5.0, 3.0), _entry("b", 5.0, 2.0), _entry("c", 4.0, 1.0), _entry("d", 5.0, 1.5)],
                 "iqm", "auc", "on fresh seeds")
    assert tie == {"with": ["b", "d"], "value": 5.0, "broken_by": "auc", "secondary": {"a": 3.0, "b": 2.0, "d": 1.5},
                   "note": "a ties b, d on iqm (5) on fresh seeds; the tie is broken by auc: a 3, b 2, d 1.5"}
    tie = tie_of([_entry("a", 5.0, None), _entry("b", 5.0, 2.0)], "iqm", None, "here")
    assert tie["broken_by"] is None
    assert tie["note"] == ("a ties b on iqm (5) here; no secondary objective breaks it (hydra.sweeper.tie_break=none, "
                           "or no threshold), so the first is named")
    tie = tie_of([_entry("a", 5.0, None), _entry("b", 5.0, 2.0)], "iqm", "auc", "here")
    assert tie["broken_by"] is None
    assert tie["note"] == "a ties b on iqm (5) here, and auc does not tell them apart (-, 2): the first is named"
    tie = tie_of([_entry("a", float("inf"), 2.0), _entry("b", float("inf"), 2.0)], "time", "auc", "here")
    assert tie["note"] == "a ties b on time (never) here, and auc does not tell them apart (2, 2): the first is named"


def test_metric_direction_from_the_records_then_the_task(tmp_path):
    for name, record in (("a", {"seed": 0}), ("b", {"seed": 0, "higher_is_better": 0}), ("c", {"higher_is_better": True})):
        (tmp_path / name / "seed0").mkdir(parents=True)
        (tmp_path / name / "seed0" / "result.json").write_text(json.dumps({"status": "ok", **record}))
    search = types.SimpleNamespace(_task_class=lambda: types.SimpleNamespace(higher_is_better=True))
    assert metric_direction(search, {"preset": tmp_path / "a", "trial1": tmp_path / "b"}) is False
    assert metric_direction(search, {"x": tmp_path / "c"}) is True
    assert metric_direction(search, {"preset": tmp_path / "a"}) is True
    lower = types.SimpleNamespace(_task_class=lambda: types.SimpleNamespace(higher_is_better=0))
    assert metric_direction(lower, {}) is False
    assert metric_direction(types.SimpleNamespace(_task_class=lambda: object()), {}) is True


def _search(tmp_path, fixed=(), choices=None, tune_seeds=(0, 1, 2), **over):
    config = {"name": "dqn_cartpole", "hydra": {"runtime": {"choices": choices}} if choices is not None else {}}
    config.update(over.pop("config", {}))
    search = types.SimpleNamespace(
        config=OmegaConf.create(config), fixed=list(fixed), tune_seeds=list(tune_seeds), name="st", url="sqlite:///o.db",
        sweep_dir=tmp_path, confirm_seeds=[100, 101], maximize=True,
        s=OmegaConf.create({"objective": "iqm", "sampler": "tpe", "pruner": "median", "tie_break": "none"}),
        _task_class=lambda: types.SimpleNamespace(higher_is_better=True))
    for k, v in over.items():
        setattr(search, k, v)
    return search


def test_best_yaml_keeps_what_the_run_is_and_adds_the_tuned_values(tmp_path):
    search = _search(tmp_path, choices={"experiment": "dqn_cartpole", "model": "mlp"},
                     fixed=["seed=3", "+logger=wandb", "trainer.max_epochs=5", "model=dueling", "~checkpoint",
                            "hydra.job.chdir=true", "device.num_threads=2", "seeds_per_process=4", "+task.gamma=0.9",
                            "trainer.enable_progress_bar=false", "resume=true", "isolate_jobs=false"])
    text = best_yaml(search, {"optimizer.lr": 0.001, "optimizer": "adam", "task.double": True}, tmp_path / "tune", "It wins.")
    assert text.splitlines() == [
        "# @package _global_",
        "# Tuned by pipeline's Optuna sweeper over 3 seeds per trial (study 'st').",
        "# Verdict: It wins.",
        f"# python -m pipeline --config-dir {tmp_path / 'tune'} experiment=best",
        "defaults:",
        "  - dqn_cartpole",
        "  - override /model: dueling",
        "  - override /optimizer: adam",
        "  - _self_",
        "",
        "name: dqn_cartpole_tuned",
        "trainer:",
        "  max_epochs: 5",
        "task:",
        "  gamma: 0.9",
        "  double: true",
        "optimizer:",
        "  lr: 0.001",
    ]


def test_best_yaml_without_hydra_choices_names_no_preset(tmp_path):
    text = best_yaml(_search(tmp_path), {"task.k": 4}, tmp_path, "v")
    assert text.splitlines()[4:] == ["defaults:", "  - _self_", "", "name: dqn_cartpole_tuned", "task:", "  k: 4"]
    text = best_yaml(_search(tmp_path, choices={"model": "mlp"}), {}, tmp_path, "v")
    assert text.splitlines()[4:7] == ["defaults:", "  - _self_", ""]


def run_summary(calls) -> dict:
    return sys.modules["wandb"].runs[-1].summary


@pytest.fixture
def fake_wandb(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "wandb", stand_in_wandb(calls))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    return calls


def test_log_tune_to_wandb_sends_the_counts_values_plots_and_tune_json(tmp_path, fake_wandb):
    summary = {"study_name": "my study", "objective": "iqm", "best_params": {"lr": 0.1},
               "trials": {"total": 4, "pruned": 1}, "best_tuned_value": 9.5, "preset_wins": False,
               "plots": {"confirmed scores": "confirmed.png"},
               "candidates": [{"label": "trial2", "value": 8.0, "optimism_gap": 1.5}], "preset": {"value": 7.0}}
    info = log_tune_to_wandb(summary, tmp_path, "grp", {"project": "proj", "entity": "me"})
    (_, kwargs), (_, logged), (_, artifact), (finish,) = fake_wandb
    assert kwargs == {"project": "proj", "entity": "me", "mode": "offline", "group": "grp", "job_type": "tune",
                      "name": "tune-my study", "dir": str(tmp_path), "reinit": "create_new",
                      "config": {"best_params": {"lr": 0.1}, "objective": "iqm"},
                      "settings": {"silent": True, "console": "off"}}  # no W&B lines on the console
    assert run_summary(fake_wandb) == {"trials/total": 4, "trials/pruned": 1, "best_tuned_value": 9.5, "preset_wins": False,
                           "trial2/confirmed_value": 8.0, "trial2/optimism_gap": 1.5, "preset/confirmed_value": 7.0}
    assert list(logged) == ["plots/confirmed"] and logged["plots/confirmed"].path == str(tmp_path / "confirmed.png")
    assert (artifact.name, artifact.type, artifact.files) == ("tune-my_study", "tune", [str(tmp_path / "tune.json")])
    assert finish == "finish" and info == {"id": "run-id", "mode": "offline", "sync_dir": "/sync/here"}


def test_log_tune_to_wandb_mode_and_defaults(tmp_path, fake_wandb, monkeypatch):
    summary = {"study_name": "s", "objective": "iqm", "best_params": None, "trials": {}, "best_tuned_value": None,
               "preset_wins": None, "candidates": [], "preset": None}
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert log_tune_to_wandb(summary, tmp_path, "g", {})["mode"] == "disabled"
    kwargs, logged = fake_wandb[0][1], fake_wandb[1][1]
    assert kwargs["project"] == "pipeline" and kwargs["entity"] is None and kwargs["mode"] == "disabled"
    assert run_summary(fake_wandb) == {"best_tuned_value": None, "preset_wins": None} and logged == {}
    assert log_tune_to_wandb(summary, tmp_path, "g", {"mode": "online"})["mode"] == "online"


def test_the_wandb_run_is_finished_when_logging_fails(tmp_path, fake_wandb, monkeypatch):
    monkeypatch.setattr(StandInWandbRun, "log", lambda self, payload: (_ for _ in ()).throw(RuntimeError("no")))
    summary = {"study_name": "s", "objective": "iqm", "best_params": None, "trials": {}, "best_tuned_value": None,
               "preset_wins": None, "candidates": [], "preset": None}
    with pytest.raises(RuntimeError, match="no"):
        log_tune_to_wandb(summary, tmp_path, "g", {})
    assert fake_wandb[-1] == ("finish",)


def _trial(number, value, state=optuna.trial.TrialState.COMPLETE, failed=None, **params):
    trial = optuna.trial.create_trial(
        params=params, distributions={k: optuna.distributions.FloatDistribution(0.0, 1.0) for k in params},
        value=value if state == optuna.trial.TrialState.COMPLETE else None, state=state,
        user_attrs={"failed": failed} if failed else {})
    trial.number = number
    return trial


def test_write_tune_without_confirmation(tmp_path, monkeypatch):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    trials = [_trial(0, 0.5, x=0.1), _trial(1, 0.9, x=0.2), _trial(2, 0.2, failed={"3": "boom"}, x=0.3),
              _trial(3, None, state=optuna.trial.TrialState.PRUNED, x=0.4),
              _trial(4, None, state=optuna.trial.TrialState.FAIL, x=0.5)]
    for t in trials:
        study.add_trial(t)
    ranked = sorted(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)), key=lambda t: -t.value)
    plotted = []
    monkeypatch.setattr("pipeline.tune.plots.write_plots",
                        lambda *args: plotted.append(args) or {"optimization history": "optimization_history.png"})
    search = _search(tmp_path, choices={"experiment": "dqn_cartpole"}, candidates=lambda: ranked, study=study)
    out = tune_summary.write_tune(search, {})
    assert out == tmp_path / "tune"
    summary = json.loads((out / "tune.json").read_text())
    assert summary["trials"] == {"total": 5, "completed": 2, "pruned": 1, "failed": 2}
    assert (summary["best_trial"], summary["best_params"], summary["best_tuned_value"]) == (1, {"x": 0.2}, 0.9)
    assert summary["best_confirmed"] is None and summary["preset_wins"] is None and summary["verdict"] is None
    assert summary["direction"] == "maximize" and summary["tie_break"] is None and summary["tie"] is None
    assert (summary["experiment"], summary["study_name"], summary["storage"]) == ("dqn_cartpole", "st", "sqlite:///o.db")
    assert (summary["sampler"], summary["pruner"], summary["objective"]) == ("tpe", "median", "iqm")
    assert summary["tuning_seeds"] == [0, 1, 2] and summary["confirm_seeds"] == [100, 101]
    assert summary["candidates"] == [] and summary["preset"] is None
    assert summary["warnings"] == [
        "not confirmed (confirm_top=0): the tuned value is the winner's own score and is optimistic",
        "3 seeds per trial: one seed is not a comparison, and fewer than five is a weak one",
        "2 trials had failed seeds or failed outright (their value is the worst possible)",
    ]
    best = (out / "best.yaml").read_text()
    assert best == (out / "experiment" / "best.yaml").read_text() and best.splitlines()[-1] == "x: 0.2"
    ((study_arg, candidates, preset, plot_dir, warnings),) = plotted
    assert study_arg is study and candidates == [] and preset is None and plot_dir == out
    md = (out / "tune.md").read_text()
    assert "- `x=0.2`" in md and "![optimization history](optimization_history.png)" in md


def test_write_tune_of_a_study_with_nothing_finished(tmp_path, monkeypatch):
    study = optuna.create_study(direction="minimize")
    monkeypatch.setattr("pipeline.tune.plots.write_plots", lambda *args: {})
    search = _search(tmp_path, tune_seeds=range(5), candidates=lambda: [], study=study, maximize=False)
    out = tune_summary.write_tune(search, {})
    summary = json.loads((out / "tune.json").read_text())
    assert summary["best_trial"] is None and summary["best_params"] is None and summary["best_tuned_value"] is None
    assert summary["direction"] == "minimize" and summary["trials"] == {"total": 0, "completed": 0, "pruned": 0, "failed": 0}
    assert summary["warnings"] == ["not confirmed (confirm_top=0): the tuned value is the winner's own score and is optimistic"]
    assert not (out / "best.yaml").exists()


def test_write_tune_logs_to_wandb_when_the_config_has_it(tmp_path, monkeypatch):
    study = optuna.create_study(direction="maximize")
    monkeypatch.setattr("pipeline.tune.plots.write_plots", lambda *args: {})
    logged = []
    monkeypatch.setattr(tune_summary, "log_tune_to_wandb", lambda *args: logged.append(args))
    search = _search(tmp_path, candidates=lambda: [], study=study, config={"logger": {"wandb": {"project": "p"}}})
    out = tune_summary.write_tune(search, {})
    ((summary, where, group, cfg),) = logged
    assert where == out and group == "dqn_cartpole" and cfg == {"project": "p"} and summary["study_name"] == "st"


def _confirm_records(run_dir, returns, failed_seed=None, seeds=(10, 11, 12, 13), times=None):
    for i, (seed, value) in enumerate(zip(seeds, returns)):
        d = run_dir / f"seed{seed}"
        d.mkdir(parents=True)
        ok = seed != failed_seed
        record = {"seed": seed, "status": "ok" if ok else "failed", "error": None if ok else "boom",
                  "primary_metric": "eval/return", "metrics": {"eval/return": value} if ok else {},
                  "higher_is_better": True, "threshold": None if times is None else 475.0,
                  "time_to_threshold_s": None if times is None else times[i]}
        (d / "result.json").write_text(json.dumps(record))
    return run_dir


@pytest.mark.parametrize("preset_return", [400.0, 600.0])
def test_write_tune_with_confirmation(tmp_path, monkeypatch, preset_return):
    study = optuna.create_study(direction="maximize")
    for t in (_trial(0, 0.9, x=0.2), _trial(1, 0.5, x=0.1)):
        study.add_trial(t)
    ranked = sorted(study.get_trials(), key=lambda t: -t.value)
    plotted = []
    monkeypatch.setattr("pipeline.tune.plots.write_plots", lambda *args: plotted.append(args) or {})
    # The losing preset has a failed seed (which makes its value the worst: none); the winning one has none.
    failed_seed = 13 if preset_return < 500 else None
    dirs = {"preset": _confirm_records(tmp_path / "c" / "preset", [preset_return] * 4, failed_seed=failed_seed),
            "trial0": _confirm_records(tmp_path / "c" / "trial0", [500.0, 500.0, 500.0, 500.0])}
    search = _search(tmp_path, tune_seeds=range(5), candidates=lambda: ranked, study=study)
    search.confirm_seeds = [10, 11, 12, 13]
    out = tune_summary.write_tune(search, dirs)
    summary = json.loads((out / "tune.json").read_text())
    assert summary["best_trial"] == 0 and summary["best_params"] == {"x": 0.2} and summary["best_tuned_value"] == 0.9
    confirmed = summary["best_confirmed"]
    assert sorted(confirmed) == ["optimism_gap", "primary", "probability_of_improvement_over_preset", "secondary",
                                 "time_to_threshold_s", "value"]
    assert confirmed["value"] == 500.0 and confirmed["optimism_gap"] == pytest.approx(0.9 - 500.0)
    assert confirmed["probability_of_improvement_over_preset"]["p"] == (1.0 if preset_return < 500 else 0.0)
    assert [c["label"] for c in summary["candidates"]] == ["trial0"]
    if preset_return < 500:
        assert summary["preset"]["failed"] == {"13": "boom"} and summary["preset"]["value"] is None
        assert summary["preset_wins"] is False and summary["verdict"] == (
            "trial0 beats the preset's iqm on fresh seeds: iqm 500 vs worst (1 of 4 seeds failed), P(trial0 does better on "
            "a seed) 1.00 [1.00, 1.00].")
        assert summary["warnings"] == ["preset: 1 of 4 confirmation seeds failed"]
    else:
        assert summary["preset"]["failed"] == {} and summary["preset"]["value"] == preset_return
        assert summary["preset_wins"] is True and summary["verdict"] == (
            "The preset does better than trial0 on fresh seeds: iqm 500 vs 600, P(trial0 does better on a seed) 0.00 "
            "[0.00, 0.00]: keep it.")
        assert summary["warnings"] == [summary["verdict"]]
    # The verdict's interval is in tune.json whichever way it went.
    assert summary["evidence"] == {"objective": "iqm", "p": float(preset_return < 500), "ci": [float(preset_return < 500)] * 2,
                                   "seeds": 4, "distinguishable": True, "seeds_needed": None,
                                   "better": "candidate" if preset_return < 500 else "preset"}
    ((_, candidates, preset, _, _),) = plotted
    assert [c["label"] for c in candidates] == ["trial0"]
    assert preset["primary_scores"] == [preset_return] * (3 if failed_seed else 4)
    md = (out / "tune.md").read_text()
    assert "## Confirmed on fresh seeds 10-13" in md and summary["verdict"] in md
    # best.yaml says what the confirmation found, in its header.
    header = " ".join(line[1:].strip() for line in (out / "best.yaml").read_text().splitlines() if line.startswith("#"))
    assert f"Verdict: {summary['verdict']}" in header
    assert summary["beats_preset"] is (preset_return < 500)


def test_best_yaml_of_a_winner_within_the_noise_says_so(tmp_path, monkeypatch):
    """Confirmed on 4 seeds that interleave with the preset's: tune.json's verdict and best.yaml's header say
    "Cannot tell", never "beats", and the verdict is a warning."""
    study = optuna.create_study(direction="maximize")
    study.add_trial(_trial(0, 0.9, x=0.2))
    monkeypatch.setattr("pipeline.tune.plots.write_plots", lambda *args: {})
    dirs = {"preset": _confirm_records(tmp_path / "c" / "preset", [300.0, 420.0, 480.0, 200.0]),
            "trial0": _confirm_records(tmp_path / "c" / "trial0", [310.0, 450.0, 500.0, 190.0])}
    search = _search(tmp_path, tune_seeds=range(5), candidates=lambda: study.get_trials(), study=study)
    search.confirm_seeds = [10, 11, 12, 13]
    out = tune_summary.write_tune(search, dirs)
    summary = json.loads((out / "tune.json").read_text())
    assert summary["beats_preset"] is False and summary["evidence"]["distinguishable"] is False
    assert summary["verdict"].startswith("Cannot tell trial0 from the preset on 4 fresh seeds")
    assert summary["verdict"] in summary["warnings"] and summary["preset_wins"] is False
    header = " ".join(line[1:].strip() for line in (out / "best.yaml").read_text().splitlines() if line.startswith("#"))
    assert "Cannot tell trial0 from the preset" in header and "beats" not in header


def test_fmt_shows_floats_to_four_digits_and_the_rest_as_they_are():
    assert tune_summary._fmt(None) == "-" and tune_summary._fmt(12345) == "12345" and tune_summary._fmt(1234.5) == "1234"
    assert tune_summary._fmt("x") == "x"


def test_write_tune_names_a_tie_on_the_tuning_seeds_and_how_it_was_broken(tmp_path, monkeypatch):
    study = optuna.create_study(direction="maximize")
    for t in (_trial(0, 500.0, x=0.3), _trial(1, 500.0, x=0.7), _trial(2, 480.0, x=0.5)):
        study.add_trial(t)
    by_number = {t.number: t for t in study.get_trials()}
    ranked = [by_number[1], by_number[0], by_number[2]]  # as the sweeper ranks them: the tie went to the faster
    seeds = [0, 1, 2, 3, 4]
    sweep = tmp_path / "new" / "sweep"  # not made yet: write_tune makes it
    _confirm_records(sweep / "trials" / "1", [500.0] * 5, seeds=seeds, times=[50.0, 61.0, 61.0, 61.0, 70.0])
    _confirm_records(sweep / "trials" / "0", [500.0] * 5, seeds=seeds, times=[90.0, 97.0, 97.0, 97.0, 120.0])
    _confirm_records(sweep / "trials" / "2", [480.0] * 5, seeds=seeds, times=[1.0] * 5)
    monkeypatch.setattr("pipeline.tune.plots.write_plots", lambda *args: {})
    search = _search(sweep, tune_seeds=seeds, candidates=lambda: ranked, study=study)
    search.s = OmegaConf.create({"objective": "iqm", "sampler": "tpe", "pruner": "median"})  # tie_break: auto
    out = tune_summary.write_tune(search, {})
    summary = json.loads((out / "tune.json").read_text())
    assert summary["tie_break"] == "time_to_threshold" and summary["best_trial"] == 1
    assert summary["trials"] == {"total": 3, "completed": 3, "pruned": 0, "failed": 0}
    assert summary["tie"] == {
        "with": ["trial0"], "value": 500.0, "broken_by": "time_to_threshold", "secondary": {"trial1": 61.0, "trial0": 97.0},
        "note": "trial1 ties trial0 on iqm (500) on the tuning seeds; the tie is broken by time_to_threshold: trial1 61, "
                "trial0 97"}
    assert "**A tie:** trial1 ties trial0 on iqm (500) on the tuning seeds" in (out / "tune.md").read_text()
    search.s = OmegaConf.create({"objective": "iqm", "sampler": "tpe", "pruner": "median", "tie_break": "none"})
    summary = json.loads((tune_summary.write_tune(search, {}) / "tune.json").read_text())  # into the tune dir it made
    assert summary["tie_break"] is None and summary["tie"]["broken_by"] is None


def test_write_tune_breaks_confirmation_ties_by_the_secondary_objective(tmp_path, monkeypatch):
    study = optuna.create_study(direction="maximize")
    for t in (_trial(0, 510.0, x=0.3), _trial(1, 505.0, x=0.7)):
        study.add_trial(t)
    ranked = sorted(study.get_trials(), key=lambda t: -t.value)
    monkeypatch.setattr("pipeline.tune.plots.write_plots", lambda *args: {})
    dirs = {"preset": _confirm_records(tmp_path / "c" / "preset", [400.0] * 4, times=[80.0] * 4),
            "trial0": _confirm_records(tmp_path / "c" / "trial0", [500.0] * 4, times=[97.0] * 4),
            "trial1": _confirm_records(tmp_path / "c" / "trial1", [500.0] * 4, times=[61.0] * 4)}
    search = _search(tmp_path, tune_seeds=range(5), candidates=lambda: ranked, study=study)
    search.s = OmegaConf.create({"objective": "iqm", "sampler": "tpe", "pruner": "median"})
    search.confirm_seeds = [10, 11, 12, 13]
    summary = json.loads((tune_summary.write_tune(search, dirs) / "tune.json").read_text())
    assert summary["tie_break"] == "time_to_threshold" and summary["best_trial"] == 1
    assert summary["best_confirmed"]["secondary"] == 61.0 and summary["best_confirmed"]["value"] == 500.0
    assert summary["tie"]["broken_by"] == "time_to_threshold" and summary["tie"]["with"] == ["trial0"]
    assert summary["tie"]["note"].startswith("trial1 ties trial0 on iqm (500) on fresh seeds; the tie is broken by")
    assert summary["best_confirmed"]["time_to_threshold_s"]["reached"] == 4


def test_a_wandb_run_without_a_sync_dir(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", stand_in_wandb([], settings=object()))
    summary = {"study_name": "s", "objective": "iqm", "best_params": None, "trials": {}, "best_tuned_value": None,
               "preset_wins": None, "candidates": [], "preset": None}
    assert log_tune_to_wandb(summary, tmp_path, "g", {"mode": "offline"})["sync_dir"] == ""


def test_best_yaml_keeps_seeding_and_overrides_whose_value_holds_an_equals_sign(tmp_path):
    """`seed` (where a run ran) is left out, `seeding` (deterministic kernels: what a run computes) is not."""
    search = _search(tmp_path, fixed=["seeding=deterministic", "task.note=a=b", "seed.x=1", "+Xk=1", "+Xseed=2",
                                      "checkpointing=1", "trial.number=3", "hydra/launcher=joblib", "+logger/wandb=on"])
    lines = best_yaml(search, {}, tmp_path, "v").splitlines()
    assert lines[4:] == ["defaults:", "  - override /seeding: deterministic", "  - _self_", "", "name: dqn_cartpole_tuned",
                         "task:", "  note: a=b", "Xk: 1", "Xseed: 2", "checkpointing: 1"]


def test_stats_and_threshold_of_the_confirmation_records():
    assert tune_summary._stats([float("nan"), float("inf")]) is None and tune_summary._stats([]) is None
    stats = tune_summary._stats([1.0, float("nan"), 3.0, 2.0])
    assert stats["iqm"] == pytest.approx(2.0) and stats["n"] == 3 and sorted(stats) == ["iqm", "iqm_ci", "n"]
    records = {0: {"status": "ok", "threshold": 475.0, "time_to_threshold_s": 10.0},
               1: {"status": "ok", "threshold": 475.0, "time_to_threshold_s": None},
               2: {"status": "failed", "threshold": 475.0, "time_to_threshold_s": 1.0},
               3: {"status": "ok", "threshold": 475.0, "time_to_threshold_s": 30.0}}
    out = tune_summary._threshold(records, [0, 1, 2, 3, 9])
    assert (out["reached"], out["of"], out["threshold"], out["n"]) == (2, 5, 475.0, 2)
    assert out["iqm"] == pytest.approx(20.0)
    assert tune_summary._threshold({0: {"status": "ok", "threshold": None}}, [0]) is None
    assert tune_summary._threshold({}, [0]) is None
    none = tune_summary._threshold({0: {"status": "ok", "threshold": 5.0, "time_to_threshold_s": None}}, [0])
    assert none == {"reached": 0, "of": 1, "threshold": 5.0, "iqm": None, "iqm_ci": None, "n": 0}
    mixed = tune_summary._threshold({0: {"status": "ok"}, 1: {"status": "ok", "threshold": 7.0}}, [0, 1])
    assert mixed["reached"] == 0 and mixed["threshold"] is None  # the first record's threshold, as it is


def test_improvement_by_hand():
    improvement = tune_summary._improvement
    assert improvement([], [1.0], True) is None and improvement([1.0], [], True) is None
    assert improvement([2.0, 3.0], [1.0], True)["p"] == 1.0 and improvement([2.0, 3.0], [1.0], False)["p"] == 0.0


SEEDS4 = [10, 11, 12, 13]


def _outcome(tmp_path, preset_times, trial_times, secondary="time_to_threshold", tuned=500.0, preset_return=500.0):
    dirs = {"preset": _confirm_records(tmp_path / "preset", [preset_return] * 4, times=preset_times),
            "trial1": _confirm_records(tmp_path / "trial1", [500.0] * 4, times=trial_times)}
    trial = types.SimpleNamespace(number=1, params={"x": 0.5}, value=tuned)
    return tune_summary.confirm_outcome(dirs, {"trial1": trial}, SEEDS4, "iqm", True, True, secondary)


def test_a_tie_with_the_preset_that_the_candidate_wins_on_the_secondary(tmp_path):
    out = _outcome(tmp_path, [70.0] * 4, [50.0] * 4)
    assert out["preset_wins"] is False and out["preset_tie"] is False
    assert out["verdict"] == ("trial1 ties the preset's iqm on fresh seeds (500) and is better on time_to_threshold "
                              "(50 vs 70, P(trial1 does better on a seed) 1.00 [1.00, 1.00]): the tie-break picks it.")
    (entry,) = out["candidates"]
    assert entry["optimism_gap"] == 0.0 and entry["primary_metric"] == "eval/return"
    assert entry["primary"]["n"] == 4 and entry["primary"]["iqm"] == 500.0 and entry["primary_scores"] == [500.0] * 4
    assert out["preset"]["secondary"] == 70.0 and entry["secondary"] == 50.0


def test_a_tie_with_the_preset_that_no_secondary_value_settles(tmp_path):
    # The preset's records have no threshold: its secondary value is missing, so nothing breaks the tie.
    out = _outcome(tmp_path / "a", None, [50.0] * 4, tuned=None)
    assert out["preset_wins"] is False and out["preset_tie"] is True
    assert out["verdict"] == ("trial1 ties the preset's iqm on fresh seeds (500), and time_to_threshold is missing on one "
                              "side: compare the other columns before switching.")
    assert out["candidates"][0]["optimism_gap"] is None and out["candidates"][0]["tuned_value"] is None
    out = _outcome(tmp_path / "b", [60.0] * 4, [60.0] * 4)  # equal secondaries: no break either
    assert out["preset_tie"] is True and out["preset_wins"] is False


def test_a_clear_win_is_no_tie(tmp_path):
    out = _outcome(tmp_path, [50.0] * 4, [50.0] * 4, preset_return=400.0)
    assert out["preset_tie"] is False and out["preset_wins"] is False and out["tie"] is None
    assert out["verdict"] == ("trial1 beats the preset's iqm on fresh seeds: iqm 500 vs 400, P(trial1 does better on a "
                              "seed) 1.00 [1.00, 1.00].")


def test_finite():
    assert tune_summary._finite(2.5) == 2.5 and tune_summary._finite(None) is None
    assert tune_summary._finite(float("inf")) is None and tune_summary._finite(float("nan")) is None

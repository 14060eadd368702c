"""TrialReporter and PruningCallback against stand-in trials and trainers: what is reported, when, and what stops."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from optuna.study import StudyDirection

import pipeline.tune.study as study_module
from pipeline.tune.pruning import PruningCallback, TrialReporter


class _Trial:
    def __init__(self, direction=StudyDirection.MAXIMIZE, prune=False):
        self.study = SimpleNamespace(direction=direction)
        self.prune = prune
        self.reported: list[tuple[float, object]] = []

    def report(self, value, step):
        self.reported.append((value, step))

    def should_prune(self):
        return self.prune


def test_from_config_fills_the_sweepers_defaults(monkeypatch):
    calls = []
    monkeypatch.setattr(study_module, "load_trial", lambda *args: calls.append(args) or "the trial")
    reporter = TrialReporter.from_config({"storage": "sqlite:///x.db", "study_name": "s", "number": "3"})
    assert reporter.trial == "the trial" and reporter.last_step is None
    assert calls == [("sqlite:///x.db", "s", 3, "median", 5, 0)]
    assert all(type(a) is type(b) for a, b in zip(calls[0], ("", "", 0, "", 0, 0)))


def test_from_config_passes_every_setting_on(monkeypatch):
    calls = []
    monkeypatch.setattr(study_module, "load_trial", lambda *args: calls.append(args))
    TrialReporter.from_config({"storage": 1, "study_name": 2, "number": 4.0, "pruner": "hyperband",
                               "n_startup_trials": "7", "n_warmup_steps": 2.0})
    assert calls == [("1", "2", 4, "hyperband", 7, 2)]
    assert [type(a) for a in calls[0]] == [str, str, int, str, int, int]


def test_report_sends_the_iqm_of_the_finite_values_at_an_integer_step():
    trial = _Trial()
    reporter = TrialReporter(trial)
    # None, NaN and infinities are dropped; three values are not trimmed: the IQM is their mean.
    assert reporter.report(7.0, [None, float("nan"), float("inf"), 1.0, 2.0, 6.0]) is False
    assert trial.reported == [(pytest.approx(3.0), 7)]
    assert type(trial.reported[0][1]) is int
    assert reporter.last_step == 7 and type(reporter.last_step) is int


def test_report_returns_the_pruners_answer_as_a_bool():
    trial = _Trial(prune=1)
    assert TrialReporter(trial).report(5, [2.0]) is True


def test_nothing_finite_reports_nothing():
    trial = _Trial(prune=True)
    reporter = TrialReporter(trial)
    assert reporter.report(3, [None, float("-inf")]) is False
    assert reporter.report(4, []) is False
    assert trial.reported == [] and reporter.last_step is None


@pytest.mark.parametrize(("direction", "higher", "sign"), [
    (StudyDirection.MAXIMIZE, True, 1.0), (StudyDirection.MAXIMIZE, False, -1.0),
    (StudyDirection.MINIMIZE, True, -1.0), (StudyDirection.MINIMIZE, False, 1.0),
])
def test_values_are_reported_in_the_studys_direction(direction, higher, sign):
    trial = _Trial(direction)
    TrialReporter(trial).report(1, [4.0], higher_is_better=higher)
    assert trial.reported == [(sign * 4.0, 1)]


class _Reporter:
    def __init__(self, answer):
        self.answer = answer
        self.calls = []

    def report(self, step, values):
        self.calls.append((step, values))
        return self.answer


def _trainer(metrics, epoch=2, sanity=False):
    return SimpleNamespace(callback_metrics=metrics, current_epoch=epoch, sanity_checking=sanity, should_stop=False)


def test_the_callback_reports_the_monitored_value_and_stops_when_pruned():
    reporter = _Reporter(True)
    callback = PruningCallback(reporter, "val/acc")
    trainer = _trainer({"val/acc": 0.25, "val/acc/agent0": 9.0, "val/loss": 1.0}, epoch=3)
    callback.on_validation_end(trainer, None)
    assert reporter.calls == [(3, [0.25])]
    assert trainer.should_stop is True and callback.pruned_at_step == 3


def test_the_callback_reports_every_agent_in_order_and_goes_on_when_not_pruned():
    reporter = _Reporter(False)
    callback = PruningCallback(reporter, "val/acc")
    metrics = {"val/acc/agent1": 0.5, "val/accuracy": 7.0, "val/acc/agent0": 0.25, "x/val/acc/agent2": 3.0}
    trainer = _trainer(metrics)
    callback.on_validation_end(trainer, None)
    assert reporter.calls == [(2, [0.25, 0.5])]
    assert type(reporter.calls[0][1][0]) is float
    assert trainer.should_stop is False and callback.pruned_at_step is None


def test_the_callback_skips_the_sanity_check_and_runs_without_the_metric():
    reporter = _Reporter(True)
    callback = PruningCallback(reporter, "val/acc")
    sanity = _trainer({"val/acc": 0.1}, sanity=True)
    callback.on_validation_end(sanity, None)
    missing = _trainer({"val/loss": 0.1})
    callback.on_validation_end(missing, None)
    assert reporter.calls == []
    assert not sanity.should_stop and not missing.should_stop and callback.pruned_at_step is None

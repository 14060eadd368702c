"""The Optuna objects study.py builds, checked against real Optuna (in memory or SQLite in tmp_path)."""

import logging
import warnings

import optuna
import pytest
from optuna.trial import TrialState

from pipeline.tune.space import Param, TuneError
from pipeline.tune.study import (
    _engine_kwargs,
    load_trial,
    make_pruner,
    make_sampler,
    open_storage,
    quiet_optuna,
    sampler_seed,
    tell,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _history(study, n_complete: int, value: float = 1.0, steps: int = 3) -> None:
    """`n_complete` finished trials that reported `value` at steps 0..steps-1 (they maximize: higher is better)."""
    for _ in range(n_complete):
        trial = study.ask()
        for step in range(steps):
            trial.report(value, step)
        study.tell(trial, value)


def _pruned_at(pruner, n_complete: int, step: int) -> bool:
    """Whether a trial far behind the `n_complete` finished ones is pruned when it reports at `step`."""
    study = optuna.create_study(direction="maximize", pruner=pruner)
    _history(study, n_complete)
    trial = study.ask()
    trial.report(0.0, step)
    return trial.should_prune()


def test_the_median_pruner_waits_for_five_finished_trials_and_no_warm_up_by_default():
    assert not _pruned_at(make_pruner("median"), 4, 0)
    assert _pruned_at(make_pruner("median"), 5, 0)


def test_the_median_pruner_takes_its_start_up_trials_and_warm_up_steps():
    pruner = make_pruner("median", n_startup_trials=2, n_warmup_steps=2)
    assert not _pruned_at(pruner, 1, 2)
    assert not _pruned_at(pruner, 2, 1)  # still warming up
    assert _pruned_at(pruner, 2, 2)


def test_pruner_none_never_prunes_and_an_unknown_one_is_named():
    assert not _pruned_at(make_pruner("none"), 10, 2)
    with pytest.raises(TuneError) as err:
        make_pruner("hyperband")
    assert str(err.value) == "hydra.sweeper.pruner=hyperband: unknown pruner; choose one of: median, none"


def _draws(sampler, n: int = 6) -> list[float]:
    study = optuna.create_study(sampler=sampler)
    dist = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}
    draws = []
    for _ in range(n):
        trial = study.ask(dist)
        draws.append(trial.params["x"])
        study.tell(trial, 0.0)
    return draws


def test_the_random_sampler_follows_its_seed():
    assert _draws(make_sampler("random", 3, [])) == _draws(make_sampler("random", 3, []))
    assert _draws(make_sampler("random", 3, [])) != _draws(make_sampler("random", 4, []))


def test_the_grid_sampler_visits_its_points_in_the_order_its_seed_gives():
    space = [Param("a", "int", low=0, high=4), Param("b", "categorical", choices=("x", "y", "z", "w"))]

    def order(seed):
        study = optuna.create_study(sampler=make_sampler("grid", seed, space))
        dists = {p.name: p.distribution() for p in space}
        seen = []
        for _ in range(20):
            trial = study.ask(dists)
            seen.append((trial.params["a"], trial.params["b"]))
            tell(study, trial, 0.0)
        return seen

    first = order(5)
    assert sorted(first) == sorted((a, b) for a in range(5) for b in "xyzw")
    assert order(5) == first  # 20 points: an unseeded order repeats with chance 1/20!
    assert order(6) != first  # (Optuna's GridSampler takes seed None as 0)


def test_sampler_seed_without_a_worker_is_seed_plus_tried_and_with_one_is_reproducible():
    assert sampler_seed(7, 3) == 10
    assert sampler_seed(0, 0) == 0
    assert sampler_seed(0, 1, ("node", 3407)) == sampler_seed(0, 1, ("node", 3407))
    assert sampler_seed(0, 1, ("node", 3407)) != sampler_seed(0, 1, ("other", 3407))


def test_engine_options_bound_a_postgresql_connection_only():
    assert _engine_kwargs("postgresql://u:p@db.example/optuna") == {"connect_args": {"connect_timeout": 10}}
    assert _engine_kwargs("postgresql+psycopg2://u:p@db.example/optuna") == {"connect_args": {"connect_timeout": 10}}
    assert _engine_kwargs("sqlite:///x/optuna.db") == {}


def test_a_path_that_is_not_a_url_is_refused_before_any_attempt():
    with pytest.raises(TuneError) as err:
        open_storage("/tmp/optuna.db")
    assert str(err.value) == ("hydra.sweeper.storage=/tmp/optuna.db: not a database URL; give e.g. sqlite:///path/optuna.db "
                              "or postgresql://user:pass@host/db")


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_a_sqlite_storage_opens_holds_studies_and_takes_heartbeat_settings(tmp_path):
    url = f"sqlite:///{tmp_path}/optuna.db"
    storage = open_storage(url)
    optuna.create_study(study_name="s", storage=storage)
    assert optuna.study.get_all_study_names(open_storage(url)) == ["s"]
    assert open_storage(url).get_heartbeat_interval() is None
    assert open_storage(url, heartbeat_interval=60, grace_period=120).get_heartbeat_interval() == 60


class _FlakyStorage:
    """Stands in for RDBStorage: fails `failures` times with `error`, then opens; records what it was given."""

    def __init__(self, failures: int, error: Exception):
        self.failures, self.error, self.calls = failures, error, []

    def __call__(self, url, **kwargs):
        self.calls.append((url, kwargs))
        if len(self.calls) <= self.failures:
            raise self.error
        return "storage"


@pytest.fixture
def sleeps(monkeypatch):
    slept = []
    monkeypatch.setattr("time.sleep", slept.append)
    return slept


def test_opening_retries_three_times_with_growing_pauses(monkeypatch, sleeps):
    # Workers that start together race to create a new database's schema: the losers retry.
    fake = _FlakyStorage(3, RuntimeError("table already exists"))
    monkeypatch.setattr(optuna.storages, "RDBStorage", fake)
    url = "postgresql://u:p@db.example/optuna"
    assert open_storage(url, heartbeat_interval=30) == "storage"
    assert sleeps == [0.25, 0.5, 1.0]
    assert fake.calls == [(url, {"heartbeat_interval": 30, "engine_kwargs": {"connect_args": {"connect_timeout": 10}}})] * 4


@pytest.mark.parametrize(
    ("error", "cause"),
    [(RuntimeError("could not connect to server\nIs the server running?"), "could not connect to server"),
     (OSError(), "OSError"), (ValueError("  "), "ValueError")],
)
def test_a_storage_that_never_opens_is_one_line_with_its_first_cause(monkeypatch, sleeps, error, cause):
    fake = _FlakyStorage(99, error)
    monkeypatch.setattr(optuna.storages, "RDBStorage", fake)
    with pytest.raises(TuneError) as err:
        open_storage("sqlite:///x.db", attempts=2)
    assert str(err.value) == (
        f"hydra.sweeper.storage=sqlite:///x.db: cannot open it ({cause}); give a SQLAlchemy URL that this machine can "
        "reach, e.g. sqlite:///path/optuna.db or postgresql://user:pass@host/db"
    )
    assert len(fake.calls) == 2 and sleeps == [0.25]


def test_four_attempts_by_default(monkeypatch, sleeps):
    fake = _FlakyStorage(99, RuntimeError("no"))
    monkeypatch.setattr(optuna.storages, "RDBStorage", fake)
    with pytest.raises(TuneError, match=r"cannot open it \(no\)"):
        open_storage("sqlite:///x.db")
    assert len(fake.calls) == 4 and sleeps == [0.25, 0.5, 1.0]


def test_load_trial_is_the_running_trial_its_job_reports_to(tmp_path):
    url = f"sqlite:///{tmp_path}/optuna.db"
    optuna.create_study(study_name="another", storage=url).ask()  # a shared database holds other studies
    study = optuna.create_study(study_name="s", direction="maximize", storage=url)
    _history(study, 2)
    running = study.ask()  # trial number 2
    study.ask()  # another running trial, number 3
    trial = load_trial(url, "s", 2, "median", 2, 1)
    assert isinstance(trial, optuna.trial.Trial)
    assert trial.number == 2
    trial.report(0.0, 0)
    assert not trial.should_prune()  # the warm-up step
    trial.report(0.0, 1)
    assert trial.should_prune()  # behind the median of the two finished trials after the warm-up
    seen = optuna.load_study(study_name="s", storage=url).trials[running.number]
    assert seen.intermediate_values == {0: 0.0, 1: 0.0}
    assert seen.state == TrialState.RUNNING


def test_load_trial_takes_its_pruner_settings(tmp_path):
    url = f"sqlite:///{tmp_path}/optuna.db"
    study = optuna.create_study(study_name="s", direction="maximize", storage=url)
    _history(study, 2)
    study.ask()
    never = load_trial(url, "s", 2, "none", 0, 0)
    never.report(0.0, 2)
    assert not never.should_prune()
    waits = load_trial(url, "s", 2, "median", 3, 0)  # three finished trials needed, two there
    assert not waits.should_prune()


def test_quiet_optuna_keeps_warnings_and_drops_optuna_s_chatter():
    optuna.logging.set_verbosity(logging.DEBUG)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_optuna()
        assert optuna.logging.get_verbosity() == logging.WARNING
        warnings.warn("an experimental feature", optuna.exceptions.ExperimentalWarning, stacklevel=1)
        warnings.warn("Heartbeat of storage is supposed to be used with Study.optimize.", UserWarning, stacklevel=1)
        warnings.warn("something else", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["something else"]


def test_tell_passes_the_state_through_and_other_errors_escape():
    study = optuna.create_study()
    trial = study.ask()
    tell(study, trial, state=TrialState.PRUNED)
    assert study.trials[0].state == TrialState.PRUNED

    class Broken:
        def tell(self, *args, **kwargs):
            raise RuntimeError("database is locked")

    with pytest.raises(RuntimeError, match="database is locked"):
        tell(Broken(), trial, 1.0)

"""The search space from Hydra's override grammar, and the one-line errors for a bad one."""

import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from pipeline.config.checks import group_options
from pipeline.tune.space import TuneError, format_value, parse_space
from pipeline.tune.study import make_sampler, open_storage, tell


def _space(make_cfg, *args, params=None):
    cfg = make_cfg("experiment=dqn_cartpole")
    return parse_space(["experiment=dqn_cartpole", *args], params, cfg, group_options())


def test_grammar_maps_to_optuna_distributions(make_cfg):
    fixed, space = _space(
        make_cfg, "optimizer.lr=tag(log, interval(1e-4, 1e-2))", "task.gradient_steps=choice(16, 32, 64)",
        "model.hidden=choice([64,64],[128,128])", "task.batch_size=range(32, 129, 32)", "seed=3",
        params={"task.gamma": "interval(0.9, 0.999)", "optimizer.lr": "choice(1,2)"},
    )
    by_name = {p.name: p.distribution() for p in space}
    assert fixed == ["experiment=dqn_cartpole", "seed=3"]
    assert by_name["optimizer.lr"] == FloatDistribution(1e-4, 1e-2, log=True)  # the command line wins over params
    assert by_name["task.gradient_steps"] == CategoricalDistribution((16, 32, 64))
    # Lists are not Optuna choices: they travel as override text, which Hydra reads back as the list.
    assert by_name["model.hidden"] == CategoricalDistribution(("[64,64]", "[128,128]"))
    assert by_name["task.batch_size"] == IntDistribution(32, 128, step=32)
    assert by_name["task.gamma"] == FloatDistribution(0.9, 0.999)


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("optimizer.lrr=interval(0.1, 1.0)", "unknown parameter 'optimizer.lrr' (not in the composed config); did you mean optimizer.lr?"),
        ("optimizer.lr=interval(0.1, 0.01)", "optimizer.lr=interval(0.1, 0.01) is empty"),
        ("optimizer.lr=interval(0.1, 0.1)", "is empty"),
        ("task.gradient_steps=choice(16)", "task.gradient_steps=choice(...) has 1 option; give at least two"),
        ("seed=range(0,5)", "seed is chosen by the tuner"),
        ("optimizer.lr=tag(log, interval(0.0, 0.1))", "needs a positive lower bound"),
    ],
)
def test_bad_space_is_one_line_naming_the_problem(make_cfg, arg, message):
    with pytest.raises(TuneError) as err:
        _space(make_cfg, arg)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_empty_space_and_grid_over_an_interval(make_cfg):
    with pytest.raises(TuneError, match="nothing to tune"):
        _space(make_cfg)
    _, space = _space(make_cfg, "optimizer.lr=interval(1e-4, 1e-2)")
    with pytest.raises(TuneError, match="grid cannot enumerate"):
        make_sampler("grid", 0, space)
    with pytest.raises(TuneError, match="unknown sampler; choose one of: tpe, random, grid"):
        make_sampler("cmaes", 0, space)


def test_storage_that_cannot_be_opened(tmp_path):
    url = f"sqlite:///{tmp_path}/no/such/dir/optuna.db"
    with pytest.raises(TuneError) as err:
        open_storage(url)
    assert str(err.value).startswith(f"hydra.sweeper.storage={url}: cannot open it (")
    assert "\n" not in str(err.value)


def test_format_value_reads_back_as_hydra_parses_it():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for value in (1e-05, 0.0023, 16, True, "adam", [128, 128], None):
        parsed = parser.parse_override(f"k={format_value(value)}").value()
        assert parsed == value


def test_grid_sampler_visits_every_point_once(make_cfg):
    import optuna

    _, space = _space(make_cfg, "task.gradient_steps=choice(16, 32)", "task.batch_size=range(32, 97, 32)")
    study = optuna.create_study(sampler=make_sampler("grid", 0, space))
    dists = {p.name: p.distribution() for p in space}
    seen = []
    for _ in range(6):
        trial = study.ask(dists)
        seen.append((trial.params["task.gradient_steps"], trial.params["task.batch_size"]))
        tell(study, trial, 0.0)  # the last one ends the grid: Optuna's study.stop() must not escape
    assert sorted(seen) == [(g, b) for g in (16, 32) for b in (32, 64, 96)]
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)

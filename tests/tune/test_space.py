"""The search space from Hydra's override grammar, and the one-line errors for a bad one."""

import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from pipeline.config.checks import group_options
from pipeline.tune.space import Param, TuneError, format_value, parse_space
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
        # Every value a trial could get passes the run's own start-up checks.
        ("model.hidden=choice([64],[0])", "search space: model.hidden=choice([64],[0]) can give model.hidden=[0], which a run "
                                          "refuses: model.hidden=[0]: layer widths are whole numbers >= 1"),
        ("task.gamma=interval(0.9, 1.5)", "can give task.gamma=1.5, which a run refuses: task.gamma=1.5: must be a finite "
                                          "number in [0, 1]; e.g. task.gamma=0.99"),
        ("task.batch_size=range(0, 64, 32)", "can give task.batch_size=0, which a run refuses"),
        ("task.target_update=choice(hard,polyak)", "task.target_update=polyak: must be one of hard, soft"),
        ("optimizer.lr=interval(0.0, 0.1)", "can give optimizer.lr=0.0, which a run refuses"),
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


# The rest build the composed config by hand: parse_space only reads it for the known keys.
_CFG = {"optimizer": {"lr": 0.001, "momentum": 0.9}, "task": {"head": {"width": 64}, "gamma": 0.99}, "seed": 0}


def _parse(*args, params=None, groups=None, cfg=None):
    from omegaconf import OmegaConf

    config = OmegaConf.create(_CFG if cfg is None else cfg)
    return parse_space(list(args), params, config, groups or {})


def _error(*args, **kwargs) -> str:
    with pytest.raises(TuneError) as err:
        _parse(*args, **kwargs)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_key_whose_value_is_mandatory_missing_can_be_searched():
    # `lr: ???` is in the config, waiting for a value: it used to be called unknown ("did you mean optimizer.lr?").
    _, space = _parse("optimizer.lr=interval(0.1, 1.0)", cfg={"optimizer": {"lr": "???"}})
    assert [p.distribution() for p in space] == [FloatDistribution(0.1, 1.0)]


def test_group_names_and_added_keys_need_not_be_in_the_config():
    fixed, space = _parse("env=choice(cartpole,acrobot)", "+extra.knob=choice(1,2)", groups={"env": ["cartpole", "acrobot"]})
    assert fixed == []
    assert [(p.name, p.distribution()) for p in space] == [
        ("env", CategoricalDistribution(("cartpole", "acrobot"))),
        ("+extra.knob", CategoricalDistribution((1, 2))),
    ]
    # Without the group it is an unknown top-level name with nothing close to it.
    assert _error("env=choice(cartpole,acrobot)").endswith("unknown parameter 'env' (not in the composed config); add it with +env=...")


@pytest.mark.parametrize(
    ("arg", "hint"),
    [
        ("optimzer=choice(1,2)", "unknown parameter 'optimzer' (not in the composed config); did you mean optimizer?"),
        ("task.head.widht=choice(1,2)", "did you mean task.head.width?"),  # the parent is everything before the last dot
        ("nothere.lr=choice(1,2)", "unknown parameter 'nothere.lr' (not in the composed config); add it with +nothere.lr=..."),
        ("task.gamma.x=choice(1,2)", "add it with +task.gamma.x=..."),  # the parent is a value, not a node
        ("zzzz=choice(1,2)", "add it with +zzzz=..."),
        ("task.qqqqqqqqqqqqqqqqq=choice(1,2)", "add it with +task.qqqqqqqqqqqqqqqqq=..."),
    ],
)
def test_an_unknown_key_is_named_with_the_closest_known_one_or_how_to_add_it(arg, hint):
    message = _error(arg)
    assert message.startswith("search space: unknown parameter ")
    assert message.endswith(hint)


def test_ranges_of_two_values_of_floats_and_on_a_log_scale():
    _, space = _parse("optimizer.lr=range(1, 3)", "optimizer.momentum=range(0.5, 2.0, 0.5)", "task.gamma=tag(log, range(1, 10))")
    lr, momentum, gamma = space
    assert lr == Param("optimizer.lr", "int", low=1, high=2, step=1)
    assert lr.distribution() == IntDistribution(1, 2)
    assert momentum == Param("optimizer.momentum", "categorical", choices=(0.5, 1.0, 1.5))  # floats: Optuna's ints cannot hold them
    assert gamma.distribution() == IntDistribution(1, 9, log=True)


def test_hydra_intervals_are_continuous_even_between_integers():
    # Hydra's interval() makes both bounds floats: interval(1, 10) samples floats.
    _, space = _parse("optimizer.lr=interval(1, 10)")
    assert [p.distribution() for p in space] == [FloatDistribution(1.0, 10.0)]


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("optimizer.lr=range(1, 2)", "search space: optimizer.lr=range(1, 2, 1) holds 1 value; widen it"),
        ("optimizer.lr=tag(log, range(1, 10, 2))",
         "search space: optimizer.lr: tag(log, range(...)) needs step 1 (Optuna samples log-int with step 1)"),
        ("optimizer.lr=tag(log, choice(1, 2))",
         "search space: tag(log, ...) applies to interval(...) or range(...), not to optimizer.lr=choice(...)"),
        ("optimizer=glob(*)", "search space: optimizer: unsupported sweep 'optimizer=glob(*)'; use interval, choice or range"),
        ("seeds_per_process=choice(1, 2)",
         "seeds_per_process is chosen by the tuner; set the number of seeds per trial with hydra.sweeper.seeds=<K>"),
    ],
)
def test_each_bad_sweep_has_its_own_message(arg, message):
    assert _error(arg) == message


def test_params_from_the_config_one_value_or_overridden_by_a_fixed_value():
    assert _error(params={"optimizer.momentum": "0.5"}) == (
        "hydra.sweeper.params.optimizer.momentum=0.5 is one value; give a sweep such as choice(a,b) or interval(lo,hi)"
    )
    # A value fixed on the command line wins over the param's sweep.
    fixed, space = _parse("optimizer.momentum=0.5", params={"optimizer.momentum": "interval(0.1, 0.9)", "optimizer.lr": "choice(1, 2)"})
    assert fixed == ["optimizer.momentum=0.5"]
    assert [p.name for p in space] == ["optimizer.lr"]
    assert _error() == "nothing to tune: give a search space, e.g. 'optimizer.lr=tag(log, interval(1e-4, 1e-2))'"


def test_seeds_per_process_is_dropped_and_the_rest_still_read():
    fixed, space = _parse("seeds_per_process=2", "optimizer.momentum=0.5", "optimizer.lr=choice(1, 2)")
    assert fixed == ["optimizer.momentum=0.5"]
    assert [p.name for p in space] == ["optimizer.lr"]


def test_int_params_to_optuna_and_to_a_grid():
    assert Param("k", "int", low=1, high=8, log=True).distribution() == IntDistribution(1, 8, log=True)
    assert Param("k", "int", low=1, high=3).distribution() == IntDistribution(1, 3, step=1)
    assert Param("k", "int", low=1, high=3).grid_values() == [1, 2, 3]
    assert Param("k", "int", low=2, high=8, step=3).grid_values() == [2, 5, 8]
    with pytest.raises(TuneError, match="k is an interval"):
        Param("k", "int", low=1, high=8, log=True).grid_values()


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (True, "true"), (False, "false"), (None, "null"), ("adam", "adam"), (16, "16"), (1e-05, "1e-05"), (0.1, "0.1"),
        ([64, 64], "[64,64]"), ((1, "a"), "[1,a]"), ({"a": 1, "b": [None, 2.5]}, "{a:1,b:[null,2.5]}"), ({}, "{}"),
    ],
)
def test_format_value_writes_override_text(value, text):
    assert format_value(value) == text

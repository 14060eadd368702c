"""A sweep gets every start-up check a single run gets, once, before anything is launched."""

import pytest

from pipeline import cli


@pytest.mark.parametrize(("args", "said"), [
    (["task.gamma=0.9,1.5"], "task.gamma=1.5"),  # a bad value in the second job only
    (["optimizer.lrr=0.1"], "did you mean optimizer.lr?"),
    (["seed=range(0,3)", "optimizer.lr=-1"], "optimizer.lr"),
])
def test_a_bad_value_or_a_typo_in_a_sweep_is_one_line_before_any_job(args, said, capsys, tmp_path):
    with pytest.raises(SystemExit) as stop:
        cli._check_sweep_first(["-m", "experiment=dqn_cartpole", "seed=0,1", *args, f"hydra.sweep.dir={tmp_path / 's'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and said in err[0], err
    assert not (tmp_path / "s").exists()


def test_a_good_sweep_and_a_tuners_search_space_pass(capsys):
    cli._check_sweep_first(["-m", "experiment=dqn_cartpole", "seed=range(0,3)", "optimizer.lr=0.001,0.0005"])
    cli._check_sweep_first(["-m", "experiment=dqn_cartpole", "hydra/sweeper=optuna", "optimizer.lr=tag(log, interval(1e-4, 1e-2))"])
    cli._check_sweep_first(["--cfg", "job", "optimizer.lr=-1"])  # not a sweep: Hydra's business
    assert capsys.readouterr().err == ""

"""A network of the user's own at the front door: a preset's `model:` keys are not merged into it, and one that does
not take what its task passes is refused before Lightning loads, in one line quoting the task's contract.

tests/config/user_models/ stands for the user's project: `my_nets.py` beside a config folder `my_conf/model/`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipeline.config.errors import ConfigError
from pipeline.runtime.start import compose_and_check
from pipeline_testing import run_cli

USER = Path(__file__).parent / "user_models"
SEARCHPATH = f"hydra.searchpath=[file://{USER / 'my_conf'}]"
DQN_DUTY = ("task=dqn builds it as model(in_features=..., out_features=...) with forward(obs [N, *obs_shape]) -> "
            "Q-values [N, out_features] (out_features: the actions)")


@pytest.fixture
def user_project(monkeypatch):
    monkeypatch.syspath_prepend(str(USER))  # the CLI puts the current folder on the path; here the project's


def model_of(*overrides: str) -> dict:
    _, run = compose_and_check(["experiment=dqn_cartpole", SEARCHPATH, *overrides])
    return OmegaConf.to_container(run.cfg.model)


def test_a_users_model_option_gets_none_of_the_presets_model_keys(user_project):
    assert model_of("model=resmlp") == {"_target_": "my_nets.ResMLP", "_partial_": True, "width": 64}
    with pytest.raises(ConfigError, match=r"^model=sized_otherwise does not fit task=dqn: .*; task=dqn builds it as "):
        model_of("model=sized_otherwise")


@pytest.mark.slow
def test_a_model_option_other_than_the_presets_is_its_own_yaml_plus_the_users_overrides(user_project):
    assert model_of("model=resmlp", "model.width=128") == {"_target_": "my_nets.ResMLP", "_partial_": True, "width": 128}
    # A shipped option other than the preset's mlp: its own hidden, not the preset's [128, 128].
    assert model_of("model=dueling")["hidden"] == OmegaConf.load(USER.parents[2] / "conf" / "model" / "dueling.yaml").hidden
    # The preset's own option keeps the preset's keys, typed or not.
    assert model_of()["hidden"] == model_of("model=mlp")["hidden"] == [128, 128]


@pytest.mark.slow
def test_a_model_that_does_not_take_what_its_task_passes_is_one_line_quoting_the_contract(user_project):
    def refused(*overrides: str) -> str:
        with pytest.raises(ConfigError) as info:
            compose_and_check(["experiment=dqn_cartpole", SEARCHPATH, *overrides])
        assert "\n" not in str(info.value)
        return str(info.value)

    assert refused("model=sized_otherwise") == (
        "model=sized_otherwise does not fit task=dqn: my_nets.SizedOtherwise(n_in: int, n_out: int): missing a required "
        f"argument: 'n_in'; {DQN_DUTY}")
    assert refused("model=not_a_module") == f"model._target_=my_nets.NotAModule is not a torch.nn.Module subclass; {DQN_DUTY}"
    assert refused("model=not_partial") == (
        "model=not_partial (my_nets.ResMLP) needs _partial_: true in its YAML (the task calls it with the sizes only it "
        f"knows); {DQN_DUTY}")
    assert refused("model=missing_module") == (
        "model._target_=no_such_module_here.Net cannot be imported (ModuleNotFoundError: No module named "
        f"'no_such_module_here'); {DQN_DUTY}")
    # The user's own key the model does not take: kept (the user typed it), and named.
    assert refused("model=resmlp", "+model.hidden=[8]") == (
        f"model=resmlp does not fit task=dqn: its keys model.hidden are no argument of my_nets.ResMLP; {DQN_DUTY}")
    assert refused("model=none").startswith("model=none: task=dqn builds its network from the model group; choose one "
                                            "with model=actor_critic|")
    # A factory function is checked by its signature, as a class is.
    assert model_of("model=resmlp_factory") == {"_target_": "my_nets.resmlp", "_partial_": True, "width": 16}


@pytest.fixture
def project(tmp_path) -> Path:
    """A copy of the user's project, run from its own folder as the docs show."""
    shutil.copytree(USER, tmp_path / "project", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / "project"


@pytest.mark.slow
def test_a_refused_model_leaves_no_run_dir_with_either_spelling_of_the_config_folder(project):
    for folder in ("hydra.searchpath=[file://my_conf]", "--config-dir=my_conf"):
        done = run_cli("experiment=dqn_cartpole", "trainer=debug", folder, "model=sized_otherwise", cwd=project)
        lines = (done.stdout + done.stderr).strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, lines
        assert lines[0].startswith("error: model=sized_otherwise does not fit task=dqn: ") and lines[0].endswith(DQN_DUTY)
        assert not (project / "outputs").exists()


@pytest.mark.slow
def test_a_users_model_trains_from_the_cli_and_loads_from_what_the_run_dir_saved(project, monkeypatch):
    import pipeline

    done = run_cli("experiment=dqn_cartpole", "trainer=debug", "hydra.searchpath=[file://my_conf]", "model=resmlp",
                   "hydra.run.dir=out/run", cwd=project)
    assert done.returncode == 0, done.stderr[-2000:]
    saved = OmegaConf.load(project / "out" / "run" / ".hydra" / "config.yaml")
    assert OmegaConf.to_container(saved.model) == {"_target_": "my_nets.ResMLP", "_partial_": True, "width": 64}
    monkeypatch.syspath_prepend(str(project))
    agent = pipeline.load(project / "out" / "run")
    assert type(agent.model).__name__ == "ResMLP" and agent.model.inp.out_features == 64
    assert agent.act([0.0, 0.0, 0.0, 0.0]) in (0, 1)


def test_help_shows_what_each_task_passes_to_a_model_and_calls_on_it(tmp_path):
    done = run_cli("--help", cwd=tmp_path)
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert lines[-8].startswith("Models: model=<option>, or one of your own")
    assert f"  task=dqn: {DQN_DUTY.removeprefix('task=dqn builds it as ')}" in lines
    assert sum(line.startswith("  task=") for line in lines[-7:]) == 7  # cem, dqn, gan, ppo, sac, supervised, td3

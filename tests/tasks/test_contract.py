"""The declared task contract (pipeline.tasks.base): each shipped task's typed Config is its YAML, and what a
task's Config declares is checked against the config before anything is built or written (the start-up check)."""

import dataclasses
from importlib.resources import files

import pytest
from hydra.utils import get_class
from omegaconf import OmegaConf

from pipeline.config.errors import ConfigError
from pipeline.config.startup import check_run
from pipeline.tasks.base import Task
from pipeline.tasks.configs import SCHEMAS

TASK_YAMLS = sorted(p.name for p in (files("pipeline.conf") / "task").iterdir() if p.name.endswith(".yaml"))


@pytest.mark.parametrize("name", TASK_YAMLS)
def test_each_shipped_task_config_is_its_dataclass_with_the_same_defaults(name):
    node = OmegaConf.to_container(OmegaConf.load(str(files("pipeline.conf") / "task" / name)))
    cls = get_class(node.pop("_target_"))
    assert issubclass(cls, Task)
    if name.removesuffix(".yaml") in SCHEMAS:  # the torch-free schemas name the task they belong to
        assert cls.Config is SCHEMAS[name.removesuffix(".yaml")]
    defaults = dataclasses.asdict(cls.Config())
    assert defaults.pop("_target_", cls.__module__ + "." + cls.__name__) == cls.__module__ + "." + cls.__name__
    # The YAML lists every hyperparameter (so --cfg job shows them all), with the dataclass's defaults:
    # a task built by hand (Task.create) behaves as one built from the shipped config.
    assert set(node) == set(defaults)
    assert {k: v for k, v in node.items() if v != defaults[k]} == {}


def test_a_wrong_type_or_unknown_key_is_one_line_naming_it(make_cfg):
    assert check_run(make_cfg("experiment=dqn_cartpole", "task.gamma=0.5")).task.gamma == 0.5
    with pytest.raises(ConfigError, match=r"^task\.gamma=high: expected a number; e\.g\. task\.gamma=0\.99$"):
        check_run(make_cfg("experiment=dqn_cartpole", "task.gamma=high"))
    with pytest.raises(ConfigError, match=r"^task\.nope is not a setting of task=dqn; its settings: "):
        check_run(make_cfg("experiment=dqn_cartpole", "+task.nope=1"))


def test_what_a_task_declares_is_checked_before_it_is_built(make_cfg):
    with pytest.raises(ConfigError, match="^task=counterfactual does not use a model; drop it with model=none"):
        check_run(make_cfg("experiment=rmac_auction", "model=mlp"))
    with pytest.raises(ConfigError, match="^task=gan trains one seed per process; seeds_per_process=3"):
        check_run(make_cfg("experiment=gan_digits", "seeds_per_process=3"))
    assert check_run(make_cfg("experiment=dqn_cartpole", "seeds_per_process=3")).trains_seeds_together
    assert check_run(make_cfg("experiment=cem_cartpole", "seeds_per_process=3")).k == 3  # RLBatchConfig's, as every RL task
    with pytest.raises(ConfigError, match="is not a pipeline.tasks.base.Task subclass"):
        check_run(make_cfg("experiment=dqn_cartpole", "task._target_=pipeline.nets.mlp.MLP"))


def test_a_task_declaring_eval_splits_must_say_how_it_scores_them():
    with pytest.raises(TypeError, match="declares eval_splits: define evaluate_model"):

        class Unscored(Task):
            eval_splits = ("test",)

    class Scored(Task):
        eval_splits = ("test",)

        def evaluate_model(self, datamodule, split, seed=None):
            return {f"{split}/x": 1.0}

    assert Scored().evaluate_model(None, "test") == {"test/x": 1.0}

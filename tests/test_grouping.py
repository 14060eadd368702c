"""Groups come from the resolved config (real Hydra composition), not from how the command was typed."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from pipeline.config.grouping import IGNORED, config_id, differences, flatten, group_name, semantic_config


@pytest.fixture
def resolved(make_cfg):
    def _resolved(*overrides: str) -> dict:
        return OmegaConf.to_container(make_cfg(*overrides), resolve=True)

    return _resolved


def test_two_spellings_of_one_configuration_are_one_group(resolved):
    plain = resolved("experiment=dqn_cartpole")
    # The preset already uses mlp 128-128 and Adam at 0.0023: the same run, typed differently.
    typed = resolved("experiment=dqn_cartpole", "model=mlp", "model.hidden=[128,128]", "optimizer.lr=0.0023")
    assert group_name(plain, "dqn_cartpole") == group_name(typed, "dqn_cartpole")


def test_keys_that_do_not_change_results_do_not_split_groups(resolved):
    base = resolved("experiment=dqn_cartpole")
    cosmetic = resolved("experiment=dqn_cartpole", "seed=7", "trainer.enable_progress_bar=false",
                        "device.num_threads=2", "logger=many", "resume=true", "ckpt_path=last")
    assert semantic_config(base) == semantic_config(cosmetic)
    durable = {**base, "checkpoint": {"enabled": False, "every_s": 5}, "isolate_jobs": False}
    assert config_id(durable) == config_id(base)
    assert config_id(base) == config_id(cosmetic)


def test_seeding_deterministic_is_a_group_of_its_own_and_says_why(resolved):
    default = semantic_config(resolved("experiment=dqn_cartpole"))
    deterministic = semantic_config(resolved("experiment=dqn_cartpole", "seeding=deterministic"))
    # The old grouping skipped every key starting with "seed", seeding included.
    assert config_id(default, already_semantic=True) != config_id(deterministic, already_semantic=True)
    names = differences({"a": default, "b": deterministic})
    assert names == {"a": "seeding.deterministic=false", "b": "seeding.deterministic=true"}
    with_choices = differences({"a": default, "b": deterministic},
                               {"a": {"seeding": "default", "logger": "csv"}, "b": {"seeding": "deterministic", "logger": "many"}})
    assert with_choices == {"a": "seeding=default", "b": "seeding=deterministic"}


def test_a_real_difference_in_a_task_key_is_named(resolved):
    configs = {
        "lr": semantic_config(resolved("experiment=dqn_cartpole", "optimizer.lr=0.001")),
        "base": semantic_config(resolved("experiment=dqn_cartpole")),
    }
    assert differences(configs) == {"lr": "optimizer.lr=0.001", "base": "optimizer.lr=0.0023"}


def test_flatten_and_ignore_by_prefix():
    nested = {"seed": 3, "task": {"gamma": 0.99, "hidden": [64, 64]}, "scheduler": {}, "logger": {"wandb": {"project": "x"}},
              "device": {"num_threads": 4, "accelerator": "cpu"}}
    assert flatten(nested) == {"seed": 3, "task.gamma": 0.99, "task.hidden": [64, 64], "scheduler": {},
                               "logger.wandb.project": "x", "device.num_threads": 4, "device.accelerator": "cpu"}
    assert semantic_config(nested) == {"device.accelerator": "cpu", "scheduler": {}, "task.gamma": 0.99,
                                       "task.hidden": [64, 64]}
    # A key that merely starts with an ignored word is kept: `seeding` is not `seed`.
    assert semantic_config({"seeding": {"deterministic": True}}) == {"seeding.deterministic": True}
    assert "seed" in IGNORED and "seeding" not in IGNORED
    # Already flat (what result.json holds) gives the same answer.
    assert semantic_config(flatten(nested)) == semantic_config(nested)


def test_many_differences_are_cut_short():
    configs = {"a": {f"k{i}": 0 for i in range(6)}, "b": {f"k{i}": 1 for i in range(6)}}
    assert differences(configs)["a"] == "k0=0 k1=0 k2=0 k3=0 +2 more"
    assert differences({"only": {"x": 1}}) == {"only": ""}
    assert differences({"a": {"x": 1}, "b": {}}) == {"a": "x=1", "b": "x=<absent>"}

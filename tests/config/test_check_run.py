"""The one start-up check (pipeline.config.startup.check_run): what it refuses, in one line each, and the typed run it
returns. Every expected line is written out as a user reads it."""

import pytest
from omegaconf import OmegaConf

from pipeline.config.errors import ConfigError
from pipeline.config.startup import (
    CheckedRun,
    CheckpointSettings,
    DeviceSettings,
    check_run,
    import_task_class,
)
from pipeline.tasks.configs import DQNConfig, GANConfig, SupervisedConfig


def refused(cfg, choices=None) -> str:
    with pytest.raises(ConfigError) as info:
        check_run(cfg, choices)
    line = str(info.value)
    assert "\n" not in line
    return line


def test_a_checked_run_is_the_config_typed(make_cfg):
    cfg = make_cfg("experiment=dqn_cartpole", "seed=7", "seeds_per_process=3", "task.gamma=0.5", "device=cpu",
                   "device.num_threads=2", "checkpoint.every_steps=500", "seeding=deterministic")
    run = check_run(cfg)
    assert isinstance(run, CheckedRun) and run.task_target == "pipeline.tasks.dqn.DQNTask"
    assert isinstance(run.task, DQNConfig) and run.task.gamma == 0.5 and run.task.total_steps == cfg.task.total_steps
    assert run.seeds == (7, 8, 9) and run.seed == 7 and run.k == 3 and run.processes == 1
    assert run.uses == frozenset({"model", "loss", "optimizer", "scheduler", "env"}) and run.trains_seeds_together
    assert run.device == DeviceSettings(accelerator="cpu", precision="32-true", num_threads=2, flush_denormal=True,
                                        cpu_heap_mb=32, compile=False, deterministic=True)
    assert run.checkpoint == CheckpointSettings(enabled=True, every_s=60.0, every_steps=500)
    assert run.choices == {} and run.data is None  # composed outside Hydra's app, without its node: no choices known
    assert "hydra" not in run.cfg and cfg.task.gamma == 0.5  # the caller's config is left as it was


def test_the_choices_come_from_the_hydra_node_and_the_data_is_typed(make_cfg):
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=rmac_auction", "data.n_bids=300"],
                      return_hydra_config=True)
    run = check_run(cfg)
    assert run.choices["experiment"] == "rmac_auction" and run.choices["task"] == "counterfactual"
    assert type(run.data).__name__ == "AuctionBidsDataConfig" and run.data.n_bids == 300
    assert run.uses == frozenset({"data"}) and not run.trains_seeds_together and "hydra" not in run.cfg


def test_a_removed_optional_group_is_filled_in_the_checked_config_only(make_cfg):
    cfg = make_cfg("experiment=supervised_digits", "~scheduler")
    run = check_run(cfg)
    assert OmegaConf.to_container(run.cfg.scheduler) == {} and "scheduler" not in cfg


def test_the_task_class_is_its_target_and_must_be_a_task():
    assert import_task_class("pipeline.tasks.dqn.DQNTask").__name__ == "DQNTask"
    with pytest.raises(ConfigError) as info:
        import_task_class("pipeline.tasks.nope.Task")
    assert str(info.value) == "task._target_=pipeline.tasks.nope.Task: ModuleNotFoundError: No module named 'pipeline.tasks.nope'"
    with pytest.raises(ConfigError) as info:
        import_task_class("torch.nn.Linear")
    assert str(info.value) == "task._target_=torch.nn.Linear is not a pipeline.tasks.base.Task subclass"


def test_seeds_together_only_for_a_task_whose_config_declares_it(make_cfg):
    assert refused(make_cfg("experiment=gan_digits", "seeds_per_process=2")) == (
        "task=gan trains one seed per process; seeds_per_process=2 works with task=cem, dqn, ppo, sac, supervised and "
        "td3 (run the seeds as a sweep: -m seed='range(0,N)')")
    assert check_run(make_cfg("experiment=supervised_digits", "seeds_per_process=3")).k == 3
    assert check_run(make_cfg("experiment=cem_cartpole", "seeds_per_process=3")).k == 3  # RLBatchConfig's, as every RL task


def test_a_group_the_task_does_not_use_is_refused_and_data_never(make_cfg):
    assert refused(make_cfg("experiment=cem_cartpole", "scheduler=step")) == (
        "task=cem does not use a scheduler; drop it with scheduler=none (got scheduler=torch.optim.lr_scheduler.StepLR)")
    assert refused(make_cfg("experiment=rmac_auction", "model=mlp")).startswith(
        "task=counterfactual does not use a model; drop it with model=none")
    # data is never refused (the lifecycle builds it for the tasks that take it), an empty group is no group.
    assert check_run(make_cfg("experiment=cem_cartpole", "data=digits")).uses == frozenset({"model", "optimizer", "loss", "env"})


def test_the_task_node_is_merged_once_with_the_key_and_an_example(make_cfg):
    assert refused(make_cfg("experiment=dqn_cartpole", "task.gamma=high")) == (
        "task.gamma=high: expected a number; e.g. task.gamma=0.99")
    assert refused(make_cfg("experiment=dqn_cartpole", "+task.nope=1")).startswith(
        "task.nope is not a setting of task=dqn; its settings: eval_every, eval_episodes, final_eval_episodes, ")
    assert refused(make_cfg("experiment=dqn_cartpole", "+task.gama=1")) == (
        "task.gama is not a setting of task=dqn; did you mean task.gamma?")
    node = make_cfg("experiment=supervised_digits", "+g=epoch", "task.scheduler_interval=${g}")
    assert check_run(node).task == SupervisedConfig(scheduler_interval="epoch")  # interpolations resolved


def test_seeds_are_whole_numbers_in_numpys_range(make_cfg):
    cfg = make_cfg("experiment=gan_digits")
    for seed, line in ((True, "seed: expected a number, got True; e.g. seed=0"),
                       (1.5, "seed=1.5: a seed is a whole number from 0 to 4294967295"),
                       (-1, "seed=-1: a seed is a whole number from 0 to 4294967295")):
        assert refused(OmegaConf.merge(cfg, {"seed": seed})).startswith(line)
    assert refused(OmegaConf.merge(cfg, {"seeds_per_process": 0})) == (
        "seeds_per_process=0: the number of seeds trained in one process is a whole number >= 1")
    assert refused(make_cfg("experiment=dqn_cartpole", "task.gamma=2.0")).startswith("task.gamma=2.0")


def test_monitors_are_checked_against_the_tasks_config(make_cfg):
    assert refused(make_cfg("experiment=supervised_digits", "callbacks=early_stopping",
                            "callbacks.early_stopping.monitor=val_acc")) == (
        "callbacks.early_stopping.monitor=val_acc: SupervisedTask logs no metric 'val_acc' for callbacks (it logs "
        "val/acc, val/loss, train/loss); did you mean callbacks.early_stopping.monitor=val/acc?")


def test_a_task_of_the_users_own_is_imported_once_and_its_config_read(make_cfg, tmp_path, monkeypatch):
    (tmp_path / "my_tasks.py").write_text(
        "from dataclasses import dataclass\nfrom typing import ClassVar\nfrom pipeline.tasks.base import Task\n\n"
        "@dataclass\nclass CoinConfig:\n    uses: ClassVar[frozenset] = frozenset()\n    flips: int = 3\n\n"
        "class CoinTask(Task):\n    Config = CoinConfig\n\n"
        "class OldTask(Task):\n    Config = CoinConfig\n    trains_seeds_together = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = make_cfg("model=none", "loss=none", "optimizer=none", "scheduler=none", "data=none")
    cfg.task = OmegaConf.create({"_target_": "my_tasks.CoinTask", "flips": 5})
    run = check_run(cfg)
    assert type(run.task).__name__ == "CoinConfig" and run.task.flips == 5 and run.uses == frozenset()
    cfg.task.flips = "many"
    assert refused(cfg) == "task.flips=many: expected a whole number; e.g. task.flips=3"
    cfg.task = OmegaConf.create({"_target_": "my_tasks.OldTask"})
    assert refused(cfg) == ("OldTask.trains_seeds_together: a task declares it on its Config; move it to "
                            "CoinConfig.trains_seeds_together (docs/add_an_algorithm.md)")


def test_a_config_typed_check_passes_the_gan_config(make_cfg):
    assert isinstance(check_run(make_cfg("experiment=gan_digits")).task, GANConfig)


def test_the_groups_a_task_may_take_are_the_task_contracts():
    """The config layer names the part groups without importing the tasks: the same six as TaskParts is built from."""
    from pipeline.config import startup
    from pipeline.tasks.base import PART_GROUPS

    assert set(startup.PART_GROUPS) == set(PART_GROUPS)

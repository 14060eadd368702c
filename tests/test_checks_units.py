"""pipeline.config.checks on configs written by hand (OmegaConf.create, no composition): each refusal's one line,
the values at the edges that pass, and what the shipped conf/ tree says (its groups and options, read by hand)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from typing import ClassVar

import pytest
from omegaconf import OmegaConf

from pipeline.config import checks
from pipeline.config.checks import ConfigError


def cfg(**node):
    return OmegaConf.create(node)


def refused(fn, *args) -> str:
    with pytest.raises(ConfigError) as info:
        fn(*args)
    return str(info.value)


# ---- the shipped groups -------------------------------------------------------------------------------------


def test_group_options_are_the_shipped_yaml_files_per_folder():
    groups = checks.group_options()
    assert groups["device"] == ["auto", "cpu", "cuda", "mps"]
    assert groups["seeding"] == ["default", "deterministic"]
    assert groups["logger"] == ["csv", "many", "tensorboard", "wandb"]
    assert groups["scheduler"] == ["cosine", "exponential", "none", "step"]
    assert groups["hydra/launcher"] == ["slurm"]
    # conf/config.yaml is not a group; conf/debug/ is chosen by the defaults list itself.
    assert "" not in groups and "config" not in groups and not any(g.startswith("debug") for g in groups)
    assert checks.conf_root().joinpath("config.yaml").is_file()


@pytest.mark.parametrize("value, options", [
    ("mlp", ["mlp"]), (" [csv,wandb] ", ["csv", "wandb"]), ("mlp, dueling", ["mlp", "dueling"]),
    ("choice(mlp,dueling)", ["mlp", "dueling"]), ("'mlp',\"dueling\"", ["mlp", "dueling"]), ("a,,b,", ["a", "b"]),
    ("range(mlp)", ["mlp"]), ("x(a)b", ["x(a)b"]),
])
def test_options_in_an_override_value(value, options):
    assert checks._options_in(value) == options


def test_group_overrides_name_the_group_and_its_options():
    assert refused(checks.check_group_overrides, ["device=gpu"]) == (
        "unknown option 'gpu' for config group 'device'; choose one of: auto, cpu, cuda, mps")
    assert "'nope'" in refused(checks.check_group_overrides, ["logger=[csv,nope]"])
    assert "'nope'" in refused(checks.check_group_overrides, ["+override seeding=nope"])
    assert "'nope'" in refused(checks.check_group_overrides, ["+seeding=nope"])
    assert "'nope'" in refused(checks.check_group_overrides, ["override seeding =nope"])
    assert refused(checks.check_group_overrides, ["scheduler=null"]) == (
        "scheduler=null does not choose an option of config group 'scheduler'; use scheduler=none")
    assert refused(checks.check_group_overrides, ["device="]) == (
        "device=null does not choose an option of config group 'device'; use one of auto, cpu, cuda, mps")
    assert refused(checks.check_group_overrides, ["device= null "]) .startswith("device=null does not")
    # Passed through: not a group, removals, Hydra's own groups, flags, options that exist, experiment=null.
    checks.check_group_overrides(["seed=3", "~device=nope", "hydra/launcher=nope", "--multirun", "-m=x", "seeding",
                                  "device=cpu", "logger=choice(csv,wandb)", "experiment=null", "experiment=",
                                  "task.gamma=null"])


# ---- types --------------------------------------------------------------------------------------------------


def test_kinds():
    assert [checks._kind(v) for v in (True, 1, 1.5, [1], OmegaConf.create([1]), "s", None, {})] == [
        "bool", "number", "number", "list", "list", None, None, None]


def test_a_value_keeps_the_type_of_the_shipped_default():
    base = {"seed": 0, "seeds_per_process": 1, "resume": False, "checkpoint": {"every_s": 60}}
    checks.check_types(cfg(**base), {})
    assert refused(checks.check_types, cfg(**{**base, "seed": "x"}), {}) == "seed: expected a number, got 'x'; e.g. seed=0"
    assert refused(checks.check_types, cfg(**{**base, "resume": 1}), {}) == "resume: expected a bool, got 1; e.g. resume=false"
    assert refused(checks.check_types, cfg(**{**base, "checkpoint": {"every_s": "often"}}), {}).startswith(
        "checkpoint.every_s: expected a number")
    # A group's option file: keys under the group's name; a list default shown without spaces.
    node = cfg(**base, model={"hidden": 5})
    assert refused(checks.check_types, node, {"model": "mlp"}) == "model.hidden: expected a list, got 5; e.g. model.hidden=[128,128]"
    assert refused(checks.check_types, cfg(**base, seeding={"deterministic": "yes"}), {"seeding": "default"}) == (
        "seeding.deterministic: expected a bool, got 'yes'; e.g. seeding.deterministic=false")
    # Not compared: experiment and hydra choices, an option not shipped, a missing value, None choices.
    checks.check_types(node, {"experiment": "dqn_cartpole", "hydra/launcher": "slurm", "model": None,
                              "task": "mine", "hydra": "x"})
    checks.check_types(cfg(seed=None, resume=None), {})


def test_check_types_skips_hydra_and_underscore_keys_of_an_option(tmp_path, monkeypatch):
    (tmp_path / "grp").mkdir()
    (tmp_path / "config.yaml").write_text("a: 1\nhydra:\n  x: 1\n")
    (tmp_path / "grp" / "o.yaml").write_text("_target_: 3\nhydra_x: 1\nb: [1, 2]\nc: s\n")
    monkeypatch.setattr(checks, "conf_root", lambda: tmp_path)
    checks.check_types(cfg(a=2, hydra={"x": "s"}, grp={"_target_": "s", "hydra_x": "s", "b": [3], "c": 1}), {"grp": "o"})
    assert refused(checks.check_types, cfg(a="s"), {}) == "a: expected a number, got 's'; e.g. a=1"
    assert refused(checks.check_types, cfg(a=1, grp={"b": 1}), {"grp": "o"}) == (
        "grp.b: expected a list, got 1; e.g. grp.b=[1,2]")


def test_missing_values_name_the_first_key_not_hydras():
    checks.check_missing(cfg(a=1))
    checks.check_missing(cfg(hydra={"x": "???"}))
    assert refused(checks.check_missing, cfg(b="???", a={"c": "???"}, hydra={"x": "???"})) == (
        "missing required value 'a.c'; set it on the command line, e.g. a.c=...")


# ---- values -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [-1, 2**32, 1.0, True, "3", None])
def test_seeds_outside_the_range_are_refused(seed):
    assert refused(checks._check_seed, cfg(seed=seed)) == (
        f"seed={seed}: a seed is a whole number from 0 to 4294967295; e.g. seed=0, or -m seed='range(0,10)'")


def test_seeds_at_the_edges_and_seeds_per_process():
    checks._check_seed(cfg(seed=0))
    checks._check_seed(cfg(seed=2**32 - 1, seeds_per_process=1))
    for k in (0, -2, 1.0, True):
        assert refused(checks._check_seed, cfg(seed=0, seeds_per_process=k)) == (
            f"seeds_per_process={k}: the number of seeds trained in one process is a whole number >= 1")


def test_a_batch_of_seeds_stays_in_the_seed_range_and_under_the_stated_limit():
    checks._check_seed(cfg(seed=2**32 - 16, seeds_per_process=16))  # the last seed is 2^32 - 1
    assert refused(checks._check_seed, cfg(seed=4294967290, seeds_per_process=16)) == (
        "seed=4294967290 seeds_per_process=16: the batch's seeds 4294967290..4294967305 pass the largest seed 4294967295; "
        "e.g. seed=4294967280")
    checks._check_seed(cfg(seed=0, seeds_per_process=4096))
    assert refused(checks._check_seed, cfg(seed=0, seeds_per_process=100000)) == (
        "seeds_per_process=100000: at most 4096 seeds train in one process; run more as processes of up to 4096, "
        "e.g. -m seed='range(0,100000,4096)' seeds_per_process=4096")


def test_removed_groups_read_as_none_or_are_refused():
    full = {g: {} for g in checks.group_options() if "/" not in g and g != "experiment"}
    for group in ("task", "device", "seeding", "logger", "trainer"):
        node = cfg(**{k: v for k, v in full.items() if k != group})
        assert refused(checks.fill_removed_groups, node) == (
            f"~{group} removes a group every run needs; choose an option: "
            f"{group}={'|'.join(checks.group_options()[group])}")
    node = cfg(**{k: v for k, v in full.items() if k not in ("scheduler", "callbacks")})
    checks.fill_removed_groups(node)
    assert node.scheduler == {} and node.callbacks == {} and "experiment" not in node


def test_a_removed_group_without_a_none_option_is_refused(monkeypatch):
    monkeypatch.setattr(checks, "group_options", lambda: {"opt": ["a", "b"], "exp": ["x"]})
    assert refused(checks.fill_removed_groups, cfg(exp={})) == (
        "~opt removes a group every run needs; choose an option: opt=a|b")


@pytest.mark.parametrize("lr", [float("nan"), float("inf"), 0, -1e-3])
def test_a_learning_rate_is_a_finite_positive_number(lr):
    assert refused(checks._check_numbers, cfg(optimizer={"lr": lr})) == (
        f"optimizer.lr={lr}: a learning rate is a finite number > 0; e.g. optimizer.lr=0.001")
    checks._check_numbers(cfg(optimizer={"lr": 1e-9}))


def test_nan_anywhere_and_inf_in_a_built_group_are_refused_with_the_shipped_default():
    assert refused(checks._check_numbers, cfg(optimizer={"weight_decay": float("nan")}), {"optimizer": "adamw"}) == (
        "optimizer.weight_decay=nan: not a finite number; e.g. optimizer.weight_decay=0.01")
    assert refused(checks._check_numbers, cfg(model={"dropout": float("-inf")}), {"model": "mine"}) == (
        "model.dropout=-inf: not a finite number; give a finite number")
    assert refused(checks._check_numbers, cfg(task={"x": float("nan")})).startswith("task.x=nan: not a finite number")
    checks._check_numbers(cfg(task={"stop_at_return": float("inf")}, trainer={"max_time": None}))  # the task's Config decides


def test_checkpoint_intervals_and_threads():
    checks._check_numbers(cfg(checkpoint={"every_s": 0, "every_steps": 0}, device={"num_threads": 1}))
    checks._check_numbers(cfg(checkpoint={"every_s": None, "every_steps": None, "enabled": False}, device={"num_threads": None}))
    checks._check_numbers(cfg(checkpoint={"every_s": 0.5, "every_steps": 3.0}))
    assert refused(checks._check_numbers, cfg(checkpoint={"every_s": -1})) == (
        "checkpoint.every_s=-1: a checkpoint interval is a number of seconds >= 0 (null: not by this measure); e.g. "
        "checkpoint.every_s=60, or checkpoint.enabled=false for no periodic checkpoints")
    for steps in (-0.5, 1.5, "abc", True, float("inf")):
        assert refused(checks._check_numbers, cfg(checkpoint={"every_steps": steps})).startswith(
            f"checkpoint.every_steps={steps}: a checkpoint interval is a whole number of steps >= 0 (null: not by this "
            "measure); e.g. checkpoint.every_steps=10000,")
    assert refused(checks._check_numbers, cfg(checkpoint={"enabled": "no"})) == (
        "checkpoint.enabled=no: true or false; e.g. checkpoint.enabled=true")
    assert refused(checks._check_numbers, cfg(checkpoint={"every_step": 5})) == (
        "checkpoint.every_step is not a checkpoint setting (it would be ignored); did you mean checkpoint.every_steps?")
    assert refused(checks._check_numbers, cfg(checkpoint=5)).startswith("checkpoint=5: checkpoint is a group of settings")
    for threads in (0, 1.0, "2", False):
        assert refused(checks._check_numbers, cfg(device={"num_threads": threads})) == (
            f"device.num_threads={threads}: the CPU thread count is a whole number >= 1 (null: torch's default); "
            "e.g. device.num_threads=1")


def test_layer_widths():
    checks._check_numbers(cfg(model={"hidden": [1, 2], "act": "relu", "hiddenx": [0], "d_hidden": 0}))
    checks._check_numbers(cfg(model=None))
    assert refused(checks._check_numbers, cfg(model={"hidden": [4, 0]})) == (
        "model.hidden=[4, 0]: layer widths are whole numbers >= 1; e.g. model.hidden=[128,128]")
    assert refused(checks._check_numbers, cfg(model={"g_hidden": [True]})).startswith("model.g_hidden=[True]:")
    assert refused(checks._check_numbers, cfg(model={"hidden": [2.0]})).startswith("model.hidden=[2.0]:")


def test_data_with_a_typed_config_is_checked_against_it_and_other_data_is_not(tmp_path):
    """The checker knows no data class: a data node is checked when its _target_ has a Config
    (pipeline.config.data_settings), whatever group option chose it."""
    check = checks.check_group_settings
    target = "pipeline.data.auction.AuctionBidsData"
    check(cfg(data={"_target_": "x.Other", "path": str(tmp_path), "n_bidders": 1}), "data", {})
    check(cfg(data=None), "data", {})
    check(cfg(data={"n_bidders": 1}), "data", {})  # no _target_: nothing declares its ranges
    check(cfg(data={"_target_": target, "path": None, "n_bidders": None}), "data", {})
    check(cfg(data={"_target_": target, "path": "", "n_bidders": 3}), "data", {})
    assert refused(check, cfg(data={"_target_": target, "path": str(tmp_path)}), "data", {}) == (
        f"data.path={tmp_path}: a directory, not a file; pass the path of the CSV file itself (data.path=<dir>/<file>.csv)")
    message = refused(check, cfg(data={"_target_": target, "path": str(tmp_path / "none.csv")}), "data", {})
    assert message.startswith(f"data.path={tmp_path / 'none.csv'}: file not found; ")
    assert refused(check, cfg(data={"_target_": target, "n_bidders": 1}), "data", {"data": "auction_bids"}) == (
        "data.n_bidders=1: must be a whole number in [2, 100] (an auction has 2 to 100 bidders here); "
        "e.g. data.n_bidders=2 or more, or null to read it from the file")


def test_closed_groups_refuse_unknown_keys_and_trainer_owned_keys():
    checks._check_closed_groups(cfg(device={"accelerator": "cpu", "num_threads": 2}), {"device": "cpu"})
    checks._check_closed_groups(cfg(device={"x": 1}), {"device": "mine"})  # the user's own option
    checks._check_closed_groups(cfg(device="cpu"), {"device": "cpu"})
    assert refused(checks._check_closed_groups, cfg(device={"accelerator": "cpu", "x": 1}), {"device": "cpu"}) == (
        "device.x is not a setting of device=cpu (it would be ignored); "
        "its settings: accelerator, compile, cpu_heap_mb, flush_denormal, num_threads, precision")
    assert refused(checks._check_closed_groups, cfg(seeding={"y": 1}), {"seeding": "default"}) == (
        "seeding.y is not a setting of seeding=default (it would be ignored); its settings: deterministic")
    assert refused(checks._check_closed_groups, cfg(trainer={"precision": 16}), {}) == (
        "trainer.precision is set by the pipeline; use device.precision (e.g. device.precision=16-mixed or bf16-mixed) instead")
    assert refused(checks._check_closed_groups, cfg(trainer={"accelerator": "gpu"}), {}) == (
        "trainer.accelerator is set by the pipeline; use device=cpu|cuda|mps|auto (device.accelerator) instead")
    # Every key the pipeline sets from its own groups is refused here, before Lightning loads (not only in trainer_kwargs).
    # trainer.devices is trainer=ddp's process count (tests/test_ddp.py); alone it is refused by _check_processes.
    checks._check_closed_groups(cfg(trainer={"devices": 2, "ddp_timeout_s": 5}), {})
    assert refused(checks._check_processes, cfg(trainer={"devices": 2})).startswith(
        "trainer.devices=2 without trainer.strategy=ddp: choose trainer=ddp")
    assert refused(checks._check_closed_groups, cfg(trainer={"default_root_dir": "x"}), {}) == (
        "trainer.default_root_dir is set by the pipeline; use hydra.run.dir=<dir> instead")
    checks._check_closed_groups(cfg(trainer=None), {})
    checks._check_closed_groups(cfg(trainer={"accumulate_grad_batches": 4, "max_epochs": 1}), {})
    assert refused(checks._check_closed_groups, cfg(trainer={"accumulate_grad_batchs": 4}), {}) == (
        "trainer.accumulate_grad_batchs is not a Lightning Trainer argument; did you mean trainer.accumulate_grad_batches?")
    assert refused(checks._check_closed_groups, cfg(trainer={"zzz": 4}), {}) == (
        "trainer.zzz is not a Lightning Trainer argument; see lightning.pytorch.Trainer's arguments")


def test_a_precision_must_be_lightnings():
    for ok in ("32-true", "bf16-mixed", 32, "16", None):
        checks._check_precision(cfg(device={"precision": ok}))
    assert refused(checks._check_precision, cfg(device={"precision": 17})) == (
        "device.precision=17 is not a Lightning precision (one of 32-true, 16-mixed, bf16-mixed, 64-true, 16-true, bf16-true, "
        "...); e.g. device.precision=32-true")
    assert refused(checks._check_precision, cfg(device={"precision": "bf16-mix"})).endswith(
        "did you mean device.precision=bf16-mixed?")
    assert refused(checks._check_precision, cfg(device={"precision": "half"})).endswith("e.g. device.precision=32-true")


def test_the_precisions_are_lightnings():
    import typing

    from lightning.fabric.connector import _PRECISION_INPUT

    allowed = {str(v) for literal in typing.get_args(_PRECISION_INPUT) for v in typing.get_args(literal)}
    assert set(checks.PRECISIONS) == allowed


def test_the_trainer_arguments_are_lightnings():
    """TRAINER_ARGS lets the start-up check skip importing Lightning; it must list the installed Trainer's arguments."""
    import inspect

    import lightning

    assert set(checks.TRAINER_ARGS) == set(inspect.signature(lightning.Trainer.__init__).parameters) - {"self"}


def test_runtime_choices_from_the_config_or_none_outside_hydra():
    node = cfg(hydra={"runtime": {"choices": {"model": "mlp", "scheduler": None, "n": 3}}})
    assert checks.runtime_choices(node) == {"model": "mlp", "scheduler": None, "n": "3"}
    assert checks.runtime_choices(cfg(a=1)) == {}


def test_built_groups_need_a_target():
    checks._check_built_groups(cfg(model={}, loss={"_target_": "x"}, optimizer=None, scheduler="s"))
    shipped = sorted(p.stem for p in (checks.conf_root() / "model").glob("*.yaml") if p.stem != "none")
    assert {"actor_critic", "mlp", "dueling"} <= set(shipped)
    assert refused(checks._check_built_groups, cfg(model={"hidden": [1], "act": "relu"})) == (
        "model has keys (hidden, act) but no _target_ (model=none keeps the preset's model.* keys); "
        f"choose one with model={'|'.join(shipped)}")
    assert refused(checks._check_built_groups, cfg(scheduler={"gamma": 0.5})).endswith(
        "choose one with scheduler=cosine|exponential|step")
    assert refused(checks._check_built_groups, cfg(optimizer={"lr": 1})).startswith("optimizer has keys (lr)")
    assert refused(checks._check_built_groups, cfg(loss={"w": 1})).startswith("loss has keys (w)")


def test_check_values_runs_every_check_and_fills_removed_groups():
    full = {g: {} for g in checks.group_options() if "/" not in g and g != "experiment"}
    ok = {**full, "seed": 0}
    node = cfg(**{k: v for k, v in ok.items() if k != "scheduler"})
    checks.check_values(node, {})
    assert node.scheduler == {}
    checks.check_values(cfg(**ok))  # choices from the config: none outside Hydra
    dqn = {"_target_": "pipeline.tasks.dqn.DQNTask"}
    for bad, says in [({"seed": -1}, "seed=-1"), ({"task": {**dqn, "gamma": 2}}, "task.gamma=2"),
                      ({"optimizer": {"_target_": "torch.optim.SGD", "lr": float("nan")}}, "optimizer.lr=nan"),
                      ({"trainer": {"max_epoch": 3}}, "did you mean trainer.max_epochs?"),
                      ({"device": {"x": 1}}, "device.x"), ({"model": {"hidden": [1]}}, "no _target_"),
                      ({"callbacks": {"x": 1}}, "callbacks.x"),
                      ({"data": {"_target_": "pipeline.data.auction.AuctionBidsData", "n_bidders": 1}}, "n_bidders")]:
        assert says in refused(checks.check_values, cfg(**{**ok, **bad}), {"device": "cpu"})


def test_callback_entries():
    assert checks.callback_entries(cfg(a=1)) == []
    assert checks.callback_entries(cfg(callbacks={"es": {"_target_": "x"}}))[0][0] == "es"
    assert refused(checks.callback_entries, cfg(callbacks=[1])) == (
        "callbacks: expected named callback configs, got [1]; e.g. callbacks=default")
    checks.check_callback_entries(cfg(callbacks={"es": {"_target_": "x"}}))
    assert refused(checks.check_callback_entries, cfg(callbacks={"x": 1})) == (
        "callbacks.x: expected a callback config with a _target_, got 1; "
        "e.g. +callbacks.x._target_=lightning.pytorch.callbacks.EarlyStopping")
    assert refused(checks.check_callback_entries, cfg(callbacks={"y": {"monitor": "m"}})).startswith(
        "callbacks.y: expected a callback config with a _target_, got {'monitor': 'm'};")


# ---- monitors -----------------------------------------------------------------------------------------------

ES = "lightning.pytorch.callbacks.EarlyStopping"
MC = "lightning.pytorch.callbacks.ModelCheckpoint"


class Logs:  # a task's Config declares what the task logs for callbacks
    monitorable_metrics = ("val/acc", "val/loss")


class LogsNothing:
    monitorable_metrics = ()


@dataclasses.dataclass
class StopsItself:
    monitorable_metrics: ClassVar[tuple] = ()
    stop_at_return: float | None = None


class Undeclared:
    pass


def test_monitoring_entries_are_early_stopping_and_checkpoints_that_name_a_metric():
    node = cfg(callbacks={"es": {"_target_": ES, "monitor": "m"}, "mc": {"_target_": MC, "monitor": "n"},
                          "lr": {"_target_": "lightning.pytorch.callbacks.LearningRateMonitor", "monitor": "x"},
                          "bad": {"_target_": "no.such.Class", "monitor": "x"}, "none": {"_target_": ES, "monitor": None},
                          "plain": {"_target_": ES}, "fn": {"_target_": "os.getcwd", "monitor": "x"}})
    assert checks._monitoring_entries(node) == [("es", "m", True), ("mc", "n", False)]
    assert checks._monitoring_entries(cfg(a=1)) == []


def test_monitors_must_name_a_logged_metric():
    ok = cfg(callbacks={"es": {"_target_": ES, "monitor": "val/acc"}, "mc": {"_target_": MC, "monitor": "val/loss"}})
    checks.check_monitors(ok, Logs)
    checks.check_monitors(cfg(callbacks={"es": {"_target_": ES, "monitor": "zzz"}}), Undeclared)
    checks.check_monitors(cfg(callbacks={}), Logs)
    typo = cfg(callbacks={"es": {"_target_": ES, "monitor": "val_acc"}})
    assert refused(checks.check_monitors, typo, Logs) == (
        "callbacks.es.monitor=val_acc: Logs logs no metric 'val_acc' for callbacks (it logs val/acc, val/loss); "
        "did you mean callbacks.es.monitor=val/acc?")
    far = cfg(callbacks={"mc": {"_target_": MC, "monitor": "qqqqqq"}})
    assert refused(checks.check_monitors, far, Logs).endswith("; e.g. callbacks.mc.monitor=val/acc")
    es = cfg(callbacks={"es": {"_target_": ES, "monitor": "r"}})
    mc = cfg(callbacks={"mc": {"_target_": MC, "monitor": "r"}})
    assert refused(checks.check_monitors, es, LogsNothing) == (
        "callbacks.es.monitor=r: LogsNothing logs no metric a callback can monitor; drop the callback with ~callbacks.es")
    assert refused(checks.check_monitors, mc, StopsItself) == (
        "callbacks.mc.monitor=r: StopsItself logs no metric a callback can monitor (it stops early by itself with "
        "task.stop_at_return); keep the latest checkpoint with callbacks.mc.monitor=null")


def test_monitors_against_the_shipped_config_of_the_task_target():
    """Without a Config handed in, the shipped one task._target_ names (torch-free); another target is not checked
    here (the start-up check hands in the Config of a task of the user's own)."""
    node = cfg(task={"_target_": "pipeline.tasks.gan.GANTask"}, callbacks={"es": {"_target_": ES, "monitor": "r"}})
    assert refused(checks.check_monitors, node) == (
        "callbacks.es.monitor=r: GANTask logs no metric a callback can monitor; drop the callback with ~callbacks.es")
    checks.check_monitors(cfg(task={"_target_": "no.such.Task"}, callbacks={"es": {"_target_": ES, "monitor": "r"}}))


def test_one_line_is_the_root_cause_first_line():
    class InstantiationException(Exception):
        pass

    inner = ValueError("bad thing\nsecond line")
    outer = InstantiationException("wrapped")
    outer.__cause__ = inner
    assert checks.root_cause(outer) is inner
    assert checks.one_line(outer) == "ValueError: bad thing"
    assert checks.one_line(RuntimeError("")) == "RuntimeError"
    lone = InstantiationException("alone")
    assert checks.root_cause(lone) is lone
    other = KeyError("k")
    other.__cause__ = inner
    assert checks.root_cause(other) is other


# ---- the env at start-up: a missing simulator, what EnvPool cannot run -----------------------------------------

def test_a_mujoco_env_without_mujoco_is_one_line_with_the_install_command(monkeypatch):
    from pipeline.config import env_ids

    monkeypatch.setitem(sys.modules, "mujoco", None)  # import mujoco now raises ImportError
    monkeypatch.setattr(env_ids, "_SPACES", {})
    line = refused(env_ids.action_kind, "HalfCheetah-v5", {})
    assert line.startswith("env HalfCheetah-v5 needs MuJoCo, which is not installed: pip install") and "\n" not in line
    assert env_ids.action_kind("CartPole-v1", {}) == ("discrete", "Discrete(2)")  # no simulator to install


def test_backend_envpool_is_refused_without_envpool(monkeypatch):
    from pipeline.config.env_ids import check_env_backend

    monkeypatch.setitem(sys.modules, "envpool", None)
    assert refused(check_env_backend, "CartPole-v1", {}, "envpool").startswith(
        'env.backend=envpool needs envpool, which is not installed: pip install "envpool==1.2.5"')
    check_env_backend("CartPole-v1", {}, "gym")  # other backends are not EnvPool's business


@pytest.mark.parametrize(("env_id", "kwargs", "start"), [
    ("Taxi-v4", {}, "EnvPool 1.2.5 has no Taxi-v4; see envpool.list_all_envs() (or env.backend=gym)"),
    ("CartPole-v1", {"render_mode": "human"}, "env.backend=envpool: CartPole-v1 takes no env.kwargs ['render_mode']"),
    ("ALE/Pong-v5", {"terminal_on_life_loss": True}, "env.backend=envpool: terminal_on_life_loss=true restarts the game"),
    ("ALE/Pong-v5", {"noop_max": 0}, "env.backend=envpool: EnvPool 1.2.5 crashes (segfault) with noop_max=0"),
])
def test_backend_envpool_refuses_what_envpool_cannot_run(env_id, kwargs, start):
    pytest.importorskip("envpool", reason="envpool is not installed (pip install -e '.[envpool]')")
    from pipeline.config.env_ids import check_env_backend

    assert refused(check_env_backend, env_id, kwargs, "envpool").startswith(start)
    check_env_backend(env_id, kwargs, "gym")


def test_the_env_checks_load_no_torch():
    pytest.importorskip("envpool", reason="envpool is not installed (pip install -e '.[envpool]')")
    probe = ("import sys; from pipeline.config import env_ids; "
             "env_ids.check_env_backend('ALE/Pong-v5', {'noop_max': 30}, 'envpool'); env_ids.action_kind('Pendulum-v1'); "
             "print(sorted(m for m in ('torch', 'lightning') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr[-2000:] + proc.stdout

"""The task contract's defaults (pipeline.tasks.base), each hook called by hand on small stand-in tasks.

Expectations are written out by hand: the declarations a new algorithm inherits, the messages of each refusal,
the metrics kept by scalar_metrics, the time breakdown of the default fit_and_evaluate under a stand-in clock.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from pipeline.tasks import base
from pipeline.tasks.base import (
    PART_GROUPS,
    NoConfig,
    NonFiniteLossError,
    Progress,
    Task,
    TaskParts,
    check_finite,
    scalar_metrics,
)


@dataclasses.dataclass
class _Config:
    gamma: float = 0.99
    width: int = 4


class _Plain(Task):
    """A task with no net attribute: its own parameters are the agent."""

    def __init__(self, config=None, parts=None):
        super().__init__(config, parts)
        self.weight = nn.Parameter(torch.tensor([1.0, 2.0]))


class _WithNet(Task):
    Config = _Config

    def __init__(self, config=None, parts=None):
        super().__init__(config, parts)
        self.net = nn.Linear(2, 1)
        self.extra = nn.Parameter(torch.zeros(3))


# ---- check_finite -----------------------------------------------------------------------------------------
def test_check_finite_passes_finite_losses_and_names_the_step_and_hint_otherwise():
    check_finite(torch.tensor(1.5), 3)
    check_finite(torch.tensor([0.0, -2.0, 1e30]), 3)
    with pytest.raises(NonFiniteLossError) as info:
        check_finite(torch.tensor(float("nan")), 7)
    assert str(info.value) == "loss became nan at step 7; lower the learning rate or clip gradients"
    # One bad entry among finite ones is enough; the value shown is the mean.
    with pytest.raises(NonFiniteLossError, match=r"^loss became inf at step 12; clip harder$"):
        check_finite(torch.tensor([1.0, float("inf"), 2.0]), 12, hint="clip harder")
    with pytest.raises(NonFiniteLossError, match=r"^loss became -inf at step 0; "):
        check_finite(torch.tensor([-float("inf")], requires_grad=True), 0)
    assert issubclass(NonFiniteLossError, RuntimeError)


# ---- the parts -------------------------------------------------------------------------------------------
def test_part_groups_name_each_config_group_and_its_taskparts_field():
    assert PART_GROUPS == {"model": "net", "loss": "loss", "optimizer": "optimizer", "scheduler": "scheduler",
                           "env": "env", "data": "datamodule"}
    names = {f.name for f in dataclasses.fields(TaskParts)}
    assert set(PART_GROUPS.values()) <= names


def test_taskparts_defaults_and_require():
    parts = TaskParts()
    assert (parts.seed, parts.n_agents) == (0, 1)
    assert all(getattr(parts, k) is None for k in ("net", "loss", "optimizer", "scheduler", "env", "datamodule",
                                                   "run_dir", "device"))
    with pytest.raises(ValueError) as info:
        parts.require("env", "dqn", "choose env=cartpole")
    assert str(info.value) == "task=dqn needs env: choose env=cartpole"
    env = {"id": "CartPole-v1"}
    assert TaskParts(env=env).require("env", "dqn", "unused") is env
    # A falsy part that is not None is still a part.
    assert TaskParts(env={}).require("env", "dqn", "unused") == {}


def test_progress_fields():
    p = Progress(3, 10, "steps", {"return": 1.0})
    assert (p.done, p.total, p.unit, p.shown) == (3, 10, "steps", {"return": 1.0})


# ---- declarations and construction ----------------------------------------------------------------------
def test_the_declarations_a_new_task_inherits():
    from pipeline.config.task_settings import declared

    assert Task.Config is NoConfig
    # Start-up declarations live on the Config: one that declares none takes no group, trains one seed per process.
    assert declared(NoConfig, "uses") == frozenset() and declared(NoConfig, "trains_seeds_together") is False
    assert declared(NoConfig, "monitorable_metrics") is None
    assert not hasattr(Task, "uses") and not hasattr(Task, "monitorable_metrics")
    assert Task.writes_curves is False
    assert Task.checkpointing == "lightning"
    assert Task.primary_metric == ""
    assert Task.primary_curve is None
    assert Task.higher_is_better is True
    assert Task.capture_video is False
    assert Task.eval_splits == ()


def test_init_defaults_and_what_the_lifecycle_sets_later():
    task = _Plain()
    assert isinstance(task.config, NoConfig)
    assert (task.seed, task.n_agents, task.agent_seeds) == (0, 1, [0])
    assert task.time_breakdown_s == {}
    assert task.curves == []
    assert task.checkpoint_hook is None
    assert task.trial_reporter is None
    assert task.video_hook is None
    assert task.progress() is None
    assert task.resume_step is None
    assert task.agent_record(0) == {}


def test_init_takes_the_config_and_the_parts_seed_and_agents():
    config = _Config(gamma=0.5)
    task = _WithNet(config, TaskParts(seed=torch.tensor(7), n_agents=3))
    assert task.config is config
    assert task.seed == 7 and type(task.seed) is int
    assert task.n_agents == 3 and type(task.n_agents) is int
    assert task.agent_seeds == [7, 8, 9]
    assert isinstance(_WithNet().config, _Config)


def test_create_splits_parts_from_config_fields():
    env = {"id": "CartPole-v1"}
    task = _WithNet.create(seed=5, n_agents=2, env=env, gamma=0.25, run_dir=Path("x"))
    assert task.config == _Config(gamma=0.25, width=4)
    assert (task.seed, task.n_agents, task.agent_seeds) == (5, 2, [5, 6])
    assert isinstance(task, _WithNet)
    with pytest.raises(TypeError, match="nope"):
        _WithNet.create(nope=1)


def test_add_time_accumulates_per_phase_as_floats():
    task = _Plain()
    task.add_time("train", 1)
    task.add_time("train", 0.5)
    task.add_time("eval", 2)
    assert task.time_breakdown_s == {"train": 1.5, "eval": 2.0}
    assert all(type(v) is float for v in task.time_breakdown_s.values())


# ---- fit_and_evaluate ------------------------------------------------------------------------------------
class _Trainer:
    def __init__(self, results):
        self.results = results
        self.calls = []

    def fit(self, task, **kwargs):
        self.calls.append(("fit", task, kwargs))

    def test(self, task, **kwargs):
        self.calls.append(("test", task, kwargs))
        return self.results


def _clock(monkeypatch, times):
    ticks = iter(times)
    monkeypatch.setattr(base.time, "perf_counter", lambda: next(ticks))


def test_fit_and_evaluate_fits_tests_and_returns_the_test_metrics(monkeypatch):
    task = _Plain()
    trainer = _Trainer([{"test/acc": torch.tensor(0.75), "test/n": 4, "flag": True}, {"ignored": 1.0}])
    dm = object()
    _clock(monkeypatch, [10.0, 12.5, 20.0, 20.25])
    out = task.fit_and_evaluate(trainer, dm, "last.ckpt")
    assert out == [{"test/acc": 0.75, "test/n": 4.0}]
    assert trainer.calls == [("fit", task, {"datamodule": dm, "ckpt_path": "last.ckpt"}),
                             ("test", task, {"datamodule": dm, "verbose": False})]
    assert task.time_breakdown_s == {"fit": 2.5, "test": 0.25}


def test_fit_and_evaluate_without_test_results_is_one_empty_dict(monkeypatch):
    _clock(monkeypatch, [0.0, 1.0, 1.0, 3.0])
    assert _Plain().fit_and_evaluate(_Trainer([]), None, None) == [{}]


# ---- weights ---------------------------------------------------------------------------------------------
def test_agent_state_dict_is_the_nets_weights_detached_on_cpu():
    task = _WithNet()
    with torch.no_grad():
        task.net.weight.copy_(torch.tensor([[1.0, -1.0]]))
        task.net.bias.fill_(0.5)
    state = task.agent_state_dict(0)
    assert set(state) == {"weight", "bias"}
    assert torch.equal(state["weight"], torch.tensor([[1.0, -1.0]]))
    assert torch.equal(state["bias"], torch.tensor([0.5]))
    assert not any(v.requires_grad for v in state.values())
    assert all(v.device.type == "cpu" for v in state.values())


def test_by_default_a_policy_needs_no_files_besides_its_weights():
    assert _WithNet().agent_files(0) == {} and _Plain().agent_files(3) == {}


def test_agent_state_dict_of_a_task_without_net_is_the_tasks_own():
    task = _Plain()
    state = task.agent_state_dict(0)
    assert set(state) == {"weight"}
    assert torch.equal(state["weight"], torch.tensor([1.0, 2.0]))
    task.net = "not a module"  # a non-module `net` attribute is not the agent
    assert set(task.agent_state_dict(0)) == {"weight"}


def test_load_agent_state_dict_into_the_net_or_the_task():
    task = _WithNet()
    task.load_agent_state_dict({"weight": torch.tensor([[3.0, 4.0]]), "bias": torch.tensor([-2.0])})
    assert torch.equal(task.net.weight.detach(), torch.tensor([[3.0, 4.0]]))
    assert torch.equal(task.net.bias.detach(), torch.tensor([-2.0]))
    plain = _Plain()
    plain.load_agent_state_dict({"weight": torch.tensor([5.0, 6.0])})
    assert torch.equal(plain.weight.detach(), torch.tensor([5.0, 6.0]))
    with pytest.raises(RuntimeError, match="weight"):
        task.load_agent_state_dict({"weight": torch.zeros(3, 3), "bias": torch.zeros(1)})


def test_evaluate_model_refused_without_eval_splits():
    with pytest.raises(TypeError) as info:
        _Plain().evaluate_model(None, "test")
    assert str(info.value) == "_Plain declares no eval_splits: python -m pipeline.eval cannot score it"


# ---- checkpointing ---------------------------------------------------------------------------------------
def test_state_checkpointing_needs_both_methods_when_the_class_is_made():
    message = r"^Stateful declares checkpointing='state': define checkpoint_state and load_checkpoint_state$"
    with pytest.raises(TypeError, match=message):
        class Stateful(Task):
            checkpointing = "state"
    with pytest.raises(TypeError, match=message):
        class Stateful(Task):  # noqa: F811
            checkpointing = "state"

            def checkpoint_state(self):
                return {}
    with pytest.raises(TypeError, match=message):
        class Stateful(Task):  # noqa: F811
            checkpointing = "state"

            def load_checkpoint_state(self, state):
                return 0

    class Complete(Task):
        checkpointing = "state"

        def checkpoint_state(self):
            return {"step": 4}

        def load_checkpoint_state(self, state):
            return state["step"]

    assert Complete().load_checkpoint_state(Complete().checkpoint_state()) == 4

    class LightningOnly(Task):  # the default checkpointing needs neither
        pass

    assert LightningOnly.checkpointing == "lightning"


def test_eval_splits_need_evaluate_model_when_the_class_is_made():
    with pytest.raises(TypeError, match=r"^Scored declares eval_splits: define evaluate_model$"):
        class Scored(Task):
            eval_splits = ("test",)

    class Scored(Task):
        eval_splits = ("test",)

        def evaluate_model(self, datamodule, split, seed=None):
            return {f"{split}/acc": 1.0}

    assert Scored().evaluate_model(None, "test") == {"test/acc": 1.0}


def test_default_checkpoint_state_is_refused_and_load_reads_the_epoch():
    task = _Plain()
    with pytest.raises(TypeError) as info:
        task.checkpoint_state()
    assert str(info.value) == "_Plain declares checkpointing='lightning' without checkpoint_state"
    assert task.load_checkpoint_state({"epoch": 3, "global_step": 90}) == 3
    assert task.load_checkpoint_state({}) == 0
    step = task.load_checkpoint_state({"epoch": 2.0})
    assert step == 2 and type(step) is int


# ---- scalar_metrics --------------------------------------------------------------------------------------
def test_scalar_metrics_keeps_numbers_as_floats_and_non_finite_as_nan():
    out = scalar_metrics({
        "a": torch.tensor(0.5),
        "b": 3,
        "c": 2.5,
        "d": True,
        "e": "text",
        "f": float("inf"),
        "g": torch.tensor(float("-inf")),
        "h": None,
        7: 1,
        "i": torch.tensor(False),
    })
    assert set(out) == {"a", "b", "c", "f", "g", "7"}
    assert (out["a"], out["b"], out["c"], out["7"]) == (0.5, 3.0, 2.5, 1.0)
    assert all(type(v) is float for v in out.values())
    assert math.isnan(out["f"]) and math.isnan(out["g"])
    assert scalar_metrics({}) == {}

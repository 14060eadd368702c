"""When a run saves its checkpoint, by hand: the policy on a hand-driven clock, the epoch-end checkpointer and
the state-task hook on stand-in trainers and tasks (no Lightning fit, no training)."""

from __future__ import annotations

import logging
import signal
from types import SimpleNamespace

import pytest
import torch

from pipeline.runtime import checkpointing
from pipeline.runtime.checkpointing import (
    CheckpointPolicy,
    EpochCheckpointer,
    ValidationTimer,
    state_checkpointer,
)
from pipeline.runtime.rundir import Interrupted, StopRequests


class Clock:
    """Stands in for the `time` module inside checkpointing: both clocks read `now`, moved by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(checkpointing, "time", c)
    return c


def _stop(requested: bool = False) -> StopRequests:
    stop = StopRequests()
    if requested:
        stop._handle(signal.SIGTERM, None)
    return stop


# ---- CheckpointPolicy ----------------------------------------------------------------------------------
def test_the_default_policy_saves_every_60_seconds_and_not_by_steps(clock):
    policy = CheckpointPolicy()
    assert (policy.enabled, policy.every_s, policy.every_steps) == (True, 60.0, None)
    clock.now += 59.9
    assert policy.due(10**9) is False  # steps alone never make it due
    clock.now += 0.1
    assert policy.due(0) is True  # exactly 60 s after it was made


def test_a_time_policy_counts_from_the_last_start_or_save(clock):
    policy = CheckpointPolicy(every_s=10)
    clock.now += 8
    policy.start(5)
    clock.now += 9
    assert policy.due(5) is False
    clock.now += 1
    assert policy.due(5) is True
    policy.saved(7)
    assert policy.due(7) is False
    clock.now += 10
    assert policy.due(7) is True


def test_a_step_policy_is_due_every_n_steps_from_the_last_save(clock):
    policy = CheckpointPolicy(every_s=None, every_steps=10)
    clock.now += 1e9  # time alone never makes it due
    assert policy.due(9) is False
    assert policy.due(10) is True
    policy.saved(13)
    assert policy.due(22) is False
    assert policy.due(23) is True
    policy.start(100)
    assert policy.due(109) is False and policy.due(110) is True


def test_steps_and_seconds_whichever_comes_first(clock):
    policy = CheckpointPolicy(every_s=30, every_steps=4)
    assert policy.due(3) is False
    assert policy.due(4) is True
    clock.now += 30
    assert policy.due(0) is True


def test_values_from_a_config_are_read_as_numbers(clock):
    policy = CheckpointPolicy(every_s="5", every_steps="3")
    policy.start("2")
    assert policy.due(4) is False and policy.due(5) is True
    clock.now += 5
    assert policy.due(2) is True


@pytest.mark.parametrize("every_steps", [None, 0])
def test_no_step_count_never_makes_it_due(clock, every_steps):
    policy = CheckpointPolicy(every_s=None, every_steps=every_steps)
    clock.now += 1e9
    assert policy.due(10**6) is False


def test_the_first_safe_point_after_start_up_saves_then_the_interval_counts_from_it(clock):
    policy = CheckpointPolicy(every_s=60, first=True)
    policy.start(0)
    assert policy.due(1) is True and policy.due(1) is True  # until it is saved
    policy.saved(1)
    clock.now += 59
    assert policy.due(500) is False
    clock.now += 1
    assert policy.due(500) is True
    assert CheckpointPolicy(enabled=False, first=True).due(1) is False


def test_a_disabled_policy_is_never_due(clock):
    policy = CheckpointPolicy(enabled=False, every_s=1, every_steps=1)
    clock.now += 100
    assert policy.due(100) is False


# ---- ValidationTimer -----------------------------------------------------------------------------------
def test_validation_time_adds_up_over_the_validations(clock):
    timer = ValidationTimer()
    assert timer.seconds == 0.0
    clock.now = 10.0
    timer.on_validation_start(None, None)
    clock.now = 12.5
    timer.on_validation_end(None, None)
    clock.now = 20.0  # training time in between is not counted
    timer.on_validation_start(None, None)
    clock.now = 21.0
    timer.on_validation_end(None, None)
    assert timer.seconds == 3.5


# ---- EpochCheckpointer ----------------------------------------------------------------------------------
class Trainer:
    """What EpochCheckpointer reads from Lightning's trainer: the epoch, max_epochs, the checkpoint dict and the
    number of processes (one: the run's own)."""

    world_size = 1

    def __init__(self, max_epochs) -> None:
        self.current_epoch = 0
        self.max_epochs = max_epochs
        self.dumps = 0
        self._checkpoint_connector = SimpleNamespace(dump_checkpoint=self.dump)

    def dump(self, weights_only):
        assert weights_only is False  # the full checkpoint: optimizer and loop state too
        self.dumps += 1
        return {"epoch": self.current_epoch, "w": torch.full((3,), float(self.current_epoch))}


class Saves(list):
    def __call__(self, **kw):
        self.append(kw)


def _checkpointer(tmp_path, policy, stop=None, saved_epoch=None):
    saves = Saves()
    ckpt = EpochCheckpointer(tmp_path / "last.ckpt", policy, stop or _stop(), saves, saved_epoch=saved_epoch)
    return ckpt, saves


def _epoch_end(ckpt, trainer, epoch) -> None:
    trainer.current_epoch = epoch
    ckpt.on_train_epoch_end(trainer, None)


def test_a_due_epoch_is_saved_and_reported(tmp_path, clock):
    policy = CheckpointPolicy(every_s=None, every_steps=1)
    ckpt, saves = _checkpointer(tmp_path, policy)
    assert ckpt.path == tmp_path / "last.ckpt" and ckpt.saved_epoch is None
    trainer = Trainer(max_epochs=10)
    _epoch_end(ckpt, trainer, 1)
    assert torch.load(tmp_path / "last.ckpt")["epoch"] == 1
    assert saves == [{"step": 1, "seconds": 0.0, "size": (tmp_path / "last.ckpt").stat().st_size}]
    assert ckpt.saved_epoch == 1 and ckpt._unsaved is None
    assert policy.due(1) is False and policy.due(2) is True  # the policy counts from the saved epoch


def test_the_save_is_timed(tmp_path, clock, monkeypatch):
    def slow_save(state, path):
        clock.now += 2.5
        return real(state, path)

    real = checkpointing.save_atomic
    monkeypatch.setattr(checkpointing, "save_atomic", slow_save)
    ckpt, saves = _checkpointer(tmp_path, CheckpointPolicy(every_s=None, every_steps=1))
    _epoch_end(ckpt, Trainer(max_epochs=10), 1)
    assert saves[0]["seconds"] == 2.5


def test_an_epoch_not_due_is_kept_in_memory_and_saved_on_a_stop_request(tmp_path, clock):
    stop = _stop()
    ckpt, saves = _checkpointer(tmp_path, CheckpointPolicy(every_s=None, every_steps=5), stop)
    trainer = Trainer(max_epochs=10)
    _epoch_end(ckpt, trainer, 2)
    assert not (tmp_path / "last.ckpt").exists() and saves == []
    assert ckpt._unsaved[0] == 2
    trainer.current_epoch = 3  # the live state moves on; the kept copy does not
    ckpt.on_train_batch_end(trainer, None, None, None, 0)  # no stop requested: nothing happens
    assert not (tmp_path / "last.ckpt").exists()
    stop._handle(signal.SIGTERM, None)
    with pytest.raises(Interrupted) as err:
        ckpt.on_train_batch_end(trainer, None, None, None, 1)
    assert err.value.step == 2
    state = torch.load(tmp_path / "last.ckpt")
    assert state["epoch"] == 2 and torch.equal(state["w"], torch.full((3,), 2.0))
    assert saves == [{"step": 2, "seconds": 0.0, "size": (tmp_path / "last.ckpt").stat().st_size}]
    assert ckpt.saved_epoch == 2 and ckpt._unsaved is None


def test_a_stop_with_nothing_kept_saves_nothing_and_names_the_last_saved_epoch(tmp_path, clock):
    ckpt, saves = _checkpointer(tmp_path, CheckpointPolicy(), _stop(requested=True), saved_epoch=4)
    with pytest.raises(Interrupted) as err:
        ckpt.on_train_batch_end(Trainer(10), None, None, None, 0)
    assert err.value.step == 4 and saves == [] and not (tmp_path / "last.ckpt").exists()


@pytest.mark.parametrize("kept, saved, written", [(3, 3, False), (2, 3, False), (4, 3, True), (0, None, True)])
def test_a_kept_epoch_is_written_only_when_newer_than_the_saved_one(tmp_path, clock, kept, saved, written):
    ckpt, saves = _checkpointer(tmp_path, CheckpointPolicy(), saved_epoch=saved)
    ckpt._unsaved = (kept, b"bytes of the kept epoch")
    ckpt.save_last_finished_epoch()
    assert (tmp_path / "last.ckpt").exists() is written
    assert len(saves) == int(written)
    if written:
        assert (tmp_path / "last.ckpt").read_bytes() == b"bytes of the kept epoch"
        assert saves == [{"step": kept, "seconds": 0.0, "size": 23}]


def test_the_last_epoch_and_an_epoch_with_a_stop_request_are_saved_even_when_not_due(tmp_path, clock):
    ckpt, saves = _checkpointer(tmp_path, CheckpointPolicy(every_s=None, every_steps=100))
    trainer = Trainer(max_epochs=3)
    _epoch_end(ckpt, trainer, 1)
    assert saves == []
    _epoch_end(ckpt, trainer, 2)  # epoch 2 of 0..2 is the last
    assert [s["step"] for s in saves] == [2]

    stop = _stop()
    ckpt, saves = _checkpointer(tmp_path / "b", CheckpointPolicy(every_s=None, every_steps=100), stop)
    _epoch_end(ckpt, trainer, 0)
    stop._handle(signal.SIGTERM, None)
    _epoch_end(ckpt, trainer, 1)
    assert [s["step"] for s in saves] == [1]


def test_without_max_epochs_every_epoch_is_saved(tmp_path, clock):
    ckpt, saves = _checkpointer(tmp_path, CheckpointPolicy(every_s=None, every_steps=100))
    trainer = Trainer(max_epochs=None)
    _epoch_end(ckpt, trainer, 0)
    _epoch_end(ckpt, trainer, 1)
    assert [s["step"] for s in saves] == [0, 1]


def test_a_disabled_policy_saves_no_epoch_and_keeps_none(tmp_path, clock):
    ckpt, saves = _checkpointer(tmp_path, CheckpointPolicy(enabled=False), _stop(requested=True))
    trainer = Trainer(max_epochs=1)
    _epoch_end(ckpt, trainer, 0)  # the last epoch, and a stop requested: still nothing
    assert trainer.dumps == 0 and ckpt._unsaved is None and saves == []


def test_a_failed_epoch_save_warns_and_training_goes_on(tmp_path, clock, caplog):
    (tmp_path / "file").write_text("a file where the checkpoint dir should be")
    policy = CheckpointPolicy(every_s=None, every_steps=2)
    saves = Saves()
    ckpt = EpochCheckpointer(tmp_path / "file" / "last.ckpt", policy, _stop(), saves)
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        _epoch_end(ckpt, Trainer(max_epochs=10), 2)  # no exception
    assert saves == [] and ckpt.saved_epoch is None
    (record,) = caplog.records
    assert record.getMessage().startswith(f"checkpoint of epoch 2 not saved: cannot write {tmp_path / 'file' / 'last.ckpt'}: ")
    assert record.getMessage().endswith("; training goes on")
    assert policy.due(3) is False and policy.due(4) is True  # the next try waits a full interval


def test_a_failed_save_of_the_kept_epoch_warns(tmp_path, clock, caplog):
    (tmp_path / "file").write_text("")
    saves = Saves()
    ckpt = EpochCheckpointer(tmp_path / "file" / "last.ckpt", CheckpointPolicy(), _stop(), saves)
    ckpt._unsaved = (3, b"x")
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        ckpt.save_last_finished_epoch()
    (record,) = caplog.records
    assert record.getMessage().startswith(f"checkpoint of epoch 3 not saved: cannot write {tmp_path / 'file' / 'last.ckpt'}: ")
    assert "training goes on" not in record.getMessage()  # the run is stopping
    assert saves == [] and ckpt.saved_epoch is None and ckpt._unsaved == (3, b"x")


# ---- state_checkpointer ----------------------------------------------------------------------------------
class Task:
    def __init__(self, step: int = 0, replay=None, fail: Exception | None = None) -> None:
        self.resume_step = step
        self.replay = replay
        self.fail = fail

    def checkpoint_state(self) -> dict:
        if self.fail is not None:
            raise self.fail
        return {"step": self.resume_step, "replay": self.replay}


def test_the_hook_saves_when_due_and_reports_the_save(tmp_path, clock):
    task, notes = Task(step=3), Saves()
    policy = CheckpointPolicy(every_s=None, every_steps=5)
    hook = state_checkpointer(task, tmp_path / "last.ckpt", policy, _stop(), notes)
    hook()
    assert notes == [] and not (tmp_path / "last.ckpt").exists()
    task.resume_step = 5
    hook()
    assert torch.load(tmp_path / "last.ckpt", weights_only=False) == {"step": 5, "replay": None}
    size = (tmp_path / "last.ckpt").stat().st_size
    assert notes == [{"step": 5, "seconds": 0.0, "size": size, "replay_saved": False}]
    task.resume_step, task.replay = 10, [1, 2]
    hook()
    assert notes[-1]["step"] == 10 and notes[-1]["replay_saved"] is True
    assert policy.due(14) is False and policy.due(15) is True  # counted from the last save


def test_the_final_call_saves_whenever_checkpoints_are_on(tmp_path, clock):
    task, notes = Task(step=2), Saves()
    hook = state_checkpointer(task, tmp_path / "last.ckpt", CheckpointPolicy(every_s=None, every_steps=100), _stop(), notes)
    hook(final=True)
    assert [n["step"] for n in notes] == [2]
    notes = Saves()
    hook = state_checkpointer(task, tmp_path / "off.ckpt", CheckpointPolicy(enabled=False), _stop(), notes)
    hook(final=True)
    hook()
    assert notes == [] and not (tmp_path / "off.ckpt").exists()


def test_a_stop_request_saves_and_interrupts_except_at_the_final_call(tmp_path, clock):
    task, notes = Task(step=7), Saves()
    stop = _stop(requested=True)
    hook = state_checkpointer(task, tmp_path / "last.ckpt", CheckpointPolicy(enabled=False), stop, notes)
    with pytest.raises(Interrupted) as err:
        hook()
    assert err.value.step == 7 and [n["step"] for n in notes] == [7]  # saved even with periodic saves off
    notes.clear()
    hook(final=True)  # the fit is over: the final save is the policy's, no interruption
    assert notes == []
    hook = state_checkpointer(task, tmp_path / "b.ckpt", CheckpointPolicy(every_s=None, every_steps=100), stop, notes)
    hook(final=True)
    assert [n["step"] for n in notes] == [7]


@pytest.mark.parametrize("fail", [OSError(28, "No space left on device"), RuntimeError("unexpected pos 64\nmore")])
def test_a_failed_state_save_warns_in_one_line_and_training_goes_on(tmp_path, clock, caplog, fail):
    task, notes = Task(step=6, fail=fail), Saves()
    policy = CheckpointPolicy(every_s=None, every_steps=3)
    hook = state_checkpointer(task, tmp_path / "last.ckpt", policy, _stop(), notes)
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        hook()
    first = str(fail).splitlines()[0]
    assert [r.getMessage() for r in caplog.records] == [
        f"checkpoint at step 6 not saved: {type(fail).__name__}: {first}; training goes on"
    ]
    assert notes == []
    assert policy.due(8) is False and policy.due(9) is True  # the next try waits a full interval


def test_a_failed_write_of_the_state_warns_too(tmp_path, clock, caplog):
    (tmp_path / "file").write_text("")
    task, notes = Task(step=1), Saves()
    hook = state_checkpointer(task, tmp_path / "file" / "last.ckpt", CheckpointPolicy(every_s=None, every_steps=1), _stop(), notes)
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        hook()
    (record,) = caplog.records
    assert record.getMessage().startswith("checkpoint at step 1 not saved: StoreWriteError: cannot write ")
    assert notes == []


def test_the_state_save_is_timed(tmp_path, clock):
    class SlowTask(Task):
        def checkpoint_state(self):
            clock.now += 1.25
            return super().checkpoint_state()

    notes = Saves()
    hook = state_checkpointer(SlowTask(step=1), tmp_path / "last.ckpt", CheckpointPolicy(every_s=None, every_steps=1), _stop(), notes)
    hook()
    assert notes[0]["seconds"] == 1.25

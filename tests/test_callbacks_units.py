"""runtime/callbacks.py piece by piece: trainer_kwargs' defaults and switches, build_callbacks' replacing and
checkpoint folder, early_stop_of on EarlyStopping callbacks set by hand (no fit: a stand-in trainer)."""

from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason
from omegaconf import OmegaConf

from pipeline.config.checks import ConfigError
from pipeline.runtime.callbacks import build_callbacks, early_stop_of, trainer_kwargs


def cfg_of(trainer=None, callbacks=None):
    return OmegaConf.create({"trainer": trainer, "callbacks": callbacks or {}})


def test_trainer_kwargs_defaults_without_a_trainer_group():
    expected = {"num_sanity_val_steps": 0, "enable_model_summary": False, "enable_checkpointing": False}
    assert trainer_kwargs(OmegaConf.create({"callbacks": {}})) == expected
    assert trainer_kwargs(cfg_of()) == expected


def test_trainer_kwargs_drops_nulls_and_keeps_the_users_overrides():
    cfg = cfg_of({"max_epochs": 3, "max_steps": None, "num_sanity_val_steps": 2, "enable_model_summary": True})
    assert trainer_kwargs(cfg) == {"num_sanity_val_steps": 2, "enable_model_summary": True,
                                   "enable_checkpointing": False, "max_epochs": 3}


def test_trainer_kwargs_resolves_interpolations():
    cfg = OmegaConf.create({"epochs": 4, "trainer": {"max_epochs": "${epochs}"}, "callbacks": {}})
    assert trainer_kwargs(cfg)["max_epochs"] == 4


@pytest.mark.parametrize(("target", "summary", "checkpointing"), [
    ("lightning.pytorch.callbacks.ModelSummary", True, False),
    ("lightning.pytorch.callbacks.RichModelSummary", True, False),
    ("lightning.pytorch.callbacks.ModelCheckpoint", False, True),
    ("my.OwnCheckpointSaver", False, True),
    ("RichModelSummary", True, False),  # a bare class name: the name is the whole target
    ("lightning.pytorch.callbacks.LearningRateMonitor", False, False),
])
def test_summary_and_checkpoint_callbacks_switch_their_trainer_flags_on(target, summary, checkpointing):
    kwargs = trainer_kwargs(cfg_of({}, {"c": {"_target_": target}}))
    assert (kwargs["enable_model_summary"], kwargs["enable_checkpointing"]) == (summary, checkpointing)


def test_owned_keys_name_the_group_to_use_and_unknown_keys_the_nearest_argument():
    with pytest.raises(ConfigError, match=r"^trainer\.logger is set by the pipeline; use logger=csv\|tensorboard"):
        trainer_kwargs(cfg_of({"logger": True}))
    with pytest.raises(ConfigError, match=r"^trainer\.max_stepz is not a Lightning Trainer argument; did you mean "
                                          r"trainer\.max_steps\?$"):
        trainer_kwargs(cfg_of({"max_stepz": 3}))
    with pytest.raises(ConfigError, match=r"^trainer\.qqqqqq is not a Lightning Trainer argument; see "
                                          r"lightning\.pytorch\.Trainer's arguments$"):
        trainer_kwargs(cfg_of({"qqqqqq": 3}))
    with pytest.raises(ConfigError, match="trainer.self is not"):  # `self` is no argument a config can give
        trainer_kwargs(cfg_of({"self": 3}))


def test_build_callbacks_keeps_own_ones_of_other_classes_first_and_fills_only_a_null_dirpath(tmp_path):
    own_lr, own_ckpt = LearningRateMonitor(), ModelCheckpoint(dirpath=str(tmp_path / "own"))
    cfg = cfg_of({}, {"a": {"_target_": "lightning.pytorch.callbacks.ModelCheckpoint"},
                      "b": {"_target_": "lightning.pytorch.callbacks.ModelCheckpoint", "dirpath": str(tmp_path / "b")}})
    built = build_callbacks(cfg, tmp_path / "run", own=[own_ckpt, own_lr])
    assert built[0] is own_lr and len(built) == 3
    assert built[1].dirpath == str((tmp_path / "run" / "checkpoints" / "lightning").resolve())
    assert built[2].dirpath == str(tmp_path / "b")
    # No run dir: Lightning picks the folder itself.
    assert build_callbacks(cfg, None)[0].dirpath is None


def test_a_callback_that_fails_to_build_names_its_entry_and_target(tmp_path):
    cfg = cfg_of({}, {"es": {"_target_": "lightning.pytorch.callbacks.EarlyStopping", "monitor": "x", "mode": "sideways"}})
    with pytest.raises(ConfigError, match=r"^callbacks\.es \(lightning\.pytorch\.callbacks\.EarlyStopping\): .*sideways"):
        build_callbacks(cfg, tmp_path)
    cfg = cfg_of({}, {"m": {"_target_": "torch.nn.Identity"}})
    with pytest.raises(ConfigError, match=r"^callbacks\.m: torch\.nn\.Identity is not a lightning\.pytorch Callback$"):
        build_callbacks(cfg, tmp_path)


def stopped(reason=EarlyStoppingReason.PATIENCE_EXHAUSTED, epoch=3, best=0.25, mode="min", message=None, **kw):
    callback = EarlyStopping(monitor="val/loss", mode=mode, min_delta=0.05, patience=2, **kw)
    callback.stopping_reason, callback.stopped_epoch, callback.best_score = reason, epoch, torch.tensor(best)
    callback.wait_count, callback.stopping_reason_message = 2, message
    return callback


def trainer_with(*callbacks, current_epoch=4, max_epochs=10, global_step=40):
    return SimpleNamespace(callbacks=list(callbacks), current_epoch=current_epoch, max_epochs=max_epochs,
                           global_step=global_step)


def test_early_stop_of_a_patience_stop_says_when_and_why():
    stop = early_stop_of(trainer_with(ModelCheckpoint(), stopped()))
    assert stop == {
        "epoch": 3, "step": 40, "by": "EarlyStopping", "rule": "patience_exhausted", "monitor": "val/loss", "mode": "min",
        "best": 0.25, "min_delta": 0.05, "patience": 2, "wait_count": 2,
        "reason": "val/loss did not improve on its best 0.25 by more than min_delta 0.05 in 2 validation(s) (patience 2)",
    }
    assert all(type(stop[k]) is int for k in ("epoch", "step", "patience", "wait_count"))


def test_early_stop_of_a_threshold_stop_gives_lightnings_words_without_the_signal():
    message = "Stopping threshold reached: val/loss = 0.1 < 0.2. Signaling Trainer to stop."
    stop = early_stop_of(trainer_with(stopped(EarlyStoppingReason.STOPPING_THRESHOLD, message=message)))
    assert stop["reason"] == "Stopping threshold reached: val/loss = 0.1 < 0.2."
    assert stop["rule"] == "stopping_threshold"
    # No message kept (a callback restored from an old checkpoint): the rule's name.
    assert early_stop_of(trainer_with(stopped(EarlyStoppingReason.STOPPING_THRESHOLD)))["reason"] == "stopping_threshold"


def test_early_stop_of_a_non_finite_best_is_null():
    stop = early_stop_of(trainer_with(stopped(EarlyStoppingReason.NON_FINITE_METRIC, best=float("inf"), message="x")))
    assert stop["best"] is None and stop["rule"] == "non_finite_metric"


@pytest.mark.parametrize(("epoch", "current", "max_epochs", "expected"), [
    (3, 4, 10, 3),      # stopped in the epoch before the trainer's counter moved on
    (4, 4, 10, 4),      # stopped in the current epoch
    (2, 4, 10, None),   # an older segment's stop, restored from its checkpoint
    (5, 4, 10, None),
    (8, 9, 10, 8),      # the budget's second-to-last epoch: early stopping ended it
    (9, 9, 10, None),   # the budget's last epoch: the budget ended it
    (9, 9, None, 9),
    (9, 9, -1, 9),      # -1: no epoch budget
    (0, 0, 0, None),
])
def test_early_stop_of_counts_only_this_fits_stop_before_the_budget(epoch, current, max_epochs, expected):
    stop = early_stop_of(trainer_with(stopped(epoch=epoch), current_epoch=current, max_epochs=max_epochs))
    assert (None if stop is None else stop["epoch"]) == expected


def test_early_stop_of_skips_a_callback_that_did_not_stop_for_one_that_did():
    idle = stopped(EarlyStoppingReason.NOT_STOPPED)
    assert early_stop_of(trainer_with(idle)) is None
    assert early_stop_of(trainer_with()) is None
    late = stopped(mode="max", epoch=4, best=0.75)
    old = stopped(epoch=1)
    stop = early_stop_of(trainer_with(idle, old, late))
    assert (stop["epoch"], stop["mode"], stop["best"]) == (4, "max", 0.75)
    # One stopped in the budget's last epoch (the budget ended it), another the epoch before: that one is the stop.
    at_budget, before = stopped(epoch=9), stopped(mode="max", epoch=8)
    stop = early_stop_of(trainer_with(at_budget, before, current_epoch=9, max_epochs=10))
    assert (stop["epoch"], stop["mode"]) == (8, "max")

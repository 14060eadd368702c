"""Callbacks and Trainer arguments from config: the template's group, the user's own, one line for a bad one."""

import textwrap

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_module
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from pipeline.config.checks import ConfigError, group_options
from pipeline.runtime.callbacks import build_callbacks, trainer_kwargs
from pipeline_testing import read_result, run_cli


class LoggingBoringModel(BoringModel):
    """Lightning's demo model, logging its validation loss for the early-stopping callback."""

    def validation_step(self, batch, batch_idx):
        out = super().validation_step(batch, batch_idx)
        self.log("valid_loss", out["x"])
        return out


def compose_with(*overrides: str, searchpath: str | None = None):
    extra = [f"hydra.searchpath=[file://{searchpath}]"] if searchpath else []
    with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
        return compose(config_name="config", overrides=[*extra, *overrides])


def test_default_group_builds_the_template_set_and_replaces_our_checkpoint(tmp_path):
    cfg = compose_with("experiment=supervised_digits", "callbacks=default")
    own = [ModelCheckpoint(dirpath=str(tmp_path / "own"), save_last=True)]
    callbacks = build_callbacks(cfg, tmp_path, own=own)
    kinds = [type(c) for c in callbacks]
    assert sorted(k.__name__ for k in kinds) == ["ModelCheckpoint", "RichModelSummary"]
    (checkpoint,) = [c for c in callbacks if isinstance(c, ModelCheckpoint)]
    assert checkpoint is not own[0] and checkpoint.dirpath == str((tmp_path / "checkpoints" / "lightning").resolve())
    kwargs = trainer_kwargs(cfg)  # else Lightning refuses a summary or checkpoint callback
    assert kwargs["enable_model_summary"] is True and kwargs["enable_checkpointing"] is True


def test_none_group_keeps_only_our_callbacks(tmp_path):
    cfg = compose_with("experiment=supervised_digits")
    own = [ModelCheckpoint(dirpath=str(tmp_path))]
    assert build_callbacks(cfg, tmp_path, own=own) == own
    assert trainer_kwargs(cfg)["enable_model_summary"] is False and trainer_kwargs(cfg)["enable_checkpointing"] is False


def test_users_own_callback_from_config_dir_runs_in_a_real_fit(tmp_path, monkeypatch):
    (tmp_path / "my_callbacks.py").write_text(textwrap.dedent("""
        from lightning.pytorch.callbacks import Callback

        class CountEpochs(Callback):
            def __init__(self, start=0):
                self.epochs = start

            def on_train_epoch_end(self, trainer, pl_module):
                self.epochs += 1
    """))
    (tmp_path / "callbacks").mkdir()
    (tmp_path / "callbacks" / "mine.yaml").write_text("mine:\n  _target_: my_callbacks.CountEpochs\n  start: 10\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = compose_with(
        "experiment=supervised_digits", "callbacks=[mine,early_stopping]", "callbacks.early_stopping.monitor=valid_loss",
        "callbacks.early_stopping.mode=min", "callbacks.early_stopping.patience=0", "callbacks.early_stopping.min_delta=1e9",
        "trainer.max_epochs=5", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
        "trainer.enable_progress_bar=false", searchpath=str(tmp_path),
    )
    callbacks = build_callbacks(cfg, tmp_path)
    counter = next(c for c in callbacks if type(c).__name__ == "CountEpochs")
    trainer = L.Trainer(callbacks=callbacks, logger=False, default_root_dir=tmp_path, **trainer_kwargs(cfg))
    trainer.fit(LoggingBoringModel())
    # min_delta=1e9 never counts as an improvement: with patience 0 early stopping ends the fit after epoch 2.
    assert any(isinstance(c, EarlyStopping) for c in callbacks)
    assert trainer.current_epoch < 5 and counter.epochs == 10 + trainer.current_epoch


def test_extra_trainer_arguments_pass_through():
    cfg = compose_with("experiment=supervised_digits", "+trainer.accumulate_grad_batches=2", "trainer.max_epochs=7")
    kwargs = trainer_kwargs(cfg)
    assert kwargs["accumulate_grad_batches"] == 2 and kwargs["max_epochs"] == 7
    # trainer=debug is configuration now (conf/debug/), not a marker key: `trainer.debug` is no Trainer argument.
    with pytest.raises(ConfigError, match="trainer.debug is not a Lightning Trainer argument"):
        trainer_kwargs(compose_with("experiment=supervised_digits", "+trainer.debug=true"))
    L.Trainer(logger=False, **kwargs)  # every key is a real Trainer argument


@pytest.mark.parametrize(
    ("override", "fix"),
    [
        ("+trainer.precision=16-mixed", "device.precision"),
        ("+trainer.accelerator=cpu", "device=cpu"),
        ("+trainer.max_epocs=3", "trainer.max_epochs"),
    ],
)
def test_trainer_keys_the_pipeline_owns_or_lightning_lacks_are_one_line(override, fix):
    with pytest.raises(ConfigError) as err:
        trainer_kwargs(compose_with("experiment=supervised_digits", override))
    message = str(err.value)
    assert fix in message and override.split("=")[0].lstrip("+") in message and "\n" not in message


@pytest.mark.parametrize(
    ("override", "name"),
    [("+callbacks.x=1", "callbacks.x"), ("+callbacks.bad._target_=no.such.Callback", "callbacks.bad"),
     ("+callbacks.model._target_=torch.nn.Linear", "callbacks.model")],
)
def test_bad_callback_entries_are_one_line(tmp_path, override, name):
    with pytest.raises(ConfigError) as err:
        build_callbacks(compose_with("experiment=supervised_digits", override), tmp_path)
    assert str(err.value).startswith(name) and "\n" not in str(err.value)


@pytest.mark.slow
def test_callbacks_from_the_command_line(tmp_path):
    """End to end through run.py: a configured early stopping ends a 60-epoch preset early."""
    proc = run_cli(
        "experiment=supervised_digits", "logger=tensorboard", "callbacks=[default,early_stopping,lr_monitor]", "callbacks.early_stopping.patience=0",
        "callbacks.early_stopping.min_delta=1.0", "trainer.limit_train_batches=2", "trainer.enable_progress_bar=false",
        f"hydra.run.dir={tmp_path}",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert read_result(tmp_path)["status"] == "ok"
    # min_delta=1.0 of accuracy is never met: patience 0 stops after the second validation, far from 60 epochs.
    (saved,) = (tmp_path / "checkpoints" / "lightning").glob("*.ckpt")  # model_checkpoint keeps the latest
    assert torch.load(saved, weights_only=False)["epoch"] < 5


@pytest.mark.parametrize("option", group_options()["callbacks"])
def test_every_shipped_option_builds_real_callbacks(tmp_path, option):
    from lightning.pytorch.callbacks import Callback

    cfg = compose_with("experiment=supervised_digits", f"callbacks={option}")
    callbacks = build_callbacks(cfg, tmp_path)
    assert len(callbacks) == len(cfg.callbacks) and all(isinstance(c, Callback) for c in callbacks)
    assert (option == "none") == (callbacks == [])

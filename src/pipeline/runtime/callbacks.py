"""Lightning callbacks and Trainer arguments from config, in the lightning-hydra-template manner.

`callbacks=default` (or a list, or `+callbacks.<name>._target_=...`) adds callbacks to the pipeline's own;
every `trainer.<key>` is a Lightning Trainer argument, except the few the pipeline sets from another group.
"""

from __future__ import annotations

import difflib
import inspect
import math
import os
from collections.abc import Iterable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from pipeline.config.checks import (
    PIPELINE_TRAINER_KEYS,
    TRAINER_OWNED,
    ConfigError,
    callback_entries,
    check_callback_entries,
    one_line,
)

# Trainer arguments the pipeline sets from its own groups (refused at start-up by config.checks).
OWNED = TRAINER_OWNED
# Defaults of the pipeline that a user may still override with trainer.<key>.
PIPELINE_DEFAULTS = {"num_sanity_val_steps": 0, "enable_model_summary": False, "enable_checkpointing": False}
SUMMARY_CALLBACKS = ("ModelSummary", "RichModelSummary")


def _trainer_params() -> list[str]:
    import lightning as L

    return [p for p in inspect.signature(L.Trainer.__init__).parameters if p != "self"]


def _targets(cfg: DictConfig) -> list[str]:
    return [str(entry.get("_target_", "")) for _, entry in callback_entries(cfg) if isinstance(entry, DictConfig)]


def trainer_kwargs(cfg: DictConfig) -> dict:
    """cfg.trainer as Lightning Trainer keyword arguments (null values left to Lightning's defaults).

    Includes the pipeline's own defaults (no sanity validation, no model summary and no Lightning
    checkpointing unless such a callback is configured) unless the user set them. A key the pipeline sets from another group, or a
    key that is no Trainer argument, is a ConfigError naming what to use instead.
    """
    given = OmegaConf.to_container(cfg.trainer, resolve=True) if cfg.get("trainer") is not None else {}
    params = _trainer_params()
    given = {k: v for k, v in given.items() if k not in PIPELINE_TRAINER_KEYS}  # the pipeline's own (trainer=ddp's timeout)
    for key in given:
        if key in OWNED:
            raise ConfigError(f"trainer.{key} is set by the pipeline; use {OWNED[key]} instead")
        if key not in params:
            close = difflib.get_close_matches(key, params, n=1)
            hint = f"did you mean trainer.{close[0]}?" if close else "see lightning.pytorch.Trainer's arguments"
            raise ConfigError(f"trainer.{key} is not a Lightning Trainer argument; {hint}")
    kwargs = dict(PIPELINE_DEFAULTS)
    names = [t.rsplit(".", 1)[-1] for t in _targets(cfg)]
    # Lightning refuses a summary or checkpoint callback when its switch is off.
    if any(n in SUMMARY_CALLBACKS for n in names):
        kwargs["enable_model_summary"] = True
    if any("Checkpoint" in n for n in names):
        kwargs["enable_checkpointing"] = True
    kwargs.update({k: v for k, v in given.items() if v is not None})
    return kwargs


def build_callbacks(cfg: DictConfig, run_dir: Path | str | None = None, own: Iterable = ()) -> list:
    """The pipeline's own callbacks (`own`) plus those in cfg.callbacks; a configured callback replaces an
    own one of the same class (e.g. callbacks=model_checkpoint replaces the pipeline's checkpoint).

    A ModelCheckpoint with `dirpath: null` writes to <run_dir>/checkpoints/lightning (beside, never over,
    the pipeline's own last.ckpt). A bad entry is a ConfigError naming it.
    """
    from hydra.utils import instantiate
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint

    check_callback_entries(cfg)
    built = []
    for name, entry in callback_entries(cfg):
        try:
            callback = instantiate(entry)
        except Exception as exc:
            raise ConfigError(f"callbacks.{name} ({entry._target_}): {one_line(exc)}") from exc
        if not isinstance(callback, Callback):
            raise ConfigError(f"callbacks.{name}: {entry._target_} is not a lightning.pytorch Callback")
        if isinstance(callback, ModelCheckpoint) and callback.dirpath is None and run_dir is not None:
            callback.dirpath = os.path.realpath(Path(run_dir) / "checkpoints" / "lightning")
        built.append(callback)
    replaced = {type(c) for c in built}
    return [c for c in own if type(c) not in replaced] + built



def early_stop_of(trainer) -> dict | None:
    """What result.json's `early_stop` says when a configured EarlyStopping ended the fit: when (the epoch whose
    validation decided, metrics.csv's last step, and the global step) and why (Lightning's reason, the monitored
    metric, its best value, the patience). None when no EarlyStopping stopped it, or it stopped at the last epoch
    the budget allowed anyway."""
    from lightning.pytorch.callbacks import EarlyStopping
    from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason

    for callback in trainer.callbacks:
        if not isinstance(callback, EarlyStopping) or callback.stopping_reason == EarlyStoppingReason.NOT_STOPPED:
            continue
        epoch = int(callback.stopped_epoch)
        # A stop restored from the checkpoint of an earlier segment is not this fit's (the fit ends in the epoch it stops).
        if epoch not in (trainer.current_epoch - 1, trainer.current_epoch):
            continue
        max_epochs = trainer.max_epochs
        if max_epochs is not None and max_epochs >= 0 and epoch + 1 >= max_epochs:
            continue  # patience ran out in the last epoch of the budget: the budget ended the run
        best = float(callback.best_score)
        rule = callback.stopping_reason.name.lower()
        if callback.stopping_reason == EarlyStoppingReason.PATIENCE_EXHAUSTED:
            message = (f"{callback.monitor} did not improve on its best {best:.4g} by more than min_delta "
                       f"{abs(float(callback.min_delta)):g} in {callback.wait_count} validation(s) (patience {callback.patience})")
        else:  # a threshold reached, or a non-finite value: Lightning's words
            message = (callback.stopping_reason_message or rule).replace(" Signaling Trainer to stop.", "").strip()
        return {
            "epoch": epoch,
            "step": int(trainer.global_step),
            "reason": message,
            "by": "EarlyStopping",
            "rule": rule,
            "monitor": callback.monitor,
            "mode": callback.mode,
            "best": best if math.isfinite(best) else None,
            "min_delta": abs(float(callback.min_delta)),
            "patience": int(callback.patience),
            "wait_count": int(callback.wait_count),
        }
    return None


def aligned_epoch_metrics():
    """A callback for a run on several processes: the epoch's `sync_dist=True` values are all-reduced when first read,
    and rank 0's progress bar reads them at the train epoch's end before Lightning reads them on every rank, a
    collective only rank 0 joins. Read here first, on every rank (the result is cached for the bar)."""
    from lightning.pytorch.callbacks import Callback

    class AlignedEpochMetrics(Callback):
        def on_train_epoch_end(self, trainer, pl_module) -> None:
            trainer.progress_bar_metrics  # noqa: B018 - computed (and all-reduced) for its side effect

    return AlignedEpochMetrics()

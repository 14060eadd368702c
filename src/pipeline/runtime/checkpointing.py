"""When and how a training run saves its checkpoint: the policy (every N seconds or steps), the Lightning-loop
tasks' epoch-end checkpointer, and the hook for tasks that keep their own state (DQN)."""

from __future__ import annotations

import io
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback, Checkpoint

from pipeline.config.checks import one_line
from pipeline.runtime.rundir import Interrupted, StopRequests
from pipeline.store.atomic import StoreWriteError
from pipeline.store.integrity import save_checkpoint

log = logging.getLogger("pipeline")


@dataclass
class CheckpointPolicy:
    """When to save: every `every_s` seconds of wall time or every `every_steps` steps, whichever comes first, and
    (`first`) once at the first safe point after start-up, so a kill in the first `every_s` loses one iteration or
    epoch, not all of it (docs/durability.md: the first save's cost).

    `enabled: false` turns periodic checkpoints off (the run then saves only on an interruption).
    """

    enabled: bool = True
    every_s: float | None = 60.0
    every_steps: int | None = None
    first: bool = False

    def __post_init__(self) -> None:
        self._last_time = time.monotonic()
        self._last_step = 0

    def start(self, step: int) -> None:
        self._last_time, self._last_step = time.monotonic(), int(step)

    def due(self, step: int) -> bool:
        if not self.enabled:
            return False
        if self.first:
            return True
        if self.every_s is not None and time.monotonic() - self._last_time >= float(self.every_s):
            return True
        return bool(self.every_steps) and step - self._last_step >= int(self.every_steps)

    def saved(self, step: int) -> None:
        self.first = False
        self.start(step)


class FailedSaves:
    """A save that fails (a full disk) is one warning; the same failure again is not repeated until a save works
    (with checkpoint.every_s=0 a full disk printed one line per epoch)."""

    def __init__(self) -> None:
        self._said: str | None = None

    def warn(self, what: str, cause: str, going_on: bool = True) -> None:
        if cause != self._said:
            log.warning(f"{what}: {cause}" + ("; training goes on" if going_on else ""))
            self._said = cause

    def clear(self) -> None:
        self._said = None


class ValidationTimer(Callback):
    """Time spent in validation, so the fit time can be split into train and val."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def on_validation_start(self, trainer, pl_module) -> None:
        self._start = time.perf_counter()

    def on_validation_end(self, trainer, pl_module) -> None:
        self.seconds += time.perf_counter() - self._start


class EpochCheckpointer(Checkpoint):
    """Lightning-loop tasks: a checkpoint at epoch ends when the policy says so; a stop request ends the fit.

    Saved at epoch ends only: a mid-epoch Lightning checkpoint of our index-based loaders would
    resume at the start of the epoch anyway. An interrupted run therefore continues from its last
    finished epoch. A `Checkpoint` so that Lightning runs its epoch end AFTER the task's, as it does
    ModelCheckpoint's: the task writes that epoch's train row (and a GAN steps its schedulers and
    scores the epoch) there, and the checkpoint of an epoch must hold all of it. As a plain Callback
    it saved first, and a run killed after that save lost the checkpointed epoch's train row for good
    (the resumed run starts at the next epoch).
    """

    def __init__(self, path: Path, policy: CheckpointPolicy, stop: StopRequests, on_save, saved_epoch: int | None = None,
                 curve_step=None, writes: bool = True, history=None, before_save=None) -> None:
        self.path, self.policy, self.stop, self.on_save = Path(path), policy, stop, on_save
        # before_save(): the run's curves onto disk, so a checkpoint never covers a row that is only in memory (a
        # kill between the save and a later flush lost the checkpointed epoch's rows: the resume starts after them).
        self.before_save = before_save or (lambda: None)
        # history(step): the record's segments as they stand once this step is saved (kept in the checkpoint).
        self.history = history
        # False on ranks > 0 of a run on several processes: rank 0 writes the one checkpoint.
        self.writes = writes
        self.saved_epoch = saved_epoch
        # The last step of the run's curves when an epoch is saved: a GAN's curve counts batches, CEM's env steps,
        # while the checkpoint's own step is the epoch; a resume keeps every row up to this step (curve_step_of).
        self.curve_step = curve_step or (lambda: None)
        self.failures = FailedSaves()
        # The last finished epoch's checkpoint, serialised in memory when the policy did not write it: a stop
        # request in the middle of the next epoch saves it, so the run continues from there (not from scratch).
        self._unsaved: tuple[int, bytes] | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._stop_agreed(trainer):
            self.save_last_finished_epoch()
            raise Interrupted(self.saved_epoch)

    def _stop_agreed(self, trainer) -> bool:
        """Whether to stop now; with several processes, whether any rank was asked (each one's signal, the largest
        number wins), so every rank stops at the same batch and the one that was not signalled exits as interrupted.

        The answer is the agreed one, never this rank's flag read afterwards: a signal that lands while this rank
        waits in the all-reduce (a rank held back, e.g. stopped) is seen at the next batch by all, not now by one
        (which then stopped alone, and the others failed in their next collective)."""
        if trainer.world_size <= 1:
            return self.stop.requested
        asked = torch.tensor([self.stop.signal or 0], device=trainer.strategy.root_device)
        torch.distributed.all_reduce(asked, op=torch.distributed.ReduceOp.MAX)
        agreed = int(asked.item())
        if agreed and self.stop.signal is None:
            self.stop.signal = agreed
        if agreed:
            self.stop.requested  # noqa: B018 - announces the stop in the log (its first poll)
        return bool(agreed)

    def on_train_end(self, trainer, pl_module) -> None:
        """With several processes, a stop asked after the last batch's agreement is agreed here too, so every rank
        ends the fit the same way (interrupted, or on to the test)."""
        if trainer.world_size > 1 and self._stop_agreed(trainer):
            self.save_last_finished_epoch()
            raise Interrupted(self.saved_epoch)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if not self.policy.enabled:
            return
        epoch = trainer.current_epoch
        # What trainer.save_checkpoint would write now (one device: the same dict, without its temp-file handling).
        # Every rank dumps, as trainer.save_checkpoint has them do: a task's hooks gather each rank's random states
        # (store.checkpoint.rng_state); rank 0 writes.
        state = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        if not self.writes:
            return
        state[PIPELINE_KEY] = {"curve_step": self.curve_step()}
        if self.history is not None:
            state[RECORD_KEY] = {"segments": self.history(epoch)}
        if self.policy.due(epoch) or epoch + 1 >= (trainer.max_epochs or 0) or self.stop.requested:
            self.before_save()
            t0 = time.perf_counter()
            try:
                save_atomic(state, self.path)
            except StoreWriteError as exc:  # a full disk must not end the training: the next save may fit
                self.policy.saved(epoch)
                self.failures.warn(f"checkpoint of epoch {epoch} not saved", str(exc))
                return
            self.failures.clear()
            self._saved(epoch, t0)
        else:
            buffer = io.BytesIO()
            torch.save(state, buffer)  # frozen: the live state dicts move on with training
            self._unsaved = (epoch, buffer.getvalue())

    def save_last_finished_epoch(self) -> None:
        if self._unsaved is None or (self.saved_epoch is not None and self._unsaved[0] <= self.saved_epoch):
            return
        self.before_save()
        t0 = time.perf_counter()
        epoch, data = self._unsaved
        try:
            save_checkpoint(self.path, lambda f: f.write(data), step=epoch)
        except StoreWriteError as exc:
            self.failures.warn(f"checkpoint of epoch {epoch} not saved", str(exc), going_on=False)
            return
        self._saved(epoch, t0)

    def _saved(self, epoch: int, t0: float) -> None:
        self.saved_epoch = epoch
        self._unsaved = None
        self.policy.saved(epoch)
        self.on_save(step=epoch, seconds=time.perf_counter() - t0, size=self.path.stat().st_size)


def save_atomic(state: dict, path: Path) -> int:
    """A Lightning checkpoint dict saved with its digest (store/integrity.py), naming its epoch as its step."""
    return save_checkpoint(path, lambda f: torch.save(state, f), step=state.get("epoch"))


# A Lightning checkpoint's entry of our own (Lightning ignores keys it does not know).
PIPELINE_KEY = "pipeline_curves"
# Every checkpoint's copy of its run record's history ({"segments": [...]}, as they stand once it is saved): a resume
# whose result.json cannot be read (half-written) rebuilds it from here instead of starting a new history.
RECORD_KEY = "pipeline_record"


def history_of(state: dict) -> list[dict] | None:
    """The record segments a loaded checkpoint kept, or None (an older checkpoint, or one that kept none)."""
    kept = state.get(RECORD_KEY) if isinstance(state, dict) else None
    segments = kept.get("segments") if isinstance(kept, dict) else None
    return [dict(s) for s in segments if isinstance(s, dict)] if isinstance(segments, list) else None


def curve_step_of(state: dict, resume_step: int | None) -> int | None:
    """The last curve step a loaded checkpoint covers: what it recorded when it was saved, else its own step (the
    state tasks' env step is their curves' step too)."""
    saved = (state.get(PIPELINE_KEY) or {}).get("curve_step") if isinstance(state, dict) else None
    return int(saved) if isinstance(saved, int) else resume_step


def state_checkpointer(task, path: Path, policy: CheckpointPolicy, stop: StopRequests, note_save, history=None,
                       note_progress=None, before_save=None):
    """For tasks that keep their own state (DQN): save when due; on a stop request save and end the fit.
    `history(step)`: the record's segments to keep in the checkpoint; `note_progress()`: called at every other safe
    point (the lifecycle writes what the records learnt since, e.g. an evaluation and the best weights it kept);
    `before_save()`: the curves onto disk first, so the checkpoint covers no row that is only in memory."""

    failures = FailedSaves()
    before_save = before_save or (lambda: None)

    def save() -> None:
        before_save()
        t0 = time.perf_counter()
        try:
            state = task.checkpoint_state()
            if history is not None:
                state[RECORD_KEY] = {"segments": history(task.resume_step)}
            size = save_checkpoint(path, lambda f: torch.save(state, f), step=task.resume_step)
        except (OSError, RuntimeError) as exc:  # a failed save (disk full, ...) must not end the training
            policy.saved(task.resume_step)
            failures.warn(f"checkpoint at step {task.resume_step} not saved", one_line(exc))
            return
        failures.clear()
        policy.saved(task.resume_step)
        note_save(step=task.resume_step, seconds=time.perf_counter() - t0, size=size, replay_saved=state.get("replay") is not None)

    def hook(final: bool = False) -> None:
        if stop.requested and not final:
            save()
            raise Interrupted(task.resume_step)
        if policy.due(task.resume_step) or (final and policy.enabled):
            save()  # the final one lets ckpt_path=last continue a finished run to a larger budget
        elif note_progress is not None:
            note_progress()

    return hook

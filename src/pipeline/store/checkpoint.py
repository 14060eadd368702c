"""Checkpoints a killed run can continue from, and the weights a run leaves: atomic writes with digests, safe
loads, RNG states (integrity: store/integrity.py).

A checkpoint (and model.pt, best.pt, obs_norm.pt) is a plain nested dict of tensors, numbers, strings and lists,
written with `torch.save` to a temp file, its digest beside it, and renamed over the previous one (so a kill during
a save leaves the previous file usable), then read back only once it matches its digest, with `weights_only=True`
(no pickled code ever runs on load).
"""

from __future__ import annotations

import random
import zipfile
from pathlib import Path

import numpy as np
import torch

from pipeline.store.integrity import (  # noqa: F401 - re-exported
    CheckpointError,
    DamagedCheckpoint,
    UnverifiedFile,
    save_verified,
    verify_file,
)
from pipeline.store.layout import model_path


def save_atomic(state: dict, path: Path) -> int:
    """Write `state` to `path` via a temp file, fsync, its digest, and rename. Returns the size in bytes."""
    return save_verified(Path(path), lambda f: torch.save(state, f))


def load_safely(path: Path, what: str = "checkpoint", map_location="cpu") -> dict:
    """`torch.load(..., weights_only=True)` with one-line errors that name the file and what is wrong; the file is
    checked against its digest first (DamagedCheckpoint; UnverifiedFile when it has none)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{what} {path}: no such file")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{what} {path}: the file is empty (a save was interrupted?)")
    verify_file(path, what)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises many kinds here (KeyError, UnpicklingError, RuntimeError, ...)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "weights only" in first.lower() or "weights_only" in first or "Unsupported global" in first:
            reason = "it holds objects other than tensors and plain values (not a pipeline checkpoint?)"
        elif isinstance(exc, zipfile.BadZipFile | EOFError | KeyError) or "zip" in first.lower() or "central directory" in first:
            reason = "the file is truncated or not a torch checkpoint"
        else:
            reason = first[:160]
        raise CheckpointError(f"{what} {path}: cannot be loaded: {reason}") from None


# ---- random number generators ------------------------------------------------------------------
def _distributed() -> tuple[int, int]:
    """(rank, world size) of the process group this process is in; (0, 1) outside one."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _local_rng_state() -> dict:
    py = random.getstate()
    np_state = np.random.get_state(legacy=False)
    np_state["state"] = {"key": [int(k) for k in np_state["state"]["key"]], "pos": int(np_state["state"]["pos"])}
    return {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": np_state,
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def rng_state() -> dict:
    """The global python, numpy and torch RNG states, as plain values a weights_only load accepts.

    In a run on several processes (a process group of more than one) every rank's states, under `ranks`: the ranks
    draw apart (dropout on batches of other sizes), and a checkpoint holding only rank 0's made a resumed run differ
    from the first row after it. A collective: every rank calls it at the same point (as every rank dumps a Lightning
    checkpoint, `trainer.save_checkpoint` and runtime.checkpointing.EpochCheckpointer alike)."""
    state = _local_rng_state()
    rank, world = _distributed()
    if world > 1:
        ranks: list = [None] * world
        torch.distributed.all_gather_object(ranks, state)
        state["ranks"] = ranks
    return state


def set_rng_state(state: dict) -> None:
    """Restore what `rng_state` saved: in a run on several processes, this rank's own states (when the checkpoint
    holds one per rank of a group of this size; else the states it holds)."""
    rank, world = _distributed()
    ranks = state.get("ranks")
    if isinstance(ranks, list) and len(ranks) == world and world > 1:
        state = ranks[rank]
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = dict(state["numpy"])
    np_state["state"] = {"key": np.asarray(np_state["state"]["key"], dtype=np.uint32), "pos": np_state["state"]["pos"]}
    np.random.set_state(np_state)
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_model(state: dict, run_dir: Path, files: dict[str, dict] | None = None) -> int:
    """The trained weights (a state_dict of CPU tensors) as `<run dir>/model.pt`, atomically, and `files` (name ->
    state: what else the policy needs, the task's `agent_files`) beside it; returns model.pt's size."""
    files = dict(files or {})
    for name in files:
        if Path(name).name != name or name == model_path(run_dir).name:
            raise ValueError(f"agent file {name!r}: a plain file name other than model.pt")
    for name, extra in files.items():
        save_atomic(extra, Path(run_dir) / name)
    return save_atomic(state, model_path(run_dir))


def load_model(run_dir: Path, map_location="cpu") -> dict:
    """`<run dir>/model.pt`, loaded with weights_only=True; a CheckpointError naming the file if it is not one."""
    return load_safely(model_path(run_dir), "model", map_location=map_location)

"""File integrity, without torch (the CLI's start-up checks use it before Lightning or torch load).

Every file the pipeline reads back (checkpoints and the replay buffers in them, model.pt, best.pt, obs_norm.pt,
exported policies) is written with `save_verified` (checkpoints: `save_checkpoint`): beside it `<name>.sha256`
(JSON: the digests its contents may have, and the step it holds) is written before the rename, so at every moment
the file on disk matches one of them. Reading it back (`verify_file`) refuses, in one line, a file that matches
none (bytes flipped in place, a torn copy) and a file without a digest, unless the user accepts unchecked files
knowingly with PIPELINE_ACCEPT_UNVERIFIED=1 (a run written before digests, a file brought from elsewhere).
The checkpoint a save replaced is kept as `previous.ckpt` (a hard link: no copy) with its own digest, and offered
when the last one is damaged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import IO

from pipeline.store.atomic import write_atomically

log = logging.getLogger("pipeline")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message is one line naming the file and the problem."""


class DamagedCheckpoint(CheckpointError):
    """A checkpoint whose contents match no digest written with it."""


class UnverifiedFile(CheckpointError):
    """A file the pipeline reads back that has no digest beside it (and unchecked files were not accepted)."""


# Set to 1 to read files without a digest knowingly (each is named once in the log); a damaged file is refused still.
ACCEPT_ENV = "PIPELINE_ACCEPT_UNVERIFIED"


PREVIOUS = "previous.ckpt"


def digest_path(path: Path) -> Path:
    return Path(path).with_name(Path(path).name + ".sha256")


def previous_checkpoint(path: Path) -> Path:
    """Where the checkpoint `path` replaced is kept."""
    return Path(path).with_name(PREVIOUS)


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_digests(path: Path) -> dict | None:
    """The digest file beside `path` ({"sha256": [...], "step": n}), or None when it has none (an older
    checkpoint, or one the user brought)."""
    try:
        data = json.loads(digest_path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("sha256"), list) else None


def _write_digests(path: Path, digests: list[str], step: int | None) -> None:
    text = json.dumps({"sha256": list(dict.fromkeys(digests)), "step": step}).encode()
    write_atomically(digest_path(path), lambda f: f.write(text))


# Checkpoints this process wrote or verified, by path: (inode, size, mtime) when it knew them good.
_known_good: dict[str, tuple[int, int, int]] = {}


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def accepts_unverified() -> bool:
    return os.environ.get(ACCEPT_ENV, "").strip().lower() in ("1", "true", "yes")


_said_unverified: set[str] = set()


def unverified_line(path: Path, what: str) -> str:
    return (f"{what} {path} has no digest ({digest_path(path).name}), so it cannot be checked (written before the "
            f"pipeline kept digests, or copied without it); to use it knowingly, set {ACCEPT_ENV}=1")


def verify_file(path: Path, what: str = "file", required: bool = True) -> dict | None:
    """The digest record of `path` once its contents match one of its digests; DamagedCheckpoint when they match
    none; UnverifiedFile when it has no digest and `required` (unless PIPELINE_ACCEPT_UNVERIFIED=1: then None, as
    for a file not `required` to have one)."""
    path = Path(path)
    digests = read_digests(path)
    if digests is None:
        if not required:
            return None
        if not accepts_unverified():
            raise UnverifiedFile(unverified_line(path, what))
        if str(path) not in _said_unverified:
            _said_unverified.add(str(path))
            log.warning(f"{what} {path} has no digest: used unchecked ({ACCEPT_ENV}=1)")
        return None
    stamp = _stamp(path)
    if stamp is not None and _known_good.get(str(path)) == stamp:
        return digests
    if file_digest(path) not in digests["sha256"]:
        raise DamagedCheckpoint(f"{what} {path} is damaged: its contents match no sha256 written with it ({digest_path(path).name})")
    _known_good[str(path)] = stamp
    return digests


def verify_checkpoint(path: Path, what: str = "checkpoint", required: bool = True) -> dict | None:
    """`verify_file` for a checkpoint: one without a digest is refused unless accepted knowingly."""
    return verify_file(path, what, required)


def save_verified(path: Path, write: Callable[[IO[bytes]], None], step: int | None = None, keep_previous: bool = False) -> int:
    """Write `path` atomically through `write(file)` with its digest beside it; returns its size. Use it for every
    file the pipeline reads back (`verify_file` checks it then). `keep_previous`: the file it replaces, if good, is
    kept as previous.ckpt (checkpoints).

    Order (a kill between any two steps leaves every file matching a digest beside it): the new file whole in a
    temp file; its digest added to the old file's list; (the old file hard-linked as previous, its digests first);
    the rename; the list cut to the new digest."""
    path = Path(path)
    new: dict[str, str] = {}

    def before_replace(tmp: Path) -> None:
        new["sha256"] = file_digest(tmp)
        old = read_digests(path)
        if keep_previous and path.is_file() and old is not None and _good(path):
            _keep_as_previous(path, old)
        _write_digests(path, [new["sha256"], *(old["sha256"] if old else [])], step)

    size = write_atomically(path, write, before_replace=before_replace)
    _write_digests(path, [new["sha256"]], step)
    _known_good[str(path)] = _stamp(path)
    return size


def save_checkpoint(path: Path, write: Callable[[IO[bytes]], None], step: int | None = None) -> int:
    """Write a checkpoint atomically with its digest; the one it replaces, if good, is kept as previous.ckpt."""
    return save_verified(path, write, step, keep_previous=True)


def _good(path: Path) -> bool:
    try:
        return verify_file(path, required=False) is not None
    except CheckpointError:
        return False  # a damaged last checkpoint never replaces a good previous one


def _keep_as_previous(path: Path, digests: dict) -> None:
    previous = previous_checkpoint(path)
    before = read_digests(previous)
    _write_digests(previous, [*digests["sha256"], *(before["sha256"] if before else [])], digests.get("step"))
    tmp = previous.with_name(previous.name + ".tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(path, tmp)
    except OSError:  # a file system without hard links: a copy
        shutil.copyfile(path, tmp)
    os.replace(tmp, previous)
    _write_digests(previous, digests["sha256"], digests.get("step"))
    _known_good[str(previous)] = _stamp(previous)


def damaged_line(exc: DamagedCheckpoint, path: Path) -> str:
    """The refusal of a damaged checkpoint, offering the previous one when it is good."""
    previous = previous_checkpoint(path)
    offer = "no earlier good checkpoint is kept; start a new run in a new dir (hydra.run.dir=<dir>)"
    if previous.is_file() and previous != Path(path):
        try:
            held = verify_file(previous, required=False)
        except CheckpointError:
            held = False
        if held is not False:
            step = (held or {}).get("step")
            offer = f"the previous checkpoint{f' (step {step})' if step is not None else ''} is good: continue from it with ckpt_path={previous}"
    return f"{exc}; nothing was changed; {offer}"

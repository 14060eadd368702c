"""Every file the store writes is written whole or not at all: a temp file beside it, fsync, rename.

A write that fails (disk full, a read-only or immutable dir) removes its temp file and raises StoreWriteError,
one line that names the path and the cause; the file it was replacing is left as it was.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import IO

CAUSES = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted (an immutable dir?)",
}


class StoreWriteError(OSError):
    """A run-dir file could not be written; str() is one line: the path, the cause and what to do."""

    def __str__(self) -> str:
        return str(self.strerror)


def _full(path: Path) -> bool:
    try:
        return shutil.disk_usage(path).free < 1 << 20
    except OSError:
        return False


def cause_of(exc: OSError) -> str:
    return CAUSES.get(exc.errno, (exc.strerror or type(exc).__name__).lower())


def mount_of(path: Path) -> Path:
    """The mount point (the disk) `path` is on."""
    path = Path(os.path.abspath(path))
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def disk_line(path: Path) -> str:
    """Which disk holds `path` and how much is free on it, e.g. `the disk at /data (0.0 MB free)`."""
    where = mount_of(path)
    probe = where if not Path(path).exists() else Path(path)
    try:
        free = f" ({shutil.disk_usage(probe).free / 1e6:.1f} MB free)"
    except OSError:
        free = ""
    return f"the disk at {where}{free}"


def write_error(path: Path, exc: OSError) -> StoreWriteError:
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    fix = "free some space" if full else "choose a writable dir (hydra.run.dir=<dir>)"
    cause = f"{cause_of(exc)} on {disk_line(path.parent)}" if full else cause_of(exc)
    err = StoreWriteError(exc.errno, f"cannot write {path}: {cause}; {fix}")
    err.filename = str(path)
    return err


def write_atomically(path: Path, write: Callable[[IO[bytes]], None], fsync: bool = True,
                     before_replace: Callable[[Path], None] | None = None) -> int:
    """Write `path` through `write(file)` into `<path>.tmp`, then rename it over `path`; returns the size.
    `before_replace(tmp)` runs once the temp file is whole, before the rename (a checkpoint's digest)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tmp.open("wb") as f:
            write(f)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        if before_replace is not None:
            before_replace(tmp)
        os.replace(tmp, path)
        return path.stat().st_size
    except (OSError, RuntimeError) as exc:
        # Judged while the temp file still holds its blocks: once it is removed a disk that was full is not.
        full = isinstance(exc, RuntimeError) and _full(path.parent)
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        if isinstance(exc, StoreWriteError):
            raise
        if isinstance(exc, RuntimeError):
            # torch.save's zip writer reports a failed write as a RuntimeError ("unexpected pos ..."): a full disk
            # is named as one; anything else is not a storage problem and goes on as it was.
            if not full:
                raise
            exc = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        raise write_error(path, exc) from None

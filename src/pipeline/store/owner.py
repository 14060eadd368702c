"""Who works on a run: the process a live record names (`owner`: {pid, host, since}, as the run dir's lock does), and
whether it still runs. A record says `running` while its process trains; a reader that finds that process gone
reads it as `failed`, with what its checkpoint holds and the command that continues it."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from pipeline.store.layout import read_owner


def this_process() -> dict[str, Any]:
    """The owner a record written now names: this process, on this host, since now."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}


def owner_alive(owner: dict[str, Any]) -> bool | None:
    """Whether the process a lock file names still runs: on this host, the same pid, started before it took
    the lock (a reused pid started later). None for a process on another host: it cannot be checked from here."""
    import psutil

    if owner.get("host") != socket.gethostname():
        return None
    try:
        process = psutil.Process(owner["pid"])
        started = process.create_time()
        if process.status() == psutil.STATUS_ZOMBIE:  # ended (killed), not yet reaped by its parent
            return False
    except (psutil.Error, ValueError, OverflowError, KeyError, TypeError):
        return False
    since = owner.get("since")
    return not isinstance(since, (int, float)) or started <= since + 1.0


def settled(data: dict, run_dir: Path) -> dict:
    """A record as it stands now: one that says `running` whose process is gone (killed: kill -9, out of memory, a
    lost node) reads as `failed`, saying so with its checkpoint's step and the command that continues it. One whose
    process runs, or runs on another host (not checkable from here), stays `running`."""
    if data.get("status") != "running":
        return data
    owner = data.get("owner") if isinstance(data.get("owner"), dict) else read_owner(run_dir)
    if owner is None or owner_alive(owner) is not False:
        return data
    step = (data.get("checkpoint") or {}).get("step")
    saved = f"its checkpoint holds step {step}" if step is not None else "no checkpoint was written yet"
    resume = data.get("resume_command") or "its own command with ckpt_path=last"
    return {**data, "status": "failed",
            "error": f"run did not finish (killed: its process {owner.get('pid')} on {owner.get('host')} is gone); "
                     f"{saved}; continue with: {resume}"}

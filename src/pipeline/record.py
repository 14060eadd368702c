"""The run record: result.json, written atomically, the contract between runs, reports and tests."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

RESULT = "result.json"

_VERSIONED = ("torch", "lightning", "hydra-core", "gymnasium", "numpy", "ale-py", "wandb", "scikit-learn")


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in _VERSIONED:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def git_commit() -> str | None:
    """The commit of the checkout the package runs from, when it runs from one."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _clean(value: Any) -> Any:
    """Strict JSON: floats that are NaN or infinite become null; tensors and numpy scalars become numbers."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json(path: Path, data: dict) -> None:
    """Write via a temporary file and rename, so a reader never sees half a record."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_clean(data), indent=2, allow_nan=False) + "\n")
    os.replace(tmp, path)


def read_result(run_dir: Path) -> dict | None:
    path = Path(run_dir) / RESULT
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None

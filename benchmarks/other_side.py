"""What the comparison benchmarks share: a virtualenv of their own for the other side, and a scratch clone of its code.

The other side's packages never enter the pipeline's environment, and its code is cloned at run time into
outputs/ (never vendored); without network the clone comes from a local copy named by an environment variable.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, text=True, **kw)


def own_venv(venv: Path, packages: list[str], label: str) -> Path:
    """`venv`'s python, the virtualenv (re)made with exactly `packages` when its stamp says otherwise."""
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    if not stamp.is_file() or stamp.read_text() != " ".join(packages):
        print(f"{label}: installing {' '.join(packages)} into {venv} (once)", flush=True)
        sh([sys.executable, "-m", "venv", str(venv)])
        sh([str(python), "-m", "pip", "install", "--quiet", *packages])
        stamp.write_text(" ".join(packages))
    return python


def scratch_clone(url: str, clone: Path, env_var: str, what: str) -> str:
    """Clone `url` into `clone` unless it is there; the commit it is at."""
    if not (clone / ".git").exists():
        clone.parent.mkdir(parents=True, exist_ok=True)
        try:
            sh(["git", "clone", "--quiet", url, str(clone)])
        except subprocess.CalledProcessError:
            raise SystemExit(f"error: cannot clone {what} from {url}; without network set "
                             f"{env_var}=<a local clone of {what}>") from None
    return sh(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True).stdout.strip()

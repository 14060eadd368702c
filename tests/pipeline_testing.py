"""Helpers shared by the test files (a module of its own: every test folder may have a conftest.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, cwd: Path | None = None, timeout: int = 600, env: dict | None = None):
    """`python -m pipeline ...` as a user types it."""
    full_env = {**os.environ, "WANDB_MODE": "offline", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True, text=True, timeout=timeout, cwd=cwd or ROOT, env=full_env,
    )


def read_result(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "result.json").read_text())


def sweep_dir(root: Path) -> Path:
    """The one sweep folder a `-m` run started in ``root`` made (outputs/multirun/<date>/<time>)."""
    dirs = [p for p in (root / "outputs" / "multirun").glob("*/*") if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def blank_border(path, pixels: int = 2) -> bool:
    """Whether a PNG's outermost pixels are all background: a label or legend cut off at an edge leaves ink there."""
    import numpy as np
    from matplotlib import image as mpimg

    rgb = mpimg.imread(path)[..., :3]
    border = np.concatenate([rgb[:pixels].reshape(-1, 3), rgb[-pixels:].reshape(-1, 3),
                             rgb[:, :pixels].reshape(-1, 3), rgb[:, -pixels:].reshape(-1, 3)])
    return bool((border > 0.98).all())


class StandInWandbRun:
    """A W&B run that records what is logged to it: ("log", payload), ("artifact", artifact), ("finish",)."""

    def __init__(self, calls: list, settings=None):
        import types

        self.calls, self.id, self.summary = calls, "run-id", {}
        self.settings = types.SimpleNamespace(sync_dir="/sync/here") if settings is None else settings

    def log(self, payload):
        self.calls.append(("log", payload))

    def log_artifact(self, artifact):
        self.calls.append(("artifact", artifact))

    def finish(self):
        self.calls.append(("finish",))


def stand_in_wandb(calls: list, settings=None, fail_on_log: bool = False):
    """A `wandb` module (put it in sys.modules) whose init records ("init", kwargs) and returns a StandInWandbRun
    (kept in the module's `runs`)."""
    import types

    wandb = types.ModuleType("wandb")

    def init(**kwargs):
        calls.append(("init", kwargs))
        run = StandInWandbRun(calls, settings)
        wandb.runs.append(run)
        if fail_on_log:
            run.log = lambda payload: (_ for _ in ()).throw(RuntimeError("log failed"))
        return run

    class Table:
        def __init__(self, columns, data):
            self.columns, self.data = columns, data

    class Image:
        def __init__(self, path, caption=None):
            self.path, self.caption = path, caption

    class Artifact:
        def __init__(self, name, type):
            self.name, self.type, self.files = name, type, []

        def add_file(self, path):
            self.files.append(path)

    wandb.init, wandb.Table, wandb.Image, wandb.Artifact, wandb.runs = init, Table, Image, Artifact, []
    return wandb

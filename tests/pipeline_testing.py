"""Helpers shared by the test files (a module of its own: every test folder may have a conftest.py)."""

import atexit
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# `run_cli` forks its runs from a warm interpreter (tests/forkserver.py: torch, Lightning and Hydra imported once)
# unless PIPELINE_TEST_FORKSERVER=0, or the run's environment differs from the server's in a variable read
# while those libraries import (threads, devices, the interpreter): then it starts a fresh interpreter.
_IMPORT_TIME_ENV = ("CUDA", "NVIDIA", "OMP_", "MKL_", "KMP_", "OPENBLAS", "TORCH", "PYTORCH", "PYTHON", "LD_", "PL_", "HYDRA")
_SERVER: dict = {}
_SERVER_LOCK = threading.Lock()


def _forkserver() -> tuple[subprocess.Popen, dict] | None:
    proc = _SERVER.get("proc")
    if proc is None or proc.poll() is not None:
        env = dict(os.environ)
        proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "forkserver.py")], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
        if not proc.stdout.readline():
            return None
        atexit.register(proc.kill)
        _SERVER.update(proc=proc, env=env)
    return _SERVER["proc"], _SERVER["env"]


def _same_import_env(a: dict, b: dict) -> bool:
    keys = {k for k in (*a, *b) if k.startswith(_IMPORT_TIME_ENV)}
    return all(a.get(k) == b.get(k) for k in keys)


def run_cli(*args: str, cwd: Path | None = None, timeout: int = 600, env: dict | None = None):
    """`python -m pipeline ...` as a user types it (forked from a warm interpreter, see tests/forkserver.py)."""
    return run_module("pipeline", *args, cwd=cwd, timeout=timeout, env=env)


def run_module(module: str, *args: str, cwd: Path | None = None, timeout: int = 600, env: dict | None = None):
    """`python -m <module> ...` (pipeline, pipeline.eval, pipeline.report) as `run_cli` runs `python -m pipeline`."""
    # As from a user's shell: not the W&B service an in-process test may have started in this test process.
    full_env = {**{k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}, "WANDB_MODE": "offline", **(env or {})}
    cmd = [sys.executable, "-m", module, *args]
    if os.environ.get("PIPELINE_TEST_FORKSERVER", "1") != "0":
        with _SERVER_LOCK:
            server = _forkserver()
            if server is not None and _same_import_env(full_env, server[1]):
                proc = server[0]
                proc.stdin.write(json.dumps({"module": module, "args": list(args), "cwd": str(cwd or ROOT),
                                             "env": full_env, "timeout": timeout}) + "\n")
                proc.stdin.flush()
                reply = json.loads(proc.stdout.readline())
                out, err = (_read_and_remove(reply[k]) for k in ("stdout", "stderr"))
                if reply["timed_out"]:
                    raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err)
                return subprocess.CompletedProcess(cmd, reply["returncode"], out, err)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd or ROOT, env=full_env)


def _read_and_remove(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    finally:
        os.unlink(path)


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

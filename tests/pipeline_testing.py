"""Helpers shared by the test files (a module of its own: every test folder may have a conftest.py)."""

import atexit
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# `run_cli` forks its runs from a warm interpreter (tests/forkserver.py: torch, Lightning and Hydra imported once)
# unless PIPELINE_TEST_FORKSERVER=0, or the run's environment differs from the server's in a variable read
# while those libraries import (threads, devices, the interpreter): then it starts a fresh interpreter.
_IMPORT_TIME_ENV = ("CUDA", "NVIDIA", "OMP_", "MKL_", "KMP_", "OPENBLAS", "TORCH", "PYTORCH", "PYTHON", "LD_", "PL_", "HYDRA")
# Those variables as the suite's shell set them (tests/conftest.py imports this module first): an in-process run
# seeds and so writes PYTHONHASHSEED and PL_GLOBAL_SEED into the test process's environment, which a CLI run a
# user types would not inherit (and which would send every later run to a fresh interpreter).
_SHELL_IMPORT_ENV = {k: v for k, v in os.environ.items() if k.startswith(_IMPORT_TIME_ENV)}
_SERVER: dict = {}
_SERVER_LOCK = threading.Lock()
# Why the last run that could have been forked started a fresh interpreter (for a test's failure message).
fresh_because: list[str] = []


def _forkserver() -> tuple[subprocess.Popen, dict] | None:
    proc = _SERVER.get("proc")
    if proc is None or proc.poll() is not None:
        if proc is not None:
            fresh_because.append(f"the fork server ended ({proc.returncode}); started another")
        env = _module_env(None)
        proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "forkserver.py")], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
        if not proc.stdout.readline():
            return None
        atexit.register(proc.kill)
        _SERVER.update(proc=proc, env=env)
    return _SERVER["proc"], _SERVER["env"]


def _import_env_differences(a: dict, b: dict) -> list[str]:
    return sorted(k for k in {*a, *b} if k.startswith(_IMPORT_TIME_ENV) and a.get(k) != b.get(k))


def _same_import_env(a: dict, b: dict) -> bool:
    return not _import_env_differences(a, b)


def run_cli(*args: str, cwd: Path | None = None, timeout: int = 600, env: dict | None = None):
    """`python -m pipeline ...` as a user types it (forked from a warm interpreter, see tests/forkserver.py)."""
    return run_module("pipeline", *args, cwd=cwd, timeout=timeout, env=env)


class Completed(subprocess.CompletedProcess):
    """subprocess.run's answer, plus a forked run's peak resident memory (MB, wait4's maxrss: the process and what
    it waited for). None for a fresh interpreter: one started from this (large) test process inherits its
    high-water mark through exec, so wait4 cannot tell the run's own (test_debug measures those from a small parent)."""

    peak_mb: float | None


def _completed(cmd, returncode: int, out: str, err: str, maxrss_kb: int | None) -> Completed:
    done = Completed(cmd, returncode, out, err)
    done.peak_mb = None if maxrss_kb is None else maxrss_kb / 1024
    return done


def _module_env(env: dict | None) -> dict:
    """The environment of a CLI run: as from the suite's shell (not the W&B service an in-process test may have
    started in this test process, nor the import-time variables it may have changed), plus `env`."""
    inherited = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE" and not k.startswith(_IMPORT_TIME_ENV)}
    return {**inherited, **_SHELL_IMPORT_ENV, "WANDB_MODE": "offline", **(env or {})}


def _ask_server(request: dict) -> dict | None:
    """Send one request to the warm server; None where the run needs a fresh interpreter (see _IMPORT_TIME_ENV)."""
    if os.environ.get("PIPELINE_TEST_FORKSERVER", "1") == "0":
        return None
    with _SERVER_LOCK:
        server = _forkserver()
        if server is None:
            fresh_because.append("the fork server did not start")
            return None
        differences = _import_env_differences(request["env"], server[1])
        if differences:
            fresh_because.append(f"the run sets {', '.join(differences)}")
            return None
        proc = server[0]
        proc.stdin.write(json.dumps(request) + "\n")
        proc.stdin.flush()
        return json.loads(proc.stdout.readline())


def run_module(module: str, *args: str, cwd: Path | None = None, timeout: int = 600, env: dict | None = None,
               fresh: bool = False) -> Completed:
    """`python -m <module> ...` (pipeline, pipeline.eval, pipeline.report) as `run_cli` runs `python -m pipeline`
    (`fresh=True`: in a fresh interpreter, never forked)."""
    full_env = _module_env(env)
    cmd = [sys.executable, "-m", module, *args]
    request = {"module": module, "args": list(args), "cwd": str(cwd or ROOT), "env": full_env, "timeout": timeout}
    reply = None if fresh else _ask_server(request)
    if reply is not None:
        out, err = (_read_and_remove(reply[k]) for k in ("stdout", "stderr"))
        if reply["timed_out"]:
            raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err)
        return _completed(cmd, reply["returncode"], out, err, reply["maxrss_kb"])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd or ROOT, env=full_env)
    return _completed(cmd, done.returncode, done.stdout, done.stderr, None)


def start_module(module: str, *args: str, cwd: Path | None = None, env: dict | None = None,
                 merge_stderr: bool = True, timeout: int = 900):
    """`python -m <module> ...` in the background, as `subprocess.Popen(..., stdout=PIPE, stderr=STDOUT or PIPE,
    text=True)` starts it: forked from the warm server where it can be (a `Forked`), else a fresh interpreter."""
    full_env = _module_env(env)
    cmd = [sys.executable, "-m", module, *args]
    reply = _ask_server({"module": module, "args": list(args), "cwd": str(cwd or ROOT), "env": full_env,
                         "timeout": timeout, "detach": True, "merge_stderr": merge_stderr})
    if reply is not None:
        return Forked(cmd, reply)
    return subprocess.Popen(cmd, cwd=cwd or ROOT, env=full_env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE)


class Forked:
    """The part of `subprocess.Popen` the tests use, for a process the warm server forked (it is the server's
    grandchild, not ours: its exit status comes from the monitor's status file, signals go to its pid)."""

    def __init__(self, args: list[str], reply: dict) -> None:
        self.args, self.pid, self.returncode = args, reply["pid"], None
        self._paths = reply

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                status = json.loads(Path(self._paths["status"]).read_text())
            except FileNotFoundError:
                return None
            self.returncode = status["returncode"]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # as Popen: never a signal to a pid that may have been reused
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    @property
    def stdout(self) -> io.StringIO:
        """What the process wrote so far (read it after it ended for all of it)."""
        return io.StringIO(Path(self._paths["stdout"]).read_text(errors="replace"))

    def communicate(self, timeout: float | None = None) -> tuple[str, str | None]:
        self.wait(timeout)
        out = _read_and_remove(self._paths["stdout"])
        err = None if self._paths["stderr"] is None else _read_and_remove(self._paths["stderr"])
        os.unlink(self._paths["status"])
        return out, err

    def __del__(self) -> None:  # a test that failed before its end: stop the process, keep no files
        if self.returncode is None and self.poll() is None:
            self.kill()
        for key in ("stdout", "stderr", "status"):
            if self._paths.get(key):
                try:
                    os.unlink(self._paths[key])
                except OSError:
                    pass


def _read_and_remove(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    finally:
        os.unlink(path)


def read_result(run_dir: Path) -> dict:
    """The run's record as the pipeline's readers see it (a `running` record whose process is gone reads `failed`:
    store.owner); a missing or unreadable file raises as reading it raw does."""
    from pipeline.store.record import read_result as read

    return read(run_dir) or json.loads((Path(run_dir) / "result.json").read_text())


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
    wandb.Settings = lambda **kwargs: dict(kwargs)  # what was asked of wandb.Settings, as a dict
    return wandb


def fit_ready(task):
    """An off-policy actor-critic task built by hand (SAC, TD3, DDPG), set up as Lightning's fit sets it up: its buffers
    and optimizers made, and `optimizers()` handing back the actor's (what RLTask reads when it shrinks the batch)."""
    from types import SimpleNamespace

    task.on_fit_start()
    task.configure_optimizers()
    task.optimizers = lambda: SimpleNamespace(optimizer=task.actor_opt)
    return task


def assert_compile_booked_apart(task) -> None:
    """Two iterations of a compiled RL task: the first compiled, and its compiling is booked as "compile" (equal to
    the task's compile_s), not "learn"; the second compiled nothing and only learnt."""
    import pytest

    task.iterate()
    first = dict(task.time_breakdown_s)
    task.iterate()
    assert first["compile"] == pytest.approx(task.compile_s) and first["compile"] > 0.0
    assert task.time_breakdown_s["compile"] == first["compile"]
    assert task.time_breakdown_s["learn"] > first.get("learn", 0.0)

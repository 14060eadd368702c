"""A warm interpreter that runs `python -m pipeline ...` in forked children, for the test suite's `run_cli`.

(and `python -m pipeline.eval` / `pipeline.report`, through `run_module`).

Every run of the CLI spends ~3-4 s importing torch, Lightning and Hydra before it does anything (docs/speed.md,
"Start-up time"); the suite runs the CLI a few hundred times. This server imports them once and forks a child
per request; the child is a real process (its own pid, signals, exit status, files) that sets the request's cwd,
environment and argv and runs the requested module (`pipeline` unless named) as `__main__` (as `-m` does), its stdout and stderr in
files. Only the import cost is shared: nothing of a test's state is, since the server is its own fresh process.

Protocol (one JSON object per line): request {"module", "args", "cwd", "env", "timeout"} on stdin; reply
{"returncode", "stdout", "stderr", "timed_out", "maxrss_kb"} (the two outputs are file paths the caller reads and
removes; maxrss_kb is the child's peak resident memory, from wait4).

A request with "detach": true is a process started in the background, as `subprocess.Popen` starts one (the
kill -9 / signal tests): the reply comes at once, {"pid", "stdout", "stderr", "status"}, and a small monitor (a
fork of this server that waits for the child) writes {"returncode", "timed_out", ...} to the `status` file
when the child ends. "merge_stderr": true sends both streams to the `stdout` file (stderr=STDOUT).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time


def _child(request: dict, out_fd: int, err_fd: int, channel: list[int]) -> None:
    for fd in channel:
        os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    os.setpgid(0, 0)  # its own process group: a timeout kills what it started too
    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["-m", *request["args"]]
        import runpy

        runpy.run_module(request.get("module", "pipeline"), run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as stop:
        if stop.code is None:
            code = 0
        elif isinstance(stop.code, int):
            code = stop.code
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        # What the interpreter does on its way out: join non-daemon threads, run atexit, flush.
        try:
            import threading

            threading._shutdown()
            import atexit

            atexit._run_exitfuncs()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
            os._exit(code)


def _wait(pid: int, timeout: float) -> dict:
    """Wait for child `pid` (killing its process group past `timeout` seconds): its exit and peak memory."""
    deadline = time.monotonic() + timeout
    timed_out = False
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            timed_out = True
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _, status, usage = os.wait4(pid, 0)
            break
        time.sleep(0.02)
    return {"returncode": os.waitstatus_to_exitcode(status), "timed_out": timed_out, "maxrss_kb": usage.ru_maxrss}


def _start_detached(request: dict, out_fd: int, err_fd: int, channel: list[int]) -> int:
    """Fork a monitor that forks the child and waits for it; return the child's pid (the monitor's own is reaped
    later by `_reap`)."""
    read_end, write_end = os.pipe()
    monitor = os.fork()
    if monitor == 0:
        try:
            os.close(read_end)
            pid = os.fork()
            if pid == 0:
                _child(request, out_fd, err_fd, [*channel, write_end])
            for fd in (out_fd, err_fd, *channel):
                os.close(fd)
            os.write(write_end, str(pid).encode())
            os.close(write_end)
            status = _wait(pid, float(request["timeout"]))
            tmp = request["status"] + ".tmp"
            with open(tmp, "w") as f:
                json.dump(status, f)
            os.replace(tmp, request["status"])
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        pid = int(pipe.read())
    _MONITORS.append(monitor)
    return pid


_MONITORS: list[int] = []


def _reap() -> None:
    for monitor in list(_MONITORS):
        if os.waitpid(monitor, os.WNOHANG)[0]:
            _MONITORS.remove(monitor)


def serve() -> None:
    requests = os.fdopen(os.dup(0), "r")
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)
    # The imports every run of the CLI makes; nothing runs (no torch op, no thread pool, no Hydra state).
    import hydra  # noqa: F401
    import lightning  # noqa: F401
    import omegaconf  # noqa: F401
    import torch  # noqa: F401

    replies.write(json.dumps({"ready": os.getpid()}) + "\n")
    replies.flush()
    for line in requests:
        request = json.loads(line)
        out_fd, out_path = tempfile.mkstemp(prefix="forkserver-out-")
        err_fd, err_path = tempfile.mkstemp(prefix="forkserver-err-")
        sys.stdout.flush()
        sys.stderr.flush()
        if request.get("detach"):
            if request.get("merge_stderr"):
                os.close(err_fd)
                os.unlink(err_path)
                err_fd, err_path = os.dup(out_fd), None
            status_path = out_path + ".status"
            pid = _start_detached({**request, "status": status_path}, out_fd, err_fd,
                                  [requests.fileno(), replies.fileno()])
            os.close(out_fd)
            os.close(err_fd)
            reply = {"pid": pid, "stdout": out_path, "stderr": err_path, "status": status_path}
        else:
            pid = os.fork()
            if pid == 0:
                _child(request, out_fd, err_fd, [requests.fileno(), replies.fileno()])
            os.close(out_fd)
            os.close(err_fd)
            reply = {**_wait(pid, float(request["timeout"])), "stdout": out_path, "stderr": err_path}
        _reap()
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    serve()

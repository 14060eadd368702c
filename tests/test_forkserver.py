"""The suite's warm interpreter (tests/forkserver.py) must answer as a fresh `python -m pipeline` does."""

import functools
import os
import signal
import subprocess
import sys
import time

import pytest

import pipeline_testing
from pipeline_testing import ROOT, Forked, _same_import_env, read_result, run_cli, run_module, start_module


@functools.cache  # a fresh interpreter's answer is the same for every test of a worker that asks (~4 s each)
def fresh(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline"}
    return subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=120)


# A refusal (exit 2, one line) and the help (a long stdout) in the fast suite; a Hydra error on the slow one.
@pytest.mark.parametrize("args", [("optimizer.lr=abc",), ("--help",),
                                  pytest.param(("experiment=no_such_preset",), marks=pytest.mark.slow)])
def test_a_forked_run_prints_and_exits_as_a_fresh_interpreter_does(args):
    forked, direct = run_cli(*args), fresh(*args)
    assert forked.returncode == direct.returncode
    assert forked.stdout == direct.stdout
    assert forked.stderr.strip().splitlines()[-1:] == direct.stderr.strip().splitlines()[-1:]


def test_a_forked_run_gets_the_cwd_and_environment_it_is_given(tmp_path):
    # A relative run dir lands under the cwd given, not the server's; the environment given reaches the run.
    proc = run_cli("experiment=cem_cartpole", "trainer=debug", "hydra.run.dir=rel_dir", cwd=tmp_path,
                   env={"WANDB_MODE": "disabled"})
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-1500:]
    assert (tmp_path / "rel_dir" / "result.json").is_file()
    assert not (ROOT / "rel_dir").exists()
    shown = run_cli("experiment=cem_cartpole", "+probe=${oc.env:FORKSERVER_PROBE}", "--cfg", "job", "--resolve",
                    env={"FORKSERVER_PROBE": "value-from-the-test"})
    assert shown.returncode == 0 and "probe: value-from-the-test" in shown.stdout, shown.stdout[-800:] + shown.stderr[-800:]


def test_a_run_past_its_timeout_is_killed_and_raises_as_subprocess_run_does(tmp_path):
    # A dir of its own: a run killed here before is refused at once in the same dir (it would not time out).
    with pytest.raises(subprocess.TimeoutExpired):
        run_cli("experiment=dqn_cartpole", f"hydra.run.dir={tmp_path / 'run'}", timeout=2)


def test_variables_read_while_torch_imports_send_the_run_to_a_fresh_interpreter():
    base = {"PATH": "/bin", "WANDB_MODE": "offline"}
    assert _same_import_env(base, {**base, "WANDB_MODE": "disabled", "HOME": "/x"})
    for key in ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "PYTHONHASHSEED", "MKL_NUM_THREADS", "PL_GLOBAL_SEED"):
        assert not _same_import_env(base, {**base, key: "1"}), key


def test_a_background_run_is_a_real_process_that_takes_signals_and_reports_its_exit(tmp_path):
    """start_module: the Popen-like handle of a forked run (the kill -9 tests' `start`)."""
    run_dir = tmp_path / "run"
    proc = start_module("pipeline", "experiment=dqn_cartpole", "task.stop_at_return=null", "task.total_steps=400000",
                        "trainer.enable_progress_bar=false", f"hydra.run.dir={run_dir}")
    assert isinstance(proc, Forked) and proc.poll() is None, pipeline_testing.fresh_because[-3:]
    # Its own process, running the CLI (not the server, not a copy of the test process).
    assert proc.pid not in (os.getpid(), os.getppid())
    deadline = time.monotonic() + 120
    while not (run_dir / "result.json").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-2000:]
        time.sleep(0.1)
    assert read_result(run_dir)["pid"] == proc.pid
    proc.send_signal(signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL and err is None  # stderr went into stdout, as stderr=STDOUT
    assert "Traceback" not in out
    with pytest.raises(ProcessLookupError):
        os.kill(proc.pid, 0)  # reaped, not a zombie
    # An ordinary exit: the code and both streams, separately when asked.
    done = start_module("pipeline", "optimizer.lr=abc", merge_stderr=False)
    out, err = done.communicate(timeout=60)
    direct = fresh("optimizer.lr=abc")
    assert done.returncode == direct.returncode != 0
    assert out == direct.stdout and err.strip().splitlines()[-1:] == direct.stderr.strip().splitlines()[-1:]


@pytest.mark.slow  # what it checks serves only test_debug's memory check, itself slow
def test_a_forked_runs_peak_memory_is_reported(tmp_path):
    """run_module's peak_mb (wait4's maxrss) of a forked run: it holds torch and Lightning at least; a fresh
    interpreter started from this process reports none (it would inherit this process's high-water mark)."""
    forked = run_module("pipeline", "experiment=cem_cartpole", "trainer=debug", "device=cpu", f"hydra.run.dir={tmp_path / 'a'}")
    assert forked.returncode == 0 and 200 < forked.peak_mb < 1024, forked.peak_mb
    fresh_one = run_module("pipeline", "--help", fresh=True)
    assert fresh_one.returncode == 0 and fresh_one.peak_mb is None

"""A sweep stopped by a signal, or whose launcher fails, ends as any sweep ends: each job's status, the partial
report, the command that finishes it, and no process of it left training."""

import json
import os
import signal
import time
from pathlib import Path

import pytest

from pipeline.sweep import sweep_processes
from pipeline_testing import start_module

DQN = ("experiment=dqn_cartpole", "task.stop_at_return=null", "trainer.enable_progress_bar=false",
       "task.total_steps=400000", "checkpoint.every_steps=1024")


def _checkpointed(sweep: Path) -> int:
    count = 0
    for job in sweep.glob("*_*"):
        try:
            count += bool((json.loads((job / "result.json").read_text()).get("checkpoint") or {}).get("step"))
        except (OSError, ValueError):
            pass
    return count


def _joblib_sweep_with_two_jobs_checkpointed(tmp_path):
    """A 3-seed joblib sweep (2 at a time) in the background, returned once its two running jobs have checkpointed."""
    sweep = tmp_path / "sweep"
    proc = start_module("pipeline", "-m", *DQN, "seed=0,1,2", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                        f"hydra.sweep.dir={sweep}")
    end = time.monotonic() + 400
    while _checkpointed(sweep) < 2 and proc.poll() is None and time.monotonic() < end:
        time.sleep(0.3)
    return sweep, proc


@pytest.mark.slow
def test_sigterm_to_a_joblib_sweep_stops_its_jobs_starts_no_other_and_ends_with_report_and_resume(tmp_path):
    """The sweep exited at once ("nothing to resume") while its workers trained on, started the next job, then sat
    idle for 24+ minutes."""
    sweep, proc = _joblib_sweep_with_two_jobs_checkpointed(tmp_path)
    assert proc.poll() is None, proc.stdout.getvalue()[-2000:]
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 143, out[-3000:]
    assert "Traceback" not in out and "nothing to resume" not in out, out[-3000:]
    records = {r["seed"]: r for r in (json.loads(p.read_text()) for p in sweep.glob("*/result.json"))}
    assert {s: r["status"] for s, r in records.items()} == {0: "interrupted", 1: "interrupted"}, records  # seed 2 never ran
    assert "0 failed, 2 interrupted, 1 not started]" in out, out[-3000:]
    assert all(r["checkpoint"]["step"] > 0 for r in records.values())
    assert (sweep / "report" / "report.json").is_file()
    lines = out.strip().splitlines()
    assert lines[-1].startswith("finish the sweep with: python -m pipeline -m") and lines[-1].endswith("resume=true"), lines[-3:]
    assert sweep_processes(sweep, jobs_only=False) == []  # nothing of the sweep outlives the command


def test_sweep_processes_finds_a_jobs_training_process_by_its_command_line_only(tmp_path):
    import subprocess
    import sys

    sweep = tmp_path / "sweep"
    job = sweep / "0_seed=0" / ".pipeline"
    job.mkdir(parents=True)
    # A stand-in with a job's command line (python -m pipeline.runtime.job <dir>), and a bystander naming the dir.
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "pipeline.runtime.job", str(job)])
    bystander = subprocess.Popen(["sleep", "60", str(sweep)])
    try:
        time.sleep(0.2)
        assert sweep_processes(sweep, jobs_only=True) == [stand_in.pid]
        assert sweep_processes(tmp_path / "other") == []
    finally:
        for p in (stand_in, bystander):
            p.kill()
            p.wait()
    assert os.getpid() not in sweep_processes(sweep)


def _children(pid: int) -> list[tuple[int, str]]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pid:
                out.append((int(entry.name), command))
    return out


@pytest.mark.slow
def test_a_killed_joblib_worker_ends_the_sweep_with_statuses_report_and_resume_not_a_traceback(tmp_path):
    """kill -9 of a loky worker printed a 48-line TerminatedWorkerError traceback, wrote no report, and lost the
    other in-flight seed's work."""
    sweep, proc = _joblib_sweep_with_two_jobs_checkpointed(tmp_path)
    workers = [pid for pid, command in _children(proc.pid) if "LokyProcess" in command]
    assert workers, _children(proc.pid)
    os.kill(workers[0], signal.SIGKILL)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, out[-3000:]
    assert "Traceback" not in out and [line for line in out.splitlines() if line.startswith("the launcher failed: TerminatedWorkerError")]
    assert (sweep / "report" / "report.json").is_file()
    records = [json.loads(p.read_text()) for p in sweep.glob("*/result.json")]
    assert records and all("still running" not in (r.get("error") or "") for r in records), records
    assert all(r["status"] == "ok" or (r.get("checkpoint") or {}).get("step") for r in records)  # each can continue
    # Both jobs in flight were stopped, not killed: the killed worker's (its parent gone) and the other worker's, which
    # loky kills with its worker once one dies (it gets the stop signal first): each saved where it was.
    stopped = [r for r in records if r["status"] == "interrupted"]
    assert len(stopped) == 2 and all(r["interrupted"]["signal"] == "SIGTERM" for r in stopped), records
    assert all(r["checkpoint"]["step"] == r["interrupted"]["step"] for r in stopped)
    assert out.strip().splitlines()[-1].endswith("resume=true")
    assert sweep_processes(sweep) == []

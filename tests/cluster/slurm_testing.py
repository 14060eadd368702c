"""Helpers for the cluster tests: a sweep started as a user types it, and SLURM's own tools to watch it."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

SLURM_SMALL = ["hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1", "hydra.launcher.timeout_min=10"]


class Cli:
    """`python -m pipeline ...` in the background; its output lines collected as they come."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        env = {**os.environ, "WANDB_MODE": "offline"}
        self.proc = subprocess.Popen([sys.executable, "-m", "pipeline", *args], cwd=cwd, env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait(self, timeout: float = 400) -> tuple[int, str]:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self._reader.join(10)
        return rc, "\n".join(self.lines)

    def job_ids(self) -> list[str]:
        """The first and last SLURM job ids the launcher printed ('submitted 2 SLURM job(s): 12_0 .. 12_1')."""
        for line in list(self.lines):
            if line.startswith("submitted ") and "SLURM job" in line:
                return line.split(": ", 1)[1].split(" .. ")
        return []

    def array_job(self) -> str | None:
        ids = self.job_ids()
        return ids[0].split("_")[0] if ids else None

    def stop(self) -> None:
        """Teardown: end the sweep and cancel its jobs, whatever the test's outcome."""
        if self.proc.poll() is None:
            self.proc.kill()
        for job in {i.split("_")[0] for i in self.job_ids()}:
            subprocess.run(["scancel", job], capture_output=True)


def squeue_states(job: str) -> dict[str, str]:
    """{'12_0': 'RUNNING', ...} for the tasks of array job `job` still in the queue."""
    out = subprocess.run(["squeue", "-h", "-r", "-j", job, "-o", "%i %T"], capture_output=True, text=True).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def node_settled() -> bool:
    """No node of the cluster is still completing a job: SLURM has killed the old instance's processes and run
    its epilog, so a requeued job forced to start now (`scontrol update StartTime=now`) cannot be hit by the
    old instance's clean-up (same job id, same node)."""
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True).stdout.split()
    return bool(out) and not any("comp" in state or "drain" in state for state in out)


def slurm_story(job: str, sweep: Path) -> str:
    """What SLURM and submitit saw of `job`, for an assertion message: sacct's rows and the job's logs."""
    acct = subprocess.run(["sacct", "-D", "-j", job, "-o", "JobID,State,ExitCode,Start,End"], capture_output=True,
                          text=True).stdout
    logs = "\n".join(f"--- {p.name}\n" + p.read_text()[-3000:] for p in sorted(sweep.glob(".submitit/*/*_log.*")))
    return f"sacct:\n{acct}\n{logs}"


def wait_until(predicate, timeout: float, what: str, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def read_steps(csv_path: Path, column: str) -> list[int]:
    with open(csv_path, newline="") as f:
        return [int(float(row[column])) for row in csv.DictReader(f) if row.get(column) not in (None, "")]

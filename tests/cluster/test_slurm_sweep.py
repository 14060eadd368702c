"""The README's SLURM sweep on a real (one-node) SLURM cluster: each seed a job of an array, one line per
finished job with its SLURM id, the report; a job the scheduler kills (`scancel` of one array task) leaves
the other seed ok, the report over what finished and the resume command as the last line, and that command
finishes only the missing seed. Quiet: no submitit sacct warnings (accounting is up), no Lightning srun
warning, and Lightning's own SLURM auto-requeue is off in the jobs."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

from slurm_testing import SLURM_SMALL, squeue_states, wait_until

# Long enough (in epochs) that the cancelled task is still training when scancel arrives.
SWEEP = ["-m", "experiment=supervised_digits", "trainer=debug", "trainer.max_epochs=40", "seed=0,1",
         "hydra/launcher=slurm"]


def _records(sweep: Path) -> dict[int, dict]:
    out = {}
    for path in sweep.glob("*/result.json"):
        record = json.loads(path.read_text())
        out[record["seed"]] = record
    return out


def test_slurm_sweep_scancel_one_task_then_resume_finishes_only_it(tmp_path, cluster, start_cli):
    sweep = tmp_path / "sweep"
    cli = start_cli([*SWEEP, f"hydra.launcher.partition={cluster['partition']}", *SLURM_SMALL, f"hydra.sweep.dir={sweep}"], tmp_path)
    job = wait_until(cli.array_job, 120, "the sweep to submit its array")
    # Cancel seed 1's task once its training process has started, as the scheduler would kill it.
    started = sweep / "1_seed=1,trainer.max_epochs=40,trainer=debug" / ".pipeline" / "context.json"
    wait_until(lambda: started.exists() or cli.proc.poll() is not None, 240, "seed 1 to start")
    assert squeue_states(job).get(f"{job}_1") == "RUNNING", (squeue_states(job), cli.lines[-20:])
    subprocess.run(["scancel", f"{job}_1"], check=True)
    rc, out = cli.wait()

    assert rc != 0, out
    lines = out.strip().splitlines()
    assert any(line.startswith(f"[job 0] slurm {job}_0: seed=0 ok") for line in lines), out
    assert any(line.startswith(f"[job 1] slurm {job}_1: seed=1 failed") for line in lines), out
    records = _records(sweep)
    assert records[0]["status"] == "ok"
    assert records[1]["status"] == "failed" and "CANCELLED" in records[1]["error"], records[1]
    assert (sweep / "report" / "report.md").is_file()
    report = (sweep / "report" / "report.md").read_text()
    assert "(1 ok, 1 failed" in report, report
    resume = lines[-1]
    assert resume.startswith("finish the sweep with: python -m pipeline -m "), out
    assert f"hydra.sweep.dir={sweep}" in resume and resume.endswith("resume=true")
    # Quiet on a cluster with accounting.
    assert "Bypassing sacct" not in out and "The `srun` command is available" not in out, out

    seed0_before = (sweep / "0_seed=0,trainer.max_epochs=40,trainer=debug" / "result.json").read_text()
    args = shlex.split(resume.split(": ", 1)[1])[3:]  # after "python -m pipeline"
    rc, out = start_cli(args, tmp_path).wait()
    assert rc == 0, out
    records = _records(sweep)
    assert records[0]["status"] == records[1]["status"] == "ok", out
    assert (sweep / "0_seed=0,trainer.max_epochs=40,trainer=debug" / "result.json").read_text() == seed0_before
    assert len([line for line in out.splitlines() if " seed=1 ok" in line]) == 1, out
    # Lightning's SLURM environment (and its auto-requeue, a second requeuer) stays off inside the jobs.
    logs = "".join(p.read_text() for p in sweep.glob(".submitit/*/*_log.*"))
    assert "SLURM auto-requeueing enabled" not in logs, logs[-2000:]
    assert "The `srun` command is available" not in logs, logs[-2000:]

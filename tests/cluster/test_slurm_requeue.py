"""Preemption and time limits on SLURM lose nothing. A job sent SIGUSR2 (what SLURM sends before preemption
or the time limit, as submitit asks for it with --signal=USR2@<delay>) writes its checkpoint, records
`interrupted`, is requeued once (by submitit, not also by Lightning) and continues to its budget; the same
for a job an operator requeues (`scontrol requeue`: SLURM sends SIGTERM and requeues it itself). DQN (its own
loop) and supervised (Lightning's loop) both."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from slurm_testing import SLURM_SMALL, node_settled, read_steps, slurm_story, squeue_states, wait_until

DQN_BUDGET = 24000
# supervised_digits: ~0.07 s an epoch here (0.1-0.13 s on a loaded machine). The run's curve file is first written
# ~5 s into training (store.curves.CurveLog flushes every 5 s; no periodic checkpoint flushes it sooner), so the signal
# sent after two rows lands near epoch 50-85; 200 epochs leave 8 s or more of training after it.
EPOCHS = 200

CASES = {
    # name: (overrides, how the job is told, the signal the run records, the run's budget check)
    "dqn-usr2": (["experiment=dqn_cartpole", f"task.total_steps={DQN_BUDGET}", "task.stop_at_return=null",
                  "checkpoint.every_steps=2000"], "usr2", "SIGUSR2"),
    "supervised-usr2": (["experiment=supervised_digits", f"trainer.max_epochs={EPOCHS}", "trainer.enable_progress_bar=false"],
                        "usr2", "SIGUSR2"),
    "dqn-scontrol-requeue": (["experiment=dqn_cartpole", f"task.total_steps={DQN_BUDGET}", "task.stop_at_return=null",
                              "checkpoint.every_steps=2000"], "requeue", "SIGTERM"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_job_preempted_or_requeued_continues_to_its_budget(tmp_path, cluster, start_cli, case):
    overrides, how, signal_name = CASES[case]
    sweep = tmp_path / "sweep"
    cli = start_cli(["-m", *overrides, "seed=0", "hydra/launcher=slurm", f"hydra.launcher.partition={cluster['partition']}",
                     *SLURM_SMALL, f"hydra.sweep.dir={sweep}"], tmp_path)
    job = wait_until(cli.job_ids, 120, "the sweep to submit its job")[0]  # one job: no array
    run_dir = next(iter(wait_until(lambda: list(sweep.glob("0_*")), 240, "the job's run dir")))
    curve = run_dir / "metrics.csv"
    wait_until(lambda: curve.exists() and len(read_steps(curve, "step")) >= 2, 240, "training to log two rows", every=0.1)
    if how == "usr2":
        subprocess.run(["scancel", "--signal=USR2", job], check=True)
    else:
        subprocess.run(["scontrol", "requeue", job], check=True)
    interrupted = wait_until(
        lambda: (r := json.loads((run_dir / "result.json").read_text())).get("interrupted") and r, 120,
        "the run to record its interruption")
    assert interrupted["status"] == "interrupted" and interrupted["interrupted"]["signal"] == signal_name, interrupted
    stopped_at = interrupted["interrupted"]["step"]
    budget_step = DQN_BUDGET if case.startswith("dqn") else EPOCHS - 1
    assert stopped_at is not None and 0 < stopped_at < budget_step, interrupted
    rows_before = [s for s in read_steps(curve, "step") if s <= stopped_at]
    # SLURM 22.05 holds a requeued job for about two minutes (EligibleTime); let it start now to keep CI short,
    # but not within the second the old instance was killed: slurmd compares credential times in whole seconds,
    # so a restart then reads "Job credential revoked" and SLURM fails the job (seen: the start forced 0.2 s
    # after the requeue; slurmd.log "Job 9 already killed, do not launch batch job"). SLURM's hold exists for this.
    wait_until(lambda: squeue_states(job).get(job) == "PENDING" and node_settled(), 120, "the job to be requeued")
    time.sleep(2.5)
    subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], check=True)

    rc, out = cli.wait(timeout=400)
    assert rc == 0, f"{out}\n{slurm_story(job, sweep)}"
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "ok", f"{record}\n{slurm_story(job, sweep)}"
    steps = read_steps(curve, "step")
    if case.startswith("dqn"):
        assert record["env_steps"] == DQN_BUDGET
    else:  # one validation row per epoch, then the test row one step on
        assert steps[-2:] == [EPOCHS - 1, EPOCHS], steps[-5:]
        assert record["metrics"]["test/acc"] > 0.9, record["metrics"]
    assert steps == sorted(set(steps)), steps  # unique and increasing: no piece ran twice
    assert [s for s in steps if s <= stopped_at] == rows_before  # every row from before the signal kept
    segments = record["segments"]
    assert [s.get("end") for s in segments] == ["interrupted", "ok"], segments
    assert segments[0]["to_step"] == stopped_at and segments[1]["from_step"] == stopped_at
    assert abs(record["wall_time_s"] - sum(s["wall_time_s"] for s in segments)) < 0.01
    # SLURM requeued the job exactly once (one requeue, not one by submitit and one by Lightning).
    runs = subprocess.run(["sacct", "-n", "-X", "-D", "-j", job, "-o", "State"], capture_output=True,
                          text=True).stdout.split()
    assert runs == ["REQUEUED", "COMPLETED"], f"{runs}\n{slurm_story(job, sweep)}"
    logs = "".join(p.read_text() for p in sweep.glob(".submitit/*/*_log.*"))
    assert "SLURM auto-requeueing enabled" not in logs

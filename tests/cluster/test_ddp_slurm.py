"""One run on two SLURM tasks (trainer=ddp, hydra/launcher=slurm with tasks_per_node=2): SLURM starts both ranks,
Lightning's SLURMEnvironment names them, rank 0 owns the run dir and writes the one record."""

from __future__ import annotations

import json
import subprocess
import time

from slurm_testing import SLURM_SMALL, node_settled, read_steps, slurm_story, squeue_states, wait_until


def test_a_run_on_two_slurm_tasks_writes_one_record_of_both(tmp_path, cluster, start_cli):
    sweep = tmp_path / "sweep"
    cli = start_cli(["-m", "experiment=supervised_digits", "seed=0", "trainer=ddp", "trainer.devices=2", "trainer.num_nodes=1",
                     "trainer.max_epochs=2", "model.dropout=0", "trainer.enable_progress_bar=false", "trainer.ddp_timeout_s=60",
                     "hydra/launcher=slurm", f"hydra.launcher.partition={cluster['partition']}", *SLURM_SMALL,
                     "hydra.launcher.tasks_per_node=2", "hydra.launcher.nodes=1", f"hydra.sweep.dir={sweep}"], tmp_path)
    rc, out = cli.wait(timeout=400)
    job = (cli.job_ids() or ["?"])[0]
    assert rc == 0, out[-3000:] + slurm_story(job.split("_")[0], sweep)
    (run_dir,) = sweep.glob("0_*")
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "ok" and record["processes"] == 2 and record["effective_batch_size"] == 128, record
    assert record["metrics"]["test/acc"] > 0.5  # two epochs of a real run (chance is 0.1)
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == ["0", "1", "2"], rows  # one curve, one row per epoch, not one per rank


# supervised_digits at batch 32 a task, ~0.1 s an epoch (0.25-0.35 s on a loaded machine): 60 epochs (~6 s) let a
# signal sent after two rows arrive after the run's end on a loaded CI machine, as the curve file is first written ~5 s
# into training (store.curves.CurveLog flushes every 5 s), i.e. near epoch 50. 160 leave ~100 epochs (10 s) after it.
EPOCHS = 160


def test_a_preempted_run_on_two_slurm_tasks_saves_once_is_requeued_once_and_finishes(tmp_path, cluster, start_cli):
    sweep = tmp_path / "sweep"
    cli = start_cli(["-m", "experiment=supervised_digits", "seed=0", "trainer=ddp", "trainer.devices=2", "data.batch_size=32",
                     f"trainer.max_epochs={EPOCHS}", "trainer.enable_progress_bar=false", "trainer.ddp_timeout_s=60",
                     "hydra/launcher=slurm", f"hydra.launcher.partition={cluster['partition']}", *SLURM_SMALL,
                     "hydra.launcher.tasks_per_node=2", f"hydra.sweep.dir={sweep}"], tmp_path)
    job = wait_until(cli.job_ids, 120, "the sweep to submit its job")[0]
    run_dir = next(iter(wait_until(lambda: list(sweep.glob("0_*")), 240, "the job's run dir")))
    curve = run_dir / "metrics.csv"
    wait_until(lambda: curve.exists() and len(read_steps(curve, "step")) >= 2, 240, "training to log two rows", every=0.1)
    subprocess.run(["scancel", "--signal=USR2", job], check=True)  # what SLURM sends every task before preemption
    interrupted = wait_until(
        lambda: (r := json.loads((run_dir / "result.json").read_text())).get("interrupted") and r, 120,
        "the run to record its interruption")
    assert interrupted["interrupted"]["signal"] == "SIGUSR2", interrupted
    stopped_at = interrupted["interrupted"]["step"]
    rows_before = [s for s in read_steps(curve, "step") if s <= stopped_at]
    wait_until(lambda: squeue_states(job).get(job) == "PENDING" and node_settled(), 120, "the job to be requeued")
    time.sleep(2.5)  # see test_slurm_requeue.py: not within the second the old instance was killed
    subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], check=True)
    rc, out = cli.wait(timeout=400)
    assert rc == 0, f"{out}\n{slurm_story(job, sweep)}"
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "ok" and record["processes"] == 2, f"{record}\n{slurm_story(job, sweep)}"
    steps = read_steps(curve, "step")
    assert steps[-2:] == [EPOCHS - 1, EPOCHS] and steps == sorted(set(steps)), steps
    assert [s for s in steps if s <= stopped_at] == rows_before
    assert [s.get("end") for s in record["segments"]] == ["interrupted", "ok"], record["segments"]
    runs = subprocess.run(["sacct", "-n", "-X", "-D", "-j", job, "-o", "State"], capture_output=True, text=True).stdout.split()
    assert runs == ["REQUEUED", "COMPLETED"], f"{runs}\n{slurm_story(job, sweep)}"

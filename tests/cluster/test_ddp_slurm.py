"""One run on two SLURM tasks (trainer=ddp, hydra/launcher=slurm with tasks_per_node=2): SLURM starts both ranks,
Lightning's SLURMEnvironment names them, rank 0 owns the run dir and writes the one record."""

from __future__ import annotations

import json

from slurm_testing import SLURM_SMALL, slurm_story


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

"""A SAC batch killed with SIGKILL and resumed with ckpt_path=last ends bitwise where an uninterrupted run ends:
weights, targets, temperatures, Adam moments, replay buffers, per-agent generators and the envs all come back."""

import signal

import pandas as pd
import pytest
import torch

from pipeline_testing import read_result, run_cli
from test_durable import checkpoint_step, start, wait_for

pytestmark = pytest.mark.slow

ARGS = ("experiment=sac_pendulum", "seeds_per_process=2", "model.hidden=[32,32]", "task.critic_hidden=[32,32]",
        "task.batch_size=64", "task.learning_starts=200", "task.eval_every=1000", "checkpoint.every_steps=500",
        "trainer.enable_progress_bar=false")


def test_kill_9_then_ckpt_path_last_continues_a_sac_batch_exactly(tmp_path):
    # Killed at a checkpoint of 1,000 or later, past learning_starts and an evaluation, with 2,000 steps still to go;
    # evaluations before and after the kill (1,000, 2,000, 3,000) are compared too.
    budget = 3_000
    args = (*ARGS, f"task.total_steps={budget}")
    run_dir = tmp_path / "killed"
    proc = start(*args, f"hydra.run.dir={run_dir}")
    wait_for(lambda: (checkpoint_step(run_dir / "seed1") or 0) >= 1000, timeout=900, proc=proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"the run ended ({proc.returncode}) before the kill: raise the budget"
    killed = read_result(run_dir / "seed1")
    saved_at = killed["checkpoint"]["step"]
    assert killed["status"] == "failed" and 1000 <= saved_at < budget
    resumed = run_cli(*args, f"hydra.run.dir={run_dir}", "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    reference = run_cli(*args, f"hydra.run.dir={tmp_path / 'reference'}")
    assert reference.returncode == 0, reference.stdout[-2000:]
    for seed in ("seed0", "seed1"):
        record, ref = read_result(run_dir / seed), read_result(tmp_path / "reference" / seed)
        assert record["status"] == "ok" and record["env_steps"] == budget
        assert [s.get("from_step") for s in record["segments"]] == [None, saved_at]
        assert record["replay_restored_on_resume"] is True
        assert record["metrics"] == ref["metrics"] and record["evaluations"] == ref["evaluations"]
        a, b = (torch.load(d / seed / "model.pt", weights_only=True) for d in (run_dir, tmp_path / "reference"))
        assert all(torch.equal(a[k], b[k]) for k in a)
        curve, ref_curve = (pd.read_csv(d / seed / "metrics.csv").drop(columns=["perf/env_steps_per_s"])
                            for d in (run_dir, tmp_path / "reference"))
        pd.testing.assert_frame_equal(curve, ref_curve)

"""trainer=ddp stopped and resumed is the run it would have been (real `python -m pipeline` runs on two processes, gloo
on CPU, dropout on), and a stop is agreed by every rank at the same batch even when one rank is held back.

With dropout each rank draws its own masks, and the ranks' random streams part in the first epoch (their last
batches differ in size): a checkpoint holding rank 0's states alone made every resumed run differ from the first
row after the checkpoint (28 of 31 rows). Each rank's states are saved and restored now, so the curves and the test
metrics of a run stopped and resumed equal an uninterrupted run's exactly."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from pipeline_testing import read_result, run_cli, start_module

DDP = ("experiment=supervised_digits", "trainer=ddp", "trainer.max_epochs=4", "data.batch_size=32", "checkpoint.every_s=0",
       "trainer.enable_progress_bar=false", "trainer.ddp_timeout_s=60")


def _stopped(run_dir: Path, rank: int, sig: int) -> str:
    """Start the run and send `sig` to rank `rank` once two epochs are in its curve; the output of rank 0's process."""
    proc = start_module("pipeline", *DDP, f"hydra.run.dir={run_dir}")
    curve = run_dir / "metrics.csv"
    while proc.poll() is None and not (curve.is_file() and len(curve.read_text().splitlines()) >= 3):
        time.sleep(0.1)
    ranks = psutil.Process(proc.pid).children()
    assert len(ranks) == 1, [r.cmdline() for r in ranks]
    target = proc.pid if rank == 0 else ranks[0].pid
    psutil.Process(target).send_signal(sig)
    if rank == 0 and sig == signal.SIGKILL:
        psutil.wait_procs(ranks, timeout=120)  # rank 1 finds rank 0 gone and ends
    proc.wait(timeout=600)  # a bound on a hang, not a speed target
    return proc.communicate()[0]


@pytest.mark.slow
def test_a_ddp_run_stopped_and_resumed_equals_an_uninterrupted_one(tmp_path):
    straight = run_cli(*DDP, f"hydra.run.dir={tmp_path / 'straight'}")
    assert straight.returncode == 0, straight.stderr[-3000:]
    reference = pd.read_csv(tmp_path / "straight" / "metrics.csv")
    for name, rank, sig in (("sigterm", 1, signal.SIGTERM), ("kill9", 0, signal.SIGKILL)):
        run_dir = tmp_path / name
        out = _stopped(run_dir, rank, sig)
        if sig == signal.SIGKILL:  # rank 1, left alone, says so in one line instead of gloo's 100-line traceback
            assert "Traceback" not in out and out.count("[rank 1] stopped: rank 0 (pid ") == 1, out[-3000:]
        else:
            assert read_result(run_dir)["status"] == "interrupted"
        saved = read_result(run_dir)["checkpoint"]["step"]
        assert 0 <= saved < 3
        resumed = run_cli(*DDP, "ckpt_path=last", f"hydra.run.dir={run_dir}")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        pd.testing.assert_frame_equal(pd.read_csv(run_dir / "metrics.csv"), reference, check_exact=True)
        assert read_result(run_dir)["metrics"] == read_result(tmp_path / "straight")["metrics"]


# Two ranks of a real gloo group run EpochCheckpointer._stop_agreed twice; rank 0's stop signal lands while it waits in
# the first all-reduce (rank 1 is late: held back, as a SIGSTOPped rank is), so Python runs its handler after the
# all-reduce returned. Each rank prints its answers.
RANK = textwrap.dedent("""
    import json, os, signal, sys, threading, time
    from types import SimpleNamespace
    import torch
    import torch.distributed as dist
    from pipeline.runtime.checkpointing import CheckpointPolicy, EpochCheckpointer
    from pipeline.runtime.rundir import StopRequests

    rank, store = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    stop = StopRequests((signal.SIGUSR2,)).install()
    trainer = SimpleNamespace(world_size=2, strategy=SimpleNamespace(root_device=torch.device("cpu")))
    epochs = EpochCheckpointer(os.devnull, CheckpointPolicy(), stop, on_save=None, writes=False)
    dist.barrier()
    if rank == 0:
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGUSR2)).start()
    else:
        time.sleep(1.5)
    answers = [epochs._stop_agreed(trainer), epochs._stop_agreed(trainer)]
    print(json.dumps({"answers": answers, "signal": stop.signal}))
    dist.destroy_process_group()
""")


@pytest.mark.slow
def test_a_stop_that_lands_during_the_agreement_is_agreed_at_the_next_batch_by_every_rank(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(rank), str(tmp_path / "store")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    said = [json.loads(o[0].strip().splitlines()[-1]) for o in outs]
    # Not [True, ...] on rank 0 alone: both ranks see nothing at the first agreement and the stop at the second.
    assert [s["answers"] for s in said] == [[False, True], [False, True]], said
    assert [s["signal"] for s in said] == [int(signal.SIGUSR2)] * 2

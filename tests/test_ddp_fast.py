"""trainer=ddp's data-parallel arithmetic in seconds: two real gloo processes (tests/ddp_fast_rank.py, forked by the
suite's fork server, so nothing is imported again) train SupervisedTask through Lightning's DDP strategy as the
lifecycle builds it (`ddp_strategy`), on a tiny model and 9 or 11 samples, against one process with a batch twice as
large.

Rank r's step s takes minibatch 2s + r, so the two processes' step is the one process's minibatch s, split in two. Where
the epoch's last step is uneven (11 samples in minibatches of 2: the last pair holds 2 + 1) or padded (9 samples: the
sampler repeats a minibatch for rank 1, which must weigh nothing), only each rank's mean reweighted by its share of the
step's samples gives the one process's gradient. With plain SGD (a step proportional to the gradient, where Adam would
hide a scale) the weights after two epochs then agree up to float32 summation order (~1e-7 relative; 1e-5 allowed), and
so do the epoch curves rank 0 writes, which must be the means over both ranks' samples.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch

from ddp_fast_rank import EPOCHS
from pipeline_testing import start_module

BATCH = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(n: int, batch_size: int, world: int, tmp_path: Path) -> list[dict]:
    """The `world` processes of one run (each its own process: torch.distributed, Lightning's state); their outputs."""
    port, outs = free_port(), [tmp_path / f"n{n}_w{world}_rank{r}.pt" for r in range(world)]
    ranks = [start_module("ddp_fast_rank", *map(str, (n, batch_size, world, r, port, outs[r])), cwd=Path(__file__).parent)
             for r in range(world)]
    for r, proc in enumerate(ranks):
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"rank {r} of {world} exited with {proc.returncode}:\n{out[-3000:]}"
    return [torch.load(out, weights_only=True) for out in outs]


@pytest.mark.parametrize("n", [11, 9], ids=["uneven_last_step", "padded_last_step"])
def test_two_processes_train_as_one_with_twice_the_batch_and_rank_0_writes_both_ranks_means(n, tmp_path):
    one = run(n, 2 * BATCH, 1, tmp_path)[0]
    rank0, rank1 = run(n, BATCH, 2, tmp_path)
    for name, weight in one["weights"].items():
        # DDP keeps the ranks' weights equal; the one process's up to the summation order.
        torch.testing.assert_close(rank1["weights"][name], rank0["weights"][name], rtol=0, atol=0, msg=name)
        torch.testing.assert_close(rank0["weights"][name], weight, rtol=1e-5, atol=1e-6, msg=name)
    for agent in range(2):
        curve, expected = rank0["curves"][agent], one["curves"][agent]
        assert sorted(curve) == sorted(expected) and all("train/loss" in curve[e] for e in range(EPOCHS)), curve
        for epoch, row in expected.items():
            assert set(curve[epoch]) == set(row), epoch
            for key, value in row.items():
                assert curve[epoch][key] == pytest.approx(value, rel=1e-5, abs=1e-6), (agent, epoch, key)

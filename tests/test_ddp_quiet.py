"""A run on several processes (trainer=ddp) prints its own lines, not Lightning's "Initializing distributed" per
process and handler (4 lines for 2 processes)."""

import pytest

from pipeline_testing import read_result, run_cli


@pytest.mark.slow
def test_a_two_process_run_does_not_print_initializing_distributed(tmp_path):
    done = run_cli("experiment=supervised_digits", "trainer=ddp", "trainer.max_epochs=1", "data.batch_size=64",
                   "trainer.enable_progress_bar=false", f"hydra.run.dir={tmp_path}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert read_result(tmp_path)["status"] == "ok"
    out = done.stdout + done.stderr
    assert "Initializing distributed" not in out and "rank 1 (pid " in out, out

"""The Atari presets are real runs of millions of env steps: without a CUDA GPU both refuse at start-up in one line
(ppo_atari silently started a 10M-step CPU run while dqn_atari refused), and `device=cpu trainer=debug` runs."""

import pytest
import torch

from pipeline_testing import run_cli


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a CUDA GPU")
@pytest.mark.parametrize("preset", ["ppo_atari", "dqn_atari"])
def test_an_atari_preset_without_cuda_is_refused_in_one_line(tmp_path, preset):
    done = run_cli(f"experiment={preset}", f"hydra.run.dir={tmp_path / 'run'}")
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and lines == [
        "error: device=cuda was requested but torch sees no CUDA GPU; use device=cpu or device=auto"], lines
    assert not (tmp_path / "run").exists()

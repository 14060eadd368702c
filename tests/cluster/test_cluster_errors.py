"""On a cluster's login node: bad cluster input is one line naming the cause and the fix, exit 2, before anything
is submitted; a plain run is as quiet as anywhere else."""

from __future__ import annotations

import subprocess
from pathlib import Path

from pipeline_testing import run_cli

SWEEP = ["-m", "experiment=supervised_digits", "trainer=debug", "seed=0", "hydra/launcher=slurm"]


def _one_error_line(proc) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (proc.returncode, proc.stderr[-2000:])
    return lines[0]


def _jobs() -> str:
    return subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout


def test_a_partition_that_does_not_exist(tmp_path, cluster):
    before = _jobs()
    line = _one_error_line(run_cli(*SWEEP, "hydra.launcher.partition=nope", f"hydra.sweep.dir={tmp_path}/s", cwd=tmp_path))
    assert "SLURM partition 'nope' does not exist" in line and cluster["partition"] in line
    assert _jobs() == before


def test_device_cuda_on_a_partition_without_gpus(tmp_path, cluster):
    line = _one_error_line(run_cli(*SWEEP, "device=cuda", f"hydra.launcher.partition={cluster['partition']}",
                                   f"hydra.sweep.dir={tmp_path}/s", cwd=tmp_path))
    assert "hydra.launcher.gpus_per_node=1" in line
    line = _one_error_line(run_cli(*SWEEP, "device=cuda", f"hydra.launcher.partition={cluster['partition']}",
                                   "hydra.launcher.gpus_per_node=1", f"hydra.sweep.dir={tmp_path}/s", cwd=tmp_path))
    assert f"partition {cluster['partition']!r} has no GPUs" in line


def test_a_controller_that_is_down(tmp_path, cluster):
    # The same cluster config, pointing at a port where no slurmctld listens: as a controller that is down.
    conf = tmp_path / "slurm.conf"
    conf.write_text(Path("/etc/slurm/slurm.conf").read_text() + "SlurmctldPort=1\n")
    line = _one_error_line(run_cli(*SWEEP, f"hydra.sweep.dir={tmp_path}/s", cwd=tmp_path, env={"SLURM_CONF": str(conf)}))
    assert "the SLURM controller is not answering" in line and "slurmctld" in line


def test_a_plain_run_on_a_login_node_prints_no_lightning_slurm_warning(tmp_path, cluster):
    # srun and sinfo are on PATH here, as on a cluster's login node: Lightning used to warn on every run.
    proc = run_cli("experiment=supervised_digits", "trainer=debug", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "The `srun` command is available" not in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-2000:]

"""SLURM facts a sweep checks before it submits, so a wrong partition, a controller that is down or a GPU
run on a node without one is one line at once, not a queue of jobs that all fail (or never start)."""

from __future__ import annotations

import shutil
import subprocess

from pipeline.config.checks import ConfigError

TIMEOUT_S = 20


def _slurm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=TIMEOUT_S)


def check_slurm_submission(params: dict, accelerator: str | None) -> None:
    """Raise ConfigError naming the cause and the fix; returns when submitting can work."""
    if shutil.which("sbatch") is None:
        raise ConfigError("hydra/launcher=slurm needs SLURM's sbatch on PATH: run the sweep on the cluster's login node "
                          "(or hydra/launcher=joblib on this machine)")
    try:
        ping = _slurm("scontrol", "ping")
    except subprocess.TimeoutExpired:
        ping = None
    if ping is None or ping.returncode != 0 or "UP" not in ping.stdout:
        said = (ping.stdout or ping.stderr).strip().splitlines()[0] if ping is not None and (ping.stdout or ping.stderr).strip() else "no answer"
        raise ConfigError(f"the SLURM controller is not answering (scontrol ping: {said}): start slurmctld "
                          "(make cluster-up for the local test cluster) or ask the cluster's admins")
    partitions = _slurm("sinfo", "-h", "-o", "%P %G").stdout.split("\n")
    names = {line.split()[0].rstrip("*"): line.split()[1] if len(line.split()) > 1 else "(null)"
             for line in partitions if line.strip()}
    default = next((line.split()[0].rstrip("*") for line in partitions if line.split() and line.split()[0].endswith("*")), None)
    partition = params.get("partition") or default
    if params.get("partition") and partition not in names:
        raise ConfigError(f"SLURM partition {partition!r} does not exist here; partitions: {', '.join(sorted(names)) or 'none'} "
                          "(hydra.launcher.partition=<one of them>)")
    wants_gpu = str(accelerator or "").lower() in ("cuda", "gpu")
    gpus = params.get("gpus_per_node") or 0
    if wants_gpu and not gpus:
        raise ConfigError("device=cuda on SLURM needs a GPU per job: add hydra.launcher.gpus_per_node=1 "
                          "(and a partition with GPUs), or use device=cpu")
    if wants_gpu and partition in names and "gpu" not in names[partition]:
        raise ConfigError(f"device=cuda, but SLURM partition {partition!r} has no GPUs (Gres {names[partition]}): "
                          "choose a GPU partition with hydra.launcher.partition=..., or use device=cpu")


def slurm_rank() -> int | None:
    """This process's rank among the tasks SLURM started for one job (srun with several tasks), else None."""
    import os

    tasks = os.environ.get("SLURM_NTASKS") or os.environ.get("SLURM_NPROCS") or "1"
    if not tasks.isdigit() or int(tasks) < 2 or not (os.environ.get("SLURM_PROCID") or "").isdigit():
        return None
    return int(os.environ["SLURM_PROCID"])

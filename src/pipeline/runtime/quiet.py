"""Warnings an ordinary run would print although nothing is wrong, silenced here, each with why it is harmless.

`install()` is called by the CLI (`python -m pipeline`) and by the process that trains a sweep's job.
Only exact messages are filtered: any other warning still reaches the user.
"""

from __future__ import annotations

import warnings

HARMLESS = (
    # task=gan scores samples in its own epoch-end hooks; the datamodule's val split serves other tasks
    # (supervised validation), so Lightning skipping a val loop the GAN never defines loses nothing.
    r"You passed in a `val_dataloader` but have no `validation_step`\. Skipping val loop\.",
    # A debug run (trainer=debug: 3 batches) or a tiny data set logs fewer batches than log_every_n_steps:
    # the pipeline writes its own curves (metrics.csv) at its own pace.
    r"The number of training batches \(\d+\) is smaller than the logging interval",
    # On a SLURM login node (srun on PATH) and in SLURM jobs: the Trainer is given LightningEnvironment
    # (runtime.run.make_trainer: one process, one device; the project's SIGUSR2 handler owns requeue), but
    # Lightning still probes SLURMEnvironment.detect() when it picks a checkpoint path, and that warns.
    r"The `srun` command is available on your system but is not used",
)


def install() -> None:
    for message in HARMLESS:
        warnings.filterwarnings("ignore", message=message)

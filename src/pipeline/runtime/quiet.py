"""Warnings an ordinary run would print although nothing is wrong, silenced here, each with why it is harmless.

`quiet_failing_log_handlers()` turns a log file that cannot be written into one line instead of a traceback
per log line. `install()` is called by the CLI (`python -m pipeline`) and by the process that trains a sweep's job.
Only exact messages are filtered: any other warning still reaches the user.
"""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

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
    # trainer=ddp: the supervised task's val/test loaders hold one item and every rank scores the whole split, so
    # no sample is counted twice (test/acc equals one process's: tests/test_ddp.py).
    r"Using `DistributedSampler` with the dataloaders\. During `trainer\.test\(\)`",
)


# Lightning's INFO lines that say nothing the run's own lines do not, printed twice (Lightning's handler and the
# run's) and once per process: "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2" (4 lines for a 2-process
# run), "[rank: 0] Received SIGTERM: 15" (2 lines before the run's own line on the stop). Their warnings still show.
CHATTY_LOGGERS = ("lightning.fabric.utilities.distributed", "lightning.pytorch.trainer.connectors.signal_connector")


def install() -> None:
    for message in HARMLESS:
        warnings.filterwarnings("ignore", message=message)
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def quiet_failing_log_handlers() -> None:
    """A log handler whose writes fail (run.log on a full disk; the terminal after SIGHUP) says so once, in one
    line naming the file and the disk, and is dropped: logging's default printed a "--- Logging error ---"
    traceback for every line the run logged after (2,329 lines, 73 tracebacks, on a disk that filled up)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.StreamHandler) and not getattr(handler, "_fails_once", False):
            handler._fails_once = True
            handler.handleError = _drop_on_error(root, handler)


def _drop_on_error(root: logging.Logger, handler: logging.StreamHandler):
    def handle_error(record: logging.LogRecord) -> None:
        exc = sys.exc_info()[1]
        root.removeHandler(handler)
        if isinstance(handler, logging.FileHandler):
            from pipeline.store.atomic import write_error
            from pipeline.store.layout import RESULT

            cause = str(write_error(Path(handler.baseFilename), exc)) if isinstance(exc, OSError) else repr(exc)
            try:
                sys.stderr.write(f"{cause}; no more lines go to it, the run goes on (its {RESULT} says how it stands)\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
        try:
            handler.close()
        except (OSError, ValueError):
            pass

    return handle_error

"""runtime/quiet.py: the exact harmless warnings are silenced, anything else still reaches the user."""

from __future__ import annotations

import warnings

import pytest

from pipeline.runtime import quiet

HARMLESS = [
    "You passed in a `val_dataloader` but have no `validation_step`. Skipping val loop.",
    "The number of training batches (3) is smaller than the logging interval Trainer(log_every_n_steps=50). "
    "Set a lower value for log_every_n_steps if you want to see logs for the training epoch.",
    "The `srun` command is available on your system but is not used. HINT: If your intention is to run Lightning "
    "on SLURM, prepend your python command with `srun` like so: srun python train.py",
    "Using `DistributedSampler` with the dataloaders. During `trainer.test()`, it is recommended to use "
    "`Trainer(devices=1, num_nodes=1)` to ensure each sample/batch gets evaluated exactly once.",
]
STILL_SHOWN = [
    "You passed in a `val_dataloader` but have no `validation_step`!",
    "The number of training batches (three) is smaller than the logging interval",
    "The `sbatch` command is available on your system but is not used",
    "Using `DistributedSampler` with the dataloaders during training",
    "Something else went wrong",
]


def shown_after_install(messages: list[str], category: type[Warning] = UserWarning) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet.install()
        for message in messages:
            warnings.warn(message, category, stacklevel=1)
    return [str(w.message) for w in caught]


@pytest.mark.parametrize("message", HARMLESS)
def test_each_harmless_warning_is_silenced(message):
    assert shown_after_install([message]) == []
    assert shown_after_install([message], category=RuntimeWarning) == []


def test_other_warnings_still_reach_the_user():
    assert shown_after_install(HARMLESS + STILL_SHOWN) == STILL_SHOWN


def test_install_leaves_one_filter_per_harmless_message_and_nothing_else():
    with warnings.catch_warnings():
        warnings.resetwarnings()
        quiet.install()
        filters = list(warnings.filters)
    assert len(filters) == 4
    assert all(f[0] == "ignore" for f in filters)


def test_a_run_from_python_is_quiet_on_a_machine_with_slurms_tools(make_cfg, tmp_path, monkeypatch):
    """runtime.run.run (notebooks, benchmarks, tests) silences the same warnings the CLI does: with an `srun` on
    PATH Lightning warned that it is "available on your system but is not used"."""
    from pipeline.runtime.run import run

    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "srun").write_text("#!/bin/sh\nexit 0\n")
    (tools / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{__import__('os').environ['PATH']}")
    cfg = make_cfg("experiment=supervised_digits", "trainer=debug", "device=cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (record,) = run(cfg, tmp_path / "run")
    assert record["status"] == "ok", record["error"]
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "srun" in m], messages
    # The check can fail: without quiet's filters Lightning's SLURM probe does warn here.
    from lightning.fabric.plugins.environments import SLURMEnvironment

    with warnings.catch_warnings(record=True) as probe:
        warnings.simplefilter("always")
        SLURMEnvironment._validate_srun_used()
    assert any("srun" in str(w.message) for w in probe)


@pytest.mark.parametrize(("logger", "message"), [
    ("lightning.fabric.utilities.distributed", "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2"),
    ("lightning.pytorch.trainer.connectors.signal_connector", "[rank: 0] Received SIGTERM: 15"),
])
def test_lightnings_repeated_info_lines_are_dropped_and_its_warnings_kept(caplog, logger, message):
    """A 2-process run printed "Initializing distributed" 4 times; a stopped run "[rank: 0] Received SIGTERM" twice
    before its own line. After install() those INFO lines are gone; a warning from the same logger still shows."""
    import logging

    quiet.install()
    with caplog.at_level(logging.DEBUG):  # the root's level: what reaches the run's handlers is the logger's own
        logging.getLogger(logger).info(message)
        logging.getLogger(logger).warning("something is wrong")
    assert [r.getMessage() for r in caplog.records] == ["something is wrong"]

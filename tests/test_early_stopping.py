"""Early stopping from config (callbacks=early_stopping): the record says when and why, the monitor names a real metric."""

import pandas as pd
import pytest

from pipeline.config.checks import ConfigError
from pipeline.runtime.run import run
from pipeline_testing import read_result, run_cli

# Three batches an epoch: an epoch ends at global step 3 * (epoch + 1).
SHORT = ("experiment=supervised_digits", "trainer.limit_train_batches=3", "trainer.enable_progress_bar=false")
# min_delta 1.0 of accuracy is never met: the first validation sets the best (from -inf), the second is no
# improvement, and patience 0 stops there, at epoch 1.
NEVER_IMPROVES = ("callbacks=early_stopping", "callbacks.early_stopping.patience=0", "callbacks.early_stopping.min_delta=1.0")


def test_a_stop_by_early_stopping_says_when_and_why(make_cfg, tmp_path):
    records = run(make_cfg(*SHORT, *NEVER_IMPROVES, "trainer.max_epochs=6", "seeds_per_process=2"), tmp_path)
    assert [r["status"] for r in records] == ["ok", "ok"], [r["error"] for r in records]
    stop = records[0]["early_stop"]
    assert stop is not None and records[1]["early_stop"] == stop  # the members stop together
    assert (stop["epoch"], stop["step"]) == (1, 6)
    assert (stop["by"], stop["rule"], stop["monitor"], stop["mode"]) == ("EarlyStopping", "patience_exhausted", "val/acc", "max")
    assert (stop["patience"], stop["wait_count"], stop["min_delta"]) == (0, 1, 1.0)
    assert "val/acc" in stop["reason"] and "patience 0" in stop["reason"]
    curves = [pd.read_csv(d / "metrics.csv") for d in (tmp_path / "seed0", tmp_path / "seed1")]
    for curve in curves:  # the curve ends at the stop, far from the 6 epochs allowed
        assert curve.dropna(subset=["val/acc"])["step"].tolist() == [0, 1]
    # The best is epoch 0's validation accuracy, the members' mean (what the callback monitors).
    first = [c.loc[c["step"] == 0, "val/acc"].item() for c in curves]
    assert stop["best"] == pytest.approx(sum(first) / 2, rel=1e-6)
    assert read_result(tmp_path / "seed0")["early_stop"] == stop


@pytest.mark.parametrize(
    "overrides",
    [
        # val/loss (mode min) is a metric the task logs; patience 100 never runs out in 3 epochs.
        ("callbacks=early_stopping", "callbacks.early_stopping.monitor=val/loss", "callbacks.early_stopping.mode=min",
         "callbacks.early_stopping.patience=100", "trainer.max_epochs=3"),
        # Patience runs out at the last epoch the budget allows: the budget ended the run, not early stopping.
        (*NEVER_IMPROVES, "trainer.max_epochs=2"),
        ("trainer.max_epochs=2",),
    ],
    ids=["not-triggered", "at-the-budget", "no-callback"],
)
def test_a_run_not_stopped_early_records_null(make_cfg, tmp_path, overrides):
    (record,) = run(make_cfg(*SHORT, *overrides), tmp_path)
    assert record["status"] == "ok", record["error"]
    assert record["early_stop"] is None
    epochs = int(overrides[-1].split("=")[1])
    assert pd.read_csv(tmp_path / "metrics.csv").dropna(subset=["val/acc"])["step"].tolist() == list(range(epochs))


def test_a_typod_monitor_is_one_line_before_any_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli("experiment=supervised_digits", "callbacks=early_stopping", "callbacks.early_stopping.monitor=val_acc",
                   f"hydra.run.dir={run_dir}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: callbacks.early_stopping.monitor=val_acc:")
    assert "val/acc, val/loss, train/loss" in line and "did you mean callbacks.early_stopping.monitor=val/acc?" in line
    assert not run_dir.exists()  # nothing trained, nothing written


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (("experiment=supervised_digits", "callbacks=early_stopping", "callbacks.early_stopping.monitor=val/acc_typo"),
         "callbacks.early_stopping.monitor=val/acc_typo: SupervisedTask logs no metric 'val/acc_typo'"),
        (("experiment=supervised_digits", "callbacks=model_checkpoint", "callbacks.model_checkpoint.monitor=val_loss"),
         "did you mean callbacks.model_checkpoint.monitor=val/loss?"),
        (("experiment=gan_digits", "callbacks=[default,early_stopping]"),
         "GANTask logs no metric a callback can monitor; drop the callback with ~callbacks.early_stopping"),
        (("experiment=cem_cartpole", "callbacks=model_checkpoint", "callbacks.model_checkpoint.monitor=batch_return"),
         "task.stop_at_return); keep the latest checkpoint with callbacks.model_checkpoint.monitor=null"),
    ],
    ids=["supervised-typo", "checkpoint-typo", "gan", "cem"],
)
def test_a_monitor_the_task_does_not_log_is_refused_before_any_record(make_cfg, tmp_path, overrides, expected):
    """Sweep jobs and run() check in the job: a ConfigError before the task is built or a record written."""
    with pytest.raises(ConfigError) as err:
        run(make_cfg(*overrides, "trainer.max_epochs=1"), tmp_path)
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert list(tmp_path.iterdir()) == []

"""runtime/loggers.py piece by piece, without a run: W&B stood in for by recording objects (tests/test_loggers.py
starts real offline runs), TensorBoard and CSV loggers real, in tmp dirs."""

from __future__ import annotations

import math
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import wandb
import yaml
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from pipeline.runtime import loggers as lg
from pipeline.store.curves import CurveLog


@pytest.fixture(autouse=True)
def no_sweep(monkeypatch):
    monkeypatch.delenv("PIPELINE_SWEEP_UID", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)


def test_wandb_mode_is_the_config_then_the_environment_then_offline(monkeypatch):
    assert lg.wandb_mode(None) == "offline" and lg.wandb_mode("") == "offline"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert lg.wandb_mode(None) == "disabled" and lg.wandb_mode("online") == "online"
    monkeypatch.setenv("WANDB_MODE", "")
    assert lg.wandb_mode(None) == "offline"


def test_tags_and_config_carry_the_sweep_only_in_a_sweep(monkeypatch):
    assert lg.wandb_tags(3, None) == ["seed=3"]
    assert lg.wandb_tags(3, ["a", 7]) == ["seed=3", "a", "7"]
    config = {"lr": 0.1}
    assert lg.wandb_config(config) == {"lr": 0.1} and lg.wandb_config(config) is not config
    monkeypatch.setenv("PIPELINE_SWEEP_UID", "s1")
    assert lg.wandb_tags(0, ["x"]) == ["seed=0", "sweep=s1", "x"]
    assert lg.wandb_config(config) == {"lr": 0.1, "sweep_id": "s1"} and config == {"lr": 0.1}


def build(spec, run_dir, **kw):
    return lg.build_loggers(spec, run_dir, run_name="exp-seed0", group="g", job_type="supervised", seed=0,
                            config={"lr": 0.1}, **kw)


def test_csv_logger_always_first_writing_into_the_run_dir(tmp_path):
    for spec in (None, {}, {"csv": None}):
        (csv,) = build(spec, tmp_path)
        assert isinstance(csv, CSVLogger) and Path(csv.log_dir) == tmp_path
    with pytest.raises(ValueError, match=r"^unknown logger 'mlflow'; choose from csv, tensorboard, wandb \(e\.g\. "
                                         r"logger=\[csv,wandb\]\)$"):
        build({"mlflow": {}, "zzz": {}, "csv": None}, tmp_path)


def test_tensorboard_logger_without_a_placeholder_metric(tmp_path):
    csv, tb = build({"tensorboard": None}, tmp_path)
    assert isinstance(tb, TensorBoardLogger) and Path(tb.log_dir) == tmp_path / "tensorboard"
    assert not tb._log_graph and tb._default_hp_metric is False
    _, tb = build({"tensorboard": {"log_graph": True}}, tmp_path)
    assert tb._log_graph


class StandInWandbLogger:
    """Lightning's WandbLogger as build_loggers uses it: keyword arguments kept as wandb.init's, `experiment` starts."""

    built: list = []

    def __init__(self, **kwargs):
        self._wandb_init = {"anonymous": None, **kwargs}
        self.started = False
        StandInWandbLogger.built.append(self)

    @property
    def experiment(self):
        self.started = True
        return self


def test_a_wandb_run_is_started_at_once_with_the_runs_names(tmp_path, monkeypatch):
    import lightning.pytorch.loggers

    monkeypatch.setattr(lightning.pytorch.loggers, "WandbLogger", StandInWandbLogger)
    monkeypatch.setenv("PIPELINE_SWEEP_UID", "sw")
    monkeypatch.delenv("WANDB_SILENT", raising=False)
    csv, run = build({"wandb": {"project": "p", "entity": "e", "tags": ["t"], "init_timeout": 7}}, tmp_path)
    init = run._wandb_init
    assert isinstance(csv, CSVLogger) and run.started and "anonymous" not in init
    assert (init["project"], init["entity"], init["name"], init["group"], init["job_type"]) == (
        "p", "e", "exp-seed0", "g", "supervised")
    assert init["tags"] == ["seed=0", "sweep=sw", "t"] and init["mode"] == "offline"
    assert init["config"] == {"lr": 0.1, "sweep_id": "sw"} and init["save_dir"] == str(tmp_path)
    assert init["settings"].init_timeout == 7 and os.environ["WANDB_SILENT"] == "true"
    monkeypatch.setenv("WANDB_SILENT", "false")  # the user's choice stays
    _, run = build({"wandb": {"mode": "disabled"}}, tmp_path)
    assert os.environ["WANDB_SILENT"] == "false" and run._wandb_init["mode"] == "disabled"
    _, _, run = build({"wandb": None, "tensorboard": None}, tmp_path)
    assert run._wandb_init["project"] == "pipeline" and run._wandb_init["entity"] is None
    assert run._wandb_init["settings"].init_timeout == 20


def test_a_wandb_run_that_cannot_start_is_one_line(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("no route to host\nmore detail")

    monkeypatch.setattr(wandb, "init", refuse)
    with pytest.raises(lg.WandbUnreachable) as err:
        build({"wandb": {"mode": "online", "init_timeout": 4}}, tmp_path)
    assert str(err.value).startswith("W&B could not start an online run (no route to host): no network? use "
                                     "WANDB_MODE=offline") and "(now 4 s)" in str(err.value)
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_explain_wandb_failure_by_mode():
    assert lg.explain_wandb_failure(ValueError("bad key\nline 2"), "offline", None) == "W&B (offline) could not start: bad key"
    assert lg.explain_wandb_failure(ValueError(""), None, None) == "W&B (None) could not start: ValueError"
    online = lg.explain_wandb_failure(OSError("  timed out  "), "online", None)
    assert online == ("W&B could not start an online run (timed out): no network? use WANDB_MODE=offline (or "
                      "logger.wandb.mode=offline) and `wandb sync` the run later; on a slow network raise "
                      "logger.wandb.init_timeout (now 20 s)")
    assert lg.explain_wandb_failure(OSError("x"), "online", 0).endswith("(now 0 s)")


def test_wandb_settings():
    settings = lg._wandb_settings()
    assert settings.init_timeout == 20 and settings.silent is True and settings.console == "off"
    assert lg._wandb_settings("2.5").init_timeout == 2.5


class Finalizing:
    def __init__(self, fail=False):
        self.statuses, self.fail = [], fail

    def finalize(self, status):
        self.statuses.append(status)
        if self.fail:
            raise OSError("disk full")


class WandbLogger(Finalizing):  # matched by class name
    def __init__(self):
        super().__init__()
        self.experiment = self
        self.exit_codes = []

    def finish(self, exit_code):
        self.exit_codes.append(exit_code)


@pytest.mark.parametrize(("status", "said", "code"), [("ok", "success", 0), ("failed", "failed", 1),
                                                      ("interrupted", "failed", 1)])
def test_finish_loggers_flushes_every_one_and_ends_each_wandb_run_with_the_runs_outcome(status, said, code):
    loggers = [Finalizing(fail=True), Finalizing(), WandbLogger(), WandbLogger()]
    lg.finish_loggers(loggers, status)
    assert [lo.statuses for lo in loggers] == [[said]] * 4
    assert [lo.exit_codes for lo in loggers[2:]] == [[code], [code]]  # every seed's run, not only wandb.run


def test_record_summary_is_the_final_metrics_and_the_records_own_numbers():
    record = {"metrics": {"test/acc": 0.9, "test/loss": None}, "status": "ok", "time_to_threshold_s": None,
              "env_steps": 10, "wall_time_s": 3.5, "seed": 1}
    assert lg.record_summary(record) == {"test/acc": 0.9, "status": "ok", "time_to_threshold_s": None, "env_steps": 10,
                                         "wall_time_s": 3.5}
    assert lg.record_summary({"metrics": None}) == dict.fromkeys(lg.RECORD_SUMMARY_KEYS)
    assert lg.record_summary({}) == {"status": None, "time_to_threshold_s": None, "env_steps": None, "wall_time_s": None}


class Summary(dict):
    def update(self, values):
        super().update(values)


class StandInRun:
    def __init__(self, summary=None):
        self.id, self.summary, self.logged, self.artifacts, self.finished = "r1", Summary(summary or {}), [], [], 0

    def log(self, values, step, commit):
        self.logged.append((values, step, commit))

    def log_artifact(self, artifact):
        self.artifacts.append(artifact)

    def finish(self):
        self.finished += 1


RECORD = {"experiment": "exp", "seed": 4, "status": "ok", "metrics": {"test/acc": 0.75}, "env_steps": 5,
          "time_to_threshold_s": None, "wall_time_s": 2.0}


def test_publish_to_wandb_makes_the_summary_the_records_and_uploads_the_model(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_SWEEP_UID", "sw")
    run = StandInRun({"test/acc": 0.1, "_runtime": 3.0, "train/loss": 0.5, "note": "kept", "flag": True})
    lg.publish_to_wandb(run, RECORD, tmp_path)
    assert dict(run.summary) == {"_runtime": 3.0, "note": "kept", "test/acc": 0.75, "status": "ok", "env_steps": 5,
                                 "time_to_threshold_s": None, "wall_time_s": 2.0}
    assert run.artifacts == []  # no model.pt
    (tmp_path / "model.pt").write_bytes(b"weights")
    lg.publish_to_wandb(run, RECORD, tmp_path)
    (artifact,) = run.artifacts
    assert artifact.name == "model-r1" and artifact.type == "model"
    assert artifact.metadata == {"experiment": "exp", "seed": 4, "status": "ok", "sweep_id": "sw",
                                 "metrics": lg.record_summary(RECORD)}
    assert list(artifact.manifest.entries) == ["model.pt"]


def test_hparam_values_are_numbers_strings_booleans_or_text():
    assert [lg._hparam_value(v) for v in (1, 0.5, "a", True)] == [1, 0.5, "a", True]
    assert lg._hparam_value(None) == "None" and lg._hparam_value([1, 2]) == "[1, 2]"


class StandInTensorBoard(TensorBoardLogger):
    def __init__(self, log_dir):
        super().__init__(save_dir=str(log_dir), name="", version="")
        self.hparams_logged, self.flushed = [], 0

    def log_hyperparams(self, params, metrics=None, step=None):
        self.hparams_logged.append((params, metrics, step))

    @property
    def experiment(self):
        return SimpleNamespace(flush=lambda: setattr(self, "flushed", self.flushed + 1))


def test_publish_to_tensorboard_writes_the_config_against_the_final_metrics(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_SWEEP_UID", "sw")
    tb = StandInTensorBoard(tmp_path)
    record = {**RECORD, "config": {"task": {"lr": 0.1, "hidden": [4, 4]}, "trainer": {"enable_progress_bar": True}},
              "metrics": {"test/acc": 0.75, "test/n": 3, "test/flag": True}}
    lg.publish_to_tensorboard(tb, record)
    ((params, metrics, step),) = tb.hparams_logged
    assert params == {"experiment": "exp", "seed": 4, "status": "ok", "sweep_id": "sw", "task.hidden": "[4, 4]",
                      "task.lr": 0.1}
    assert metrics == {"final/test/acc": 0.75, "final/test/n": 3.0, "final/env_steps": 5.0, "final/wall_time_s": 2.0}
    assert all(type(v) is float for v in metrics.values()) and step == 0 and tb.flushed == 1
    assert yaml.safe_load((tmp_path / "hparams.yaml").read_text()) == params
    monkeypatch.delenv("PIPELINE_SWEEP_UID")
    (tmp_path / "b").mkdir()
    tb = StandInTensorBoard(tmp_path / "b")
    lg.publish_to_tensorboard(tb, {"status": "failed"})
    assert tb.hparams_logged == [({"experiment": "None", "seed": "None", "status": "failed"}, None, 0)]


def test_publish_record_goes_to_tensorboard_and_wandb_only(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(lg, "publish_to_tensorboard", lambda logger, record: seen.append(("tb", logger, record)))
    monkeypatch.setattr(lg, "publish_to_wandb", lambda run, record, run_dir: seen.append(("wandb", run, record, run_dir)))
    tb, run = StandInTensorBoard(tmp_path), StandInRun()
    wandb_logger = type("WandbLogger", (), {"experiment": run})()
    lg.publish_record([CSVLogger(tmp_path), tb, wandb_logger, SimpleNamespace(experiment=run)], RECORD, tmp_path)
    assert seen == [("tb", tb, RECORD), ("wandb", run, RECORD, tmp_path)]


def test_curve_logger_writes_lightnings_logs_into_the_curve(tmp_path):
    curve = CurveLog(tmp_path / "metrics.csv", flush_every_s=math.inf)
    logger = lg.CurveLogger(curve)
    assert (logger.name, logger.version, logger.experiment) == ("curves", "", curve)
    logger.log_hyperparams({"lr": 0.1})
    logger.log_metrics({"loss": torch.tensor(0.5), "n": 3, "tag": "x", "epoch": 1.0}, step=4)
    logger.log_metrics({"loss": 0.25}, step=None)
    assert curve.rows == {4: {"loss": 0.5, "n": 3.0, "epoch": 1.0}, 0: {"loss": 0.25}}
    assert not (tmp_path / "metrics.csv").exists()
    logger.save()
    assert (tmp_path / "metrics.csv").read_text().splitlines() == ["step,loss,n,epoch", "0,0.25,,", "4,0.5,3.0,1.0"]
    logger.log_metrics({"loss": 0.125}, step=5)
    logger.finalize("success")
    assert (tmp_path / "metrics.csv").read_text().splitlines()[-1] == "5,0.125,,"

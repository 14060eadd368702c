"""csv, tensorboard and wandb (offline) loggers from the `logger` group, read back from the files they write."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pandas as pd
import pytest
import torch
import wandb
import yaml

from pipeline.runtime.loggers import build_loggers, finish_loggers, publish_record, replay_unlogged_curve
from pipeline.runtime.run import run
from pipeline_testing import read_result

SWEEP = "abc123"


def wandb_records(run_dir: Path):
    """The protobuf records of the offline run under ``run_dir/wandb`` (LevelDB log format, 32 KiB blocks)."""
    from wandb.proto import wandb_internal_pb2 as pb

    wandb.teardown()  # the service writes the log's last records on teardown
    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data, pos, pending = path.read_bytes(), 7, b""  # 7: the ":W&B" header and version
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a chunk header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (2, 3):  # first or middle piece of a record split across blocks
            pending = (pending if kind == 3 else b"") + chunk
            continue
        if kind not in (1, 4):
            break
        record = pb.Record()
        record.ParseFromString(pending + chunk if kind == 4 else chunk)
        pending = b""
        yield record


def final_summary(records) -> dict:
    summary = {}
    for record in records:
        if record.WhichOneof("record_type") == "summary":
            for item in record.summary.update:
                summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
            for item in record.summary.remove:
                summary.pop(item.key or "/".join(item.nested_key), None)
    return {k: v for k, v in summary.items() if not k.startswith("_")}


def test_many_loggers_offline(make_cfg, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = make_cfg("experiment=supervised_digits", "trainer=debug", "logger=many", "seed=5")
    run(cfg, tmp_path)
    record = read_result(tmp_path)  # the run record on disk, what reports and users read
    assert record["status"] == "ok", record["error"]
    curve = pd.read_csv(tmp_path / "metrics.csv")[record["primary_curve"]].dropna()
    assert len(curve) >= 1 and curve.between(0, 1).all()  # an accuracy curve, not just a file
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    assert record["primary_curve"] in events.Tags()["scalars"]
    records = list(wandb_records(tmp_path))
    (run_record,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    # Group = experiment, tagged with the seed, named after it; the config is resolved, not interpolations.
    assert "supervised_digits" in run_record.run_group and "seed=5" in run_record.tags
    assert run_record.display_name == "supervised_digits-seed5"
    config = {item.key: json.loads(item.value_json) for item in run_record.config.update}
    assert config["scheduler"]["T_max"] == cfg.trainer.max_epochs and config["seed"] == 5
    assert wandb.run is None  # finished, so the next run in this process starts clean


def _record(config: dict) -> dict:
    return {"experiment": "dqn_cartpole", "seed": 1, "status": "ok", "metrics": {"eval/return_mean": 122.7, "eval/return_std": 3.0},
            "time_to_threshold_s": None, "env_steps": 20000, "wall_time_s": 12.5, "config": config}


CONFIG = {"name": "dqn_cartpole", "seed": 1, "optimizer": {"lr": 0.0023}, "model": {"hidden": [128, 128]},
          "logger": {"wandb": {"project": "p"}}}
EXPECTED_SUMMARY = {"eval/return_mean": 122.7, "eval/return_std": 3.0, "status": "ok", "time_to_threshold_s": None,
                    "env_steps": 20000, "wall_time_s": 12.5}


def test_publish_record_makes_wandb_and_tensorboard_say_what_result_json_says(tmp_path, monkeypatch, capfd):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("PIPELINE_SWEEP_UID", SWEEP)
    # wandb prints a warning once per process; forget earlier runs so this one would show it.
    monkeypatch.setattr(wandb.errors.term, "_printed_messages", set())
    loggers = build_loggers({"tensorboard": {}, "wandb": {}}, tmp_path, run_name="dqn_cartpole-seed1",
                            group="dqn_cartpole 1a2b3c4d", job_type="DQNTask", seed=1, config=CONFIG)
    for logger in loggers[1:]:
        # The last logged evaluation differs from the final one: the summary must hold the final one.
        logger.log_metrics({"eval/return_mean": 130.2, "train/loss": 0.5}, step=10)
    torch.save({"w": torch.zeros(2)}, tmp_path / "model.pt")
    record = _record(CONFIG)
    publish_record(loggers, record, tmp_path)
    finish_loggers(loggers, "ok")

    records = list(wandb_records(tmp_path))
    assert "anonymous" not in capfd.readouterr().err  # wandb's warning about a setting Lightning always passed
    assert final_summary(records) == EXPECTED_SUMMARY
    (run_record,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert f"sweep={SWEEP}" in run_record.tags and run_record.run_group == "dqn_cartpole 1a2b3c4d"
    assert json.loads({i.key: i.value_json for i in run_record.config.update}["sweep_id"]) == SWEEP
    (artifact,) = [r.artifact for r in records if r.WhichOneof("record_type") == "artifact"]
    assert artifact.type == "model" and [entry.path for entry in artifact.manifest.contents] == ["model.pt"]

    events = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    assert events.Scalars("final/eval/return_mean")[0].value == pytest.approx(122.7)
    assert [e.value for e in events.Scalars("eval/return_mean")] == [pytest.approx(130.2)]  # the curve is untouched
    content = events.PluginTagToContent("hparams")
    session = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert session.hparams["optimizer.lr"].number_value == pytest.approx(0.0023)
    assert session.hparams["model.hidden"].string_value == "[128, 128]"
    assert session.hparams["sweep_id"].string_value == SWEEP
    assert "logger.wandb.project" not in session.hparams  # where numbers go is not a hyperparameter
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert {m.name.tag for m in experiment.metric_infos} >= {"final/eval/return_mean", "final/env_steps"}
    on_disk = yaml.safe_load((tmp_path / "tensorboard" / "hparams.yaml").read_text())
    assert on_disk["optimizer.lr"] == 0.0023 and on_disk["experiment"] == "dqn_cartpole"


def test_a_seeds_live_run_that_got_nothing_gets_its_metrics_csv_once(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("PIPELINE_SWEEP_UID", raising=False)
    dirs = []
    for seed in (1, 2):  # seed 1's task logged nothing live, seed 2's did
        d = tmp_path / f"seed{seed}"
        d.mkdir()
        (d / "metrics.csv").write_text("step,eval/return_mean\n0,10.0\n2500,130.2\n")
        torch.save({"w": torch.zeros(2)}, d / "model.pt")
        loggers = build_loggers({"wandb": {"project": "p"}}, d, run_name=f"dqn_cartpole-seed{seed}", group="g",
                                job_type="DQNTask", seed=seed, config={**CONFIG, "seed": seed})[1:]
        if seed == 2:
            loggers[0].log_metrics({"eval/return_mean": 5.0}, step=7)
        replay_unlogged_curve(loggers, d)
        publish_record(loggers, {**_record(CONFIG), "seed": seed}, d)
        finish_loggers(loggers, "ok")
        dirs.append(d)
    for d, expected in zip(dirs, ([(0, 10.0), (2500, 130.2)], [(7, 5.0)])):
        found = list(wandb_records(d))
        assert final_summary(found) == EXPECTED_SUMMARY
        rows = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
                for r in found if r.WhichOneof("record_type") == "history"]
        # Replayed only where nothing was logged live, on the live runs' x axis (trainer/global_step = the row's step).
        assert [(r["trainer/global_step"], r["eval/return_mean"]) for r in rows] == expected
        (run_record,) = [r.run for r in found if r.WhichOneof("record_type") == "run"]
        assert not any(t.startswith("sweep=") for t in run_record.tags)  # not in a sweep: no sweep tag
        assert [r.artifact.type for r in found if r.WhichOneof("record_type") == "artifact"] == ["model"]


def test_an_unreachable_wandb_server_is_one_line_naming_offline_mode(tmp_path, monkeypatch):
    """Online W&B with no server to talk to (a closed local port stands in for a missing network): the run is
    refused within its init timeout in one line that names WANDB_MODE=offline, before any training."""
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # the discard port: nothing listens there
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    with pytest.raises(RuntimeError) as caught:
        build_loggers({"wandb": {"project": "p", "init_timeout": 3}}, tmp_path, run_name="r", group="g",
                      job_type="DQNTask", seed=0, config={})
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and "no network? use WANDB_MODE=offline" in message
    assert "init_timeout (now 3 s)" in message  # how long it waited, and the knob for a slow network
    assert wandb.run is None

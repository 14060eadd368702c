"""seeds_per_process > 1: each seed gets its own TensorBoard and W&B (offline) run in <run dir>/seed<n>/, written while
the batch trains, holding what that seed's metrics.csv holds and its training videos."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from hydra import compose, initialize_config_module
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from pipeline.runtime.run import run
from pipeline_testing import read_result
from test_loggers import final_summary, wandb_records

SEEDS = (3, 4)


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """One K = 2 PPO batch with every logger and a training video at each evaluation, shared by the tests below
    (a few seconds of training)."""
    run_dir = tmp_path_factory.mktemp("batch")
    with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "experiment=ppo_cartpole", "trainer=debug", "seeds_per_process=2", f"seed={SEEDS[0]}", "logger=many",
            "logger.wandb.mode=offline", "task.video_every=1"])
    records = run(cfg, run_dir)
    assert [r["status"] for r in records] == ["ok", "ok"], [r["error"] for r in records]
    return run_dir


def _scalars(event_dir) -> dict[str, dict[int, float]]:
    events = EventAccumulator(str(event_dir), size_guidance={"scalars": 0}).Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def _csv_rows(seed_dir) -> dict[str, dict[int, float]]:
    frame = pd.read_csv(seed_dir / "metrics.csv")
    return {col: {int(s): float(v) for s, v in zip(frame["step"], frame[col]) if not math.isnan(v)}
            for col in frame.columns if col != "step"}


def test_each_seed_of_a_batch_has_its_own_tensorboard_run_equal_to_its_metrics_csv(batch):
    tmp_path = batch
    assert not (tmp_path / "tensorboard").exists()  # no batch-wide run that mixes the seeds
    curves = {}
    for seed in SEEDS:
        seed_dir = tmp_path / f"seed{seed}"
        assert read_result(seed_dir)["seed"] == seed
        tb, csv = _scalars(seed_dir / "tensorboard"), _csv_rows(seed_dir)
        shared = sorted(set(tb) & set(csv))
        # The curves a K = 1 run shows: training return, evaluations, the algorithm's losses, on the env-step axis.
        assert "eval/return_mean" in shared and "train/episodic_return" in shared and len(shared) >= 5, shared
        for tag in shared:
            assert tb[tag].keys() == csv[tag].keys(), tag
            for step, value in csv[tag].items():  # TensorBoard stores float32
                assert math.isclose(tb[tag][step], value, rel_tol=1e-6, abs_tol=1e-6), (tag, step)
        assert tb["env_step"] == {s: float(s) for s in tb["env_step"]}  # x axis = the seed's env steps
        # The HParams tab holds the seed's own final record, as for a K = 1 run.
        (final,) = tb["final/eval/return_mean"].values()
        assert math.isclose(final, read_result(seed_dir)["metrics"]["eval/return_mean"], rel_tol=1e-6)
        curves[seed] = csv
    # The two seeds are two runs, not one curve written twice.
    assert curves[3]["train/episodic_return"] != curves[4]["train/episodic_return"]


def test_each_seed_of_a_batch_has_its_own_wandb_run_logged_live_like_a_single_seed_run(batch):
    for seed in SEEDS:
        seed_dir = batch / f"seed{seed}"
        found = list(wandb_records(seed_dir))  # exactly one offline run per seed: none replayed a second time
        (run_record,) = [r.run for r in found if r.WhichOneof("record_type") == "run"]
        assert run_record.display_name == f"ppo_cartpole-seed{seed}" and f"seed={seed}" in run_record.tags
        assert {i.key: json.loads(i.value_json) for i in run_record.config.update}["seed"] == seed
        history: dict[str, dict[int, float]] = {}
        for r in found:
            if r.WhichOneof("record_type") == "history":
                row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
                for key, value in row.items():
                    if not key.startswith("_") and key != "trainer/global_step":
                        history.setdefault(key, {})[int(row["trainer/global_step"])] = value
        csv = _csv_rows(seed_dir)
        shared = sorted(set(history) & set(csv))
        assert "eval/return_mean" in shared and "train/episodic_return" in shared and len(shared) >= 5, shared
        for tag in shared:
            assert history[tag].keys() == csv[tag].keys(), tag
            for step, value in csv[tag].items():
                assert math.isclose(history[tag][step], value, rel_tol=1e-9, abs_tol=1e-9), (tag, step)
        assert history["env_step"] == {s: s for s in history["env_step"]}  # the same env-step x axis as K = 1
        summary = final_summary(found)  # the seed's own record, as publish_record gives a K = 1 run
        result = read_result(seed_dir)
        assert summary["status"] == "ok" and summary["env_steps"] == result["env_steps"]
        assert summary["eval/return_mean"] == result["metrics"]["eval/return_mean"]


def test_each_seed_of_a_batch_logs_its_own_training_videos_into_its_own_runs(batch):
    for seed in SEEDS:
        seed_dir = batch / f"seed{seed}"
        steps = sorted(e["env_step"] for e in read_result(seed_dir)["evaluations"])
        assert steps and sorted(int(p.name.split("-")[1][4:]) for p in (seed_dir / "videos").glob(
            "train-step*.mp4")) == steps  # the seed's own MP4 at each of its evaluations
        images = EventAccumulator(str(seed_dir / "tensorboard")).Reload().Images("video/train")
        assert sorted(i.step for i in images) == steps  # in its own TensorBoard run, at those env steps
        (offline,) = (seed_dir / "wandb").glob("offline-run-*")
        assert len(list(offline.glob("files/media/videos/**/*.mp4"))) == len(steps)  # and its own W&B run


def test_each_seed_of_a_supervised_batch_has_live_tensorboard_and_wandb_curves_equal_to_its_metrics_csv(tmp_path):
    with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "experiment=supervised_digits", "trainer=debug", "seeds_per_process=2", f"seed={SEEDS[0]}", "logger=many",
            "logger.wandb.mode=offline"])
    records = run(cfg, tmp_path)
    assert [r["status"] for r in records] == ["ok", "ok"], [r["error"] for r in records]
    curves = {}
    for seed in SEEDS:
        seed_dir = tmp_path / f"seed{seed}"
        tb, csv = _scalars(seed_dir / "tensorboard"), _csv_rows(seed_dir)
        assert {"train/loss", "train/acc", "val/loss", "val/acc", "train/lr"} <= set(csv), sorted(csv)
        for tag, values in csv.items():  # every curve of the seed, at its epochs
            assert tb[tag].keys() == values.keys(), tag
            for step, value in values.items():
                assert math.isclose(tb[tag][step], value, rel_tol=1e-6, abs_tol=1e-6), (tag, step)
        assert tb["epoch"] == {s: float(s) for s in tb["epoch"]}  # x axis = epochs, as a K = 1 run
        logged: list[tuple[str, int]] = []  # W&B: each (curve, epoch) once, as logged live (no second replay)
        for r in wandb_records(seed_dir):
            if r.WhichOneof("record_type") == "history":
                row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
                for key, value in row.items():
                    if key in csv:
                        step = int(row["trainer/global_step"])
                        logged.append((key, step))
                        assert math.isclose(value, csv[key][step], rel_tol=1e-9, abs_tol=1e-9), (key, step)
        assert sorted(logged) == sorted((k, s) for k, values in csv.items() for s in values)
        curves[seed] = csv
    assert curves[SEEDS[0]]["train/loss"] != curves[SEEDS[1]]["train/loss"]  # two seeds, two curves

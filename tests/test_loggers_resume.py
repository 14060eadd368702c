"""A resumed run continues its W&B run: every segment of a seed (first start, `ckpt_path=last`, a sweep's
`resume=true`) logs under one W&B run id, so `wandb sync` of its offline dirs gives one run per seed, whose
`trainer/global_step` axis goes on from where the checkpoint left it, and the sweep keeps its id (tag and config)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from pipeline.runtime.run import run
from pipeline_testing import run_cli, sweep_dir
from test_loggers import wandb_records

FIRST, MORE = 192, 384  # env steps of the first segment, then of the whole run (trainer=debug's PPO: 192)


def _compose(*overrides: str):
    with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
        return compose(config_name="config", overrides=[
            "experiment=ppo_cartpole", "trainer=debug", "logger=wandb", "logger.wandb.mode=offline", *overrides])


def segments(seed_dir: Path, tmp: Path) -> list[dict]:
    """Each offline W&B run dir of `seed_dir`, oldest first: its run id, tags, config and trainer/global_step axis
    (what `wandb sync <seed dir>/wandb/offline-run-*` uploads)."""
    found = []
    for i, path in enumerate(sorted(seed_dir.glob("wandb/offline-run-*/run-*.wandb"))):
        alone = tmp / f"segment{i}"  # wandb_records reads the one offline run under <dir>/wandb
        (alone / "wandb" / path.parent.name).mkdir(parents=True)
        # W&B's service process writes the offline file after the run returns; on a loaded machine it can lag a few
        # seconds behind (seen in the full suite), so read it again until its run record is there.
        deadline = time.monotonic() + 60
        while True:
            shutil.copy(path, alone / "wandb" / path.parent.name / path.name)
            records = list(wandb_records(alone))
            runs = [r.run for r in records if r.WhichOneof("record_type") == "run"]
            if runs or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        (run_record,) = runs
        steps = []
        for r in records:
            if r.WhichOneof("record_type") == "history":
                row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
                if "trainer/global_step" in row:
                    steps.append(int(row["trainer/global_step"]))
        config = {i.key: json.loads(i.value_json) for i in run_record.config.update}
        found.append({"id": run_record.run_id, "file_id": path.stem.split("-")[-1], "tags": list(run_record.tags),
                      "config": config, "steps": steps})
    return found


def _assert_one_run_continued(seed_dir: Path, tmp: Path, seed: int) -> None:
    first, resumed = segments(seed_dir, tmp)
    assert first["id"] == resumed["id"] == first["file_id"] == resumed["file_id"]
    assert f"seed={seed}" in first["tags"] and f"seed={seed}" in resumed["tags"]
    assert first["steps"] and max(first["steps"]) <= FIRST, first["steps"]
    # The resumed segment goes on from the checkpoint (the first segment's end): no step logged twice, none rewound.
    assert resumed["steps"] and min(resumed["steps"]) > FIRST and max(resumed["steps"]) <= MORE, resumed["steps"]
    assert resumed["steps"] == sorted(resumed["steps"])


def test_a_run_continued_with_ckpt_path_last_logs_into_the_same_wandb_run(tmp_path):
    run_dir = tmp_path / "run"
    (record,) = run(_compose("seed=2", f"task.total_steps={FIRST}"), run_dir)
    assert record["status"] == "ok", record["error"]
    (record,) = run(_compose("seed=2", f"task.total_steps={MORE}", "ckpt_path=last"), run_dir)
    assert record["status"] == "ok" and record["env_steps"] == MORE, record["error"]
    _assert_one_run_continued(run_dir, tmp_path, 2)
    # A fresh start in a new dir is a W&B run of its own.
    other = tmp_path / "other"
    run(_compose("seed=2", f"task.total_steps={FIRST}"), other)
    assert {s["id"] for s in segments(other, tmp_path / "o")}.isdisjoint({s["id"] for s in segments(run_dir, tmp_path / "r")})


def test_each_seed_of_a_continued_batch_logs_into_its_own_wandb_run(tmp_path):
    run_dir = tmp_path / "batch"
    batch = ("seeds_per_process=2", "seed=3")
    assert [r["status"] for r in run(_compose(*batch, f"task.total_steps={FIRST}"), run_dir)] == ["ok", "ok"]
    records = run(_compose(*batch, f"task.total_steps={MORE}", "ckpt_path=last"), run_dir)
    assert [(r["status"], r["env_steps"]) for r in records] == [("ok", MORE), ("ok", MORE)], [r["error"] for r in records]
    ids = []
    for seed in (3, 4):
        _assert_one_run_continued(run_dir / f"seed{seed}", tmp_path / f"s{seed}", seed)
        ids.append(segments(run_dir / f"seed{seed}", tmp_path / f"t{seed}")[0]["id"])
    assert ids[0] != ids[1]


@pytest.mark.slow
def test_a_resumed_sweep_keeps_its_id_and_its_rerun_job_keeps_its_wandb_run(tmp_path):
    # One job fails (lr=1e30: the loss blows up) and `resume=true` reruns it in its old dir: its second W&B segment
    # is the same run, tagged with the first invocation's sweep id (isolate_jobs=false: one process per invocation).
    args = ["-m", "experiment=supervised_digits", "trainer=debug", "seed=0", "optimizer=sgd", "optimizer.lr=0.05,1e30",
            "isolate_jobs=false", "logger=wandb", "logger.wandb.mode=offline"]
    run_cli(*args, cwd=tmp_path, env={"PIPELINE_SWEEP_UID": ""})
    sweep = sweep_dir(tmp_path)
    first_id = sweep.name.rsplit("_", 1)[-1]  # the default sweep dir's name ends with the sweep id
    (failed,) = [p.parent for p in sweep.glob("*/result.json") if json.loads(p.read_text())["status"] == "failed"]
    run_cli(*args, f"hydra.sweep.dir={sweep}", "resume=true", cwd=tmp_path, env={"PIPELINE_SWEEP_UID": ""})
    first, rerun = segments(failed, tmp_path / "failed")
    assert first["id"] == rerun["id"] == first["file_id"] == rerun["file_id"]
    for segment in (first, rerun):
        assert f"sweep={first_id}" in segment["tags"] and segment["config"]["sweep_id"] == first_id, segment["tags"]

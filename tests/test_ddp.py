"""trainer=ddp: one run on several processes (real torch.distributed, gloo on CPU, real `python -m pipeline` runs).

Rank 0 is the CLI's process and owns the run dir; rank 1 is started from the composed config and writes nothing.
Equivalence: two processes with data.batch_size=B against one with 2B, same seed, no dropout. Each step's gradient is
then the same float32 mean over the same 2B samples, summed in another order (two partial sums of B, all-reduced):
its relative rounding is at most ~2B x 2^-24 = 8e-6 per step (B = 64), and the 2 x 10 Adam steps of two epochs
carry at most ~20 such errors into the weights: 2e-4 relative bounds every loss of the curve. Measured here: 2e-7.
An accuracy moves only where a sample's two top logits lie within that bound of each other: one sample per split.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
from omegaconf import OmegaConf

from pipeline.config import checks
from pipeline.config.checks import ConfigError
from pipeline_testing import read_result, run_cli, start_module

SHORT = ("experiment=supervised_digits", "model.dropout=0", "trainer.enable_progress_bar=false")
VAL_SAMPLES = 270  # digits' 15% validation split (1,797 images)


def refused(node: dict) -> str:
    with pytest.raises(ConfigError) as info:
        checks._check_processes(OmegaConf.create(node))
    return str(info.value)


def test_processes_are_checked_before_lightning_loads():
    ddp = {"strategy": "ddp", "devices": 2, "num_nodes": 1}
    supervised, gan = "pipeline.tasks.supervised.SupervisedTask", "pipeline.tasks.gan.GANTask"
    for target in (supervised, gan):
        checks._check_processes(OmegaConf.create({"trainer": ddp, "task": {"_target_": target}}))
    assert checks.process_count(OmegaConf.create({"trainer": {**ddp, "num_nodes": 3}})) == 6
    assert checks.process_count(OmegaConf.create({"trainer": {"devices": 4}})) == 1
    for target in ("pipeline.tasks.dqn.DQNTask", "pipeline.tasks.ppo.PPOTask", "pipeline.tasks.sac.SACTask",
                   "pipeline.tasks.td3.TD3Task", "pipeline.tasks.cem.CEMTask", "pipeline.tasks.counterfactual.CounterfactualTask"):
        line = refused({"trainer": ddp, "task": {"_target_": target}})
        assert line.startswith(f"trainer=ddp shards a data loader over processes, which {target.rsplit('.', 1)[1]} does not")
        assert "seeds_per_process=N" in line and "\n" not in line
    assert refused({"trainer": {"strategy": "fsdp"}}).startswith("trainer.strategy=fsdp: the pipeline runs one run on several")
    assert refused({"trainer": {"strategy": "ddp", "devices": 0}}).startswith("trainer.devices=0: a process count is a whole")
    assert refused({"trainer": {"strategy": "ddp", "num_nodes": "2"}}).startswith("trainer.num_nodes=2: a process count")
    assert refused({"trainer": {"strategy": "ddp", "ddp_timeout_s": 0}}).startswith("trainer.ddp_timeout_s=0: seconds")
    assert refused({"trainer": {"num_nodes": 2}}).startswith("trainer.num_nodes=2 without trainer.strategy=ddp")
    # One process under trainer=ddp's keys is an ordinary run of any task.
    checks._check_processes(OmegaConf.create({"trainer": {"strategy": "ddp", "devices": 1}, "task": {"_target_": "x.Y"}}))


@pytest.mark.slow
def test_an_rl_task_is_refused_in_one_line_before_any_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli("experiment=dqn_cartpole", "trainer=ddp", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith("error: trainer=ddp shards a data loader over processes, which DQNTask does not")
    assert not run_dir.exists()


@pytest.mark.slow
def test_more_processes_than_batches_is_one_line_before_any_record(tmp_path):
    run_dir = tmp_path / "new" / "run"
    proc = run_cli(*SHORT, "trainer=ddp", "trainer.devices=3", "data.batch_size=1000", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "error: 3 processes (trainer.devices x trainer.num_nodes) but 2 training batch(es) of data.batch_size=1000" in proc.stderr
    assert not (tmp_path / "new").exists()  # what Hydra wrote there (.hydra/, run.log) went with the refusal
    # An empty dir that was there before stays, empty.
    (tmp_path / "empty").mkdir()
    again = run_cli(*SHORT, "trainer=ddp", "trainer.devices=3", "data.batch_size=1000", f"hydra.run.dir={tmp_path / 'empty'}")
    assert again.returncode == 2
    assert list((tmp_path / "empty").iterdir()) == []


@pytest.mark.slow
def test_two_processes_equal_one_process_with_twice_the_batch(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    single = run_cli(*SHORT, "trainer.max_epochs=2", "data.batch_size=128", f"hydra.run.dir={one}")
    double = run_cli(*SHORT, "trainer=ddp", "trainer.max_epochs=2", "data.batch_size=64", f"hydra.run.dir={two}")
    assert single.returncode == 0 and double.returncode == 0, double.stdout[-3000:] + double.stderr[-3000:]
    record, reference = read_result(two), read_result(one)
    assert record["status"] == "ok" and record["processes"] == 2 and record["effective_batch_size"] == 128
    assert "processes" not in reference
    # Only rank 0 wrote: one record, one curve, one model, one checkpoint, no file of rank 1's.
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in one.iterdir())
    a, b = pd.read_csv(one / "metrics.csv"), pd.read_csv(two / "metrics.csv")
    assert list(a.columns) == list(b.columns) and a["step"].tolist() == b["step"].tolist() == [0, 1, 2]
    assert a.isna().equals(b.isna())
    for column in a.columns:
        tolerance = 1 / VAL_SAMPLES + 1e-6 if column.endswith("/acc") else 2e-4 * a[column].abs().max()
        assert (a[column] - b[column]).abs().max() <= tolerance, (column, a[column].tolist(), b[column].tolist())
    for key, value in reference["metrics"].items():
        assert record["metrics"][key] == pytest.approx(value, abs=1 / 360 + 1e-6 if key.endswith("/acc") else 2e-4 * abs(value))


def _start_and_signal(run_dir: Path, sig: int, *extra: str):
    """A 2-process run signalled on rank 1 once two epochs are in its curve; (rank 0's process, its output)."""
    proc = start_module("pipeline", *SHORT, "trainer=ddp", "trainer.max_epochs=8", "data.batch_size=32",
                        "checkpoint.every_s=0", "trainer.ddp_timeout_s=60", f"hydra.run.dir={run_dir}", *extra)
    curve = run_dir / "metrics.csv"
    while proc.poll() is None and not (curve.is_file() and len(curve.read_text().splitlines()) >= 3):
        time.sleep(0.2)
    ranks = psutil.Process(proc.pid).children()
    assert len(ranks) == 1 and "--rank" in ranks[0].cmdline(), [r.cmdline() for r in ranks]
    ranks[0].send_signal(sig)
    proc.wait(timeout=600)  # a bound on a hang, not a speed target
    return proc, proc.communicate()[0]


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_every_rank_at_one_checkpoint_and_the_run_resumes(tmp_path):
    proc, out = _start_and_signal(tmp_path, signal.SIGTERM)
    assert proc.returncode == 143, out[-3000:]
    record = read_result(tmp_path)
    assert record["status"] == "interrupted" and record["interrupted"]["signal"] == "SIGTERM"
    assert "rank 1 (pid " in out and "ended with exit code 143" in out  # rank 1 exits interrupted too
    step = record["interrupted"]["step"]
    before = pd.read_csv(tmp_path / "metrics.csv")
    assert before["step"].max() == step and (tmp_path / "checkpoints" / "last.ckpt").is_file()

    resumed = run_cli(*SHORT, "trainer=ddp", "trainer.max_epochs=8", "data.batch_size=32", "checkpoint.every_s=0",
                      "trainer.ddp_timeout_s=60", f"hydra.run.dir={tmp_path}", "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    record = read_result(tmp_path)
    assert record["status"] == "ok" and [s["end"] for s in record["segments"]] == ["interrupted", "ok"]
    after = pd.read_csv(tmp_path / "metrics.csv")
    train = after.dropna(subset=["train/loss"])
    assert train["step"].tolist() == list(range(8))  # the curve kept, then continued to the budget
    pd.testing.assert_frame_equal(train[train["step"] <= step][before.columns].reset_index(drop=True), before)


@pytest.mark.slow
def test_kill_9_of_one_rank_fails_the_record_naming_the_rank(tmp_path):
    proc, out = _start_and_signal(tmp_path, signal.SIGKILL)
    assert proc.returncode == 1, out[-3000:]
    record = read_result(tmp_path)
    assert record["status"] == "failed"
    assert record["error"].startswith("RankFailed: rank 1 (pid ") and record["error"].endswith(" was killed by SIGKILL")


@pytest.mark.slow
def test_a_gan_trains_on_two_processes_and_only_rank_0_writes(tmp_path):
    proc = run_cli("experiment=gan_digits", "trainer=ddp", "trainer.max_epochs=2", "trainer.limit_train_batches=4",
                   "task.n_eval_samples=64", "task.n_grid_samples=16", "task.classifier.epochs=2",
                   "trainer.enable_progress_bar=false", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = read_result(tmp_path)
    assert record["status"] == "ok" and record["processes"] == 2 and record["effective_batch_size"] == 64
    assert record["iterations"] == 8  # each rank's 4 batches a epoch, in step
    curve = pd.read_csv(tmp_path / "metrics.csv")
    assert curve["step"].tolist() == [0, 8] and curve["train/d_loss"].notna().sum() == 1
    assert (tmp_path / "samples.png").is_file() and (tmp_path / "model.pt").is_file()


def test_a_run_on_two_processes_groups_with_a_single_run_only_at_the_same_effective_batch(tmp_path):
    import json

    from pipeline.config.grouping import config_id
    from pipeline.report.collect import GroupingNote, collect_runs

    base = {"data": {"batch_size": 128}, "trainer": {"max_epochs": 2}, "model": {"hidden": [64]}}
    ddp = {**base, "data": {"batch_size": 64}, "trainer": {"max_epochs": 2, "strategy": "ddp", "devices": 2, "num_nodes": 1,
                                                          "ddp_timeout_s": 60}}
    assert config_id(ddp) == config_id(base)
    assert config_id({**ddp, "data": {"batch_size": 128}}) != config_id(base)
    assert config_id({**base, "data": {"batch_size": 64}}) != config_id(base)
    for name, config, extra in (("one", base, {}), ("two", ddp, {"processes": 2, "effective_batch_size": 128})):
        (tmp_path / name).mkdir()
        record = {"experiment": "e", "group": f"e {config_id(config)}", "task": "SupervisedTask", "seed": 0, "status": "ok",
                  "primary_metric": "test/acc", "metrics": {"test/acc": 0.9}, **extra}
        (tmp_path / name / "result.json").write_text(json.dumps(record))
    with pytest.warns(GroupingNote, match=r"runs on 1 and 2 processes are one group, as their effective batch size agrees \(128"):
        runs = collect_runs([tmp_path])
    assert len({r.group for r in runs}) == 1

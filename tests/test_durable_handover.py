"""Where a run dir, a record or a checkpoint changes hands, with real `python -m pipeline` processes killed by kill -9:
a killed run's dir is refused to any other run and resumed by its own command; a half-written result.json is kept,
its history rebuilt from the checkpoint; a keep_best run's record says which evaluation best.pt holds as it goes;
the first checkpoint comes at the first safe point, not after checkpoint.every_s."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import pytest

from pipeline.store.record import read_record as read_record_as_it_stands
from pipeline_testing import read_result, run_cli, start_module

PPO = ("experiment=ppo_cartpole", "seeds_per_process=4", "task.total_steps=8192", "task.stop_at_return=null",
       "trainer.enable_progress_bar=false", "checkpoint.every_s=3600")
DQN = ("experiment=dqn_cartpole", "task.stop_at_return=null", "trainer.enable_progress_bar=false", "checkpoint.every_s=3600")


def _killed_once(run_dir: Path, *args: str, record: str = "result.json", until=None) -> dict:
    """Start a run, kill -9 it once its record says what `until(record)` waits for (default: a first checkpoint)."""
    until = until or (lambda r: (r.get("checkpoint") or {}).get("saves"))
    proc = start_module("pipeline", *args, f"hydra.run.dir={run_dir}")
    end = time.monotonic() + 300  # a bound on a hang, not a speed target
    while proc.poll() is None and time.monotonic() < end:
        try:
            seen = json.loads((run_dir / record).read_text())
        except (OSError, ValueError):
            seen = {}
        if until(seen):
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait(timeout=60)
    return read_record_as_it_stands((run_dir / record).parent).to_dict()  # its process gone: `failed`, not `running`


def _files(run_dir: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != "run.log"}


@pytest.mark.slow
def test_a_killed_run_is_refused_to_another_experiment_and_resumed_by_its_own_command(tmp_path):
    killed = _killed_once(tmp_path, *PPO, record="seed0/result.json")
    # The first checkpoint came at the first safe point (one iteration), not after checkpoint.every_s=3600.
    assert killed["status"] == "failed" and killed["checkpoint"]["step"] == 256, killed
    before = _files(tmp_path)
    for extra in ((), ("ckpt_path=last",)):
        other = run_cli("experiment=dqn_cartpole", f"hydra.run.dir={tmp_path}", *extra)
        lines = other.stderr.strip().splitlines()
        assert other.returncode == 1 and len(lines) == 1 and "Traceback" not in other.stdout + other.stderr, other.stderr
        assert "ppo_cartpole" in lines[0] and "dqn_cartpole" in lines[0] and "another version" not in lines[0]
        assert "hydra.run.dir=<dir>" in lines[0] and "ckpt_path=last" in lines[0], lines[0]
        assert _files(tmp_path) == before  # .hydra/, the checkpoint, the records: untouched
    # The same experiment started afresh over its own killed run is refused too, naming the resume.
    fresh = run_cli(*PPO, f"hydra.run.dir={tmp_path}")
    assert fresh.returncode == 1 and "holds a run that was killed (its checkpoint holds step 256)" in fresh.stderr
    assert _files(tmp_path) == before
    # The record's own command continues it, to the end.
    command = shlex.split(killed["resume_command"])
    assert command[:3] == ["python", "-m", "pipeline"] and "ckpt_path=last" in command
    resumed = run_cli(*command[3:])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    for seed in range(4):
        record = read_result(tmp_path / f"seed{seed}")
        assert record["status"] == "ok" and record["env_steps"] == 8192
        assert [s.get("end") for s in record["segments"]] == ["killed", "ok"] and record["segments"][1]["from_step"] == 256


@pytest.mark.slow
def test_a_half_written_record_is_kept_and_its_history_rebuilt_from_the_checkpoint(tmp_path):
    args = (*DQN, "task.total_steps=2048")
    killed = _killed_once(tmp_path, *args)
    step = killed["checkpoint"]["step"]
    text = (tmp_path / "result.json").read_text()
    (tmp_path / "result.json").write_text(text[: len(text) // 2])  # cut in the middle, as a torn write leaves it
    resumed = run_cli(*args, "ckpt_path=last", f"hydra.run.dir={tmp_path}")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert (tmp_path / "result.unreadable.json").read_text() == text[: len(text) // 2]  # kept whole
    assert "cannot be read (half-written?): kept as result.unreadable.json" in (tmp_path / "run.log").read_text()
    record = read_result(tmp_path)
    assert record["status"] == "ok" and [s.get("end") for s in record["segments"]] == ["killed", "ok"]
    first, second = record["segments"]
    assert first["to_step"] == step and first["pid"] == killed["pid"] and second["from_step"] == step
    assert record["wall_time_s"] == pytest.approx(first["wall_time_s"] + second["wall_time_s"], abs=2e-3)


@pytest.mark.slow
def test_a_keep_best_run_killed_between_checkpoints_says_which_evaluation_best_pt_holds(tmp_path):
    """Only the first checkpoint is saved (every_s=3600): the evaluations after it reach the record as they happen."""
    args = (*DQN, "task.total_steps=100000", "task.keep_best=true", "task.eval_every=500", "task.eval_episodes=2")
    killed = _killed_once(tmp_path, *args, until=lambda r: len(r.get("evaluations") or []) >= 3)
    evaluations = killed["evaluations"]
    assert killed["checkpoint"]["saves"] == 1 and killed["checkpoint"]["step"] < evaluations[1]["env_step"]
    best = killed["best"]
    top = max(evaluations, key=lambda e: e["return_mean"])  # the first of the best: a tie keeps the earlier one
    assert best["file"] == "best.pt" and (best["env_step"], best["return_mean"]) == (top["env_step"], top["return_mean"])
    assert (tmp_path / "best.pt").is_file() and (tmp_path / "best.pt.sha256").is_file()

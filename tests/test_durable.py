"""Fault injection with real processes and real signals: a killed, interrupted or repeated run never loses work."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from pipeline.store.record import read_record
from pipeline_testing import ROOT, read_result, run_cli, start_module

pytestmark = pytest.mark.slow


def start(*args: str):
    """`python -m pipeline ...` in the background (stderr into stdout), forked from the suite's warm interpreter:
    a real process with its own pid, signals and exit status; only the 3-4 s of imports are saved."""
    return start_module("pipeline", *args)


def wait_for(predicate, timeout: float = 240.0, proc=None) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process ended early ({proc.returncode}): {proc.stdout.read()[-2000:]}")
        time.sleep(0.1)
    raise AssertionError("timed out")


def checkpoint_step(run_dir: Path) -> int | None:
    try:
        record = json.loads((run_dir / "result.json").read_text())
    except (OSError, ValueError):
        return None
    return (record.get("checkpoint") or {}).get("step")


DQN = ("experiment=dqn_cartpole", "task.stop_at_return=null", "trainer.enable_progress_bar=false")


@pytest.mark.parametrize("batch", [(), ("seeds_per_process=3", "env=cartpole_tensor", "task.envs_per_agent=4")], ids=["k1-gym", "k3-tensor"])
def test_kill_9_then_ckpt_path_last_continues_a_dqn_run(tmp_path, batch):
    """Killed after its first checkpoint and resumed, the run ends exactly where an uninterrupted one does."""
    # Long enough after the first checkpoint (2,048: past learning_starts and the first evaluation, replay saved) that
    # the kill lands mid-run even on a slow, loaded machine (10k steps still to go), evaluations on both sides of it.
    budget = 12_288
    args = (*DQN, f"task.total_steps={budget}", "task.eval_every=2048", "checkpoint.every_steps=2048", *batch)
    run_dir = tmp_path / "killed"
    agent_dir = run_dir if not batch else run_dir / "seed1"
    proc = start(*args, f"hydra.run.dir={run_dir}")
    wait_for(lambda: (checkpoint_step(agent_dir) or 0) >= 2048, proc=proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed = read_record(agent_dir).to_dict()  # as a reader sees it: its process gone, `running` reads `failed`
    assert proc.returncode == -signal.SIGKILL, f"the run ended ({proc.returncode}) before the kill: raise the budget"
    assert killed["status"] == "failed" and killed["checkpoint"]["replay_saved"] is True
    saved_at = killed["checkpoint"]["step"]
    rows_before = pd.read_csv(agent_dir / "metrics.csv")
    resumed = run_cli(*args, f"hydra.run.dir={run_dir}", "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    record = read_result(agent_dir)
    assert record["status"] == "ok" and record["env_steps"] == budget
    assert [s.get("from_step") for s in record["segments"]] == [None, saved_at]
    assert record["segments"][0]["end"] == "killed" and record["wall_time_s"] >= record["segments"][1]["wall_time_s"]
    curve = pd.read_csv(agent_dir / "metrics.csv")
    steps = curve["step"].tolist()
    assert steps == sorted(set(steps)) and steps[-1] == budget  # monotone, no duplicated step
    kept = rows_before[rows_before["step"] <= saved_at]
    # The rows up to the checkpoint are the killed segment's own, unchanged.
    pd.testing.assert_frame_equal(curve[curve["step"] <= saved_at][kept.columns].reset_index(drop=True), kept.reset_index(drop=True))
    # Everything the checkpoint holds (weights, optimizer, replay, every RNG, the envs) is restored exactly:
    # the resumed run ends bitwise where a run that was never killed ends.
    reference = run_cli(*args, f"hydra.run.dir={tmp_path / 'reference'}")
    assert reference.returncode == 0, reference.stdout[-2000:]
    ref_dir = tmp_path / "reference" if not batch else tmp_path / "reference" / "seed1"
    assert read_result(ref_dir)["metrics"] == record["metrics"]
    a, b = (torch.load(d / "model.pt", weights_only=True) for d in (ref_dir, agent_dir))
    assert all(torch.equal(a[k], b[k]) for k in a)
    ref_curve = pd.read_csv(ref_dir / "metrics.csv").drop(columns=["perf/env_steps_per_s"])
    pd.testing.assert_frame_equal(curve.drop(columns=["perf/env_steps_per_s"]), ref_curve)


PPO_ARGS = ("experiment=ppo_cartpole", "task.stop_at_return=null", "trainer.enable_progress_bar=false", "model.hidden=[32,32]")


@pytest.mark.parametrize("batch", [(), ("seeds_per_process=2", "env=pendulum_tensor")], ids=["k1-cartpole", "k2-pendulum"])
def test_kill_9_then_ckpt_path_last_continues_a_ppo_run_exactly(tmp_path, batch):
    """PPO's declared state (weights, Adam, counters, evaluations, per-agent shuffles, the global RNG that draws its
    actions, the envs mid-episode) brings a killed run to the end an uninterrupted one reaches, bitwise."""
    # 50 iterations of 256 env steps per agent; a checkpoint every 5, an evaluation every 10: killed after the first
    # evaluation's checkpoint (2,560) with 40 iterations still to go, so evaluations on both sides of the kill.
    budget = 12_800
    args = (*PPO_ARGS, f"task.total_steps={budget}", "task.eval_every=2560", "checkpoint.every_steps=1280", *batch)
    run_dir = tmp_path / "killed"
    agent_dir = run_dir if not batch else run_dir / "seed1"
    proc = start(*args, f"hydra.run.dir={run_dir}")
    wait_for(lambda: (checkpoint_step(agent_dir) or 0) >= 2560, proc=proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"the run ended ({proc.returncode}) before the kill: raise the budget"
    saved_at = read_result(agent_dir)["checkpoint"]["step"]
    resumed = run_cli(*args, f"hydra.run.dir={run_dir}", "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    record = read_result(agent_dir)
    assert record["status"] == "ok" and record["env_steps"] == budget
    assert [s.get("from_step") for s in record["segments"]] == [None, saved_at]
    reference = run_cli(*args, f"hydra.run.dir={tmp_path / 'reference'}")
    assert reference.returncode == 0, reference.stdout[-2000:]
    ref_dir = tmp_path / "reference" if not batch else tmp_path / "reference" / "seed1"
    assert read_result(ref_dir)["metrics"] == record["metrics"]
    assert read_result(ref_dir)["evaluations"] == record["evaluations"]
    a, b = (torch.load(d / "model.pt", weights_only=True) for d in (ref_dir, agent_dir))
    assert all(torch.equal(a[k], b[k]) for k in a)
    curve, ref_curve = (pd.read_csv(d / "metrics.csv").drop(columns=["perf/env_steps_per_s"]) for d in (agent_dir, ref_dir))
    pd.testing.assert_frame_equal(curve, ref_curve)


def test_a_ppo_batch_resumed_after_an_agent_stopped_ends_where_it_would_have(tmp_path):
    """PPO agents that reached stop_at_return left the batch before the checkpoint; kill -9, then the resume rebuilds
    the smaller batch (weights, Adam moments, envs, generators) and ends bitwise where an uninterrupted run ends. The
    bar comes from a run without one (the best evaluation by 7,680 env steps) and the stop needs no confirmation round,
    so some agent stops by then on any CPU."""
    args = (*PPO_ARGS[:1], *PPO_ARGS[2:], "task.eval_every=2560", "task.eval_episodes=10", "task.total_steps=15360",
            "task.stop_confirm_episodes=0", "checkpoint.every_steps=2560", "seeds_per_process=3")
    free = run_cli(*args, "task.stop_at_return=null", f"hydra.run.dir={tmp_path / 'free'}")
    assert free.returncode == 0, free.stdout[-2000:]
    evaluations = [read_result(tmp_path / "free" / f"seed{s}")["evaluations"] for s in range(3)]
    bar = max(e["return_mean"] for ev in evaluations for e in ev if e["env_step"] <= 7680)
    args = (*args, f"task.stop_at_return={bar}")
    reference = run_cli(*args, f"hydra.run.dir={tmp_path / 'reference'}")
    assert reference.returncode == 0, reference.stdout[-2000:]
    stops = [read_result(tmp_path / "reference" / f"seed{s}")["early_stop"] for s in range(3)]
    first_stop = min(s["env_step"] for s in stops if s is not None)
    assert first_stop <= 7680
    run_dir = tmp_path / "killed"
    proc = start(*args, f"hydra.run.dir={run_dir}")
    wait_for(lambda: (checkpoint_step(run_dir / "seed0") or 0) >= first_stop, proc=proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"the run ended ({proc.returncode}) before the kill: raise the budget"
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert len(saved["slots"]) < 3  # an agent had left the batch
    resumed = run_cli(*args, f"hydra.run.dir={run_dir}", "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    for s in range(3):
        ref, got = read_result(tmp_path / "reference" / f"seed{s}"), read_result(run_dir / f"seed{s}")
        assert got["metrics"] == ref["metrics"] and got["early_stop"] == ref["early_stop"]
        assert got["evaluations"] == ref["evaluations"] and got["env_steps"] == ref["env_steps"]
        a, b = (torch.load(d / f"seed{s}" / "model.pt", weights_only=True) for d in (tmp_path / "reference", run_dir))
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_sigint_records_interrupted_and_the_printed_command_finishes_the_run(tmp_path):
    args = (*DQN, "task.total_steps=60000", f"hydra.run.dir={tmp_path}")
    proc = start(*args)
    wait_for(lambda: (tmp_path / "metrics.csv").exists(), proc=proc)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-2000:]
    record = read_result(tmp_path)
    assert record["status"] == "interrupted" and record["interrupted"]["signal"] == "SIGINT"
    step = record["interrupted"]["step"]
    assert record["checkpoint"]["step"] == step > 0
    command = record["interrupted"]["resume"]
    assert f"continue with: {command}" in out and "Traceback" not in out
    assert command.endswith("ckpt_path=last") and f"hydra.run.dir={tmp_path}" in command
    # Finish it with what the line said (shorter budget, so the test stays quick: same dir, same checkpoint).
    finish = run_cli(*[a for a in command.split()[3:] if not a.startswith("task.total_steps")], f"task.total_steps={step + 1024}")
    assert finish.returncode == 0, finish.stdout[-2000:]
    assert read_result(tmp_path)["env_steps"] == step + 1024


def test_a_second_process_on_a_busy_run_dir_refuses(tmp_path):
    proc = start(*DQN, "task.total_steps=60000", f"hydra.run.dir={tmp_path}")
    try:
        wait_for(lambda: (tmp_path / "result.json").exists(), proc=proc)
        second = run_cli(*DQN, f"hydra.run.dir={tmp_path}")
        assert second.returncode != 0
        message = (second.stdout + second.stderr).strip().splitlines()
        assert any("is in use by process" in line and str(proc.pid) in line for line in message), message
        assert "Traceback" not in second.stdout + second.stderr
    finally:
        proc.kill()
        proc.wait()
    # The owner was killed: the lock is stale now, and the killed run's own resume takes the dir over (a fresh start
    # is refused once it holds a checkpoint: tests/test_durable_handover.py).
    third = run_cli(*DQN, "task.total_steps=2048", "ckpt_path=last", f"hydra.run.dir={tmp_path}")
    assert third.returncode == 0, third.stdout[-2000:]
    assert "took over" in (tmp_path / "run.log").read_text()


def test_a_finished_record_is_never_overwritten_and_a_failed_resume_keeps_the_earlier_one(tmp_path):
    args = (*DQN, "task.total_steps=1024", "checkpoint.every_steps=512", f"hydra.run.dir={tmp_path}")
    assert run_cli(*args).returncode == 0
    finished = (tmp_path / "result.json").read_text()
    again = run_cli(*args)
    assert again.returncode != 0 and "already holds a finished run" in again.stdout + again.stderr
    assert (tmp_path / "result.json").read_text() == finished
    # A killed run whose checkpoint is damaged: the resume refuses in one line and changes nothing.
    record = json.loads(finished)
    record["status"] = "failed"
    (tmp_path / "result.json").write_text(json.dumps(record))
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    ckpt.write_bytes(ckpt.read_bytes()[:1000])
    curve = (tmp_path / "metrics.csv").read_text()
    resumed = run_cli(*args, "ckpt_path=last")
    assert resumed.returncode != 0
    text = resumed.stdout + resumed.stderr
    # Its digest says so before anything is read or written, and the previous checkpoint is offered.
    assert "is damaged" in text and "nothing was changed" in text and "Traceback" not in text and "weights_only=False" not in text
    assert f") is good: continue from it with ckpt_path={tmp_path / 'checkpoints' / 'previous.ckpt'}" in text
    assert json.loads((tmp_path / "result.json").read_text()) == record
    assert (tmp_path / "metrics.csv").read_text() == curve
    changed = run_cli(*args, f"ckpt_path={tmp_path / 'checkpoints' / 'previous.ckpt'}", "model.hidden=[8]")
    assert changed.returncode != 0 and "cannot resume" in changed.stdout + changed.stderr


def test_a_killed_supervised_run_resumes_and_keeps_its_earlier_rows(tmp_path):
    args = ("experiment=supervised_digits", "trainer.max_epochs=30", "checkpoint.every_s=0", "trainer.enable_progress_bar=false",
            f"hydra.run.dir={tmp_path}")
    proc = start(*args)
    wait_for(lambda: (checkpoint_step(tmp_path) or 0) >= 8, proc=proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = pd.read_csv(tmp_path / "metrics.csv")
    saved = read_result(tmp_path)["checkpoint"]["step"]
    resumed = run_cli(*args, "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    record = read_result(tmp_path)
    assert record["status"] == "ok" and len(record["segments"]) == 2
    curve = pd.read_csv(tmp_path / "metrics.csv")
    val = curve.dropna(subset=["val/acc"])
    assert val["step"].tolist() == list(range(30))  # every epoch once, in order
    # The training rows too: an epoch's train row is written in the task's epoch-end hook, so the checkpoint
    # of that epoch must be saved after it (before, the row of the checkpointed epoch was lost on a kill).
    assert curve.dropna(subset=["train/loss", "train/lr"])["step"].tolist() == list(range(30))
    kept = before[before["step"] <= saved].dropna(subset=["val/acc"])
    assert val[val["step"] <= saved]["val/acc"].tolist() == kept["val/acc"].tolist()
    assert record["metrics"]["test/acc"] > 0.9
    assert record["wall_time_s"] > record["segments"][1]["wall_time_s"]
    model = torch.load(tmp_path / "model.pt", weights_only=True)
    assert "net.0.weight" in model


@pytest.mark.parametrize("launcher", ["basic", "joblib"])
def test_kill_9_of_one_sweep_job_never_takes_down_the_sweep(tmp_path, launcher):
    sweep = tmp_path / "sweep"
    # 10k steps after the victim's first checkpoint (2,048): the kill lands mid-training even on a loaded machine.
    args = ("-m", *DQN, "seed=0,1,2", "task.total_steps=12288", "checkpoint.every_steps=2048", f"hydra/launcher={launcher}",
            f"hydra.sweep.dir={sweep}")
    if launcher == "joblib":
        args = (*args, "hydra.launcher.n_jobs=2")
    proc = start(*args)
    victim: dict = {}

    def job1_running() -> bool:
        # Killed mid-training: after its first checkpoint, long before its budget.
        for path in sweep.glob("1_*/result.json"):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                return False
            victim["pid"] = record.get("pid")
            return victim["pid"] is not None and (record.get("checkpoint") or {}).get("step", 0) >= 2048
        return False

    wait_for(job1_running, proc=proc, timeout=400)
    os.kill(victim["pid"], signal.SIGKILL)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode != 0
    lines = [line for line in out.strip().splitlines() if line.strip()]
    assert lines[-1].startswith("finish the sweep with: python -m pipeline -m") and lines[-1].endswith("resume=true"), lines[-5:]
    assert "Traceback" not in out
    records = {r["seed"]: r for r in (json.loads(p.read_text()) for p in sweep.glob("*/result.json"))}
    assert records[0]["status"] == records[2]["status"] == "ok"
    assert records[1]["status"] == "failed" and "SIGKILL" in records[1]["error"]
    # Its record says how far it got as of its last checkpoint or evaluation (the lifecycle writes the task's progress
    # with each): at least as far as its checkpoint, which a resume continues from.
    assert "its checkpoint holds step" in records[1]["error"] and records[1]["env_steps"] >= records[1]["checkpoint"]["step"]
    report = json.loads((sweep / "report" / "report.json").read_text())
    (group,) = report["groups"].values()
    assert group["n_ok"] == 2 and group["n_failed"] == 1
    assert [f["seed"] for f in group["failed"]] == [1]  # the failed seed is listed


def test_a_batch_resumed_after_some_agents_stopped_ends_where_it_would_have(tmp_path):
    """Agents that stopped early left the batch before the checkpoint: the resume rebuilds the smaller batch exactly."""
    args = (*DQN, "task.stop_at_return=150", "task.eval_every=1024", "task.total_steps=16384", "checkpoint.every_steps=1024",
            "seeds_per_process=3", "env=cartpole_tensor", "task.envs_per_agent=4")
    reference = run_cli(*args, f"hydra.run.dir={tmp_path / 'reference'}")
    assert reference.returncode == 0, reference.stdout[-2000:]
    stops = [read_result(tmp_path / "reference" / f"seed{s}")["early_stop"] for s in range(3)]
    first_stop = min(s["env_step"] for s in stops if s is not None)
    run_dir = tmp_path / "killed"
    proc = start(*args, f"hydra.run.dir={run_dir}")
    wait_for(lambda: (checkpoint_step(run_dir / "seed0") or 0) >= first_stop, proc=proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert len(saved["slots"]) < 3  # at least one agent had left the batch
    resumed = run_cli(*args, f"hydra.run.dir={run_dir}", "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    for s in range(3):
        ref, got = read_result(tmp_path / "reference" / f"seed{s}"), read_result(run_dir / f"seed{s}")
        assert got["metrics"] == ref["metrics"] and got["early_stop"] == ref["early_stop"]
        a, b = (torch.load(d / f"seed{s}" / "model.pt", weights_only=True) for d in (tmp_path / "reference", run_dir))
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_sigterm_on_a_supervised_run_saves_the_last_finished_epoch_and_the_resume_continues(tmp_path):
    """The policy never came due (checkpoint.every_s=3600): a SIGTERM mid-epoch still leaves a checkpoint of the
    last finished epoch, the record names that epoch, and the printed command continues from it (not from 0)."""
    # A budget no machine finishes before the signal (a quiet CI machine ran 40 epochs in 5.6 s); the resume
    # continues to a small one (a resume may change the budget).
    args = ("experiment=supervised_digits", "scheduler=none", "checkpoint.every_s=3600", "trainer.enable_progress_bar=false",
            f"hydra.run.dir={tmp_path}")
    proc = start(*args, "trainer.max_epochs=5000")

    def epochs_done() -> int:
        try:
            return int(pd.read_csv(tmp_path / "metrics.csv").dropna(subset=["val/acc"])["step"].max()) + 1
        except (OSError, ValueError, KeyError, pd.errors.EmptyDataError):
            return 0

    wait_for(lambda: epochs_done() >= 3, proc=proc)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out[-2000:]
    record = read_result(tmp_path)
    step = record["interrupted"]["step"]
    assert record["status"] == "interrupted" and isinstance(step, int) and step >= 2, record["interrupted"]
    assert record["checkpoint"]["step"] == step and (tmp_path / "checkpoints" / "last.ckpt").is_file()
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["epoch"] == step
    first_wall = record["wall_time_s"]
    assert first_wall > 0 and record["segments"][0]["wall_time_s"] == first_wall
    resumed = run_cli(*args, f"trainer.max_epochs={step + 4}", "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    record = read_result(tmp_path)
    assert record["status"] == "ok" and [s["from_step"] for s in record["segments"]] == [None, step]
    assert record["wall_time_s"] == pytest.approx(sum(s["wall_time_s"] for s in record["segments"]), abs=1e-3)
    curve = pd.read_csv(tmp_path / "metrics.csv").dropna(subset=["val/acc"])
    assert curve["step"].tolist() == list(range(step + 4))


SELF_SIGTERM = '''
import os, signal
from lightning.pytorch.callbacks import Callback

class SigtermAt(Callback):
    """Sends this process SIGTERM once, from `hook`, at epoch `epoch` (and batch `batch` for batch hooks)."""

    def __init__(self, hook, epoch=0, batch=0):
        self.hook, self.epoch, self.batch, self.sent = hook, epoch, batch, False

    def _maybe(self, trainer, batch_idx=None):
        if self.sent or trainer.current_epoch != self.epoch or (batch_idx is not None and batch_idx != self.batch):
            return
        self.sent = True
        os.kill(os.getpid(), signal.SIGTERM)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.hook == "train_batch_end":
            self._maybe(trainer, batch_idx)

    def on_train_epoch_end(self, trainer, pl_module):
        if self.hook == "train_epoch_end":
            self._maybe(trainer)
'''


@pytest.mark.parametrize(
    ("task", "hook", "epoch", "batch"),
    [("supervised", "train_batch_end", 2, 1), ("supervised", "train_epoch_end", 2, 0), ("dqn", "train_batch_end", 0, 3)],
    ids=["supervised-after-batch", "supervised-after-epoch", "dqn-after-batch"],
)
def test_a_sigterm_lightning_acts_on_before_our_safe_point_still_ends_interrupted(tmp_path, task, hook, epoch, batch):
    """Lightning handles SIGTERM too (its handler chains to ours) and ends the fit with its own SIGTERMException,
    a SystemExit with no code, at points between our safe points: after the last callback of a batch, after an
    epoch's end. The run must still save, record `interrupted` and exit 143; it exited 0 and left the record as
    it was (about 1 run in 5 of a SIGTERM sent from outside). Here the signal comes from a callback that runs
    after ours, at exactly those points."""
    (tmp_path / "selfterm.py").write_text(SELF_SIGTERM)
    run_dir = tmp_path / "run"
    base = (("experiment=supervised_digits", "scheduler=none", "checkpoint.every_s=3600", "trainer.max_epochs=50")
            if task == "supervised" else (*DQN, "task.total_steps=50000"))
    args = (*base, f"hydra.run.dir={run_dir}")
    at = ("+callbacks.selfterm._target_=selfterm.SigtermAt", f"+callbacks.selfterm.hook={hook}",
          f"+callbacks.selfterm.epoch={epoch}", f"+callbacks.selfterm.batch={batch}")
    # The callback's module is found in the run's folder, as a user's is (the CLI puts the cwd on sys.path).
    done = run_cli(*args, *at, "trainer.enable_progress_bar=false", cwd=tmp_path, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 143, out[-3000:]
    record = read_result(run_dir)
    assert record["status"] == "interrupted" and record["interrupted"]["signal"] == "SIGTERM", record
    step = record["interrupted"]["step"]
    assert isinstance(step, int) and record["checkpoint"]["step"] == step, record
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    if task == "supervised":  # during epoch 2 the last finished epoch is 1; after epoch 2's end, epoch 2 itself
        assert step == (1 if hook == "train_batch_end" else 2) == saved["epoch"], record["interrupted"]
    else:
        assert step > 0 and saved["progress"]["env_steps"] == step, (step, saved["progress"])
    assert "interrupted by SIGTERM" in out, out[-2000:]  # (resuming is the other tests' part: the callback is config)


@pytest.mark.parametrize("delay", [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 5.0])
def test_a_signal_in_the_first_seconds_is_honoured(tmp_path, delay):
    """Started as a shell starts a background job (SIGINT ignored), SIGINT at any moment of start-up stops the
    run: it exits 130 (before the run: no record; after: an interrupted record), never trains to the end.
    (A signal in the interpreter's own start-up, before any line of ours runs, is the OS's to drop.)"""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", *DQN, "task.total_steps=200000", f"hydra.run.dir={run_dir}"],
        cwd=ROOT, env={**os.environ, "WANDB_MODE": "offline"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 130, out[-2000:]
    if (run_dir / "result.json").is_file():
        assert read_result(run_dir)["status"] == "interrupted"
    else:
        assert "before the run started" in out


def test_a_stop_before_the_run_cannot_be_swallowed_by_a_library_that_catches_everything():
    """A CI run got SIGINT while torchmetrics imported scipy which imported numpy.dtypes: the stop, raised as
    an exception there, left a half-imported numpy behind and the process died of a RecursionError. Here
    a 'library' catches everything around the moment the signal lands; the process must still end 130."""
    code = (
        "import os, signal, time\n"
        "from pipeline.runtime.rundir import honour_stop_signals_from_now\n"
        "honour_stop_signals_from_now()\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(2)\n"
        "except BaseException:\n"
        "    pass\n"
        "print('trained to the end')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 130, proc.stdout + proc.stderr
    assert "trained to the end" not in proc.stdout
    assert "stopped by SIGINT before the run started" in proc.stderr


# Planted at interpreter start of a sweep job's child process: the child of the job whose dir says seed=1 is
# killed before it can import anything of ours (as the OOM killer or a kill during imports would).
_KILL_AT_START = (
    "import os, signal\n"
    "cmd = open('/proc/self/cmdline', 'rb').read().replace(b'\\0', b' ').decode()\n"
    "if 'pipeline.runtime.job' in cmd and 'seed=1' in cmd and os.environ.get('PIPELINE_TEST_KILL_AT_START'):\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\n"
)


def test_a_sweep_job_killed_during_its_start_up_is_counted_and_resumed(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_KILL_AT_START)
    sweep = tmp_path / "sweep"
    args = ("-m", "experiment=dqn_cartpole", "trainer=debug", "seed=0,1", f"hydra.sweep.dir={sweep}")
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]), "PIPELINE_TEST_KILL_AT_START": "1"}
    proc = run_cli(*args, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-2000:]
    lines = [line for line in proc.stdout.strip().splitlines() if line.strip()]
    assert lines[-1].startswith("finish the sweep with: python -m pipeline -m") and lines[-1].endswith("resume=true"), lines[-5:]
    records = {r["seed"]: r for r in (json.loads(p.read_text()) for p in sweep.glob("*/result.json"))}
    assert records[0]["status"] == "ok"
    assert records[1]["status"] == "failed" and "SIGKILL" in records[1]["error"], records[1]
    report = json.loads((sweep / "report" / "report.json").read_text())
    (group,) = report["groups"].values()
    assert group["n_ok"] == 1 and group["n_failed"] == 1
    # The printed command, without the planted fault, finishes only the missing seed.
    command = lines[-1].removeprefix("finish the sweep with: python -m pipeline ").split()
    finish = run_cli(*command)
    assert finish.returncode == 0, finish.stdout[-2000:] + finish.stderr[-2000:]
    again = {r["seed"]: r for r in (json.loads(p.read_text()) for p in sweep.glob("*/result.json"))}
    assert again[1]["status"] == "ok" and again[0]["segments"] == records[0]["segments"]


@pytest.fixture
def tiny_disk(tmp_path):
    """A 1.2 MB file system (tmpfs): room for a run's record and one checkpoint of supervised_digits, not two."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1200k", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("a small file system needs root and mount (tmpfs) here")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_a_full_disk_loses_nothing_finished_and_leaves_no_temp_files(tiny_disk):
    run_dir = tiny_disk / "run"
    proc = run_cli("experiment=supervised_digits", "trainer.max_epochs=5", "checkpoint.every_s=0",
                   "trainer.enable_progress_bar=false", f"hydra.run.dir={run_dir}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in out, out[-3000:]
    warnings = [line for line in out.splitlines() if "not saved" in line]
    assert warnings and all("no space left on device" in line and str(run_dir / "checkpoints") in line for line in warnings)
    assert read_result(run_dir)["status"] == "ok" and (run_dir / "model.pt").is_file()
    assert sorted(p.name for p in run_dir.rglob("*.tmp")) == []
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["epoch"] == 0  # the one that fit


def test_a_killed_sweep_leaves_no_orphan_training(tmp_path):
    """kill -9 of the sweep's own process: its job's training process is told (SIGTERM), checkpoints, records
    `interrupted` with the sweep's resume command, and ends instead of training on unseen."""
    sweep = tmp_path / "sweep"
    proc = start("-m", *DQN, "seed=0", "task.total_steps=400000", "checkpoint.every_steps=1024", f"hydra.sweep.dir={sweep}")
    wait_for(lambda: any((checkpoint_step(d) or 0) >= 1024 for d in sweep.glob("0_*")), proc=proc, timeout=400)
    (job_dir,) = sweep.glob("0_*")
    child_pid = read_result(job_dir)["pid"]
    proc.kill()
    proc.wait()

    def child_gone() -> bool:
        try:
            os.kill(child_pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(child_gone, timeout=120)
    record = read_result(job_dir)
    assert record["status"] == "interrupted" and record["interrupted"]["signal"] == "SIGTERM", record.get("error")
    assert record["interrupted"]["resume"].endswith("resume=true") and record["checkpoint"]["step"] >= 1024


def test_a_resumed_sweep_leaves_a_job_still_running_alone_in_one_line(tmp_path):
    sweep = tmp_path / "sweep"
    args = ("-m", *DQN, "seed=0", "task.total_steps=400000", "checkpoint.every_steps=1024", f"hydra.sweep.dir={sweep}")
    first = start(*args)
    wait_for(lambda: any((checkpoint_step(d) or 0) >= 1024 for d in sweep.glob("0_*")), proc=first, timeout=400)
    try:
        again = run_cli(*args, "resume=true")
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=120)
    busy = [line for line in again.stdout.splitlines() if "still running in another process" in line]
    assert len(busy) == 1 and "not started again" in busy[0], again.stdout[-2000:]
    assert "Traceback" not in again.stdout + again.stderr and "RunRefused" not in again.stdout + again.stderr
    (job_dir,) = sweep.glob("0_*")
    assert read_result(job_dir)["status"] == "interrupted"  # the first process's record, untouched by the resume


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_sweep_training_in_its_own_process_stops_on_a_signal_instead_of_starting_the_next_job(tmp_path, sig):
    """isolate_jobs=false: the job trains in the sweep's process and takes the signal itself (saves, records
    `interrupted`). The sweep then stopped only that job and went on to the next one; a tuner worker cancelled
    by SLURM (SIGTERM) kept asking for trials. It stops now, with the resume command, as with child processes."""
    sweep = tmp_path / "sweep"
    proc = start("-m", *DQN, "seed=0,1", "task.total_steps=400000", "checkpoint.every_steps=1024", "isolate_jobs=false",
                 f"hydra.sweep.dir={sweep}")
    wait_for(lambda: any((checkpoint_step(d) or 0) >= 1024 for d in sweep.glob("0_*")), proc=proc)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == (130 if sig == signal.SIGINT else 143), out[-2000:]
    (first,) = sweep.glob("0_*")
    assert read_result(first)["status"] == "interrupted"
    assert not list(sweep.glob("1_*")), "the second job started after the stop"
    said = [line for line in out.splitlines() if line.startswith(f"sweep stopped by {sig.name}; finish it with: ")]
    assert len(said) == 1 and "resume=true" in said[0], out[-2000:]
    assert "Traceback" not in out

"""A fast start: help and config errors load no torch or Lightning; a run loads heavy packages only when it uses them.

Start-up time itself is measured, not asserted (docs/speed.md, "Start-up time"): these tests pin what is imported.
"""

import json
import os
import subprocess
import sys

import pytest

from pipeline_testing import ROOT

HEAVY = ("torch", "lightning", "wandb", "tensorboard", "matplotlib", "rliable", "sklearn", "ale_py", "optuna", "imageio", "scipy")

# Runs `python -m pipeline <args>` in this process and, at exit, writes which heavy packages got imported.
_PROBE = """
import atexit, json, runpy, sys
heavy, out = sys.argv[1].split(","), sys.argv[2]
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(h for h in heavy if h in sys.modules))))
sys.argv = ["pipeline", *sys.argv[3:]]
runpy.run_module("pipeline", run_name="__main__", alter_sys=True)
"""


def imported_by(tmp_path, *args: str) -> tuple[list[str], subprocess.CompletedProcess]:
    out = tmp_path / "imported.json"
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, ",".join(HEAVY), str(out), *args],
        capture_output=True, text=True, cwd=ROOT, timeout=300, env={**os.environ, "WANDB_MODE": "offline"},
    )
    return json.loads(out.read_text()), proc


def test_help_loads_no_torch(tmp_path):
    loaded, proc = imported_by(tmp_path, "--help")
    assert proc.returncode == 0 and "experiment:" in proc.stdout
    assert loaded == []


@pytest.mark.parametrize("bad", ["model=nope", "optimizer.lr=abc", "seed=1.5", "+trainer.precision=16-mixed"])
def test_config_errors_load_no_torch(tmp_path, bad):
    loaded, proc = imported_by(tmp_path, "experiment=dqn_cartpole", bad, f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert loaded == []


@pytest.mark.parametrize(("preset", "bad", "line"), [
    ("ppo_cartpole", "task.clip_coef=-0.2", "task.clip_coef=-0.2: must be a finite number > 0; e.g. task.clip_coef=0.2"),
    ("ppo_cartpole", "task.num_minibatches=3", "task.num_minibatches=3: does not divide the rollout of task.num_steps * "),
    ("ppo_cartpole", "device.precision=16-mixed", "device.precision=16-mixed: task=ppo trains only in 32-true"),
    ("ppo_cartpole", "env.id=NoSuchEnv-v0", "env.id=NoSuchEnv-v0 is not a registered gymnasium environment; e.g. "),
    ("dqn_cartpole", "env=pendulum", "task=dqn takes discrete actions, and env.id=Pendulum-v1 has Box(-2.0, 2.0, (1,), "),
    ("dqn_cartpole", "+trainer.accumulate_grad_batchs=4",
     "trainer.accumulate_grad_batchs is not a Lightning Trainer argument; did you mean trainer.accumulate_grad_batches?"),
])
def test_task_settings_are_refused_before_torch_loads(tmp_path, preset, bad, line):
    """The task's Config (ranges, rules, precisions, action spaces), the env id and the Trainer's keys: exit 2, one
    line naming the key, nothing written, neither torch nor Lightning imported."""
    loaded, proc = imported_by(tmp_path, f"experiment={preset}", bad, f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"error: {line}"), proc.stderr
    assert not {"torch", "lightning"} & set(loaded), loaded
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_run_loads_only_what_it_uses(tmp_path):
    loaded, proc = imported_by(tmp_path, "experiment=cem_cartpole", "trainer=debug", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    # matplotlib and scipy come with Lightning itself (torchmetrics imports them when installed).
    assert set(loaded) <= {"torch", "lightning", "matplotlib", "scipy"}, loaded
    assert {"torch", "lightning"} <= set(loaded)


def test_replay_entry_loads_no_lightning():
    proc = subprocess.run(
        [sys.executable, "-c", "import sys, pipeline.eval; print(sorted(m for m in ('lightning', 'wandb', 'matplotlib') if m in sys.modules))"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    assert proc.stdout.strip() == "[]", proc.stderr[-2000:]

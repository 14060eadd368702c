"""Each start-up check runs once per process: for a CLI run, a `pipeline.run` call and a sweep job's own process.

Every checker is wrapped with a counter wherever a module holds it (by name or as a module attribute), then one real
run trains (DQN, trainer=debug). Before the one front door (pipeline.config.startup.check_run), one CLI run of this
command ran check_values 3 times, check_missing and check_types 3, check_monitors 4, the merge of `task:` into its
Config 6 and plan_start 3.
"""

from __future__ import annotations

import collections
import functools
import json
import sys
import warnings

import pytest
from omegaconf import OmegaConf

import pipeline
from pipeline.config import checks, startup, task_settings
from pipeline.runtime import job, preflight, run, start

# (module holding the checker, its name, the label it is counted under)
CHECKERS = [
    (checks, "check_missing", "missing keys"),
    (checks, "check_types", "types"),
    (checks, "check_values", "values"),
    (checks, "check_monitors", "monitors"),
    (task_settings, "typed_node", "merges of task: into its Config"),
    (startup, "_check_declarations", "task declarations"),
    (startup, "_check_model", "model contract"),
    (startup, "check_run", "check_run"),
    (preflight, "plan_start", "run dir plans"),
    (preflight, "check_run_dir_is_ours", "run dir ownership"),
]
# Modules that import a checker by name: the counter replaces their reference too.
HOLDERS = [checks, task_settings, startup, start, run, job, preflight]
ONCE = {label: 1 for _, _, label in CHECKERS}


def counted_call(label: str, args: tuple, kwargs: dict) -> bool:
    """typed_node merges any group's node: the `task:` node's merges are the ones counted."""
    if label.startswith("merges of task"):
        return (args[1] if len(args) > 1 else kwargs.get("group")) == "task"
    return True


@pytest.fixture
def counts(monkeypatch):
    seen = collections.Counter()
    for module, name, label in CHECKERS:
        real = getattr(module, name)

        @functools.wraps(real)
        def counted(*args, _real=real, _label=label, **kwargs):
            seen[_label] += counted_call(_label, args, kwargs)
            return _real(*args, **kwargs)

        for holder in HOLDERS:
            if getattr(holder, name, None) is real:
                monkeypatch.setattr(holder, name, counted)
    return seen


@pytest.fixture
def process_state():
    """The CLI and a job's main set up the process they run in (signals, logging, warnings): put this one's back."""
    import logging
    import signal

    signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    root = logging.getLogger()
    level, handlers = root.level, root.handlers[:]
    with warnings.catch_warnings():
        yield
    for s, handler in signals.items():
        signal.signal(s, handler)
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.setLevel(level)
    root.handlers = handlers


def test_a_cli_run_checks_once(counts, tmp_path, monkeypatch, process_state):
    from hydra.core.singleton import Singleton

    from pipeline import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "argv", ["pipeline"])
    hydra_state = Singleton.get_state()
    try:
        with pytest.raises(SystemExit) as stop:
            # Hydra's logging left as it is: the test process keeps its own handlers.
            cli._main(["experiment=dqn_cartpole", "trainer=debug", f"hydra.run.dir={tmp_path / 'run'}",
                       "hydra/job_logging=none", "hydra/hydra_logging=none"])
    finally:
        Singleton.set_state(hydra_state)
    assert stop.value.code == 0
    assert json.loads((tmp_path / "run" / "result.json").read_text())["status"] == "ok"
    assert dict(counts) == ONCE


def test_a_pipeline_run_call_checks_once(counts, tmp_path):
    (record,) = pipeline.run("dqn_cartpole", ["trainer=debug", f"hydra.run.dir={tmp_path / 'run'}"])
    assert record["status"] == "ok"
    assert dict(counts) == ONCE


def test_a_sweep_jobs_process_checks_once(counts, tmp_path, make_cfg, process_state):
    """The job's own process (`python -m pipeline.runtime.job <dir>`, run here by its main) from the files the sweep's
    process writes for it: the config it checked, resolved, and the job's context."""
    from pipeline.runtime.context import JobContext

    run_dir = tmp_path / "sweep" / "0_seed=0"
    job_dir = run_dir / job.JOB_DIR
    job_dir.mkdir(parents=True)
    cfg = make_cfg("experiment=dqn_cartpole", "trainer=debug")
    OmegaConf.save(cfg, job_dir / "config.yaml", resolve=True)
    ctx = JobContext(run_dir=str(run_dir), multirun=True, overrides=["seed=0"], sweep_dir=str(run_dir.parent), job_num=0,
                     isolated=True, choices={"experiment": "dqn_cartpole", "task": "dqn", "env": "cartpole"})
    (job_dir / "context.json").write_text(json.dumps(ctx.__dict__))
    assert job.child_main(str(job_dir)) == 0
    assert json.loads((run_dir / "result.json").read_text())["status"] == "ok"
    assert dict(counts) == ONCE

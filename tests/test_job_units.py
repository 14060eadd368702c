"""runtime/job.py without a sweep: the child process stood in for by an object that writes (or does not write) the
job's records and returns an exit code; signals sent to this process while the stand-in "runs"; records by hand.
tests/test_durable.py and tests/test_sweep.py run the real thing (slow)."""

from __future__ import annotations

import ctypes
import io
import json
import logging
import os
import signal
import sys

import pytest
from omegaconf import OmegaConf

from pipeline.config.grouping import group_name, semantic_config
from pipeline.runtime import job
from pipeline.runtime.context import JobContext
from pipeline.store.record import RunRecord, read_record


def cfg_of(seed=3, k=None, **extra):
    node = {"name": "exp", "seed": seed, "task": {"_target_": "pipeline.tasks.ppo.PPOTask", "lr": 0.1}, **extra}
    if k is not None:
        node["seeds_per_process"] = k
    return OmegaConf.create(node)


@pytest.fixture(autouse=True)
def checked_as_given(monkeypatch):
    """The start-up check stood in for: these configs are the job's plumbing only (tests/config/ checks real ones)."""
    from pipeline.config.startup import CheckedRun

    def check_run(cfg, choices=None):
        k = cfg.get("seeds_per_process") or 1
        k = k if isinstance(k, int) and k > 0 else 1
        return CheckedRun(cfg=cfg, choices=dict(choices or {}), task_target=str(cfg.task._target_), task=None,
                          uses=frozenset(), seeds=tuple(int(cfg.seed) + i for i in range(k)), processes=1)

    monkeypatch.setattr(job, "check_run", check_run)


def ctx_of(run_dir, multirun=True):
    return JobContext(run_dir=str(run_dir), multirun=multirun, overrides=["seed=3"], sweep_dir=str(run_dir.parent),
                      job_num=4)


def record(run_dir, seed, status="failed", **fields):
    r = RunRecord(experiment="exp", group="g", task="PPOTask", seed=seed, run_dir=str(run_dir), versions=None,
                  git_commit=None, status=status, **fields)
    run_dir.mkdir(parents=True, exist_ok=True)
    r.write()
    return r


@pytest.mark.parametrize(("k", "agents"), [(None, 1), (0, 1), (-2, 1), (1, 1), (3, 3), ("2", 1), (2.0, 1)])
def test_agents_is_seeds_per_process_when_a_positive_int(k, agents):
    assert job._agents(cfg_of(k=k)) == agents


def test_read_job_records_reads_each_agents_dir(tmp_path):
    assert job.read_job_records(tmp_path, 1, 3) == []
    record(tmp_path, 3, status="ok")
    assert [r.seed for r in job.read_job_records(tmp_path, 1, 3)] == [3]
    record(tmp_path / "seed5", 5)
    assert [r.seed for r in job.read_job_records(tmp_path, 3, 3)] == [5]  # seeds 3 and 4 wrote nothing


def test_mark_dead_says_how_and_where_the_checkpoint_is(tmp_path):
    r = record(tmp_path / "a", 1, checkpoint={"step": 120})
    job.mark_dead(r, "killed by SIGKILL", "python -m pipeline resume=true")
    again = read_record(tmp_path / "a")
    assert (again.status, again.error) == ("failed", "the training process was killed by SIGKILL; its checkpoint holds step 120")
    assert again.to_dict()["ended_by"] == "killed by SIGKILL"
    assert again.to_dict()["resume_command"] == "python -m pipeline resume=true"
    r = record(tmp_path / "b", 1, checkpoint={"step": 0})
    assert job.mark_dead(r, "x", "c").error.endswith("its checkpoint holds step 0")
    r = record(tmp_path / "c", 1)
    assert job.mark_dead(r, "x", "c").error == "the training process was x; no checkpoint was written yet"
    r = record(tmp_path / "d", 1, checkpoint={"path": "p"})
    assert job.mark_dead(r, "x", "c").error.endswith("no checkpoint was written yet")
    stopped = record(tmp_path / "f", 1, status="interrupted")
    assert job.mark_dead(stopped, "x", "c").status == "failed" and read_record(tmp_path / "f").status == "failed"
    done = record(tmp_path / "e", 1, status="ok", error=None)
    assert job.mark_dead(done, "x", "c").status == "ok" and read_record(tmp_path / "e").error is None


def test_skeletons_for_the_agents_that_wrote_nothing(tmp_path):
    cfg = cfg_of(seed=3, k=3, lr=0.5, task_lr="${lr}")
    ctx = ctx_of(tmp_path)
    have = [record(tmp_path / "seed4", 4)]
    out = job._with_skeletons(have, cfg, ctx)
    assert [r.seed for r in out] == [4, 3, 5] and out[0] is have[0]
    skeleton = out[1]
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert (skeleton.experiment, skeleton.task, skeleton.run_dir) == ("exp", "PPOTask", str(tmp_path / "seed3"))
    assert skeleton.group == group_name(resolved, "exp") and skeleton.config == semantic_config(resolved)
    assert skeleton.config["task_lr"] == 0.5  # resolved
    assert (skeleton.seeds_per_process, skeleton.agent, out[2].agent) == (3, 0, 2)
    assert skeleton.versions is None and skeleton.git_commit is None
    assert (tmp_path / "seed3").is_dir() and (tmp_path / "seed5").is_dir()
    # No name, no task target: empty strings, not "None".
    bare = job._with_skeletons([], OmegaConf.create({"seed": 0}), ctx_of(tmp_path / "bare"))
    assert (bare[0].experiment, bare[0].task, bare[0].seeds_per_process) == ("", "", 1)
    assert bare[0].run_dir == str(tmp_path / "bare") and bare[0].group == group_name({"seed": 0}, "")
    # A run dir not made yet: made, with the agents' dirs.
    deep = job._with_skeletons([], cfg_of(k=2), ctx_of(tmp_path / "new" / "job"))
    assert [r.run_dir for r in deep] == [str(tmp_path / "new" / "job" / "seed3"), str(tmp_path / "new" / "job" / "seed4")]
    assert (tmp_path / "new" / "job" / "seed4").is_dir()


def test_a_lost_job_that_never_started_gets_a_record_per_agent(tmp_path):
    cfg = cfg_of(seed=3, k=2, lr=0.5, task_lr="${lr}")
    (tmp_path / "seed3").mkdir()  # a job that made its dir and died before writing a record
    out = job.record_lost_job(cfg, tmp_path, "cancelled by SLURM", "python -m pipeline -m resume=true")
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert [r["seed"] for r in out] == [3, 4] and [r["agent"] for r in out] == [0, 1]
    for r, d in zip(out, (tmp_path / "seed3", tmp_path / "seed4")):
        assert read_record(d).to_dict() == r and r["run_dir"] == str(d)
        assert (r["status"], r["error"]) == ("failed", "the job was cancelled by SLURM before the run started")
        assert (r["ended_by"], r["resume_command"]) == ("cancelled by SLURM", "python -m pipeline -m resume=true")
        assert (r["experiment"], r["task"], r["seeds_per_process"]) == ("exp", "PPOTask", 2)
        assert r["group"] == group_name(resolved, "exp") and r["config"] == semantic_config(resolved)
        assert r["versions"] is None and r["git_commit"] is None
    assert out[0]["config"]["task_lr"] == 0.5  # resolved
    (one,) = job.record_lost_job(cfg_of(seed=7), tmp_path / "one", "lost", "c")
    assert one["run_dir"] == str(tmp_path / "one") and one["seed"] == 7
    two = job.record_lost_job(cfg_of(seed=1, k=2), tmp_path / "not" / "made", "lost", "c")
    assert [r["run_dir"] for r in two] == [str(tmp_path / "not" / "made" / "seed1"), str(tmp_path / "not" / "made" / "seed2")]


def test_a_lost_job_with_records_marks_them_and_groups_an_early_skeleton(tmp_path):
    cfg = cfg_of(seed=3, k=2, lr=0.5, task_lr="${lr}")
    record(tmp_path / "seed3", 3, checkpoint={"step": 9})  # an early skeleton: no config yet
    record(tmp_path / "seed4", 4, status="ok", error=None, config={"x": 1})
    out = job.record_lost_job(cfg, tmp_path, "killed", "python -m pipeline -m resume=true")
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert out[0]["error"] == "the training process was killed; its checkpoint holds step 9"
    assert out[0]["config"] == semantic_config(resolved) and out[0]["group"] == group_name(resolved, "exp")
    assert out[0]["config"]["task_lr"] == 0.5 and out[0]["resume_command"] == "python -m pipeline -m resume=true"
    assert out[1]["status"] == "ok" and out[1]["config"] == {"x": 1} and out[1]["group"] == "g"
    assert read_record(tmp_path / "seed3").config == semantic_config(resolved)
    record(tmp_path / "x" / "seed3", 3, config={"y": 2})  # a record with its config keeps it
    (kept, _) = job.record_lost_job(cfg, tmp_path / "x", "killed", "c") + [None]
    assert kept["config"] == {"y": 2} and kept["group"] == "g"
    record(tmp_path / "y" / "seed3", 3, status="ok", error=None)  # a finished record without a config stays as it is
    (ok, _) = job.record_lost_job(cfg, tmp_path / "y", "killed", "c") + [None]
    assert ok["config"] is None and ok["group"] == "g" and ok["status"] == "ok"


def test_relay_prints_each_lines_last_state(capsys):
    job._relay(io.BytesIO(b"one\n10%\r50%\r100%\n   \n\xffbad\ntail  \nboX\ntwo"))
    assert capsys.readouterr().out.splitlines() == ["one", "100%", "\ufffdbad", "tail  ", "boX", "two"]


def test_stop_with_parent_asks_the_kernel_for_sigterm():
    libc = ctypes.CDLL(None, use_errno=True)
    value = ctypes.c_int(0)
    try:
        job._stop_with_parent()
        libc.prctl(2, ctypes.byref(value))  # PR_GET_PDEATHSIG
        assert value.value == signal.SIGTERM
    finally:
        libc.prctl(1, 0)


def test_log_to_sends_info_to_the_console_and_the_file(tmp_path, capsys):
    root = logging.getLogger()
    saved = (root.level, root.handlers[:])
    quiet = [logging.getLogger(n) for n in ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda")]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.NOTSET)
    try:
        job._log_to(tmp_path / "run.log")
        logging.getLogger("pipeline.x").info("hello")
        logging.getLogger("lightning.pytorch.utilities.rank_zero").info("quiet")
        logging.getLogger("lightning.pytorch.accelerators.cuda").info("quiet too")
        for h in root.handlers:
            h.flush()
        assert root.level == logging.INFO and len(root.handlers) == 2
        assert capsys.readouterr().out == "hello\n"
        text = (tmp_path / "run.log").read_text()
        assert "][pipeline.x][INFO] - hello" in text and text.startswith("[") and "quiet" not in text
        assert root.handlers[0].formatter._fmt == "%(message)s"
        assert [q.level for q in quiet] == [logging.WARNING, logging.WARNING]
    finally:
        for q, level in zip(quiet, levels):
            q.setLevel(level)
        for h in root.handlers:
            h.close()
        root.setLevel(saved[0])
        root.handlers = saved[1]


class StandInChild:
    """What subprocess.Popen returns; `during_wait` runs while the parent waits (writes records, sends signals)."""

    made: list = []

    def __init__(self, rc, during_wait=None, stdout=None):
        self.rc, self.during_wait, self.stdout, self.signals, self.done = rc, during_wait, stdout, [], False

    def __call__(self, args, **kwargs):
        self.args, self.kwargs = args, kwargs
        StandInChild.made.append(self)
        return self

    def wait(self):
        if self.during_wait:
            self.during_wait(self)
        self.done = True
        return self.rc

    def poll(self):
        return self.rc if self.done else None

    def send_signal(self, signum):
        self.signals.append(signum)


def run_child(monkeypatch, tmp_path, rc, during_wait=None, cfg=None, stdout=None):
    child = StandInChild(rc, during_wait, stdout)
    monkeypatch.setattr(job.subprocess, "Popen", child)
    return child, job.run_in_child(cfg or cfg_of(seed=3), ctx_of(tmp_path / "job"))


def test_the_child_gets_the_config_and_context_and_its_records_come_back(tmp_path, monkeypatch):
    run_dir = tmp_path / "job"
    handlers = []

    def finish(child):
        handlers.extend(signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2))
        record(run_dir, 3, status="ok", error=None)

    child, out = run_child(monkeypatch, tmp_path, 0, finish)
    # While the child runs, this process forwards Ctrl-C, SIGTERM and SIGUSR2 to it.
    assert [getattr(h, "__name__", h) for h in handlers] == ["forward"] * 3
    job_dir = run_dir / ".pipeline"
    assert child.args == [sys.executable, "-m", "pipeline.runtime.job", str(job_dir)]
    assert child.kwargs["start_new_session"] is True and child.kwargs["preexec_fn"] is job._stop_with_parent
    assert "stdout" not in child.kwargs
    assert OmegaConf.load(job_dir / "config.yaml") == cfg_of(seed=3)
    context = json.loads((job_dir / "context.json").read_text())
    assert context["isolated"] is True and context["run_dir"] == str(run_dir) and context["job_num"] == 4
    assert [r["status"] for r in out] == ["ok"] and out[0]["seed"] == 3


def test_config_is_saved_resolved(tmp_path, monkeypatch):
    cfg = cfg_of(seed=3, lr=0.5, other="${lr}")
    run_child(monkeypatch, tmp_path, 0, lambda c: record(tmp_path / "job", 3, status="ok"), cfg=cfg)
    assert "${" not in (tmp_path / "job" / ".pipeline" / "config.yaml").read_text()


@pytest.mark.parametrize(("rc", "how"), [
    (-9, "killed by SIGKILL"), (-15, "killed by SIGTERM"), (130, "stopped by SIGINT before it started"),
    (143, "stopped by SIGTERM before it started"), (0, "ended with exit code 0 before it wrote a record"),
    (1, "ended with exit code 1 before it wrote a record"), (2, "ended with exit code 2 before it wrote a record"),
    (3, "exited with code 3"), (137, "exited with code 137"),
])
def test_a_child_that_wrote_no_record_gets_one_saying_how_it_ended(tmp_path, monkeypatch, capsys, rc, how):
    _, out = run_child(monkeypatch, tmp_path, rc)
    (r,) = out
    assert (r["status"], r["ended_by"], r["seed"]) == ("failed", how, 3)
    assert r["error"] == f"the training process was {how}; no checkpoint was written yet"
    resume = ctx_of(tmp_path / "job").resume_command()
    assert r["resume_command"] == resume and read_record(tmp_path / "job").status == "failed"
    assert capsys.readouterr().out == f"[job 4] seed=3: the training process was {how}; finish with: {resume}\n"


def test_a_crashed_child_keeps_what_its_agents_wrote(tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "job"
    written = lambda c: (record(run_dir / "seed3", 3, checkpoint={"step": 5}), record(run_dir / "seed4", 4, status="ok"))  # noqa: E731
    _, out = run_child(monkeypatch, tmp_path, -11, written, cfg=cfg_of(seed=3, k=3))
    assert [(r["seed"], r["status"]) for r in out] == [(3, "failed"), (4, "ok"), (5, "failed")]
    assert out[0]["error"] == "the training process was killed by SIGSEGV; its checkpoint holds step 5"
    # A child that ended normally with every record is taken at its word.
    _, out = run_child(monkeypatch, tmp_path, 1, cfg=cfg_of(seed=3, k=3))
    assert [r.get("ended_by") for r in out] == ["killed by SIGSEGV", None, "killed by SIGSEGV"]
    # A normal exit with a record missing: a skeleton for it.
    (run_dir / "seed5" / "result.json").unlink()
    _, out = run_child(monkeypatch, tmp_path, 0, cfg=cfg_of(seed=3, k=3))
    assert out[2]["ended_by"] == "ended with exit code 0 before it wrote a record"


@pytest.mark.parametrize("rc", [0, 1, 2, 130, 143])
def test_a_child_that_ended_with_its_records_is_taken_at_its_word(tmp_path, monkeypatch, capsys, rc):
    import threading

    failed = []
    monkeypatch.setattr(threading, "excepthook", failed.append)
    _, out = run_child(monkeypatch, tmp_path, rc, lambda c: record(tmp_path / "job", 3, status="interrupted"))
    assert [r["status"] for r in out] == ["interrupted"] and "ended_by" not in out[0]
    said = capsys.readouterr()
    assert said.out == "" and said.err == "" and failed == []  # nothing printed, no relay thread on a missing pipe


def test_a_job_run_from_another_thread_leaves_signals_to_the_launcher(tmp_path, monkeypatch):
    import threading

    out = []
    thread = threading.Thread(target=lambda: out.append(run_child(monkeypatch, tmp_path, 0, lambda c: record(
        tmp_path / "job", 3, status="ok"))[1]))
    thread.start()
    thread.join()
    assert [r["status"] for r in out[0]] == ["ok"]


def test_a_busy_run_dir_is_left_alone(tmp_path, monkeypatch, capsys):
    _, out = run_child(monkeypatch, tmp_path, job.BUSY_EXIT)
    assert out == [] and not (tmp_path / "job" / "result.json").exists()
    said = capsys.readouterr().out
    assert said == (f"[job 4] seed=3: still running in another process ({tmp_path / 'job'} is locked); not started "
                    "again: resume the sweep when it has ended\n")
    record(tmp_path / "job", 3)
    _, out = run_child(monkeypatch, tmp_path, 75)
    assert [r["status"] for r in out] == ["failed"] and "ended_by" not in out[0]


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stop_signal_is_forwarded_once_and_stops_the_sweep(tmp_path, monkeypatch, capsys, signum, code):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)}

    def interrupted(child):
        os.kill(os.getpid(), signum)
        record(tmp_path / "job", 3, status="interrupted")

    with pytest.raises(SystemExit) as stop:
        child, _ = run_child(monkeypatch, tmp_path, code, interrupted)
    assert stop.value.code == code
    (child,) = StandInChild.made[-1:]
    assert child.signals == [signum]
    assert {s: signal.getsignal(s) for s in before} == before  # the handlers are put back
    name = signal.Signals(signum).name
    assert capsys.readouterr().out.endswith(f"sweep stopped by {name}; finish it with: "
                                            f"{ctx_of(tmp_path / 'job').resume_command()}\n")


def test_a_signal_after_the_child_ended_is_not_forwarded(tmp_path, monkeypatch):
    def late(child):
        child.done = True
        os.kill(os.getpid(), signal.SIGTERM)
        record(tmp_path / "job", 3, status="ok")

    with pytest.raises(SystemExit):
        run_child(monkeypatch, tmp_path, 0, late)
    assert StandInChild.made[-1].signals == []


def test_sigusr2_is_forwarded_then_the_job_requeued_without_stopping_the_sweep(tmp_path, monkeypatch, caplog):
    requeued = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: requeued.append((signum, frame)))
    try:
        def warned(child):
            os.kill(os.getpid(), signal.SIGUSR2)
            record(tmp_path / "job", 3, status="interrupted", checkpoint={"step": 2})

        with caplog.at_level(logging.INFO, logger="pipeline"):
            child, out = run_child(monkeypatch, tmp_path, 0, warned)
        assert child.signals == [signal.SIGUSR2] and requeued == [(signal.SIGUSR2, None)]
        assert "[job 4] seed=3: checkpoint saved after SIGUSR2 (exit 0); requeueing" in caplog.messages
        assert [r["status"] for r in out] == ["interrupted"]
        # No requeue handler (SIG_DFL is no function): nothing to call.
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        run_child(monkeypatch, tmp_path, 0, lambda c: os.kill(os.getpid(), signal.SIGUSR2))
        assert StandInChild.made[-1].signals == [signal.SIGUSR2] and len(requeued) == 1
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_a_relayed_childs_output_is_printed_here(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(job.RELAY_ENV, "1")
    child, _ = run_child(monkeypatch, tmp_path, 0, lambda c: record(tmp_path / "job", 3, status="ok"),
                         stdout=io.BytesIO(b"epoch 1\rtraining done\n"))
    assert child.kwargs["stdout"] is job.subprocess.PIPE and child.kwargs["stderr"] is job.subprocess.STDOUT
    assert capsys.readouterr().out == "training done\n"
    monkeypatch.setenv(job.RELAY_ENV, "0")
    child, _ = run_child(monkeypatch, tmp_path, 0)
    assert "stdout" not in child.kwargs


def test_hydra_job_runs_a_single_run_here_and_a_sweeps_job_in_a_child(tmp_path, monkeypatch):
    import pipeline.runtime.run as run_module

    calls = []
    monkeypatch.setattr(run_module, "run_job", lambda run, ctx, **kw: calls.append(("here", ctx.multirun, run.cfg)) or [{"status": "ok"}])
    monkeypatch.setattr(job, "run_in_child", lambda cfg, ctx: calls.append(("child", ctx.multirun, cfg)) or [{"status": "child"}])
    cfgs = []
    for multirun, extra in ((False, {}), (True, {}), (True, {"isolate_jobs": False}), (False, {"isolate_jobs": True})):
        # The context comes from the job's config (Hydra's, here its seed names the dir).
        monkeypatch.setattr(JobContext, "from_hydra", classmethod(lambda cls, cfg, m=multirun: ctx_of(tmp_path / str(cfg.seed), m)))
        cfgs.append(cfg_of(**extra))
        job.hydra_job(cfgs[-1])
    assert calls == [("here", False, cfgs[0]), ("child", True, cfgs[1]), ("here", True, cfgs[2]), ("here", False, cfgs[3])]
    assert all(c[2] is cfg for c, cfg in zip(calls, cfgs))


def test_a_resumed_sweep_skips_a_job_that_finished_ok(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(job, "run_in_child", lambda cfg, ctx: [{"status": "ran"}])
    monkeypatch.setattr(JobContext, "from_hydra", classmethod(lambda cls, cfg: ctx_of(tmp_path / "j")))
    record(tmp_path / "j" / "seed3", 3, status="ok")
    assert [r["status"] for r in job.hydra_job(cfg_of(k=2, resume=True))] == ["ran"]  # seed 4 has no record
    record(tmp_path / "j" / "seed4", 4, status="failed")
    assert [r["status"] for r in job.hydra_job(cfg_of(k=2, resume=True))] == ["ran"]
    record(tmp_path / "j" / "seed4", 4, status="ok")
    with caplog.at_level(logging.INFO, logger="pipeline"):
        assert [r["seed"] for r in job.hydra_job(cfg_of(k=2, resume=True))] == [3, 4]
    assert caplog.messages == [f"resume: {tmp_path / 'j'} already finished ok, skipping"]
    assert [r["status"] for r in job.hydra_job(cfg_of(k=2))] == ["ran"]  # not resuming: run again
    monkeypatch.setattr(JobContext, "from_hydra", classmethod(lambda cls, cfg: ctx_of(tmp_path / "j", multirun=False)))
    import pipeline.runtime.run as run_module

    monkeypatch.setattr(run_module, "run_job", lambda run, ctx, **kw: [{"status": "single"}])
    assert [r["status"] for r in job.hydra_job(cfg_of(k=2, resume=True))] == ["single"]


@pytest.mark.parametrize(("signal_name", "code"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_job_in_the_sweeps_process_stopped_by_a_signal_stops_the_sweep(tmp_path, monkeypatch, capsys, signal_name, code):
    import pipeline.runtime.run as run_module

    records = [{"status": "ok"}, {"status": "interrupted", "interrupted": {"signal": signal_name}}]
    monkeypatch.setattr(run_module, "run_job", lambda run, ctx, **kw: records)
    monkeypatch.setattr(JobContext, "from_hydra", classmethod(lambda cls, cfg: ctx_of(tmp_path)))
    with pytest.raises(SystemExit) as stop:
        job.hydra_job(cfg_of(isolate_jobs=False))
    assert stop.value.code == code
    assert capsys.readouterr().out == f"sweep stopped by {signal_name}; finish it with: {ctx_of(tmp_path).resume_command()}\n"
    # SIGUSR2 (a requeue), or an interrupted record of a single run: no stop.
    records[1]["interrupted"]["signal"] = "SIGUSR2"
    assert job.hydra_job(cfg_of(isolate_jobs=False)) == records
    records[1]["interrupted"]["signal"] = signal_name
    records[1]["status"] = "failed"
    assert job.hydra_job(cfg_of(isolate_jobs=False)) == records
    records[1]["status"] = "interrupted"
    monkeypatch.setattr(JobContext, "from_hydra", classmethod(lambda cls, cfg: ctx_of(tmp_path, multirun=False)))
    assert job.hydra_job(cfg_of()) == records
    records[1]["interrupted"] = None
    monkeypatch.setattr(JobContext, "from_hydra", classmethod(lambda cls, cfg: ctx_of(tmp_path)))
    assert job.hydra_job(cfg_of(isolate_jobs=False)) == records


def child_dir(tmp_path, cfg=None):
    job_dir = tmp_path / "run" / ".pipeline"
    job_dir.mkdir(parents=True)
    (job_dir / "context.json").write_text(json.dumps({"run_dir": str(tmp_path / "run"), "multirun": True, "job_num": 2}))
    OmegaConf.save(cfg or cfg_of(), job_dir / "config.yaml")
    return job_dir


@pytest.fixture
def child_process_state():
    """child_main sets up the process it runs in (signals, logging): put this one's back afterwards."""
    signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    root = logging.getLogger()
    saved = (root.level, root.handlers[:])
    yield
    for s, handler in signals.items():
        signal.signal(s, handler)
    for h in root.handlers:
        if h not in saved[1]:
            h.close()
    root.setLevel(saved[0])
    root.handlers = saved[1]


def test_child_main_runs_the_job_from_its_files_and_exits_with_its_code(tmp_path, monkeypatch, child_process_state):
    import pipeline.runtime.run as run_module

    seen = []
    monkeypatch.setattr(run_module, "run_job", lambda run, ctx, **kw: seen.append((run.cfg, ctx)) or [{"status": "failed"}])
    job_dir = child_dir(tmp_path, cfg_of(seed=5))
    assert job.child_main(str(job_dir)) == 1
    ((cfg, ctx),) = seen
    assert cfg == cfg_of(seed=5) and ctx == JobContext(run_dir=str(tmp_path / "run"), multirun=True, job_num=2)
    assert (tmp_path / "run" / "run.log").is_file()  # its log goes to the run dir
    assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)  # stop signals honoured at once
    monkeypatch.setattr(run_module, "run_job", lambda run, ctx, **kw: [{"status": "ok"}])
    assert job.child_main(str(job_dir)) == 0


def test_child_main_refused_says_why_and_tells_a_busy_dir_apart(tmp_path, monkeypatch, capsys, child_process_state):
    import pipeline.runtime.run as run_module
    from pipeline.runtime.preflight import RunRefused
    from pipeline.runtime.rundir import RunDirBusy

    def refuse(message, busy):
        def run_job(run, ctx, **kw):
            if busy:
                try:
                    raise RunDirBusy("owned")
                except RunDirBusy:
                    raise RunRefused(message) from None
            raise RunRefused(message)
        return run_job

    job_dir = child_dir(tmp_path)
    monkeypatch.setattr(run_module, "run_job", refuse("the config changed; resume with the old one", False))
    assert job.child_main(str(job_dir)) == 2
    assert capsys.readouterr().err == "error: the config changed; resume with the old one\n"
    monkeypatch.setattr(run_module, "run_job", refuse("run dir taken", True))
    assert job.child_main(str(job_dir)) == job.BUSY_EXIT
    monkeypatch.setattr(run_module, "run_job", refuse("/x is in use by process 12", False))
    assert job.child_main(str(job_dir)) == job.BUSY_EXIT

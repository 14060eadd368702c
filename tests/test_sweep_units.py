"""The sweep callback's parts (pipeline.sweep) called in-process on configs, records and job returns made by hand.

test_sweep's slow tests run real sweeps end to end; here each step's output (the resume command, the refusal of a
changed resume, the per-job lines and progress files, the unfinished runs) is written out by hand.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipeline import sweep
from pipeline.runtime.context import exit_status
from pipeline.sweep import SweepReportCallback, _comparable, _key, _multirun, sweep_command, unfinished_runs


def test_key_is_the_override_name_without_add_or_remove_marks():
    assert _key("+task.gamma=0.5") == "task.gamma"
    assert _key("~scheduler") == "scheduler"
    assert _key("++a=b=c") == "a"
    assert _key("seed=range(0,3)") == "seed"


def test_comparable_drops_the_overrides_a_resume_may_change():
    given = ["seed=1,2", "resume=true", "hydra.sweep.dir=/x", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
             "device.num_threads=2", "logger=wandb", "logger.wandb.project=p", "~scheduler", "+task.gamma=0.5",
             "name=a=b"]
    assert _comparable(given) == {"seed": "1,2", "scheduler": "", "task.gamma": "0.5", "name": "a=b"}
    # Only names starting with a free one are free: device.accelerator is not device.num_threads.
    assert _comparable(["device.accelerator=cpu"]) == {"device.accelerator": "cpu"}


def _config(tmp_path: Path, task: list[str], hydra: list[str] | None = None, **more) -> OmegaConf:
    return OmegaConf.create({
        "hydra": {"overrides": {"hydra": hydra or [], "task": task}, "sweep": {"dir": str(tmp_path)},
                  "mode": "RunMode.MULTIRUN", "job": {"num": 3}},
        **more,
    })


def test_sweep_command_repeats_the_overrides_with_the_dir_and_resume(tmp_path):
    config = _config(tmp_path / "my sweep", ["seed=range(0,3)", "resume=false", "hydra.sweep.dir=/old", "name=a b",
                                             "+hydra.run.dir=x", "hydra.mode=MULTIRUN"],
                     hydra=["hydra/launcher=joblib", "hydra.run.dir=y"])
    assert sweep_command(config) == (
        f"python -m pipeline -m hydra/launcher=joblib 'seed=range(0,3)' 'name=a b' "
        f"hydra.sweep.dir='{tmp_path / 'my sweep'}' resume=true")


def test_multirun_is_hydras_multirun_mode_only():
    assert _multirun(OmegaConf.create({"hydra": {"mode": "RunMode.MULTIRUN"}})) is True
    assert _multirun(OmegaConf.create({"hydra": {"mode": "RunMode.RUN"}})) is False
    assert _multirun(OmegaConf.create({"hydra": {"mode": None}})) is False


def _saved(tmp_path: Path, task: list[str]) -> None:
    tmp_path.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create({"hydra": {"overrides": {"task": task}}}), tmp_path / "multirun.yaml")


def test_a_resume_with_other_overrides_is_refused_in_one_line(tmp_path, capsys):
    _saved(tmp_path, ["optimizer.lr=0.1", "seed=range(0,3)", "a=1", "b=1", "c=1", "d=1"])
    changed = _config(tmp_path, ["optimizer.lr=0.2", "seed=range(0,3)", "e=1", "resume=true"], resume=True)
    with pytest.raises(SystemExit) as info:
        SweepReportCallback()._refuse_changed_resume(changed)
    assert info.value.code == 2
    # The first five differing keys, sorted; '-' where one side does not set it.
    assert capsys.readouterr().err == (
        f"error: resume of {tmp_path} with other overrides than it was made with: a (1 -> -), b (1 -> -), "
        "c (1 -> -), d (1 -> -), e (- -> 1); resume with the same overrides, or start a new sweep dir\n")


def test_a_resume_with_the_same_overrides_or_no_resume_goes_on(tmp_path, capsys):
    _saved(tmp_path, ["optimizer.lr=0.1", "resume=false", "logger=csv"])
    same = _config(tmp_path, ["optimizer.lr=0.1", "resume=true", "logger=wandb", "hydra.sweep.dir=z"], resume=True)
    SweepReportCallback()._refuse_changed_resume(same)
    not_resumed = _config(tmp_path, ["optimizer.lr=0.5"], resume=False)
    SweepReportCallback()._refuse_changed_resume(not_resumed)
    # resume=true into a dir without a saved sweep: a new sweep.
    SweepReportCallback()._refuse_changed_resume(_config(tmp_path / "new", ["optimizer.lr=0.5"], resume=True))
    assert capsys.readouterr().err == ""


def _job_file(sweep_dir: Path, num: int) -> dict:
    return json.loads((sweep_dir / ".progress" / f"job{num}.json").read_text())


def test_on_job_start_marks_the_job_started_in_a_multirun_only(tmp_path):
    callback = SweepReportCallback()
    callback.on_job_start(_config(tmp_path, []))
    assert set(_job_file(tmp_path, 3)) == {"started"}
    run = _config(tmp_path / "single", [])
    run.hydra.mode = "RunMode.RUN"
    callback.on_job_start(run)
    assert not (tmp_path / "single").exists()


class _Return:
    def __init__(self, value=None, error=None, num=4):
        self.value, self.error = value, error
        self.hydra_cfg = OmegaConf.create({"hydra": {"job": {"num": num}}})

    @property
    def return_value(self):
        if self.error is not None:
            raise self.error
        return self.value


def _record(seed, status, value=0.5):
    return {"seed": seed, "status": status, "primary_metric": "test/acc", "metrics": {"test/acc": value},
            "wall_time_s": 3.0, "run_dir": f"/runs/{seed}"}


class _Progress:
    def __init__(self):
        self.updates = 0

    def update(self):
        self.updates += 1


@pytest.mark.parametrize(("value", "status", "lines"), [
    (_record(1, "ok"), "ok", ["[job 3] seed=1 ok test/acc=0.5 in 3.0 s -> /runs/1"]),
    ([_record(1, "ok"), _record(2, "interrupted"), _record(3, "failed")], "interrupted",
     ["[job 3] seed=1 ok test/acc=0.5 in 3.0 s -> /runs/1", "[job 3] seed=2 interrupted test/acc=0.5 in 3.0 s -> /runs/2",
      "[job 3] seed=3 failed test/acc=0.5 in 3.0 s -> /runs/3"]),
    ([], "failed", []),
    (None, "failed", []),
])
def test_on_job_end_prints_each_record_and_writes_the_jobs_status(tmp_path, capsys, value, status, lines):
    callback = SweepReportCallback()
    callback._progress = _Progress()
    callback.on_job_end(_config(tmp_path, []), _Return(value))
    assert capsys.readouterr().out.splitlines() == lines
    assert _job_file(tmp_path, 3)["status"] == status
    assert callback._progress.updates == 1


def test_after_a_stop_a_job_that_did_not_run_is_not_started_not_failed(tmp_path, capsys):
    from pipeline.sweep_progress import job_started, read_snapshot, start_sweep

    start_sweep(tmp_path, 3)
    callback = SweepReportCallback()
    job_started(tmp_path, 3, now=100.0)  # job 3 ran before the stop, and was interrupted
    (tmp_path / ".stop").write_text("SIGTERM")
    os.utime(tmp_path / ".stop", (200.0, 200.0))
    callback.on_job_end(_config(tmp_path, []), _Return([_record(1, "interrupted")]))
    assert _job_file(tmp_path, 3)["status"] == "interrupted"
    # Job 4 handed over after the stop: it saw .stop and returned its earlier attempt's record (or none).
    job_started(tmp_path, 4, now=300.0)
    config = _config(tmp_path, [])
    config.hydra.job.num = 4
    callback.on_job_end(config, _Return([_record(2, "failed")]))
    assert _job_file(tmp_path, 4)["status"] == "not started"
    config.hydra.job.num = 5  # no record at all, and no start written
    callback.on_job_end(config, _Return([]))
    assert _job_file(tmp_path, 5)["status"] == "not started"
    assert read_snapshot(tmp_path).line() == "[1/3 done, 0 running, 0 failed, 1 interrupted, 2 not started]"
    # Without a stop request, a job without records failed.
    (tmp_path / ".stop").unlink()
    config.hydra.job.num = 6
    callback.on_job_end(config, _Return([]))
    assert _job_file(tmp_path, 6)["status"] == "failed"


def test_on_job_end_of_a_job_that_raised_says_so_in_one_line(tmp_path, capsys):
    callback = SweepReportCallback()
    callback.on_job_end(_config(tmp_path, []), _Return(error=RuntimeError("boom\nTraceback ...")))
    callback.on_job_end(_config(tmp_path, []), _Return(error=RuntimeError(""), num=5))
    assert capsys.readouterr().out.splitlines() == ["[job 4] failed: boom", "[job 5] failed: "]
    assert _job_file(tmp_path, 3)["status"] == "failed"


def test_on_job_end_outside_a_multirun_prints_and_writes_nothing(tmp_path, capsys):
    config = _config(tmp_path / "s", [])
    config.hydra.mode = "RunMode.RUN"
    callback = SweepReportCallback()
    callback._progress = _Progress()
    callback.on_job_end(config, _Return(_record(1, "ok")))
    assert capsys.readouterr().out == ""
    assert not (tmp_path / "s").exists() and callback._progress.updates == 0


def test_the_pickled_callback_leaves_its_progress_display_behind():
    callback = SweepReportCallback()
    callback.other = 1
    callback._progress = _Progress()
    assert callback.__getstate__() == {"other": 1}


def _write(where: Path, **record) -> None:
    where.mkdir(parents=True)
    (where / "result.json").write_text(json.dumps(record))


def test_unfinished_runs_lists_the_runs_not_ok_but_not_the_tuners_trials(tmp_path):
    _write(tmp_path / "0", seed=0, status="ok", error=None, run_dir=str(tmp_path / "0"))
    _write(tmp_path / "1", seed=1, status="failed", error="boom", run_dir=str(tmp_path / "1"))
    _write(tmp_path / "2", seed=2, status="interrupted", error=None)
    _write(tmp_path / "trials" / "5" / "0", seed=5, status="failed", error="nan", run_dir=str(tmp_path / "trials" / "5" / "0"))
    assert unfinished_runs(tmp_path) == ["seed=1 failed: boom", "seed=2 interrupted: None"]


@pytest.fixture
def clean_exit_status():
    before = exit_status.code
    exit_status.set(0)
    yield exit_status
    exit_status.set(before)


def test_on_multirun_end_builds_the_report_and_says_how_to_finish(tmp_path, capsys, monkeypatch, clean_exit_status):
    calls = []
    monkeypatch.setattr("pipeline.report.build_report", lambda inputs, out: calls.append((inputs, out)) or {})
    for i in range(7):
        _write(tmp_path / str(i), seed=i, status="failed" if i else "ok", error=f"e{i}", run_dir=str(tmp_path / str(i)))
    config = _config(tmp_path, ["seed=range(0,7)"], logger={})
    callback = SweepReportCallback()
    callback.on_multirun_end(config)
    assert calls == [([tmp_path], tmp_path / "report")]
    assert capsys.readouterr().out.splitlines() == [
        f"report: {tmp_path / 'report' / 'report.md'}",
        "6 run(s) did not finish ok: seed=1 failed: e1; seed=2 failed: e2; seed=3 failed: e3; seed=4 failed: e4; "
        "seed=5 failed: e5",
        f"finish the sweep with: python -m pipeline -m 'seed=range(0,7)' hydra.sweep.dir={tmp_path} resume=true",
    ]
    assert clean_exit_status.code == 1


def test_on_multirun_end_reports_the_confirmation_runs_of_a_tuning_sweep(tmp_path, capsys, monkeypatch,
                                                                         clean_exit_status):
    calls = []
    monkeypatch.setattr("pipeline.report.build_report", lambda inputs, out: calls.append((inputs, out)) or {})
    (tmp_path / "confirm").mkdir()
    SweepReportCallback().on_multirun_end(_config(tmp_path, []))
    assert calls == [([tmp_path / "confirm"], tmp_path / "report")]
    assert clean_exit_status.code == 0
    SweepReportCallback().on_multirun_end(_config(tmp_path / "never made", []))
    assert len(calls) == 1


@pytest.mark.parametrize(("message", "shown"), [("no good\nmore", "no good"), ("", "")])
def test_a_failed_report_is_logged_with_how_to_rebuild_it(tmp_path, capsys, monkeypatch, caplog, clean_exit_status,
                                                          message, shown):
    def broken(inputs, out):
        raise ValueError(message)

    monkeypatch.setattr("pipeline.report.build_report", broken)
    with caplog.at_level("ERROR", logger="pipeline.sweep"):
        SweepReportCallback().on_multirun_end(_config(tmp_path, []))
    # Its first line only; a message-less error still says what to do.
    assert [r.getMessage() for r in caplog.records] == [
        f"report failed: {shown}; rebuild it with: python -m pipeline.report {tmp_path}"]
    assert capsys.readouterr().out == ""


def test_module_logger_name():
    assert sweep.log.name == "pipeline.sweep"


class _Shown:
    """Stands in for SweepProgress: what it was asked to show, without a display thread."""

    made: list = []

    def __init__(self, sweep_dir, live):
        self.sweep_dir, self.live = sweep_dir, live
        self.stopped = False
        _Shown.made.append(self)

    def start(self):
        return self

    def stop(self, final_line=True):
        self.stopped = True


@pytest.fixture
def shown(monkeypatch):
    from pipeline.config.grouping import SWEEP_ENV
    from pipeline.runtime.job import RELAY_ENV

    monkeypatch.setattr(sweep, "SweepProgress", _Shown)
    # Set then removed, so that monkeypatch removes what the callback sets again when the test ends.
    for name in (RELAY_ENV, SWEEP_ENV):
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)
    _Shown.made = []
    return RELAY_ENV


def _start_config(tmp_path: Path, launcher: str) -> OmegaConf:
    return OmegaConf.create({
        "hydra": {"overrides": {"hydra": [], "task": ["seed=0,1,2", "optimizer.lr=0.1,0.01", "name=x"]},
                  "sweep": {"dir": str(tmp_path)}, "sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"},
                  "launcher": {"_target_": launcher}, "mode": "RunMode.MULTIRUN"},
        "resume": False,
    })


BASIC = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
JOBLIB = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"


def test_on_multirun_start_counts_the_jobs_and_shows_plain_lines_off_a_terminal(tmp_path, shown, monkeypatch):
    (tmp_path / ".progress").mkdir(parents=True)
    (tmp_path / ".progress" / "job9.json").write_text("{}")  # a resumed sweep counts afresh
    callback = SweepReportCallback()
    callback.on_multirun_start(_start_config(tmp_path, BASIC))
    state = json.loads((tmp_path / ".progress" / "sweep.json").read_text())
    assert state["total"] == 6
    assert not (tmp_path / ".progress" / "job9.json").exists()
    assert [(p.sweep_dir, p.live) for p in _Shown.made] == [(tmp_path, False)]
    assert callback._progress is _Shown.made[0]
    import os

    assert shown not in os.environ


@pytest.mark.parametrize(("launcher", "live", "relay"), [(BASIC, True, "1"), (JOBLIB, False, None),
                                                         ("my.OtherLauncher", True, None)])
def test_on_a_terminal_the_basic_launcher_relays_and_joblib_gets_plain_lines(tmp_path, shown, monkeypatch,
                                                                            launcher, live, relay):
    import os

    monkeypatch.setattr(sweep.sys.stdout, "isatty", lambda: True)
    SweepReportCallback().on_multirun_start(_start_config(tmp_path, launcher))
    assert [p.live for p in _Shown.made] == [live]
    assert os.environ.get(shown) == relay


def test_on_multirun_end_stops_the_display_and_the_relay(tmp_path, shown, monkeypatch, clean_exit_status):
    import os

    monkeypatch.setenv(shown, "1")
    callback = SweepReportCallback()
    progress = callback._progress = _Shown(tmp_path, True)
    callback.on_multirun_end(_config(tmp_path / "never made", []))
    assert progress.stopped and callback._progress is None
    assert shown not in os.environ


@pytest.mark.parametrize(("groups", "expected"), [(["g1", "g1"], "g1"), (["g1", "g2"], "my_sweep")])
def test_a_wandb_sweep_logs_its_report_to_the_runs_group(tmp_path, monkeypatch, clean_exit_status, groups, expected):
    logged = []
    monkeypatch.setattr("pipeline.report.build_report", lambda inputs, out: {"report": 1})
    monkeypatch.setattr("pipeline.report.wandb_summary.log_report_to_wandb",
                        lambda report, out, **kw: logged.append((report, out, kw)))
    for i, group in enumerate(groups):
        _write(tmp_path / str(i), seed=i, status="ok", group=group, error=None)
    config = _config(tmp_path, [], name="my_sweep", logger={"wandb": {"project": "proj", "entity": "me", "mode": "offline"}})
    SweepReportCallback().on_multirun_end(config)
    assert logged == [({"report": 1}, tmp_path / "report",
                       {"project": "proj", "group": expected, "entity": "me", "mode": "offline"})]
    # Without a project the runs' default project; without a wandb logger nothing is logged.
    logged.clear()
    SweepReportCallback().on_multirun_end(_config(tmp_path, [], name="my_sweep", logger={"wandb": {}}))
    assert logged == [({"report": 1}, tmp_path / "report",
                       {"project": "pipeline", "group": expected, "entity": None, "mode": None})]
    logged.clear()
    SweepReportCallback().on_multirun_end(_config(tmp_path, [], name="my_sweep", logger={"csv": {}}))
    SweepReportCallback().on_multirun_end(_config(tmp_path, [], name="my_sweep"))
    assert logged == []


def test_no_wandb_summary_when_the_report_failed(tmp_path, monkeypatch, clean_exit_status):
    logged = []

    def broken(inputs, out):
        raise ValueError("x")

    monkeypatch.setattr("pipeline.report.build_report", broken)
    monkeypatch.setattr("pipeline.report.wandb_summary.log_report_to_wandb", lambda *a, **kw: logged.append(a))
    SweepReportCallback().on_multirun_end(_config(tmp_path, [], name="n", logger={"wandb": {"project": "p"}}))
    assert logged == []


class _Out:
    """A stand-in stdout/stderr that remembers what had been written at each flush."""

    def __init__(self):
        self.text = ""
        self.flushed = []

    def write(self, s):
        self.text += s
        return len(s)

    def flush(self):
        self.flushed.append(self.text)

    def isatty(self):
        return False


def _each_line_flushed(out: _Out) -> bool:
    """Every line was flushed as soon as it was printed (a launcher's workers and a pipe show it at once)."""
    ends = [i + 1 for i, c in enumerate(out.text) if c == "\n"]
    return bool(ends) and all(out.text[:e] in out.flushed for e in ends)


def test_the_callbacks_lines_are_flushed_at_once(tmp_path, monkeypatch, clean_exit_status):
    out, err = _Out(), _Out()
    monkeypatch.setattr(sweep.sys, "stdout", out)
    monkeypatch.setattr(sweep.sys, "stderr", err)
    callback = SweepReportCallback()
    callback.on_job_end(_config(tmp_path, []), _Return([_record(1, "ok"), _record(2, "failed")]))
    callback.on_job_end(_config(tmp_path, []), _Return(error=RuntimeError("boom")))
    assert out.text.count("\n") == 3 and _each_line_flushed(out)
    monkeypatch.setattr("pipeline.report.build_report", lambda inputs, out: {})
    _write(tmp_path / "0", seed=0, status="failed", error="e0")
    out.text, out.flushed = "", []
    callback.on_multirun_end(_config(tmp_path, []))
    assert out.text.count("\n") == 3 and _each_line_flushed(out)
    _saved(tmp_path / "s", ["a=1"])
    with pytest.raises(SystemExit):
        callback._refuse_changed_resume(_config(tmp_path / "s", ["a=2"], resume=True))
    assert err.text.count("\n") == 1 and _each_line_flushed(err)


def test_key_strips_only_add_and_remove_marks():
    assert _key("X=1") == "X"
    assert _key("XX+a=1") == "XX+a"


class _RecordLike:
    """A record that is not a dict (a mapping-like object): its status is its attribute."""

    def __init__(self, record, with_status=True):
        self._record = record
        if with_status:
            self.status = record["status"]

    def get(self, key, default=None):
        return self._record.get(key, default)


@pytest.mark.parametrize(("with_status", "status"), [(True, "ok"), (False, "failed")])
def test_a_record_that_is_not_a_dict_counts_by_its_status_attribute(tmp_path, capsys, with_status, status):
    SweepReportCallback().on_job_end(_config(tmp_path, []), _Return([_RecordLike(_record(1, "ok"), with_status)]))
    assert _job_file(tmp_path, 3)["status"] == status
    assert capsys.readouterr().out == "[job 3] seed=1 ok test/acc=0.5 in 3.0 s -> /runs/1\n"


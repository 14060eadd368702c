"""The W&B summary run, offline: it must write a local offline run and never touch the network."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from report_runs import OTHER_GROUP, RL_GROUP, write_two_group_sweep

from pipeline.report import build_report
from pipeline.report.collect import RunRecordWarning
from pipeline.report.wandb_summary import log_report_to_wandb, per_seed_rows, report_run_name, summary_values


def test_per_seed_rows_and_summary(two_group_report, two_group_sweep):
    assert report_run_name(two_group_report, two_group_sweep / "report", None) == f"report-{two_group_sweep.name}"
    rows = per_seed_rows(two_group_report)
    assert len(rows) == 10
    failed = [row for row in rows if row[2] == "failed"]
    assert len(failed) == 1 and failed[0][0] == RL_GROUP and "replay buffer" in failed[0][5]
    values = summary_values(two_group_report)
    assert values["n_runs"] == 10
    assert values[f"{OTHER_GROUP}/iqm"] == 315.0
    assert values[f"{RL_GROUP}/time_to_threshold/n_reached"] == 2
    assert values[f"probability_of_improvement/eval/return_mean/{RL_GROUP} > {OTHER_GROUP}"] == 1.0


@pytest.mark.slow
def test_offline_report_run(tmp_path, monkeypatch):
    import wandb

    for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("PIPELINE_SWEEP_UID", "f00d42")
    sweep = write_two_group_sweep(tmp_path / "sweep")
    report_dir = tmp_path / "sweep" / "report"
    with pytest.warns(RunRecordWarning, match="corrupt"):
        report = build_report([sweep], report_dir, reps=200)

    info = log_report_to_wandb(report, report_dir, project="pipeline-tests", group="dqn_cartpole")

    assert info["mode"] == "offline" and info["name"] == "report-dqn_cartpole"
    offline_runs = list((report_dir / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 1
    assert list(offline_runs[0].glob("run-*.wandb"))
    media = offline_runs[0] / "files" / "media"
    logged = sorted((media / "images" / "plots").glob("*.png"))
    assert len(logged) == len(report["images"]) == 6
    from PIL import Image

    for image in report["images"]:
        # W&B names a logged file <key>_<step>_<hash>.png; its pixels are the report's PNG's.
        (copy,) = [p for p in logged if p.name.rsplit("_", 2)[0] == Path(image["file"]).stem]
        assert np.array_equal(np.asarray(Image.open(copy).convert("RGB")),
                              np.asarray(Image.open(report_dir / image["file"]).convert("RGB")))
    (table_file,) = (media / "table").glob("per_seed_*.table.json")
    table = json.loads(table_file.read_text())
    assert table["columns"][:5] == ["group", "seed", "status", "primary_metric", "primary_value"]
    assert len(table["data"]) == 10
    # wandb 0.31 writes the summary only into the binary run log (no wandb-summary.json offline), and
    # its service process may still be flushing it after finish(); teardown waits for that.
    # In the log the key and its JSON value sit a few protobuf framing bytes apart.
    wandb.teardown()
    log = next(offline_runs[0].glob("run-*.wandb")).read_bytes()
    assert re.search(rb"dqn_cartpole model=dueling/iqm[^\n]{1,4}315\.0", log)
    assert b"sweep=f00d42" in log  # tagged like the runs of its sweep
    # A rebuilt report must not mistake the W&B folder for run records.
    with pytest.warns(RunRecordWarning, match="corrupt"):
        assert build_report([sweep], tmp_path / "again", reps=200)["n_runs"] == 10


# A process that starts a W&B service from its own folder and keeps it up until its stdin closes; it prints the
# token (WANDB_SERVICE) its children would inherit.
OWNER = (
    "import os, sys, wandb\n"
    "run = wandb.init(project='owner', mode='offline', dir=os.getcwd())\n"
    "run.finish()\n"
    "print(os.environ['WANDB_SERVICE'], flush=True)\n"
    "sys.stdin.read()\n"
)
CHILD = (
    "import warnings\n"
    "from pipeline.report import build_report\n"
    "from pipeline.report.wandb_summary import log_report_to_wandb\n"
    "warnings.simplefilter('ignore')\n"
    "report = build_report(['.'], 'report', reps=50)\n"
    "log_report_to_wandb(report, 'report', project='pipeline-tests', mode='offline')\n"
)


@pytest.mark.slow
def test_a_relative_report_dir_keeps_its_offline_run_through_a_service_another_process_started(tmp_path):
    """A sweep's report dir is relative (Hydra's sweep dir is). A process that inherits WANDB_SERVICE (started from a
    notebook or a script with a W&B run of its own; in the suite, a test process that used W&B) hands its runs to that
    service, which resolved the relative dir against its own folder: the report's offline run file was written
    nowhere (seen as a CI flake of the joblib + W&B sweep test)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    env.pop("WANDB_SERVICE", None)
    (tmp_path / "owner").mkdir()
    owner = subprocess.Popen([sys.executable, "-c", OWNER], cwd=tmp_path / "owner", env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        token = owner.stdout.readline().strip()
        assert token, "the owner process did not start a W&B service"
        sweep = write_two_group_sweep(tmp_path / "sweep")
        child = subprocess.run([sys.executable, "-c", CHILD], cwd=sweep, env={**env, "WANDB_SERVICE": token},
                               capture_output=True, text=True, timeout=300)
        assert child.returncode == 0, child.stderr[-2000:]
    finally:
        owner.stdin.close()  # the owner tears its service down (flushing what it holds) and exits
        owner.wait(timeout=120)
    (run_dir,) = (sweep / "report" / "wandb").glob("offline-run-*")
    (log,) = run_dir.glob("run-*.wandb")
    assert b"pipeline-tests" in log.read_bytes()
    assert not list((tmp_path / "owner").rglob("report"))  # nothing landed beside the service's owner


QUIET_CHILD = (
    "import warnings\n"
    "from pipeline.report import build_report\n"
    "from pipeline.report.wandb_summary import log_report_to_wandb\n"
    "warnings.simplefilter('ignore')\n"
    "report = build_report(['.'], 'report', reps=50)\n"
    "print(log_report_to_wandb(report, 'report', project='pipeline-tests', mode='offline')['id'])\n"
)


@pytest.mark.slow
def test_a_report_logged_twice_for_one_sweep_is_one_quiet_offline_run(tmp_path):
    """W&B's console lines (~25 at every sweep's end: the run summary, sync hints) are off without WANDB_SILENT, and a
    sweep's report rebuilt after a resume updates its one W&B run: one offline run of that id is left, not a stale
    partial one beside the final."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_MODE="offline", PIPELINE_SWEEP_UID="c0ffee", WANDB_DIR=str(tmp_path / "wandb_dir"),
               WANDB_CONFIG_DIR=str(tmp_path / "wandb_config"), WANDB_CACHE_DIR=str(tmp_path / "wandb_cache"))
    sweep = write_two_group_sweep(tmp_path / "sweep")
    for _ in range(2):  # the sweep's end, then the end of its resumed run
        done = subprocess.run([sys.executable, "-c", QUIET_CHILD], cwd=sweep, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip() == "report-c0ffee" and "wandb:" not in done.stdout + done.stderr, done.stdout + done.stderr
    (run_dir,) = (sweep / "report" / "wandb").glob("offline-run-*")
    assert run_dir.name.endswith("-report-c0ffee")

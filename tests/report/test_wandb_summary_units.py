"""The report's W&B run from a report written by hand, against a stand-in wandb that records every call."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pipeline.report.wandb_summary import log_report_to_wandb, per_seed_rows, report_run_name, summary_values
from pipeline_testing import stand_in_wandb


def _group(**over):
    g = {
        "primary_metric": "eval/return",
        "per_seed": {"0": {"seed": 0, "value": 1.5, "relative_dir": "r/0"},
                     "5": {"seed": 5, "value": 2.5, "relative_dir": "r/5"}},
        "failed": [{"seed": 1, "error": "boom", "relative_dir": "r/1"}],
        "interrupted": [{"seed": 6, "error": "killed", "relative_dir": "r/6"}],
        "pruned": [{"seed": 2, "error": "pruned by the tuner", "relative_dir": "r/2"}],
        "running": [{"seed": 7, "error": None, "relative_dir": "r/7"}],
        "other_status": {"weird": [{"seed": 3, "error": "odd", "relative_dir": "r/3"}]},
        "excluded": [{"seed": 4, "reason": "no metric", "relative_dir": "r/4"}],
        "n_ok": 2, "n_failed": 1, "n_interrupted": 1, "n_pruned": 1, "n_running": 1,
        "mean": 2.0, "std": 0.7, "median": 2.0, "min": 1.5, "max": 2.5, "iqm": 2.0,
        "iqm_ci": [1.5, 2.5], "mean_ci": [1.4, 2.6],
        "threshold": {"n_reached": 1, "n_seeds": 2, "median_reached_s": 9.0, "median_all_s": 12.0, "other": 1},
    }
    g.update(over)
    return g


def _report():
    return {
        "inputs": ["/data/sweep_a"], "n_runs": 9, "n_groups": 2, "partial": True,
        "status_counts": {"ok": 2, "failed": 1, "running": 1},
        "settings": {"bootstrap_reps": 50, "seed": 1, "confidence": 0.95},
        "groups": {"g": _group(),
                   "h": _group(per_seed={}, failed=[], interrupted=[], pruned=[], running=[], other_status={},
                               excluded=[], iqm_ci=None, mean_ci=[], threshold=None, primary_metric="loss")},
        "comparisons": {"eval/return": {"probability_of_improvement": [{"x": "g", "y": "k", "p": 0.75},
                                                                       {"x": "k", "y": "g", "p": 0.25}]}},
        "images": [{"file": "final_scores.png", "title": "Final scores"}, {"file": "missing.png", "title": "gone"}],
        "files": {"markdown": "report.md", "json": "report.json"},
    }


def test_per_seed_rows_lists_ok_then_each_status_then_excluded():
    assert per_seed_rows(_report()) == [
        ["g", "0", "ok", "eval/return", 1.5, None, "r/0"],
        ["g", "5", "ok", "eval/return", 2.5, None, "r/5"],
        ["g", "1", "failed", "eval/return", None, "boom", "r/1"],
        ["g", "6", "interrupted", "eval/return", None, "killed", "r/6"],
        ["g", "2", "pruned", "eval/return", None, "pruned by the tuner", "r/2"],
        ["g", "7", "running", "eval/return", None, None, "r/7"],
        ["g", "3", "weird", "eval/return", None, "odd", "r/3"],
        ["g", "4", "excluded", "eval/return", None, "no metric", "r/4"],
    ]


def test_summary_values_by_hand():
    values = summary_values(_report())
    expected = {
        "n_runs": 9, "n_groups": 2, "partial": True, "runs/ok": 2, "runs/failed": 1, "runs/running": 1,
        "probability_of_improvement/eval/return/g > k": 0.75, "probability_of_improvement/eval/return/k > g": 0.25,
        "g/iqm_ci_low": 1.5, "g/iqm_ci_high": 2.5, "g/mean_ci_low": 1.4, "g/mean_ci_high": 2.6,
        "g/time_to_threshold/n_reached": 1, "g/time_to_threshold/n_seeds": 2,
        "g/time_to_threshold/median_reached_s": 9.0, "g/time_to_threshold/median_all_s": 12.0,
    }
    stats = {"n_ok": 2, "n_failed": 1, "n_interrupted": 1, "n_pruned": 1, "n_running": 1, "mean": 2.0, "std": 0.7,
             "median": 2.0, "min": 1.5, "max": 2.5, "iqm": 2.0}
    for name in ("g", "h"):
        expected.update({f"{name}/{k}": v for k, v in stats.items()})
    assert values == expected


def test_report_run_name():
    report = _report()
    assert report_run_name(report, "/x/y/report", "my group") == "report-my group"
    assert report_run_name(report, "/x/y/report", None) == "report-sweep_a"
    assert report_run_name(report, "/x/y/report", "") == "report-sweep_a"
    assert report_run_name({**report, "inputs": ["/a", "/b"]}, "/x/y/report", None) == "report-y"
    assert report_run_name({"inputs": None}, "/x/z/report", None) == "report-z"


def _fake_wandb(monkeypatch, calls, fail_on_log=False, settings=None):
    monkeypatch.setitem(sys.modules, "wandb", stand_in_wandb(calls, settings, fail_on_log))


def test_log_report_to_wandb_sends_the_table_images_summary_and_files(tmp_path, monkeypatch):
    calls = []
    _fake_wandb(monkeypatch, calls)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("PIPELINE_SWEEP_UID", "ab12")
    (tmp_path / "final_scores.png").write_bytes(b"png")
    (tmp_path / "report.md").write_text("# r")
    report = _report()
    info = log_report_to_wandb(report, tmp_path, project="proj", group="G h/x", entity="me")
    (kind, kwargs), (_, payload), (_, artifact), (finish,) = calls
    assert kind == "init" and finish == "finish"
    assert kwargs == {
        # One run per sweep: a resumed sweep's report updates it (resume="allow"), no W&B lines on the console.
        "id": "report-ab12", "resume": "allow", "settings": {"silent": True, "console": "off"},
        "project": "proj", "entity": "me", "group": "G h/x", "job_type": "report", "name": "report-G h/x",
        "mode": "offline", "dir": str(tmp_path), "tags": ["sweep=ab12"], "reinit": "create_new",
        "config": {"inputs": ["/data/sweep_a"], "bootstrap_reps": 50, "seed": 1, "confidence": 0.95, "sweep_id": "ab12"},
    }
    assert sorted(payload) == ["per_seed", "plots/final_scores"]
    assert payload["per_seed"].columns == ["group", "seed", "status", "primary_metric", "primary_value", "error", "dir"]
    assert payload["per_seed"].data == per_seed_rows(report)
    image = payload["plots/final_scores"]
    assert (image.path, image.caption) == (str(tmp_path / "final_scores.png"), "Final scores")
    assert (artifact.name, artifact.type) == ("report-G_h_x", "report")
    assert artifact.files == [str(tmp_path / "report.md")]
    assert info == {"id": "run-id", "name": "report-G h/x", "mode": "offline", "sync_dir": "/sync/here"}


def test_log_report_to_wandb_outside_a_sweep_takes_the_mode_from_the_environment(tmp_path, monkeypatch):
    calls = []
    _fake_wandb(monkeypatch, calls, settings=object())
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.delenv("PIPELINE_SWEEP_UID", raising=False)
    report = {**_report(), "files": None, "inputs": ["/data/a", "/data/b"]}
    info = log_report_to_wandb(report, tmp_path / "sweep_b" / "report", project="p")
    kwargs = calls[0][1]
    assert kwargs["tags"] is None and "sweep_id" not in kwargs["config"] and kwargs["entity"] is None
    # Outside a sweep the run is the report dir's: rebuilt there, the same id; elsewhere, another.
    assert kwargs["id"].startswith("report-") and kwargs["id"] != "report-"
    log_report_to_wandb(report, tmp_path / "sweep_b" / "report", project="p")
    log_report_to_wandb(report, tmp_path / "sweep_c" / "report", project="p")
    ids = [c[1]["id"] for c in calls if c[0] == "init"]
    assert ids[1] == ids[0] != ids[2]
    # Two inputs and no group: named after the folder that holds the report dir.
    assert kwargs["mode"] == "disabled" and kwargs["group"] is None and kwargs["name"] == "report-sweep_b"
    assert info["sync_dir"] == ""  # a run whose settings have no sync dir
    assert calls[2][1].files == [] and info["mode"] == "disabled"
    assert log_report_to_wandb(report, tmp_path, project="p", mode="online")["mode"] == "online"


def test_the_run_is_finished_when_logging_fails(tmp_path, monkeypatch):
    calls = []
    _fake_wandb(monkeypatch, calls, fail_on_log=True)
    with pytest.raises(RuntimeError, match="log failed"):
        log_report_to_wandb(_report(), Path(tmp_path), project="p")
    assert calls[-1] == ("finish",)

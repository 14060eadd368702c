"""The run record: one typed, versioned definition, strict JSON, atomic writes, tolerant reads."""

import json
import math
import platform

import numpy as np
import torch

from pipeline.store.record import (
    RESULT,
    SCHEMA_VERSION,
    RunRecord,
    read_record,
    read_result,
    versions,
    write_json,
)


def _record(tmp_path, **fields) -> RunRecord:
    return RunRecord(
        experiment="dqn_cartpole", group="g", task="DQNTask", seed=3, run_dir=str(tmp_path), **fields
    )


def test_a_new_record_says_the_run_has_not_finished(tmp_path):
    r = _record(tmp_path)
    assert r.status == "failed" and "did not finish" in r.error
    assert r.schema_version == SCHEMA_VERSION == 2 and r.seeds_per_process == 1 and r.agent == 0
    assert not r.is_rl and r.metrics == {} and r.segments == []


def test_round_trip_keeps_typed_fields_and_extras_at_the_top_level(tmp_path):
    r = _record(tmp_path, status="ok", error=None, metrics={"eval/return_mean": 500.0}, env_steps=4096)
    r.update(coverage=0.9, time_to_threshold_s=1.5)
    assert r.extras == {"coverage": 0.9} and r.time_to_threshold_s == 1.5
    r.write()
    on_disk = json.loads((tmp_path / RESULT).read_text())
    assert on_disk["coverage"] == 0.9 and "extras" not in on_disk
    assert on_disk["env_steps"] == 4096 and on_disk["seed"] == 3 and on_disk["status"] == "ok"
    back = read_record(tmp_path)
    assert back == r and back.is_rl


def test_an_old_record_reads_with_defaults(tmp_path):
    (tmp_path / RESULT).write_text(
        json.dumps({"seed": 1, "status": "ok", "experiment": "x", "something_new": 2})
    )
    r = read_record(tmp_path)
    assert r.schema_version == 1 and r.group == "x" and r.extras == {"something_new": 2} and r.task == ""


def test_strict_json_for_nan_tensors_and_numpy(tmp_path):
    path = tmp_path / "r.json"
    write_json(
        path,
        {"a": float("nan"), "b": [math.inf, 1.0], "c": torch.tensor(2.5), "d": np.float32(0.5), "e": (1, 2)},
    )
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"a": None, "b": [None, 1.0], "c": 2.5, "d": 0.5, "e": [1, 2]}
    assert not (tmp_path / "r.json.tmp").exists()  # written through a temp file, renamed over


def test_reads_are_tolerant(tmp_path):
    assert read_result(tmp_path) is None and read_record(tmp_path) is None
    (tmp_path / RESULT).write_text("{half a rec")
    assert read_result(tmp_path) is None


def test_versions_name_the_stack():
    v = versions()
    assert v["python"] == platform.python_version() and v["torch"].startswith("2.13.0")
    assert {"lightning", "hydra-core", "gymnasium", "numpy"} <= set(v)


def test_mutable_defaults_are_not_shared(tmp_path):
    a, b = _record(tmp_path), _record(tmp_path)
    a.segments.append({"started": "now"})
    a.metrics["x"] = 1.0
    a.update(extra_field=1)
    assert b.segments == [] and b.metrics == {} and b.extras == {}


def test_git_commit_is_the_checkout_head():
    import subprocess
    from pathlib import Path

    import pipeline
    from pipeline.store.record import git_commit

    here = Path(pipeline.__file__).resolve().parent
    head = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        assert git_commit() is None  # installed outside a checkout
    else:
        assert git_commit() == head.stdout.strip() and len(git_commit()) == 40


def test_a_partial_record_gets_documented_defaults():
    empty = RunRecord.from_dict({})
    assert (empty.experiment, empty.group, empty.task, empty.seed, empty.run_dir, empty.schema_version) == (
        "",
        "",
        "",
        None,
        "",
        1,
    )
    assert RunRecord.from_dict({"experiment": "x"}).group == "x"
    assert RunRecord.from_dict({"experiment": "x", "group": "g"}).group == "g"


def test_the_json_is_indented_and_a_side_file_can_be_chosen(tmp_path):
    r = _record(tmp_path)
    r.write()
    text = (tmp_path / RESULT).read_text()
    assert text.startswith('{\n  "experiment": "dqn_cartpole",') and text.endswith("}\n")
    r.file = "result.extending.json"
    r.status = "ok"
    r.write()
    assert json.loads((tmp_path / "result.extending.json").read_text())["status"] == "ok"
    assert json.loads((tmp_path / RESULT).read_text())["status"] == "failed"


def test_a_checkout_without_commits_records_no_commit(tmp_path, monkeypatch):
    import subprocess

    from pipeline.store.record import git_commit

    # git fails here (exit 128) yet prints "HEAD" on stdout: only the exit status says there is no commit.
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    monkeypatch.setenv("GIT_DIR", str(tmp_path / ".git"))
    assert git_commit() is None
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "not_a_repo"))
    assert git_commit() is None


def test_a_temp_file_left_by_a_killed_writer_is_replaced_by_the_next_write(tmp_path):
    path = tmp_path / "result.json"
    (tmp_path / "result.json.tmp").write_text('{"half": ')
    write_json(path, {"status": "ok"})
    assert json.loads(path.read_text()) == {"status": "ok"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


def test_a_record_holding_an_extras_key_still_reads():
    # `extras` is the field holding the top-level extras, never a key of its own in result.json.
    r = RunRecord.from_dict({"experiment": "x", "seed": 2, "extras": {"coverage": 0.9}, "coverage": 0.8})
    assert (r.experiment, r.seed) == ("x", 2) and r.extras == {"coverage": 0.8}


def test_a_record_of_an_unknown_schema_is_refused_naming_the_file(tmp_path):
    import pytest

    from pipeline.store.record import RecordError

    (tmp_path / RESULT).write_text(json.dumps({"experiment": "x", "schema_version": 3}))
    with pytest.raises(RecordError) as err:
        read_record(tmp_path)
    assert str(err.value) == (
        f"{tmp_path / RESULT}: schema_version 3 is not one this pipeline reads (1..2); "
        "read it with the pipeline version that wrote it (its `versions`), or upgrade"
    )
    # Not an int at all (a string, a bool that JSON would call true): refused too, never compared.
    for bad in ("2", True, 2.0):
        with pytest.raises(RecordError, match=r"schema_version .* is not one this pipeline reads"):
            RunRecord.from_dict({"schema_version": bad})
    assert RunRecord.from_dict({"schema_version": 1}).schema_version == 1
    assert RunRecord.from_dict({"schema_version": 2}).schema_version == 2


def test_a_record_that_does_not_parse_is_refused_naming_the_file(tmp_path, monkeypatch):
    import pytest

    from pipeline.store.record import RecordError

    (tmp_path / RESULT).write_text(json.dumps({"experiment": "x"}))

    def wrong_shape(data):
        raise TypeError("bad field")

    monkeypatch.setattr(RunRecord, "from_dict", wrong_shape)
    with pytest.raises(RecordError) as err:
        read_record(tmp_path)
    assert str(err.value) == f"{tmp_path / RESULT}: not a run record (bad field)"


def test_a_result_that_is_json_but_not_an_object_reads_as_none(tmp_path):
    (tmp_path / RESULT).write_text("[1, 2]")
    assert read_result(tmp_path) is None and read_record(tmp_path) is None


def test_read_records_walks_a_sweep_in_path_order_and_skips_what_it_cannot_read(tmp_path):
    from pipeline.store.record import read_records

    for name, seed in (("b", 2), ("a", 1), ("c/deep", 3)):
        (tmp_path / name).mkdir(parents=True)
        _record(tmp_path / name).update(seed=seed).write()
    (tmp_path / "a_newer").mkdir()
    (tmp_path / "a_newer" / RESULT).write_text(json.dumps({"schema_version": 9}))
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / RESULT).write_text("{half")
    (tmp_path / "report").mkdir()  # outputs about runs, never a run
    _record(tmp_path / "report").update(seed=7).write()
    records = read_records(tmp_path)
    assert [r.seed for r in records] == [1, 2, 3]
    assert read_records(tmp_path / "empty_dir_that_does_not_exist") == []


def test_summary_line_by_hand():
    from pipeline.store.record import summary_line

    record = {"seed": 3, "status": "ok", "primary_metric": "test/acc", "metrics": {"test/acc": 0.912345},
              "wall_time_s": 12.5, "run_dir": "/runs/3"}
    assert summary_line(record) == "seed=3 ok test/acc=0.9123 in 12.5 s -> /runs/3"
    assert summary_line({**record, "metrics": {"test/acc": 7}}) == "seed=3 ok test/acc=7 in 12.5 s -> /runs/3"
    assert summary_line({**record, "metrics": {"test/acc": 123456.0}}) == "seed=3 ok test/acc=1.235e+05 in 12.5 s -> /runs/3"
    assert summary_line({"seed": 0, "status": "failed", "primary_metric": "test/acc", "metrics": None}) == (
        "seed=0 failed no metric in None s -> None"
    )
    assert summary_line({"status": "failed", "metrics": {"x": 1.0}}) == "seed=None failed no metric in None s -> None"
    assert summary_line({**record, "metrics": {"test/acc": "n/a"}}) == "seed=3 ok no metric in 12.5 s -> /runs/3"

"""The store's small pieces by hand: where files are (layout), the curves file, checkpoints and atomic writes."""

from __future__ import annotations

import errno
import json
import random
import re

import numpy as np
import pytest
import torch

from pipeline.store import atomic, checkpoint, curves, layout
from pipeline.store.atomic import StoreWriteError, cause_of, write_atomically, write_error
from pipeline.store.checkpoint import (
    CheckpointError,
    load_model,
    load_safely,
    rng_state,
    save_atomic,
    save_model,
    set_rng_state,
)
from pipeline.store.curves import CurveLog, read_curve, read_run_curve
from pipeline.store.integrity import save_verified


# ---- layout ----------------------------------------------------------------------------------------
def test_the_run_dir_file_names(tmp_path):
    assert layout.result_path(tmp_path) == tmp_path / "result.json"
    assert layout.metrics_path(tmp_path) == tmp_path / "metrics.csv"
    assert layout.model_path(tmp_path) == tmp_path / "model.pt"
    assert layout.checkpoint_path(tmp_path) == tmp_path / "checkpoints" / "last.ckpt"
    assert layout.lock_path(tmp_path) == tmp_path / ".lock"
    assert layout.error_log_path(tmp_path) == tmp_path / "error.log"
    assert layout.result_path(str(tmp_path)) == tmp_path / "result.json"  # a str dir works too


def test_agent_dirs_are_the_run_dir_for_one_seed_and_seed_dirs_for_more(tmp_path):
    assert layout.agent_dirs(tmp_path, [7]) == [tmp_path]
    assert layout.agent_dirs(str(tmp_path), [3, 5]) == [tmp_path / "seed3", tmp_path / "seed5"]


def test_read_owner_takes_only_a_dict_with_an_integer_pid(tmp_path):
    lock = tmp_path / ".lock"
    assert layout.read_owner(tmp_path) is None  # no lock
    for text in ("", "null", "{not json", "[1, 2]", '{"pid": "12"}', '{"host": "h"}'):
        lock.write_text(text)
        assert layout.read_owner(tmp_path) is None, text
    lock.write_text(json.dumps({"pid": 12, "host": "h", "since": 1.5}))
    assert layout.read_owner(tmp_path) == {"pid": 12, "host": "h", "since": 1.5}
    lock.write_bytes(b'{"pid": 1, "host": "\xff"}')  # not UTF-8
    assert layout.read_owner(tmp_path) is None


def test_config_path_prefers_hydras_copy(tmp_path):
    assert layout.config_path(tmp_path) is None
    (tmp_path / ".pipeline").mkdir()
    (tmp_path / ".pipeline" / "config.yaml").write_text("a: 1")
    assert layout.config_path(str(tmp_path)) == tmp_path / ".pipeline" / "config.yaml"
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").mkdir()  # a dir of that name is not a config
    assert layout.config_path(tmp_path) == tmp_path / ".pipeline" / "config.yaml"
    (tmp_path / ".hydra" / "config.yaml").rmdir()
    (tmp_path / ".hydra" / "config.yaml").write_text("a: 2")
    assert layout.config_path(tmp_path) == tmp_path / ".hydra" / "config.yaml"


def test_agent_seed_dirs_with_weights_in_numeric_order(tmp_path):
    for name in ("seed10", "seed2", "seed3", "seedx", "seed_1", "other1"):
        (tmp_path / name).mkdir()
    for name in ("seed10", "seed2", "seedx", "seed_1", "other1"):
        (tmp_path / name / "model.pt").write_bytes(b"w")
    (tmp_path / "seed3" / "model.pt").mkdir()  # not a file: no weights
    assert layout.agent_seed_dirs(str(tmp_path)) == [tmp_path / "seed2", tmp_path / "seed10"]
    assert layout.has_model(tmp_path / "seed2") and not layout.has_model(tmp_path / "seed3")
    assert not layout.has_record(tmp_path)
    (tmp_path / "result.json").write_text("{}")
    assert layout.has_record(tmp_path)


def test_record_dirs_include_the_root_and_skip_outputs_about_runs(tmp_path):
    root = tmp_path / "report"  # the root's own name does not count
    for d in ("", "b", "a/x", "report", "a/tune/t", "wandb/w", "reports"):
        (root / d).mkdir(parents=True, exist_ok=True)
        (root / d / "result.json").write_text("{}")
    (root / "c").mkdir()  # no record
    # Sorted as paths: a/x, b, reports, then the root's own result.json ("reports" < "result.json").
    assert list(layout.record_dirs(str(root))) == [root / "a" / "x", root / "b", root / "reports", root]


# ---- curves ---------------------------------------------------------------------------------------
def test_read_curve_merges_rows_of_a_step_and_leaves_out_empty_cells(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("step,loss,acc\n0,1.5,\n10.0,,0.5\n,9,9\nx,9,9\n10,0.25,\n20,nan\n")
    assert read_curve(path) == {0: {"loss": 1.5}, 10: {"loss": 0.25, "acc": 0.5}, 20: {"loss": pytest.approx(float("nan"), nan_ok=True)}}
    other = tmp_path / "o.csv"
    other.write_text("env_step,r,step\n5,1,99\n")
    assert read_curve(other, step_key="env_step") == {5: {"r": 1.0, "step": 99.0}}
    assert read_curve(other) == {99: {"env_step": 5.0, "r": 1.0}}  # the default step column is `step`

def test_read_run_curve_picks_the_step_column_and_drops_both(tmp_path):
    assert read_run_curve(tmp_path) == {}
    (tmp_path / "metrics.csv").write_text("env_step,eval/r,step\n100,5.0,3\n200,6.0,4\n")
    assert read_run_curve(tmp_path) == {3: {"eval/r": 5.0}, 4: {"eval/r": 6.0}}  # `step` comes first
    (tmp_path / "metrics.csv").write_text("env_step,eval/r\n100,5.0\n200,6.0\n")
    assert read_run_curve(str(tmp_path)) == {100: {"eval/r": 5.0}, 200: {"eval/r": 6.0}}
    (tmp_path / "metrics.csv").write_text("")
    assert read_run_curve(tmp_path) == {}
    (tmp_path / "metrics.csv").write_text("row,x\n1,2\n")
    assert read_run_curve(tmp_path) == {}


def test_a_curve_log_writes_sorted_rows_in_column_order(tmp_path):
    path = tmp_path / "new" / "agent" / "metrics.csv"
    log = CurveLog(path, flush_every_s=3600)
    assert path.parent.is_dir() and log.last_step() is None and log.step_key == "step"
    log.log(20, {"b": 2, "a": None, "step": 99})
    log.log(10, {"a": torch.tensor(0.5), "b": 0.1})
    log.log(10.0, {"c": float("inf")})
    assert log.columns == ["b", "a", "c"] and log.last_step() == 20
    assert not path.exists()  # an hour between flushes
    log.flush()
    assert path.read_bytes() == b"step,b,a,c\r\n10,0.1,0.5,inf\r\n20,2.0,,\r\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["metrics.csv"]


def test_a_metric_name_with_a_line_break_survives_the_round_trip(tmp_path):
    path = tmp_path / "metrics.csv"
    log = CurveLog(path)
    log.log(1, {"odd\r\nname": 2.0, "plain": 3.0})
    log.flush()
    assert read_curve(path) == {1: {"odd\r\nname": 2.0, "plain": 3.0}}


def test_a_curve_log_flushes_once_flush_every_s_has_passed(tmp_path, monkeypatch):
    now = [100.0]
    monkeypatch.setattr(curves.time, "monotonic", lambda: now[0])
    path = tmp_path / "metrics.csv"
    log = CurveLog(path)  # every 5 s by default
    now[0] = 104.99
    log.log(1, {"x": 1.0})
    assert not path.exists()
    now[0] = 105.0
    log.log(2, {"x": 2.0})
    assert read_curve(path) == {1: {"x": 1.0}, 2: {"x": 2.0}}
    now[0] = 109.0
    log.log(3, {"x": 3.0})  # 4 s after the last flush
    assert 3 not in read_curve(path)
    now[0] = 110.0
    log.log(4, {"x": 4.0})
    assert sorted(read_curve(path)) == [1, 2, 3, 4]
    fast = CurveLog(tmp_path / "f.csv", flush_every_s=2)
    now[0] = 111.0
    fast.log(1, {"y": 1.0})
    assert not (tmp_path / "f.csv").exists()
    now[0] = 112.0
    fast.log(2, {"y": 2.0})
    assert read_curve(tmp_path / "f.csv") == {1: {"y": 1.0}, 2: {"y": 2.0}}


def test_a_fresh_log_moves_an_old_curve_aside_and_a_resumed_one_keeps_rows_to_its_step(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("step,a\n1,1\n")
    CurveLog(path)
    assert not path.exists() and (tmp_path / "metrics.prev1.csv").read_text() == "step,a\n1,1\n"
    path.write_text("step,a\n2,2\n")
    CurveLog(path)
    assert (tmp_path / "metrics.prev2.csv").read_text() == "step,a\n2,2\n"
    path.write_text("env_step,a,b\n10,1,\n20,,2\n30,3,3\n")
    resumed = CurveLog(path, step_key="env_step", resume_step=20)
    assert resumed.rows == {10: {"a": 1.0}, 20: {"b": 2.0}} and resumed.columns == ["a", "b"]
    assert path.exists() and not (tmp_path / "metrics.prev3.csv").exists()
    resumed.log(20, {"a": 5.0})
    resumed.flush()
    assert path.read_bytes() == b"env_step,a,b\r\n10,1.0,\r\n20,5.0,2.0\r\n"
    assert CurveLog(tmp_path / "none.csv", resume_step=5).rows == {}


# ---- checkpoint ------------------------------------------------------------------------------------
class _Thing:
    pass


def test_save_and_load_a_checkpoint(tmp_path):
    path = tmp_path / "c" / "last.ckpt"
    size = save_atomic({"w": torch.arange(3.0), "step": 7}, str(path))
    assert size == path.stat().st_size > 0
    state = load_safely(str(path))
    assert state["step"] == 7 and state["w"].tolist() == [0.0, 1.0, 2.0]
    assert load_safely(path, map_location="meta")["w"].is_meta
    assert save_model({"w": torch.ones(2)}, tmp_path) == (tmp_path / "model.pt").stat().st_size
    assert load_model(str(tmp_path))["w"].tolist() == [1.0, 1.0]
    assert load_model(tmp_path, map_location="meta")["w"].is_meta
    # What else the policy needs goes beside model.pt (a task's agent_files); only plain names other than model.pt.
    save_model({"w": torch.zeros(1)}, tmp_path, {"obs_norm.pt": {"mean": torch.full((2,), 3.0)}})
    assert load_safely(tmp_path / "obs_norm.pt")["mean"].tolist() == [3.0, 3.0] and load_model(tmp_path)["w"].tolist() == [0.0]
    for bad in ("model.pt", "../x.pt", "sub/x.pt"):
        with pytest.raises(ValueError, match="a plain file name other than model.pt"):
            save_model({"w": torch.ones(1)}, tmp_path / "other", {bad: {}})
    assert not (tmp_path / "other").exists() and not (tmp_path / "x.pt").exists()


def test_checkpoint_errors_are_one_line_naming_the_file(tmp_path, monkeypatch):
    missing = tmp_path / "nope.ckpt"
    with pytest.raises(CheckpointError) as err:
        load_safely(missing)
    assert str(err.value) == f"checkpoint {missing}: no such file"
    with pytest.raises(CheckpointError) as err:
        load_model(tmp_path)
    assert str(err.value) == f"model {tmp_path / 'model.pt'}: no such file"
    empty = tmp_path / "empty.ckpt"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointError) as err:
        load_safely(empty, "weights")
    assert str(err.value) == f"weights {empty}: the file is empty (a save was interrupted?)"
    pickled = tmp_path / "obj.ckpt"
    save_verified(pickled, lambda f: torch.save({"o": _Thing()}, f))
    with pytest.raises(CheckpointError) as err:
        load_safely(pickled)
    assert str(err.value) == (
        f"checkpoint {pickled}: cannot be loaded: it holds objects other than tensors and plain values "
        "(not a pipeline checkpoint?)"
    )
    text = tmp_path / "text.ckpt"
    save_verified(text, lambda f: f.write(b"hello there"))
    with pytest.raises(CheckpointError) as err:
        load_safely(text)
    assert str(err.value) == f"checkpoint {text}: cannot be loaded: the file is truncated or not a torch checkpoint"
    whole = tmp_path / "whole.ckpt"
    save_atomic({"w": torch.arange(100.0)}, whole)
    half = tmp_path / "half.ckpt"
    save_verified(half, lambda f: f.write(whole.read_bytes()[: whole.stat().st_size // 2]))  # saved cut short
    with pytest.raises(CheckpointError, match=r"truncated or not a torch checkpoint$"):
        load_safely(half)


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (ValueError("odd value\nsecond line"), "odd value"),
        (ValueError("  "), "ValueError"),
        (ValueError("x" * 200), "x" * 160),
        (KeyError("k"), "the file is truncated or not a torch checkpoint"),
        (EOFError(), "the file is truncated or not a torch checkpoint"),
        (RuntimeError("PytorchStreamReader failed reading ZIP archive"), "the file is truncated or not a torch checkpoint"),
        (RuntimeError("failed finding central directory"), "the file is truncated or not a torch checkpoint"),
        (RuntimeError("Weights only load failed"), "it holds objects other than tensors and plain values (not a pipeline checkpoint?)"),
        (RuntimeError("bad weights_only global"), "it holds objects other than tensors and plain values (not a pipeline checkpoint?)"),
        (RuntimeError("Unsupported global: x"), "it holds objects other than tensors and plain values (not a pipeline checkpoint?)"),
    ],
)
def test_why_a_checkpoint_cannot_be_loaded(tmp_path, monkeypatch, exc, reason):
    path = tmp_path / "c.ckpt"
    save_verified(path, lambda f: f.write(b"x"))

    def fail(*args, **kwargs):
        raise exc

    monkeypatch.setattr(checkpoint.torch, "load", fail)
    with pytest.raises(CheckpointError) as err:
        load_safely(path)
    assert str(err.value) == f"checkpoint {path}: cannot be loaded: {reason}"
    assert err.value.__cause__ is None and err.value.__suppress_context__


def _draws():
    return random.random(), float(np.random.random()), float(torch.rand(1))


def test_rng_state_survives_a_weights_only_round_trip(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    state = rng_state()
    assert state["cuda"] == [] or torch.cuda.is_available()
    expected = _draws()
    save_atomic(state, tmp_path / "rng.ckpt")
    _draws()
    set_rng_state(load_safely(tmp_path / "rng.ckpt"))
    assert _draws() == expected
    set_rng_state(state)
    assert _draws() == expected
    # numpy's state is plain ints a weights_only load accepts, with the generator's position.
    assert all(type(k) is int for k in state["numpy"]["state"]["key"]) and type(state["numpy"]["state"]["pos"]) is int
    assert state["numpy"]["bit_generator"] == "MT19937" and len(state["numpy"]["state"]["key"]) == 624


def test_a_numpy_state_not_at_the_start_of_its_block_restores(tmp_path):
    np.random.seed(5)
    np.random.random(3)  # pos moves on
    random.gauss(0, 1)  # python keeps a spare gauss
    state = rng_state()
    assert state["numpy"]["state"]["pos"] != 624
    expected = (random.gauss(0, 1), *_draws())
    np.random.seed(0)
    random.seed(0)
    set_rng_state(state)
    assert (random.gauss(0, 1), *_draws()) == expected


# ---- atomic ----------------------------------------------------------------------------------------
def _failing(exc):
    def write(f):
        f.write(b"half")
        raise exc

    return write


def test_causes_by_hand():
    assert cause_of(OSError(errno.EDQUOT, "x")) == "disk quota exceeded"
    assert cause_of(OSError(errno.EPERM, "x")) == "operation not permitted (an immutable dir?)"
    assert cause_of(OSError(errno.ENOENT, "No Such File")) == "no such file"
    assert cause_of(OSError("plain")) == "oserror"
    assert cause_of(FileNotFoundError()) == "filenotfounderror"


def test_write_error_says_what_to_do(tmp_path):
    full = write_error(tmp_path / "f", OSError(errno.EDQUOT, "x"))
    # A full disk is named: which one (its mount point) and how much is free on it.
    assert re.fullmatch(rf"cannot write {re.escape(str(tmp_path / 'f'))}: disk quota exceeded on the disk at "
                        rf"{re.escape(str(atomic.mount_of(tmp_path)))} \(\d+\.\d MB free\); free some space", str(full)), str(full)
    assert full.errno == errno.EDQUOT and full.filename == str(tmp_path / "f") and isinstance(full, OSError)
    space = write_error(tmp_path / "f", OSError(errno.ENOSPC, "x"))
    assert re.search(r"no space left on device on the disk at /\S* \(\d+\.\d MB free\); free some space$", str(space))
    perm = write_error(tmp_path / "f", OSError(errno.EPERM, "x"))
    assert str(perm) == (
        f"cannot write {tmp_path / 'f'}: operation not permitted (an immutable dir?); "
        "choose a writable dir (hydra.run.dir=<dir>)"
    )


def test_a_torch_write_failing_on_a_full_disk_is_named_as_one(tmp_path, monkeypatch):
    class Usage:
        free = (1 << 20) - 1

    seen = []
    monkeypatch.setattr(atomic.shutil, "disk_usage", lambda p: seen.append(p) or Usage())
    with pytest.raises(StoreWriteError) as err:
        write_atomically(tmp_path / "m.pt", _failing(RuntimeError("unexpected pos 64")))
    assert str(err.value) == (f"cannot write {tmp_path / 'm.pt'}: no space left on device on the disk at "
                              f"{atomic.mount_of(tmp_path)} (1.0 MB free); free some space")
    assert err.value.errno == errno.ENOSPC and err.value.__cause__ is None and err.value.__suppress_context__
    assert seen[0] == tmp_path and list(tmp_path.iterdir()) == []
    Usage.free = 1 << 20  # a MiB free: not full, the error goes on as it was
    with pytest.raises(RuntimeError, match="unexpected pos 64"):
        write_atomically(tmp_path / "m.pt", _failing(RuntimeError("unexpected pos 64")))

    def unknown(path):
        raise OSError(errno.ENOENT, "gone")

    monkeypatch.setattr(atomic.shutil, "disk_usage", unknown)
    with pytest.raises(RuntimeError, match="unexpected pos 64"):
        write_atomically(tmp_path / "m.pt", _failing(RuntimeError("unexpected pos 64")))


def test_a_store_write_error_from_inside_goes_on_unchanged(tmp_path):
    inner = write_error(tmp_path / "other", OSError(errno.EROFS, "x"))
    with pytest.raises(StoreWriteError) as err:
        write_atomically(tmp_path / "f", _failing(inner))
    assert err.value is inner and list(tmp_path.iterdir()) == []


def test_a_failed_write_whose_temp_file_cannot_be_removed_still_names_the_cause(tmp_path, monkeypatch):
    def cannot_unlink(self, missing_ok=False):
        raise PermissionError(errno.EACCES, "no")

    monkeypatch.setattr(atomic.Path, "unlink", cannot_unlink)
    with pytest.raises(StoreWriteError, match=r"no space left on device on the disk at .*; free some space$"):
        write_atomically(tmp_path / "f", _failing(OSError(errno.ENOSPC, "x")))


def test_the_bytes_go_to_a_temp_file_beside_the_target_until_the_rename(tmp_path):
    path = tmp_path / "result.json"
    path.write_text("old")
    seen = []

    def write(f):
        f.write(b"new")
        seen.append((f.name, path.read_text()))

    write_atomically(path, write)
    assert seen == [(str(tmp_path / "result.json.tmp"), "old")] and path.read_text() == "new"


def test_a_write_into_a_new_dir_returns_its_size_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "a" / "b" / "c.bin"
    assert write_atomically(str(path), lambda f: f.write(b"abc"), fsync=False) == 3
    assert path.read_bytes() == b"abc" and [p.name for p in path.parent.iterdir()] == ["c.bin"]
    assert write_atomically(path, lambda f: f.write(b"")) == 0 and path.read_bytes() == b""

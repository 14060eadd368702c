"""Checkpoint integrity: a checkpoint damaged in place (still a valid zip, still unpickles) is refused in one line,
nothing is rewritten, and the previous good checkpoint is kept and offered."""

import hashlib
import json
import zipfile

import pytest
import torch

from pipeline.store.checkpoint import load_safely, save_atomic, save_model
from pipeline.store.integrity import (
    ACCEPT_ENV,
    DamagedCheckpoint,
    UnverifiedFile,
    damaged_line,
    digest_path,
    previous_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from pipeline_testing import run_cli


def flip_tensor_bytes(path, count: int = 286) -> None:
    """Flip `count` bytes inside the largest tensor's data, in place: the size is unchanged, the zip's directory
    intact, and torch.load still reads it (it does not check the entries' CRCs)."""
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = (int.from_bytes(f.read(2), "little") for _ in range(2))
        start = info.header_offset + 30 + name_len + extra_len + info.file_size // 2 - count // 2
        f.seek(start)
        data = bytearray(f.read(count))
        f.seek(start)
        f.write(bytes(b ^ 0xFF for b in data))


def save(path, value: float, step: int) -> None:
    state = {"w": torch.full((64, 64), value), "step": step}
    save_checkpoint(path, lambda f: torch.save(state, f), step=step)


def test_a_damaged_checkpoint_that_still_unpickles_is_refused_and_the_previous_one_offered(tmp_path):
    path = tmp_path / "checkpoints" / "last.ckpt"
    save(path, 1.0, step=10)
    save(path, 2.0, step=20)
    assert torch.load(previous_checkpoint(path), weights_only=True)["step"] == 10  # the one it replaced, kept
    flip_tensor_bytes(path)
    assert torch.load(path, weights_only=True)["step"] == 20  # torch alone takes the damaged file
    with pytest.raises(DamagedCheckpoint, match="is damaged") as caught:
        load_safely(path)
    line = damaged_line(caught.value, path)
    assert "\n" not in line and "(step 10) is good" in line and f"ckpt_path={previous_checkpoint(path)}" in line
    assert load_safely(previous_checkpoint(path))["w"][0, 0] == 1.0


def test_a_damaged_last_checkpoint_never_replaces_the_good_previous_one(tmp_path):
    path = tmp_path / "last.ckpt"
    save(path, 1.0, step=1)
    save(path, 2.0, step=2)
    flip_tensor_bytes(path)
    from pipeline.store import integrity

    integrity._known_good.clear()  # as a new process would see it
    save(path, 3.0, step=3)  # the run continued from previous.ckpt and saves again
    assert load_safely(previous_checkpoint(path))["step"] == 1 and load_safely(path)["step"] == 3


def test_every_moment_of_a_save_leaves_files_that_match_their_digests(tmp_path, monkeypatch):
    """A kill between any two steps of a save: last.ckpt and previous.ckpt each match a digest beside them."""
    import os

    from pipeline.store import integrity

    path = tmp_path / "last.ckpt"
    save(path, 1.0, step=1)
    save(path, 2.0, step=2)
    seen = []
    real_replace = os.replace

    def replace_and_check(src, dst):
        real_replace(src, dst)
        integrity._known_good.clear()
        for p in (path, previous_checkpoint(path)):
            if p.is_file() and digest_path(p).is_file():
                verify_checkpoint(p)  # raises if this moment would be refused
        seen.append(str(dst))

    monkeypatch.setattr(integrity.os, "replace", replace_and_check)
    save(path, 3.0, step=3)
    assert len(seen) >= 4  # the digests, the previous link, the checkpoint, the final digest


def test_a_file_without_its_digest_is_refused_naming_the_override_that_accepts_it(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv(ACCEPT_ENV, raising=False)
    old = tmp_path / "old.ckpt"
    torch.save({"w": torch.ones(3)}, old)
    for read in (verify_checkpoint, load_safely):
        with pytest.raises(UnverifiedFile) as err:
            read(old)
        assert str(err.value) == (
            f"checkpoint {old} has no digest (old.ckpt.sha256), so it cannot be checked (written before the pipeline "
            "kept digests, or copied without it); to use it knowingly, set PIPELINE_ACCEPT_UNVERIFIED=1")
    monkeypatch.setenv(ACCEPT_ENV, "1")
    with caplog.at_level("WARNING", logger="pipeline"):
        assert verify_checkpoint(old) is None and load_safely(old)["w"].sum() == 3
    assert [r.getMessage() for r in caplog.records] == [
        f"checkpoint {old} has no digest: used unchecked (PIPELINE_ACCEPT_UNVERIFIED=1)"]  # said once
    # Accepting unchecked files never accepts a damaged one.
    save(tmp_path / "last.ckpt", 1.0, step=1)
    flip_tensor_bytes(tmp_path / "last.ckpt")
    with pytest.raises(DamagedCheckpoint):
        load_safely(tmp_path / "last.ckpt")


@pytest.mark.parametrize("name", ["model.pt", "best.pt", "obs_norm.pt"])
def test_every_weights_file_the_store_writes_is_checked_when_read_back(tmp_path, monkeypatch, name):
    """A bit flipped in model.pt (or best.pt, obs_norm.pt) is refused where it is read back, and a deleted digest
    too; what wrote them is the store's save_model / save_atomic (the lifecycle's and keep_best's writers)."""
    monkeypatch.delenv(ACCEPT_ENV, raising=False)
    state = {"w": torch.linspace(0, 1, 4096).reshape(64, 64)}
    if name == "model.pt":
        save_model(state, tmp_path)
    else:
        save_atomic(state, tmp_path / name)
    assert json.loads(digest_path(tmp_path / name).read_text())["sha256"] == [hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()]
    assert torch.equal(load_safely(tmp_path / name)["w"], state["w"])
    flip_tensor_bytes(tmp_path / name, count=1)
    with pytest.raises(DamagedCheckpoint, match=f"{name} is damaged"):
        load_safely(tmp_path / name, "model")
    save_atomic(state, tmp_path / name)
    digest_path(tmp_path / name).unlink()
    with pytest.raises(UnverifiedFile, match=f"{name} has no digest"):
        load_safely(tmp_path / name)


SUPERVISED = ("experiment=supervised_digits", "scheduler=none", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
              "trainer.limit_test_batches=1", "trainer.enable_progress_bar=false", "checkpoint.every_s=0")


@pytest.mark.slow
def test_a_resume_from_a_damaged_checkpoint_is_one_line_and_changes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    first = run_cli(*SUPERVISED, "trainer.max_epochs=2", f"hydra.run.dir={run_dir}")
    assert first.returncode == 0, first.stdout[-2000:]
    last = run_dir / "checkpoints" / "last.ckpt"
    flip_tensor_bytes(last)
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    done = run_cli(*SUPERVISED, "trainer.max_epochs=3", "ckpt_path=last", f"hydra.run.dir={run_dir}")
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, lines
    assert "is damaged" in lines[0] and "previous checkpoint (step 0) is good" in lines[0], lines
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before  # nothing rewritten
    offered = lines[0].rsplit("continue from it with ", 1)[1]
    again = run_cli(*SUPERVISED, "trainer.max_epochs=3", offered, f"hydra.run.dir={run_dir}")
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "ok" and record["segments"][-1]["from_step"] == 0

"""A disk that fills up: one line naming the full disk and the path, records that say how the run ended, and no
log storm (a "--- Logging error ---" traceback for every line the run logged)."""

import errno
import json
import logging
import os
import subprocess

import pytest

from pipeline.runtime.quiet import quiet_failing_log_handlers
from pipeline.store.atomic import StoreWriteError
from pipeline.store.record import write_json
from pipeline_testing import read_result, run_cli


class FullStream:
    """A file object on a full disk: every write fails with ENOSPC."""

    def write(self, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def flush(self):
        pass

    def close(self):
        pass


def test_a_log_file_on_a_full_disk_says_so_once_and_the_run_goes_on(tmp_path, capsys):
    root = logging.getLogger()
    handler = logging.FileHandler(tmp_path / "run.log")
    handler.stream.close()
    handler.stream = FullStream()
    saved = (root.handlers[:], root.level, logging.root.manager.disable)
    root.handlers, root.level = [handler], logging.INFO
    logging.disable(logging.NOTSET)  # whatever earlier tests in this worker did to logging
    # A logger of its own that reaches the root's handler (the `pipeline` logger's propagation and level are set by
    # the run's logging config, which an earlier test in the same process may have installed).
    probe = logging.getLogger("full_disk_probe")
    try:
        quiet_failing_log_handlers()
        for i in range(50):
            probe.info(f"line {i}")
    finally:
        root.handlers, root.level = saved[:2]
        logging.disable(saved[2])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # was: 50 tracebacks
    assert err[0].startswith(f"cannot write {tmp_path / 'run.log'}: no space left on device on the disk at ")
    assert "the run goes on" in err[0] and handler not in root.handlers


def test_a_record_on_a_full_disk_is_rewritten_in_place_rather_than_left_saying_running(tmp_path, monkeypatch):
    from pipeline.store import record as record_module

    path = tmp_path / "result.json"
    write_json(path, {"status": "running", "error": "run did not finish (killed, or still running)", "x": list(range(40))})

    def full(path, write, fsync=True, before_replace=None):
        raise StoreWriteError(errno.ENOSPC, f"cannot write {path}: no space left on device")

    monkeypatch.setattr(record_module, "write_atomically", full)
    write_json(path, {"status": "failed", "error": "cannot write last.ckpt: no space left on device"})
    assert json.loads(path.read_text()) == {"status": "failed", "error": "cannot write last.ckpt: no space left on device"}
    with pytest.raises(StoreWriteError):  # a record that cannot fit in the old one's blocks: the error stands
        write_json(path, {"status": "failed", "error": "x" * 10_000})


def test_the_same_failed_save_is_said_once_until_a_save_works(caplog):
    from pipeline.runtime.checkpointing import FailedSaves

    failures = FailedSaves()
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        for epoch in range(5):
            failures.warn(f"checkpoint of epoch {epoch} not saved", "cannot write last.ckpt: no space left on device")
        failures.clear()  # a save worked
        failures.warn("checkpoint of epoch 6 not saved", "cannot write last.ckpt: no space left on device")
    assert [r.getMessage() for r in caplog.records] == [
        "checkpoint of epoch 0 not saved: cannot write last.ckpt: no space left on device; training goes on",
        "checkpoint of epoch 6 not saved: cannot write last.ckpt: no space left on device; training goes on",
    ]


@pytest.fixture
def tiny_disk(tmp_path):
    """A 600 kB file system (tmpfs): room for a run's record and log, not for its checkpoints."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("a small file system needs root and mount (tmpfs) here")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


@pytest.mark.slow
def test_a_disk_that_fills_during_training_is_one_line_per_failed_save_and_no_traceback(tiny_disk):
    run_dir = tiny_disk / "run"
    (tiny_disk / "filler").write_bytes(b"\0" * 300_000)  # most of the disk taken by something else
    done = run_cli("experiment=supervised_digits", "trainer.max_epochs=3", "checkpoint.every_s=0",
                   "trainer.enable_progress_bar=false", f"hydra.run.dir={run_dir}")
    out = done.stdout + done.stderr
    assert "Traceback" not in out and "Logging error" not in out, out[-3000:]
    full = [line for line in out.splitlines() if "no space left on device" in line]
    assert full and all(f"on the disk at {tiny_disk}" in line for line in full), full
    assert len([line for line in full if "not saved" in line]) == 1, full  # said once, not once per epoch
    assert len(out.splitlines()) < 60, out  # no storm
    record = read_result(run_dir)
    assert record["status"] in ("ok", "failed") and "still running" not in (record.get("error") or ""), record


def test_a_full_disk_at_start_up_is_one_line_and_leaves_no_run_dir(tiny_disk):
    subprocess.run(f"cat /dev/zero > {tiny_disk / 'filler'}", shell=True, check=False, capture_output=True)
    done = run_cli("experiment=supervised_digits", "trainer=debug", f"hydra.run.dir={tiny_disk / 'run'}")
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, lines  # was: a 21-line traceback from the lock's first write
    assert "no space left on device" in lines[0] and "free some space" in lines[0], lines
    assert not (tiny_disk / "run").exists()

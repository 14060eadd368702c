"""Nothing a user owns is ever written: a run dir must be new or a run dir of the pipeline, and its lock is taken
before anything (Hydra's .hydra/ included) is written there."""

import json
import time

import pytest

from pipeline.runtime.preflight import RunRefused, check_run_dir_is_ours
from pipeline.store.layout import foreign_entries
from pipeline_testing import run_cli, start_module

QUICK = ("experiment=supervised_digits", "trainer=debug", "trainer.enable_progress_bar=false")


def user_folder(path):
    """A folder of a user's own files, named as a run's are."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "result.json").write_text('{"acc": 0.91, "note": "my thesis numbers"}\n')
    (path / "metrics.csv").write_text("epoch,acc\n0,0.5\n1,0.91\n")
    return {p.name: p.read_bytes() for p in path.iterdir()}


def test_an_empty_run_dir_is_refused_and_the_users_files_in_the_current_folder_stay_as_they_were(tmp_path):
    """`hydra.run.dir=$UNSET` (empty) named the current folder, and the run overwrote the user's result.json."""
    before = user_folder(tmp_path)
    done = run_cli(*QUICK, "hydra.run.dir=", cwd=tmp_path)
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines
    assert "hydra.run.dir= is empty" in lines[0] and "Traceback" not in lines[0]
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_folder_of_the_users_own_files_is_refused_as_a_run_dir(tmp_path):
    before = user_folder(tmp_path / "mine")
    done = run_cli(*QUICK, f"hydra.run.dir={tmp_path / 'mine'}")
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, lines
    assert "did not write (result.json)" in lines[0] and "hydra.run.dir=<dir>" in lines[0]
    assert {p.name: p.read_bytes() for p in (tmp_path / "mine").iterdir()} == before  # no .hydra/, no .lock


def test_foreign_entries_knows_a_run_dir_of_ours_from_a_users_folder(tmp_path):
    assert foreign_entries(tmp_path / "absent") == [] and foreign_entries(tmp_path) == []
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / "run.log").write_text("")
    (run / "checkpoints").mkdir()
    (run / "metrics.prev2.csv").write_text("")
    assert foreign_entries(run) == []  # killed before its record: only what the pipeline and Hydra write
    (run / "notes.txt").write_text("mine")
    assert foreign_entries(run) == ["notes.txt"]
    (run / "result.json").write_text(json.dumps({"experiment": "x", "seed": 0, "status": "ok", "run_dir": str(run)}))
    assert foreign_entries(run) == []  # its record says it is a run of ours: the user's notes beside it are fine
    (run / "result.json").write_text('{"acc": 1}')
    assert foreign_entries(run) == ["result.json"]
    with pytest.raises(RunRefused, match="did not write"):
        check_run_dir_is_ours(run)
    # A half-written record among the pipeline's own files is ours (its run may be resumed); beside a user's file, or
    # alone, it is not.
    (run / "result.json").write_text('{"experiment": "x", "se')
    assert foreign_entries(run) == ["result.json", "notes.txt"]
    (run / "notes.txt").unlink()
    assert foreign_entries(run) == []
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "result.json").write_text('{"experiment": "x", "se')
    assert foreign_entries(alone) == ["result.json"]


@pytest.mark.slow
def test_a_second_run_into_a_busy_dir_is_refused_before_it_writes_anything_there(tmp_path):
    """Two runs started into one dir: the second was refused only after it had rewritten the first's
    .hydra/config.yaml (seed 1 for a run trained with seed 0)."""
    run_dir = tmp_path / "run"
    first = start_module("pipeline", "experiment=supervised_digits", "trainer.max_epochs=100000", "seed=0",
                         "trainer.enable_progress_bar=false", f"hydra.run.dir={run_dir}")
    try:
        config = run_dir / ".hydra" / "config.yaml"
        end = time.monotonic() + 240
        while not config.is_file() and first.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
        # At once, as a user's second command a second later: the first run is still importing Lightning.
        second = run_cli("experiment=supervised_digits", "seed=1", f"hydra.run.dir={run_dir}")
        lines = (second.stdout + second.stderr).strip().splitlines()
        assert second.returncode == 1 and len(lines) == 1 and "is in use by process" in lines[0], lines
        while not (run_dir / "result.json").is_file() and first.poll() is None and time.monotonic() < end:
            time.sleep(0.2)
        assert first.poll() is None, first.stdout.getvalue()[-2000:]  # the first run trains on
        assert "seed: 0" in config.read_text() and "seed=1" not in (run_dir / ".hydra" / "overrides.yaml").read_text()
        assert json.loads((run_dir / "result.json").read_text())["seed"] == 0
    finally:
        first.kill()
        first.wait()

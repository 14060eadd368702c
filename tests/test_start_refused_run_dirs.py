"""The front door (`pipeline.runtime.start`, for the CLI and `pipeline.run`) leaves a run dir as it found it when the run
is refused after the dir was claimed (before any record: e.g. more DDP processes than batches): a dir that did not
exist is gone again with the folders made for it, a dir that existed empty is there and empty again (what Hydra wrote
into it goes), and a run that was not refused keeps what Hydra wrote. Each starting state a user can give is tried.

Hydra's own files are written here as Hydra writes them once the front door hands over (`.hydra/config.yaml`,
`run.log`); the claim and the release are the real ones.
"""

from pathlib import Path

import pytest

from pipeline.runtime.start import start_single_run


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def hydra_writes(run_dir: Path) -> None:
    (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    (run_dir / ".hydra" / "config.yaml").write_text("seed: 0\n")
    (run_dir / "run.log").write_text("")


@pytest.mark.parametrize("given", ["absent", "absent, parents too", "empty"])
def test_a_run_refused_after_its_claim_leaves_the_run_dir_as_it_was(tmp_path, monkeypatch, given):
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "runs" / "deep" / "run" if "parents" in given else tmp_path / "run"
    if given == "empty":
        run_dir.mkdir()
    before = tree(tmp_path)
    start = start_single_run(["experiment=supervised_digits", f"hydra.run.dir={run_dir}"])
    assert start.run_dir == run_dir and start.lock.path.is_file()
    hydra_writes(run_dir)
    start.release(refused=True)
    assert tree(tmp_path) == before, given


@pytest.mark.parametrize("given", ["absent", "empty"])
def test_a_run_that_was_not_refused_keeps_what_hydra_wrote(tmp_path, monkeypatch, given):
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    if given == "empty":
        run_dir.mkdir()
    start = start_single_run(["experiment=supervised_digits", f"hydra.run.dir={run_dir}"])
    hydra_writes(run_dir)
    start.release(refused=False)
    assert tree(tmp_path) == ["run", "run/.hydra", "run/.hydra/config.yaml", "run/run.log"]

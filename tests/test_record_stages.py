"""A run's record read at every stage of its life: it says `ok` only once the run has finished.

The records are read from disk (what a user, `pipeline.report` or a sweep's summary sees) while a real run is
under way: when the fit has started (the first safe point), right after each checkpoint, when the fit has ended and
the models are being saved, and after the run returned; and every write that says `ok` must describe a closed
segment (written once the run's work is done, not as each agent's results come in). Two agents in one process (each its own record) on the
state-checkpointing path (DQN), and the epoch-checkpointing path (Lightning, supervised).
"""

from __future__ import annotations

import copy
import os

import pipeline.runtime.run as run_module
from pipeline.runtime.run import run
from pipeline.store.curves import read_run_curve
from pipeline.store.record import RunRecord, read_result

DQN = ("experiment=dqn_cartpole", "env=cartpole_tensor", "task.stop_at_return=null", "trainer.enable_progress_bar=false",
       "task.total_steps=1024", "task.learning_starts=256", "task.eval_every=512", "task.eval_episodes=2",
       "checkpoint.every_steps=256", "checkpoint.every_s=null", "seeds_per_process=2", "seed=5")
SUPERVISED = ("experiment=supervised_digits", "trainer.max_epochs=3", "trainer.enable_progress_bar=false",
              "checkpoint.every_steps=1", "checkpoint.every_s=null")


def _watch(monkeypatch, dirs, curves: dict | None = None):
    """Read every agent's record at each stage the run passes; returns the list the readings go to. With `curves`,
    each agent's metrics.csv as it is on disk right after each checkpoint goes there too ({step: [curve per agent]})."""
    seen: list[tuple[str, list[dict | None]]] = []
    real_write = RunRecord.write

    def write(record, run_dir=None):
        real_write(record, run_dir)
        if record.status == "ok":
            seen.append(("written ok", [copy.deepcopy(record.to_dict())]))  # as written, not as it goes on

    def look(stage: str) -> None:
        seen.append((stage, [read_result(d) for d in dirs]))

    def started_once() -> None:
        if not seen:
            look("started")

    def after(note_save):
        def noted(**saved):
            if curves is not None:  # as a kill right after the checkpoint's save would leave them
                curves[saved["step"]] = [read_run_curve(d) for d in dirs]
            note_save(**saved)
            look(f"checkpoint {saved['step']}")

        return noted

    real_state, real_epochs, real_save_model = run_module.state_checkpointer, run_module.EpochCheckpointer, run_module.save_model

    def state_checkpointer(task, path, policy, stop, note_save, **kwargs):
        hook = real_state(task, path, policy, stop, after(note_save), **kwargs)

        def watched(final: bool = False) -> None:
            started_once()
            hook(final)

        return watched

    class EpochCheckpointer(real_epochs):
        def __init__(self, path, policy, stop, on_save, *args, **kwargs):
            super().__init__(path, policy, stop, after(on_save), *args, **kwargs)

        def on_train_batch_end(self, *args):
            started_once()
            super().on_train_batch_end(*args)

    def save_model(*args, **kwargs):
        look("saving the models")
        return real_save_model(*args, **kwargs)

    monkeypatch.setattr(run_module, "state_checkpointer", state_checkpointer)
    monkeypatch.setattr(run_module, "EpochCheckpointer", EpochCheckpointer)
    monkeypatch.setattr(run_module, "save_model", save_model)
    monkeypatch.setattr(RunRecord, "write", write)
    return seen


def _check_stages(seen, returned, dirs, checkpoints: int):
    assert [r["status"] for r in returned] == ["ok"] * len(dirs), [r.get("error") for r in returned]
    written_ok = [records[0] for stage, records in seen if stage == "written ok"]
    for record in written_ok:
        assert record["segments"][-1].get("end") == "ok" and record["error"] is None, record["segments"][-1]
    assert len(written_ok) >= len(dirs)
    seen = [(stage, records) for stage, records in seen if stage != "written ok"]
    stages = [stage for stage, _ in seen]
    assert stages[0] == "started" and stages[-1] == "saving the models", stages
    assert sum(s.startswith("checkpoint") for s in stages) >= checkpoints, stages
    for stage, records in seen:
        for d, record in zip(dirs, records, strict=True):
            assert record is not None, (stage, d)
            # A live run's record says so, naming its process (a reader that finds it gone says `failed`: store.owner).
            assert record["status"] == "running" and record["error"] is None, (stage, d, record["status"])
            assert record["owner"]["pid"] == os.getpid(), (stage, d)
            assert "end" not in record["segments"][-1], (stage, d)  # the segment is still open
            if stage.startswith("checkpoint"):
                step = int(stage.split()[1])
                assert record["checkpoint"]["step"] == step, (stage, d)
            else:
                assert stage == "started" or record["checkpoint"] is not None, (stage, d)
    for d, got in zip(dirs, returned, strict=True):
        on_disk = read_result(d)
        assert on_disk["status"] == got["status"] == "ok" and on_disk["error"] is None, d
        assert on_disk["segments"][-1]["end"] == "ok" and on_disk["metrics"], d


def test_a_dqn_batchs_records_say_ok_only_after_the_run(make_cfg, tmp_path, monkeypatch):
    dirs = [tmp_path / "seed5", tmp_path / "seed6"]
    curves: dict[int, list] = {}
    seen = _watch(monkeypatch, dirs, curves)
    returned = run(make_cfg(*DQN), tmp_path)
    _check_stages(seen, returned, dirs, checkpoints=3)
    _check_curves_on_disk_at_each_save(curves, dirs)


def _check_curves_on_disk_at_each_save(curves: dict, dirs) -> None:
    """What a resume from a checkpoint keeps (every curve row up to its step) is on disk when the checkpoint is, before
    anything else happens (a kill right after the save): the finished curve's rows up to that step, with the values
    they had then (the last step's row gains the final evaluation later)."""
    final = [read_run_curve(d) for d in dirs]
    assert any(s < step for step in curves for s in final[0]), (sorted(curves), sorted(final[0]))
    for step, on_disk in curves.items():
        for got, done in zip(on_disk, final, strict=True):
            assert sorted(s for s in got if s <= step) == sorted(s for s in done if s <= step), step
            assert all(got[s].items() <= done[s].items() for s in got if s <= step), step


def test_a_supervised_runs_record_says_ok_only_after_the_run(make_cfg, tmp_path, monkeypatch):
    curves: dict[int, list] = {}
    seen = _watch(monkeypatch, [tmp_path], curves)
    returned = run(make_cfg(*SUPERVISED), tmp_path)
    _check_stages(seen, returned, [tmp_path], checkpoints=2)
    _check_curves_on_disk_at_each_save(curves, [tmp_path])

"""seeds_per_process > 1: each seed gets its own TensorBoard run in <run dir>/seed<n>/, written while the batch trains."""

from __future__ import annotations

import math

import pandas as pd
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from pipeline.runtime.run import run
from pipeline_testing import read_result


def _scalars(event_dir) -> dict[str, dict[int, float]]:
    events = EventAccumulator(str(event_dir), size_guidance={"scalars": 0}).Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def _csv_rows(seed_dir) -> dict[str, dict[int, float]]:
    frame = pd.read_csv(seed_dir / "metrics.csv")
    return {col: {int(s): float(v) for s, v in zip(frame["step"], frame[col]) if not math.isnan(v)}
            for col in frame.columns if col != "step"}


def test_each_seed_of_a_batch_has_its_own_tensorboard_run_equal_to_its_metrics_csv(make_cfg, tmp_path):
    cfg = make_cfg("experiment=ppo_cartpole", "trainer=debug", "seeds_per_process=2", "seed=3", "logger=[csv,tensorboard]")
    records = run(cfg, tmp_path)
    assert [r["status"] for r in records] == ["ok", "ok"], [r["error"] for r in records]
    assert not (tmp_path / "tensorboard").exists()  # no batch-wide run that mixes the seeds
    curves = {}
    for seed in (3, 4):
        seed_dir = tmp_path / f"seed{seed}"
        assert read_result(seed_dir)["seed"] == seed
        tb, csv = _scalars(seed_dir / "tensorboard"), _csv_rows(seed_dir)
        shared = sorted(set(tb) & set(csv))
        # The curves a K = 1 run shows: training return, evaluations, the algorithm's losses, on the env-step axis.
        assert "eval/return_mean" in shared and "train/episodic_return" in shared and len(shared) >= 5, shared
        for tag in shared:
            assert tb[tag].keys() == csv[tag].keys(), tag
            for step, value in csv[tag].items():  # TensorBoard stores float32
                assert math.isclose(tb[tag][step], value, rel_tol=1e-6, abs_tol=1e-6), (tag, step)
        assert tb["env_step"] == {s: float(s) for s in tb["env_step"]}  # x axis = the seed's env steps
        # The HParams tab holds the seed's own final record, as for a K = 1 run.
        (final,) = tb["final/eval/return_mean"].values()
        assert math.isclose(final, read_result(seed_dir)["metrics"]["eval/return_mean"], rel_tol=1e-6)
        curves[seed] = csv
    # The two seeds are two runs, not one curve written twice.
    assert curves[3]["train/episodic_return"] != curves[4]["train/episodic_return"]

"""A report built from a real seed-batched DQN run (the CLI, as a user types it): the curve report.json holds."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from pipeline.report import build_report
from pipeline_testing import run_cli

SEEDS = 4


@pytest.mark.slow
def test_curve_of_a_real_batched_cartpole_run(tmp_path):
    done = run_cli("experiment=dqn_cartpole", f"seeds_per_process={SEEDS}", "task.total_steps=6000", "task.eval_every=1500",
                   "trainer.enable_progress_bar=false", f"hydra.run.dir={tmp_path}")
    assert done.returncode == 0, done.stderr[-2000:]
    report = build_report([tmp_path], tmp_path / "report", reps=300)
    assert list(report["groups"]) == ["dqn_cartpole"]  # K seeds of one config: one group, named by its experiment
    curve = report["groups"]["dqn_cartpole"]["curve"]
    assert curve["x"] == "env steps" and curve["bounds"] == [0.0, 500.0]
    assert curve["n_seeds"] == [SEEDS] * len(curve["steps"])
    # By hand at the last step: each seed's last evaluation, IQM of 4 = mean of the middle two.
    last = []
    for seed in range(SEEDS):
        frame = pd.read_csv(tmp_path / f"seed{seed}" / "metrics.csv")
        evaluated = frame.dropna(subset=["eval/return_mean"])
        assert evaluated["step"].iloc[-1] == curve["steps"][-1]
        last.append(float(evaluated["eval/return_mean"].iloc[-1]))
    assert curve["iqm"][-2] == pytest.approx(np.mean(sorted(last)[1:3]))
    assert min(last) - 1e-9 <= curve["ci_low"][-2] <= curve["iqm"][-2] <= curve["ci_high"][-2] <= max(last) + 1e-9
    # The curve's last point is the final evaluation: the table's IQM and CI, from each seed's record.
    finals = [json.loads((tmp_path / f"seed{seed}" / "result.json").read_text())["metrics"]["eval/return_mean"]
              for seed in range(SEEDS)]
    group = report["groups"]["dqn_cartpole"]
    assert curve["last_point"] == "final" and curve["steps"][-1] == curve["steps"][-2]
    assert curve["iqm"][-1] == group["iqm"] == pytest.approx(np.mean(sorted(finals)[1:3]))
    assert [curve["ci_low"][-1], curve["ci_high"][-1]] == group["iqm_ci"]
    on_disk = json.loads((tmp_path / "report" / "report.json").read_text())
    assert on_disk["groups"]["dqn_cartpole"]["curve"]["iqm"] == curve["iqm"]

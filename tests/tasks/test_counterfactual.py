"""The counterfactual-auction task end to end: run record, figure, CSV logs and bad input, sweep coverage."""

import json

import pytest
import torch

from pipeline.games.auction import save_bids_csv, simulate_first_price_bids
from pipeline.report import build_report
from pipeline.run import run
from pipeline_testing import read_result, run_cli

FAST = ("experiment=rmac_auction", "task.rules=[second_price_r0.0,second_price_r0.5,first_price_n3]",
        "task.statistics=[revenue]", "data.n_bids=2000")


def test_default_experiment_point_estimates_within_003(tmp_path):
    proc = run_cli("experiment=rmac_auction", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = read_result(tmp_path)
    m = record["metrics"]
    rules = record["rules"]
    assert len(rules) == 16 and record["simulated"] and record["n_bids"] == 5000
    for rule in rules:
        assert abs(m[f"cf/{rule}/point"] - m[f"cf/{rule}/truth"]) <= 0.03, rule
        for eps in ("0.001", "0.005", "0.02"):
            assert m[f"cf/{rule}/lower_eps{eps}"] <= m[f"cf/{rule}/point"] <= m[f"cf/{rule}/upper_eps{eps}"]
        assert "cfw/" + rule + "/point" in m
    assert m["cf/max_abs_point_error"] <= 0.03
    assert (tmp_path / "revenue_vs_reserve.png").stat().st_size > 10_000


def test_user_csv_has_no_truth_and_bad_csv_is_one_line(tmp_path, make_cfg):
    bids = simulate_first_price_bids(1000, 2, generator=torch.Generator().manual_seed(3)).bids
    path = save_bids_csv(tmp_path / "bids.csv", bids, 2)
    record = run(make_cfg(*FAST, f"data.path={path}"), tmp_path / "ok")
    assert record["status"] == "ok", record["error"]
    assert not record["simulated"] and not any(k.endswith("/truth") for k in record["metrics"])

    bad = tmp_path / "bad.csv"
    bad.write_text("price\n0.3\n0.4\n")
    proc = run_cli(*FAST, f"data.path={bad}", f"hydra.run.dir={tmp_path / 'bad'}")
    assert proc.returncode != 0
    error = read_result(tmp_path / "bad")["error"]
    assert "bad.csv" in error and "\n" not in error


@pytest.mark.parametrize("k", [None, 0.6])
def test_sweep_report_has_coverage(tmp_path, make_cfg, k):
    for seed in range(3):
        overrides = [*FAST, f"seed={seed}"] + ([f"data.k={k}"] if k is not None else [])
        assert run(make_cfg(*overrides), tmp_path / f"s{seed}")["status"] == "ok"
    report = build_report([tmp_path], tmp_path / "report", reps=200)
    (section,) = report["counterfactual"].values()
    assert section["n_seeds"] == 3
    assert section["coverage"]["second_price_r0.5"]["0.02"] == 1.0
    assert (tmp_path / "report" / section["figure"]).is_file()
    assert "Counterfactual coverage" in (tmp_path / "report" / "report.md").read_text()
    assert json.loads((tmp_path / "report" / "report.json").read_text())["counterfactual"]

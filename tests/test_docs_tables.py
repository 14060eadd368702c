"""The docs' generated tables are what their sources give: docs/running.md's config groups are what conf/ lists
(`python -m pipeline --help`), docs/presets.md's presets table is what benchmarks/presets_table.py renders from the
committed results files."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from docs_tables import PAGE, help_groups, page_table, table


def test_the_config_group_table_is_what_help_lists():
    groups = help_groups()
    assert "ppo" in groups["task"] and "actor_critic" in groups["model"] and "ppo_cartpole" in groups["experiment"]
    documented = page_table(PAGE.read_text())
    assert documented == table(groups), "docs/running.md's table is out of date: run `python tests/docs_tables.py`"
    for group, options in groups.items():  # every group and option --help lists is in a row of the page
        row = next(line for line in documented.splitlines() if line.startswith(f"| `{group}` |"))
        assert all(f"`{o}`" in row for o in options), group


# ---- docs/presets.md's table: rendered by benchmarks/presets_table.py from the committed results files.

ROOT = Path(__file__).resolve().parents[1]
_SPEC = importlib.util.spec_from_file_location("presets_table", ROOT / "benchmarks" / "presets_table.py")
presets_table = sys.modules.setdefault("presets_table", importlib.util.module_from_spec(_SPEC))
_SPEC.loader.exec_module(presets_table)


def test_the_presets_table_is_what_the_results_render():
    documented = presets_table.page_table(presets_table.PAGE.read_text())
    assert documented == presets_table.table(), (
        "docs/presets.md's table is not what benchmarks/results/ say: run `python benchmarks/presets_table.py --write`")
    assert "How the numbers compare" in presets_table.PAGE.read_text().split(presets_table.END, 1)[1]  # the prose stays


def row(preset: str, seed: int, value: float, **kw) -> dict:
    base = {"preset": preset, "seed": seed, "k": 8, "status": "ok", "error": None, "primary_metric": "eval/return_mean",
            "value": value, "higher_is_better": True, "threshold": 475.0, "reached_threshold": value is not None and value >= 475,
            "env_steps": 1000 * (seed + 1), "metrics": {}, "cpu_s": 10.0 + seed, "date": "2026-01-02"}
    return {**base, **kw}


def cell(preset: str, results: list[dict], offpolicy: list[dict] | None = None) -> str:
    line = next(li for li in presets_table.table(results, offpolicy or []).splitlines() if li.startswith(f"| `{preset}` |"))
    return line.split(" | ")[3]


def test_a_preset_cell_says_what_its_seeds_reached():
    # Eight seeds scoring 400, 410, ..., 470 plus one at 500: IQM (25% trimmed each side of 8) = mean(420..450) = 435.
    values = [400, 410, 420, 430, 440, 450, 460, 500]
    text = cell("ppo_cartpole", [row("ppo_cartpole", s, v) for s, v in enumerate(values)])
    assert text.startswith("seeds 0-7, one process (K = 8); `eval/return_mean` IQM 435.0 [95% CI ")
    assert "400.0 to 500.0" in text and "1/8 reached the threshold 475" in text and "1/8 >= 500" in text
    assert "median 4k env steps, 14 CPU s a seed (2026-01-02;" in text  # medians of 1k..8k and 10..17
    # A changed result is a changed table: the page's test then fails until --write is run.
    changed = cell("ppo_cartpole", [row("ppo_cartpole", s, v + (s == 3)) for s, v in enumerate(values)])
    assert changed != text and "IQM 435.2 " in changed


def test_a_failed_seed_is_named_and_left_out_of_the_scores():
    rows = [row("dqn_cartpole", s, 500.0, k=1) for s in range(4)]
    rows.append(row("dqn_cartpole", 4, None, k=1, status="failed", error="RuntimeError: boom"))
    text = cell("dqn_cartpole", rows)
    assert text.startswith("seeds 0-4, single runs; 1 failed (seed 4: RuntimeError: boom); `eval/return_mean` IQM 500.0")
    assert "4/4 reached the threshold 475" in text


def test_a_bound_that_misses_the_truth_is_counted_with_its_miss():
    # Two counterfactuals, each with bounds at two eps: b's eps 0.02 bounds [0.5, 0.9] miss its truth 0.25 by 0.25.
    metrics = {"cf/a/point": 0.4, "cf/a/truth": 0.5, "cf/a/lower_eps0.01": 0.3, "cf/a/upper_eps0.01": 0.6,
               "cf/a/lower_eps0.02": 0.5, "cf/a/upper_eps0.02": 0.7,
               "cf/b/point": 0.3, "cf/b/truth": 0.25, "cf/b/lower_eps0.01": 0.0, "cf/b/upper_eps0.01": 0.25,
               "cf/b/lower_eps0.02": 0.5, "cf/b/upper_eps0.02": 0.9}
    found = presets_table.checks({"primary_metric": "cf/a/point", "metrics": metrics})
    assert found == {"truth": 0.5, "bounds_held": {"0.01": [2, 2, 0.0], "0.02": [1, 2, 0.25]}}
    text = cell("rmac_auction", [row("rmac_auction", 0, 0.4, k=1, threshold=None, **found)])
    assert "IQM 0.4000 [95% CI 0.4000, 0.4000] (the truth: 0.5000)" in text
    assert "bounds held the truth in 2/2 at eps 0.01, 1/2 at eps 0.02 (missed by at most 0.25)" in text


def test_a_preset_without_results_says_so():
    assert cell("gan_atari", []).startswith("not measured by the script yet: `python benchmarks/presets_table.py --run gan_atari`")
    assert cell("dqn_atari", []).startswith("needs a CUDA GPU")
    assert cell("sac_hopper", []).startswith("not measured yet: `make bench-offpolicy-cleanrl` has no rows of ours")


def test_a_mujoco_preset_reads_our_rows_of_the_offpolicy_bench():
    ours = [{"algo": "td3", "env": "Hopper-v4", "side": "ours", "seed": s, "env_steps": 100_000, "final_return": v,
             "k": 4, "cpu_s": 100.0, "date": "2026-01-03"} for s, v in enumerate([1000.0, 2000.0, 3000.0, 4000.0])]
    theirs = [{**r, "side": "cleanrl", "final_return": 10.0, "k": 1} for r in ours]
    other = [{**r, "algo": "sac"} for r in ours]
    text = cell("td3_hopper", [], ours + theirs + other)
    # 4 values: floor(4/4) = 1 trimmed each side, IQM = mean(2000, 3000).
    assert text.startswith("seeds 0-3, one process (K = 4) on Hopper-v4 at 100k env steps: `eval/return_mean` IQM 2,500.0")
    assert "CleanRL, same budget: IQM 10.0 over 4 seeds" in text and "2026-01-03" in text
    assert cell("td3_hopper", [], theirs).startswith("not measured yet")  # CleanRL's rows alone are not ours


def test_each_budget_names_the_presets_own():
    # The budget column is text: it must name the budget conf/ gives the preset (a 300k that became 100k).
    with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
        for name, preset in presets_table.PRESETS.items():
            cfg = compose(config_name="config", overrides=[f"experiment={name}"])
            if cfg.task.get("total_steps") is not None:
                expected = presets_table.steps(cfg.task.total_steps)
            elif cfg.task.get("max_iterations") is not None:
                expected = f"{cfg.task.max_iterations} iterations"
            elif cfg.data.get("n_bids") is not None:
                expected = f"{cfg.data.n_bids:,} bids"
            else:
                expected = f"{cfg.trainer.max_epochs} epochs"
            assert expected in preset.budget, (name, expected, preset.budget)
    assert set(presets_table.PRESETS) == {p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml")}


def test_run_refuses_an_unknown_preset_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "presets_table.py"), "--run", "dqn_cartpol",
                          "--results", str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("error: dqn_cartpol: not a preset this script runs; choose from dqn_cartpole,")
    assert not (tmp_path / "out").exists() and not (tmp_path / "r.jsonl").exists()


@pytest.mark.slow
def test_run_appends_one_line_per_seed_and_a_rerun_runs_nothing(tmp_path):
    results, out = tmp_path / "r.jsonl", tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "presets_table.py"), "--run", "cem_cartpole", "--smoke",
           "--results", str(results), "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=tmp_path)
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [r["seed"] for r in rows] == [0, 1, 2, 3, 4] and {r["k"] for r in rows} == {5}
    for r in rows:  # each line is its seed's record, read back from the run dir the command names
        record = json.loads((out / "cem_cartpole" / "seeds0-4" / f"seed{r['seed']}" / "result.json").read_text())
        assert (r["status"], r["value"], r["env_steps"]) == ("ok", record["metrics"]["eval/return_mean"], record["env_steps"])
        assert r["command"].startswith("python -m pipeline experiment=cem_cartpole seed=0 seeds_per_process=5 trainer=debug")
        assert r["cpu_s"] > 0 and r["commit"] == record["git_commit"]
    again = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=tmp_path)
    assert again.stdout == "" and results.read_text().count("\n") == 5

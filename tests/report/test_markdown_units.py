"""report.md from a report dict written by hand, against the page written out by hand."""

from __future__ import annotations

from pipeline.report.markdown import cell, fmt, fmt_ci, one_line, render_markdown, table


def test_fmt_and_cells():
    assert fmt(None) == "—" and fmt(3) == "3" and fmt("x") == "x"
    assert fmt(0.123456) == "0.1235" and fmt(9999.4) == "9999" and fmt(12345.6) == "12,346" and fmt(-25000.0) == "-25,000"
    assert fmt(10000.0) == "10,000"
    assert fmt_ci(None) == "—" and fmt_ci([]) == "—" and fmt_ci([1.0, 2.5]) == "[1, 2.5]"
    assert one_line("a\n  b\tc ") == "a b c" and one_line(None) == "—"
    assert one_line("abcdef", 4) == "abc…" and one_line("abcd", 4) == "abcd" and one_line("abcdef", 0) == "abcdef"
    assert cell("x | y\nz") == "x \\| y z"
    assert table(["a", "b"], [[1, "p|q"], [None, 2.0]]) == ["| a | b |", "|---|---|", "| 1 | p\\|q |", "| — | 2 |", ""]
    assert table(["a"], []) == ["| a |", "|---|", ""]


def _rl_group():
    return {
        "experiment": "dqn_cartpole", "task": "dqn", "primary_metric": "eval/return", "primary_curve": "eval/return",
        "higher_is_better": True, "n_runs": 6, "n_ok": 2, "n_failed": 1, "n_interrupted": 0, "n_pruned": 1,
        "n_running": 0, "n_excluded": 1, "mean": 450.0, "std": 70.71, "median": 450.0, "iqm": 450.0,
        "iqm_ci": [400.0, 500.0], "mean_ci": [401.5, 498.5], "min": 400.0, "max": 500.0,
        "ci_note": "only 2 seeds", "table_value": "each seed's final value",
        "seed_cost_s_mean": 12.5, "seeds_per_process": [2], "batch_wall_time_s_mean": 25.0, "n_batches": 1,
        "curve": {"metric": "eval/return", "x": "env step", "steps": [0.0, 10000.0, 20000.0], "iqm": [0.0, 300.0, 450.0],
                  "ci_low": [0.0, 250.0, 400.0], "ci_high": [0.0, 350.0, 500.0], "held_from": [None, 15000.0],
                  "last_point": "final"},
        "threshold": {"threshold": 475.0, "n_reached": 1, "n_seeds": 2, "median_reached_s": 90.0,
                      "min_reached_s": 80.0, "max_reached_s": 100.0, "median_all_s": None},
        "per_seed": {
            "0": {"seed": 0, "value": 500.0, "seed_cost_s": 12.5, "wall_time_s": 25.0, "time_to_threshold_s": 90.0,
                  "env_steps": 20000.0, "env_steps_per_s": 2000.0, "relative_dir": "0"},
            "1": {"seed": 1, "value": 400.0, "seed_cost_s": 12.5, "wall_time_s": 25.0, "time_to_threshold_s": None,
                  "env_steps": 15000.0, "env_steps_per_s": 1500.0, "relative_dir": "1"},
        },
        "failed": [{"seed": 2, "error": "RuntimeError: bad | value\nTraceback", "relative_dir": "2"}],
        "interrupted": [], "running": [],
        "pruned": [{"seed": 3, "error": "x" * 300, "relative_dir": "3"}],
        "other_status": {"odd": [{"seed": 4, "error": "who knows", "relative_dir": "4"}],
                         "odder": [{"seed": 8, "error": "?", "relative_dir": "8"}]},
        "excluded": [{"seed": 5, "reason": "no final value", "relative_dir": "5"}],
    }


def _plain_group():
    return {
        "experiment": "sup", "task": "supervised", "primary_metric": "test/loss", "primary_curve": None,
        "higher_is_better": False, "n_runs": 1, "n_ok": 0, "n_failed": 0, "n_interrupted": 0, "n_pruned": 0,
        "n_running": 1, "n_excluded": 0, "mean": None, "std": None, "median": None, "iqm": None, "iqm_ci": None,
        "mean_ci": None, "min": None, "max": None, "ci_note": None, "seed_cost_s_mean": 3.0, "seeds_per_process": [1],
        "batch_wall_time_s_mean": None, "n_batches": 0, "curve": None, "threshold": None, "per_seed": {},
        "failed": [], "interrupted": [], "pruned": [], "other_status": {}, "excluded": [],
        "running": [{"seed": 9, "error": None, "relative_dir": "r/9"}],
    }


def _report():
    return {
        "inputs": ["/data/a", "/data/b"], "n_runs": 7,
        "settings": {"bootstrap_reps": 2000, "seed": 0, "confidence": 0.95},
        "status_counts": {"ok": 2, "failed": 1, "interrupted": 0, "pruned": 1, "running": 1, "odd": 1},
        "partial": True, "warnings": ["first\nwarning", "second"],
        "groups": {"rl": _rl_group(), "sup": _plain_group()},
        "comparisons": {"test/loss": {"higher_is_better": False, "probability_of_improvement": [
            {"x": "a", "y": "b", "p": 0.75, "ci": [0.5, 1.0]}, {"x": "b", "y": "a", "p": 0.25, "ci": None}]},
            "eval/return": {"higher_is_better": True, "probability_of_improvement": [
                {"x": "c", "y": "d", "p": 0.5, "ci": [0.25, 0.75]}]}},
        "images": [
            {"kind": "learning_curves", "metric": "eval/return", "title": "Curves", "file": "curves.png"},
            {"kind": "probability_of_improvement", "metric": "test/loss", "title": "PoI", "file": "poi.png"},
            {"kind": "performance_profile", "metric": "other", "title": "Profile other", "file": "prof_other.png"},
            {"kind": "performance_profile", "metric": "test/loss", "title": "Profile", "file": "prof.png"},
            {"kind": "final_scores", "metric": None, "title": "Finals", "file": "finals.png"},
            {"kind": "interval_estimates", "metric": "m", "title": "Intervals", "file": "ci.png"},
            {"kind": "time_to_threshold", "metric": None, "title": "Times", "file": "ttt.png"},
            {"kind": "unknown", "metric": None, "title": "Nope", "file": "nope.png"},
        ],
        "counterfactual": {"auction": {"n_seeds": 1, "coverage": {"second_price_r0.5": {"0.1": 1.0}}}},
    }


EXPECTED = """\
# Seed-distribution report

7 runs in 2 group(s), read from:

- `/data/a`
- `/data/b`

IQM is the interquartile mean (25% trimmed mean, as in rliable), robust to an outlier seed. CIs are 95% stratified \
bootstrap percentile intervals (2000 resamples, seed 0). std uses ddof=1.

Runs by status: ok 2, failed 1, interrupted 0, pruned 1, running 1, odd 1.

> **Partial report:** 1 run(s) still running; every number below may change when they finish. Build the report again then.

> **Warning:** first warning

> **Warning:** second

## Summary

| group | primary metric | ok | failed | interrupted | pruned | running | mean ± std | median | IQM [95% CI] | min | max |
|---|---|---|---|---|---|---|---|---|---|---|---|
| rl | eval/return | 2 | 1 | 0 | 1 | 0 | 450 ± 70.71 | 450 | 450 [400, 500] | 400 | 500 |
| sup | test/loss | 0 | 0 | 0 | 0 | 1 | — | — | — | — | — |

## Time to threshold

Wall-clock seconds until the evaluation return first reached the threshold. Seeds that never reached it are not \
dropped: the last column counts them as infinitely slow, so it is `—` when half or more of the seeds never got there.

| group | threshold | seeds reached | median s (reached) | min s | max s | median s (all seeds, never = ∞) |
|---|---|---|---|---|---|---|
| rl | 475 | 1/2 | 90 | 80 | 100 | — |

## Comparison on test/loss

P(X better than Y) is the chance that a random seed of X has a lower final test/loss than a random seed of Y \
(ties count half); 0.5 means no difference. CIs are 95% stratified bootstrap.

| X | Y | P(X better than Y) | 95% CI |
|---|---|---|---|
| a | b | 0.75 | [0.5, 1] |
| b | a | 0.25 | — |

![PoI](poi.png)

![Profile](prof.png)

## Comparison on eval/return

P(X better than Y) is the chance that a random seed of X has a higher final eval/return than a random seed of Y \
(ties count half); 0.5 means no difference. CIs are 95% stratified bootstrap.

| X | Y | P(X better than Y) | 95% CI |
|---|---|---|---|
| c | d | 0.5 | [0.25, 0.75] |

## Figures

![Curves](curves.png)

![Finals](finals.png)

![Intervals](ci.png)

![Times](ttt.png)

## Counterfactual coverage: auction

Fraction of the 1 seed(s) whose robust bounds contain the true value.

| rule | eps 0.1 |
|---|---|
| second_price_r0.5 | 1.00 |

## Groups

### rl

- experiment: `dqn_cartpole`, task: `dqn`
- primary metric: `eval/return` (higher is better); learning curve: `eval/return`
- runs: 6 (2 ok, 1 failed, 0 interrupted, 1 pruned, 0 running, 1 odd, 1 odder, 1 excluded)
- cost per seed: mean 12.5 s (a process's wall time / the seeds it trained, seeds_per_process=2)
- wall time per batch of 2 seeds (one process): mean 25 s over 1 batch
- IQM 450 [400, 500], mean 450 [401.5, 498.5]
- value: each seed's final value
- curve `eval/return` ends at the final evaluation, the table's IQM: IQM 450 [400, 500] at 20,000 env step; 1 of 2 \
seeds stopped earlier and hold their final evaluation
- note: only 2 seeds

Per seed:

| seed | eval/return | seed cost s (batch / K) | time to threshold s | env steps | env steps/s | dir |
|---|---|---|---|---|---|---|
| 0 | 500 | 12.5 | 90 | 20,000 | 2000 | `0` |
| 1 | 400 | 12.5 | never | 15,000 | 1500 | `1` |

Failed runs:

| seed | error | dir |
|---|---|---|
| 2 | RuntimeError: bad \\| value Traceback | `2` |

Pruned runs (stopped by the tuner):

| seed | why | dir |
|---|---|---|
| 3 | """ + "x" * 239 + """… | `3` |

Runs with status `odd`:

| seed | why | dir |
|---|---|---|
| 4 | who knows | `4` |

Runs with status `odder`:

| seed | why | dir |
|---|---|---|
| 8 | ? | `8` |

Excluded runs (status ok, no usable final value):

| seed | reason | dir |
|---|---|---|
| 5 | no final value | `5` |

### sup

- experiment: `sup`, task: `supervised`
- primary metric: `test/loss` (lower is better); learning curve: `None`
- runs: 1 (0 ok, 0 failed, 0 interrupted, 0 pruned, 1 running, 0 excluded)
- wall time per run: mean 3 s

Runs still running (this report is partial):

| seed | why | dir |
|---|---|---|
| 9 | — | `r/9` |
"""


def test_the_whole_page_by_hand():
    assert render_markdown(_report()).splitlines() == EXPECTED.splitlines()
    assert render_markdown(_report()).endswith("`r/9` |\n")


def test_a_finished_report_without_thresholds_figures_or_auctions():
    report = _report()
    g = report["groups"]["rl"]
    g.update(threshold=None, seeds_per_process=[1], seed_cost_s_mean=None, n_batches=2, table_value=None, ci_note=None)
    g["curve"].update(last_point="last", held_from=[None, None])
    report.update(partial=False, warnings=[], comparisons={}, counterfactual={},
                  images=[i for i in report["images"] if i["kind"] not in
                          ("learning_curves", "final_scores", "interval_estimates", "time_to_threshold")])
    report["groups"] = {"rl": g}
    lines = render_markdown(report).splitlines()
    assert not any(line.startswith(("> **Partial", "> **Warning", "## Time to", "## Comparison", "## Figures",
                                    "## Counterfactual", "- cost", "- wall time", "- value", "- note"))
                   for line in lines)
    assert "- curve `eval/return` ends at: IQM 450 [400, 500] at 20,000 env step" in lines
    assert "| seed | eval/return | wall time s | dir |" in lines
    assert "| 0 | 500 | 25 | `0` |" in lines
    # Held seeds under a curve that ends at its last value.
    g["curve"]["held_from"] = [1.0, None]
    assert any(line.endswith("; 1 of 2 seeds stopped earlier and hold their last value")
               for line in render_markdown(report).splitlines())
    g["seeds_per_process"], g["seed_cost_s_mean"], g["batch_wall_time_s_mean"], g["n_batches"] = [3, 2], 1.0, 4.0, 2
    lines = render_markdown(report).splitlines()
    assert "- cost per seed: mean 1 s (a process's wall time / the seeds it trained, seeds_per_process=3/2)" in lines
    assert "- wall time per batch of 3/2 seeds (one process): mean 4 s over 2 batches" in lines
    g["batch_wall_time_s_mean"] = None
    assert not any(line.startswith("- wall time per batch") for line in render_markdown(report).splitlines())
    g["curve"]["steps"] = []
    assert not any(line.startswith("- curve") for line in render_markdown(report).splitlines())
    g["primary_metric"] = None
    assert "| seed | value | seed cost s (batch / K) | dir |" in render_markdown(report).splitlines()


def test_thresholds_after_a_group_without_one():
    report = _report()
    report["groups"] = {"sup": _plain_group(), "rl": _rl_group()}
    report["groups"]["rl"]["threshold"]["median_all_s"] = 120.0
    assert "| rl | 475 | 1/2 | 90 | 80 | 100 | 120 |" in render_markdown(report).splitlines()

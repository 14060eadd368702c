"""The training progress bar of an RL run counts env steps against the budget, with the returns beside it."""

from __future__ import annotations

import re

import pytest


def test_a_dqn_bar_shows_env_steps_of_the_budget_and_the_returns(make_cfg, tmp_path, capsys):
    from pipeline.runtime.run import run

    cfg = make_cfg("experiment=dqn_cartpole", "trainer=debug", "trainer.enable_progress_bar=true")
    (record,) = run(cfg, tmp_path)
    assert record["status"] == "ok", record["error"]
    out = capsys.readouterr().out
    # The bar's last state: all 192 env steps of trainer=debug's budget of 192 (not Lightning's "Epoch 0" over
    # 3 rounds), the mean return
    # of the last episodes and the last evaluation (debug: one evaluation, at env step 128).
    last = [s for s in re.split(r"[\r\n]", out) if s.startswith("env steps")][-1]
    assert "192/192" in last and record["env_steps"] == 192 and "100%" in last, last
    (evaluated,) = [e["return_mean"] for e in record["evaluations"]]
    assert re.search(r"return=\d+\.\d", last) and f"eval={evaluated:.1f}" in last, last
    assert "Epoch" not in out
    # Off a terminal (captured output is not one): whole lines, no redrawn frames, no empty "Training: 0/?" state.
    assert "\r" not in out and "Training" not in out
    assert len([s for s in out.splitlines() if s.startswith("env steps")]) <= 2  # the first state and the last
    assert not (tmp_path / "videos").exists()  # videos during training cost nothing unless asked for (video_every)


def test_a_supervised_run_off_a_terminal_writes_lines_without_validation_or_test_bars(make_cfg, tmp_path, capsys):
    from pipeline.runtime.run import run

    cfg = make_cfg("experiment=supervised_digits", "trainer=debug", "trainer.enable_progress_bar=true", "trainer.max_epochs=3")
    (record,) = run(cfg, tmp_path)
    assert record["status"] == "ok", record["error"]
    out = capsys.readouterr().out
    assert "\r" not in out and not any(word in out for word in ("Validation", "Sanity", "Testing"))
    epochs = [s for s in out.splitlines() if s.startswith("Epoch")]
    assert len(epochs) in (1, 2) and epochs[-1].startswith("Epoch 2: 100%")  # the last state: the third epoch, done


@pytest.mark.slow
@pytest.mark.long  # PPO's update and rollout compiled cold on a fresh machine: ~50 s (`make test-long`)
def test_a_compiled_run_says_its_results_are_not_eagers_and_its_bar_leaves_compile_time_out(tmp_path):
    """device.compile=true: one line in the run's log says compiled results are not bitwise eager's; the bar's rate
    (and so its time left) is the working rate: its last state's rate is far above steps over wall seconds, which
    the compile dominates."""
    from pipeline.store.record import read_result
    from pipeline_testing import run_cli

    done = run_cli("experiment=ppo_cartpole", "trainer=debug", "device.compile=true", "trainer.enable_progress_bar=true",
                   f"hydra.run.dir={tmp_path}")
    assert done.returncode == 0, done.stderr[-2000:]
    log = (tmp_path / "run.log").read_text()
    assert log.count("device.compile=true: results are not bitwise eager's for the same seeds") == 1, log
    record = read_result(tmp_path)
    compiled = record["time_breakdown_s"]["compile"]
    last = [s for s in done.stdout.splitlines() if s.startswith("env steps")][-1]
    rate = float(re.search(r"([\d.]+)(k?)step/s", last).group(1)) * (1000 if "kstep/s" in last else 1)
    assert compiled > 1.0 and rate > 2 * record["env_steps"] / (record["wall_time_s"] or 1), (last, compiled)

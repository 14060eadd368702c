"""The training progress bar of an RL run counts env steps against the budget, with the returns beside it."""

from __future__ import annotations

import re


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
    assert not (tmp_path / "videos").exists()  # videos during training cost nothing unless asked for (video_every)

"""The cross-entropy method learns CartPole."""

from pipeline.run import run


def test_cem_learns_cartpole(make_cfg, tmp_path):
    cfg = make_cfg("experiment=cem_cartpole", "trainer.enable_progress_bar=false", "task.stop_at_return=200",
                   "task.final_eval_episodes=10", "seed=1")
    (record,) = run(cfg, tmp_path)
    assert record["status"] == "ok", record["error"]
    assert record["early_stop"] is not None and record["early_stop"]["iteration"] < 200
    # A random policy averages ~20 on CartPole; the greedy policy after a batch mean of 200 does far better.
    assert record["metrics"]["eval/return_mean"] >= 150
    assert record["env_steps"] > 0

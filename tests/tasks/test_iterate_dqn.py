"""DQN's real training loop (`iterate()` under Lightning, the dqn_cartpole preset as the CLI composes it) for 3 agents
with 2 envs each, on CartPole with a 15-step time limit so that episodes end both ways inside the window: every
agent's replay rows are the steps its own envs took with the actions it stored (judged by a hand-stepped gymnasium
CartPole: `iterate_testing.play`), a time-limit truncation is stored as not terminal, and learning starts when each
agent holds `learning_starts` transitions, not the batch."""

from __future__ import annotations

import pytest
from iterate_testing import adam_steps, check_replay_rows, endings, fit, play, row_seed

from pipeline.runtime.run import build_task
from pipeline.runtime.seeding import seed_everything

K, E, LIMIT, SEED = 3, 2, 12, 3
ROUNDS, TRAIN_FREQUENCY, LEARNING_STARTS, GRADIENT_STEPS = 12, 8, 40, 2


@pytest.fixture(scope="module")
def trained(request):
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "experiment=dqn_cartpole", f"seed={SEED}", f"+env.kwargs.max_episode_steps={LIMIT}", "model.hidden=[16]",
            f"task.total_steps={ROUNDS * TRAIN_FREQUENCY}", f"task.envs_per_agent={E}", f"task.train_frequency={TRAIN_FREQUENCY}",
            f"task.learning_starts={LEARNING_STARTS}", f"task.gradient_steps={GRADIENT_STEPS}", "task.batch_size=8",
            "task.buffer_size=500", "task.eps_duration=24", "task.eps_end=0.6", "task.eval_every=100000", "task.log_every=100000",
        ])
    seed_everything(SEED)  # as the lifecycle does
    task = build_task(cfg, None, K)
    fit(task)
    return task


def test_each_agents_replay_rows_are_its_own_envs_steps_with_time_limits_not_terminal(trained):
    replay = trained.buffer.state_dict()
    steps_per_env = ROUNDS * TRAIN_FREQUENCY // E
    assert replay["size"] == ROUNDS * TRAIN_FREQUENCY and replay["obs"].shape[:2] == (K, steps_per_env * E)
    terminations = truncations = 0
    for agent in range(K):
        played = [play("CartPole-v1", {"max_episode_steps": LIMIT}, row_seed(SEED + agent, e),
                       replay["actions"][agent, e::E].tolist()) for e in range(E)]
        check_replay_rows(replay, agent, E, played)
        ended, cut = endings(played)
        terminations, truncations = terminations + ended, truncations + cut
        assert ended and cut, f"agent {agent}: the window must hold both endings (terminated {ended}, truncated {cut})"
        # Exploration and greedy actions both happened (eps falls from 1 to 0.6 over the first 24 env steps).
        assert len(set(replay["actions"][agent].tolist())) == 2
    assert terminations >= 6 and truncations >= 6


def test_learning_starts_when_each_agent_holds_learning_starts_transitions(trained):
    # Round r (1..12) leaves 8 r transitions per agent; rounds 5..12 learn (8 r >= 40): 8 rounds x 2 gradient steps.
    assert trained.env_steps == ROUNDS * TRAIN_FREQUENCY
    assert trained.updates == [16] * K
    assert adam_steps(trained.optimizers().optimizer) == 16

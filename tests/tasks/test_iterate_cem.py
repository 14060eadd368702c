"""CEM's real training loop (`iterate()` under Lightning, the cem_cartpole preset as the CLI composes it) for 3 agents
with 16 episodes each per iteration, on CartPole with a 19-step time limit so that episodes end by falling and by the
clock: each agent's episodes are the documented seeded episodes stepped with the actions it sampled (a hand-stepped
gymnasium CartPole), an episode ends at its first termination or truncation, its return and steps are credited to the
agent that played it, and the policy is fitted to exactly the episodes at or above the preset's 70th percentile."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_module
from iterate_testing import adam_steps, fit

from pipeline.runtime.run import build_task
from pipeline.runtime.seeding import seed_everything

K, LIMIT, SEED, ITERATIONS = 3, 19, 3, 2
EPISODES, PERCENTILE = 16, 70.0  # the preset's episodes_per_batch and elite_percentile
STRIDE = 1_000_003  # episode j of agent seed s's iteration t resets with seed s * STRIDE + t * EPISODES + j (pipeline.tasks.cem)


@pytest.fixture(scope="module")
def trained():
    with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "experiment=cem_cartpole", f"seed={SEED}", f"+env.kwargs.max_episode_steps={LIMIT}", "model.hidden=[16]",
            f"task.max_iterations={ITERATIONS}",
        ])
    seed_everything(SEED)
    task = build_task(cfg, None, K)
    batches, fitted = [], []
    play_batch = task.play_batch

    def recording_play_batch():
        batches.append(play_batch())
        return batches[-1]

    task.play_batch = recording_play_batch
    # The inputs of every forward that a gradient flows from (the elite fit; playing runs under inference_mode).
    task.net.register_forward_hook(lambda m, args, out: fitted.append(args[0].clone()) if torch.is_grad_enabled() else None)
    fit(task)
    return task, batches, fitted


def reference_episode(seed: int, actions: list[int]) -> tuple[np.ndarray, float, bool, bool]:
    """The episode a fresh CartPole reset with `seed` plays with `actions`: its observations, return and how it ended;
    it must end at the last action and not before."""
    env = gym.make("CartPole-v1", max_episode_steps=LIMIT)
    obs, _ = env.reset(seed=seed)
    seen, total = [], 0.0
    for t, action in enumerate(actions):
        seen.append(np.asarray(obs, np.float32))
        obs, reward, terminated, truncated, _ = env.step(action)
        total += float(reward)
        assert (terminated or truncated) == (t == len(actions) - 1), f"seed {seed}: ended at step {t + 1} of {len(actions)}"
    return np.stack(seen), total, bool(terminated), bool(truncated and not terminated)


def test_each_agents_episodes_are_its_own_seeded_episodes_and_credited_to_it(trained):
    task, batches, _ = trained
    assert len(batches) == ITERATIONS and task.iterations == ITERATIONS
    for agent in range(K):
        returns, steps, falls, cuts = [], 0, 0, 0
        for t, batch in enumerate(batches):
            obs, actions, batch_returns = batch[agent]
            assert len(actions) == EPISODES
            for j in range(EPISODES):
                seen, total, terminated, truncated = reference_episode((SEED + agent) * STRIDE + t * EPISODES + j, actions[j])
                np.testing.assert_array_equal(obs[j], seen, err_msg=f"agent {agent} iteration {t} episode {j}")
                assert batch_returns[j] == total
                returns.append(total)
                steps += len(actions[j])
                falls, cuts = falls + (t == 0 and terminated), cuts + (t == 0 and truncated)
            assert task.batch_means[agent][t] == pytest.approx(float(np.mean(batch_returns)))
        assert falls and cuts, f"agent {agent}'s first batch must hold both endings (terminated {falls}, truncated {cuts})"
        assert task.episode_returns[agent] == returns and task.agent_steps[agent] == steps


def test_each_agent_is_fitted_to_its_own_episodes_at_or_above_the_70th_percentile(trained):
    task, batches, fitted = trained
    assert len(fitted) == ITERATIONS * K  # fit_epochs 1: one forward per agent and iteration
    assert adam_steps(task.optimizers().optimizer) == ITERATIONS
    for t, batch in enumerate(batches):
        for agent in range(K):
            obs, _, returns = batch[agent]
            ranked = np.sort(returns)
            position = PERCENTILE / 100 * (EPISODES - 1)  # the percentile between the two returns around its rank
            low = int(position)
            cutoff = ranked[low] + (position - low) * (ranked[low + 1] - ranked[low])
            elite = np.concatenate([obs[j] for j in range(EPISODES) if returns[j] >= cutoff])
            assert 0 < len(elite) < sum(len(o) for o in obs)
            x = fitted[t * K + agent]
            assert x.shape[0] == K
            np.testing.assert_array_equal(x[agent].numpy(), elite, err_msg=f"iteration {t} agent {agent}")

"""PPO's real training loop (`iterate()` under Lightning, the ppo_cartpole and ppo_pendulum presets as the CLI composes
them) for 3 agents with 2 envs each, with a 19-step time limit so that episodes end by the clock (and CartPole's by
falling too) inside every rollout: each agent's rollout rows are the steps its own envs took with the actions it
sampled (a hand-stepped gymnasium env), a truncation is not a termination and bootstraps from the value of the
observation it really reached, the finished episodes are credited to the agent whose envs ran them, the advantages are
GAE with the preset's gamma and lambda computed by hand, and each iteration is one update of update_epochs x
num_minibatches optimizer steps. Pendulum's rewards differ from step to step and env to env (CartPole's are all 1), so a
reward in another agent's or env's row shows there."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_module
from iterate_testing import Played, adam_steps, endings, fit, play, row_seed

from pipeline.runtime.run import build_task
from pipeline.runtime.seeding import seed_everything

K, E, LIMIT, SEED = 3, 2, 19, 3  # random CartPole episodes: median 19 steps
NUM_STEPS, ITERATIONS = 64, 2


@dataclass(frozen=True)
class Case:
    preset: str
    env: str
    gamma: float  # the preset's
    gae_lambda: float  # the preset's
    epochs: int
    minibatches: int
    overrides: tuple[str, ...] = ()

    @property
    def env_id(self) -> str:
        return "Pendulum-v1" if "pendulum" in self.env else "CartPole-v1"


CASES = {
    "cartpole_tensor": Case("ppo_cartpole", "cartpole_tensor", 0.98, 0.8, 5, 2),
    "cartpole": Case("ppo_cartpole", "cartpole", 0.98, 0.8, 5, 2),
    "pendulum": Case("ppo_pendulum", "pendulum", 0.9, 0.95, 2, 4, ("task.update_epochs=2", "task.num_minibatches=4")),
}


@pytest.fixture(scope="module", params=list(CASES))
def trained(request):
    case = CASES[request.param]
    with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            f"experiment={case.preset}", f"env={case.env}", f"seed={SEED}", f"+env.kwargs.max_episode_steps={LIMIT}",
            "model.hidden=[16,16]", f"task.envs_per_agent={E}", f"task.num_steps={NUM_STEPS}",
            f"task.total_steps={ITERATIONS * NUM_STEPS * E}", "task.eval_every=100000", "task.log_every=100000", *case.overrides,
        ])
    seed_everything(SEED)  # as the lifecycle does: PPO's action noise comes from the global generator
    task = build_task(cfg, None, K)
    seen = []
    learn = task.learn

    def recording_learn(rollout):
        # The rollout as the update gets it, the networks that produced it, and the advantages the update will use.
        seen.append((rollout, copy.deepcopy(task.net), task.advantages(rollout)))
        learn(rollout)

    task.learn = recording_learn
    fit(task)
    return case, task, seen


def value_of(net, agent: int, obs: np.ndarray) -> torch.Tensor:
    """Agent `agent`'s value of observations [N, F] (its member of the K-agent net)."""
    x = torch.as_tensor(obs, dtype=torch.float32).expand(K, *obs.shape)
    with torch.no_grad():
        return net(x)[1][agent]


def stepped_from_state(obs: np.ndarray, actions: np.ndarray, ended: np.ndarray) -> Played:
    """Gymnasium's CartPole stepped from each observation (its state) with the action taken: what each step led to.
    Truncation is the clock: the LIMIT-th step of an episode that did not fall (`ended` marks the rollout's episode ends)."""
    env = gym.make("CartPole-v1").unwrapped
    env.reset(seed=0)
    rows, length = [], 0
    for o, a, end in zip(obs, actions, ended):
        env.state, env.steps_beyond_terminated = o.astype(np.float64), None
        nxt, reward, terminated, _, _ = env.step(int(a))
        length += 1
        rows.append((o, nxt, reward, terminated, length == LIMIT and not terminated))
        length = 0 if end else length
    o, nxt, reward, terminated, truncated = zip(*rows)
    return Played(np.stack(o), np.stack(nxt).astype(np.float32), np.asarray(reward, np.float32), np.asarray(terminated),
                  np.asarray(truncated))


def hand_gae(gamma, lam, rewards, values, terminated, truncated, final_values, last_value):
    """GAE(gamma, lambda) of one env's rollout, step by step: a terminated step bootstraps from nothing, a truncated one
    from V(the observation it reached), and either ends the recursion."""
    T = len(rewards)
    advantages, running = np.zeros(T), 0.0
    for t in reversed(range(T)):
        following = last_value if t == T - 1 else values[t + 1]
        next_value = 0.0 if terminated[t] else final_values[t] if truncated[t] else following
        delta = rewards[t] + gamma * next_value - values[t]
        running = delta + (0.0 if terminated[t] or truncated[t] else gamma * lam * running)
        advantages[t] = running
    return advantages, advantages + values


def test_each_agents_rollout_rows_are_its_own_envs_steps_and_a_truncation_bootstraps(trained):
    case, task, seen = trained
    assert len(seen) == ITERATIONS
    for agent in range(K):
        first = []  # the first rollout's steps (before any update) of the agent's envs
        finished = []  # (step, env, return) of each episode its envs finished
        for e in range(E):
            obs = torch.cat([r.obs[:, agent, e] for r, _, _ in seen]).numpy()
            actions = torch.cat([r.actions[:, agent, e] for r, _, _ in seen]).numpy()
            terminated = torch.cat([r.terminated[:, agent, e] for r, _, _ in seen]).numpy()
            truncated = torch.cat([r.truncated[:, agent, e] for r, _, _ in seen]).numpy() & ~terminated
            rewards = torch.cat([r.rewards[:, agent, e] for r, _, _ in seen]).numpy()
            where = f"{case.env}: agent {agent} env {e}"
            if "tensor" not in case.env:  # gymnasium's envs: the documented seeds, replayed step for step
                if task.continuous:  # the env gets the Gaussian's sample clipped to its bounds
                    actions = np.clip(actions, task.action_space.low, task.action_space.high)
                ref = play(case.env_id, {"max_episode_steps": LIMIT}, row_seed(SEED + agent, e), list(actions))
                np.testing.assert_array_equal(obs, ref.obs, err_msg=where)
            else:  # hash-seeded tensor envs: each step judged from the state it started in
                ref = stepped_from_state(obs, actions, terminated | truncated)
                following = obs[1:][~(terminated | truncated)[:-1]]
                np.testing.assert_allclose(following, ref.next_obs[:-1][~(terminated | truncated)[:-1]], rtol=0, atol=1e-5, err_msg=where)
            np.testing.assert_array_equal(rewards, ref.reward, err_msg=where)
            np.testing.assert_array_equal(terminated, ref.terminated, err_msg=f"{where}: terminated")
            np.testing.assert_array_equal(truncated, ref.truncated & ~ref.terminated, err_msg=f"{where}: truncated (not terminal)")
            first.append(ref.head(NUM_STEPS))
            episode_return = 0.0
            for t, (r, end) in enumerate(zip(ref.reward, ref.terminated | ref.truncated)):
                episode_return += float(r)
                if end:
                    finished.append((t, e, episode_return))
                    episode_return = 0.0
            # Where the clock cut an episode, the step bootstraps from V(the observation the action led to).
            offset = 0
            for rollout, net, _ in seen:
                rows = slice(offset, offset + NUM_STEPS)
                cut_here = truncated[rows]
                if cut_here.any():
                    expected = value_of(net, agent, ref.next_obs[rows][cut_here])
                    torch.testing.assert_close(rollout.final_values[:, agent, e][torch.from_numpy(cut_here)], expected,
                                               rtol=1e-4, atol=1e-5, msg=where)
                offset += NUM_STEPS
        # Both endings already in the first rollout (so no slip in learning can take them away).
        ended, cut = endings(first)
        falls = case.env_id == "CartPole-v1"  # Pendulum never terminates
        assert cut and (ended or not falls), f"{case.env}: agent {agent}: the window must hold both endings (terminated {ended}, truncated {cut})"
        # Its record's episodes are its own envs' finished ones, in step order.
        assert task.episode_returns[agent] == [r for _, _, r in sorted(finished)], agent


def test_the_advantages_are_gae_with_the_presets_gamma_and_lambda(trained):
    case, _, seen = trained
    for rollout, _, (advantages, returns) in seen:
        for agent in range(K):
            for e in range(E):
                column = [x[:, agent, e].double().numpy() for x in (rollout.rewards, rollout.values, rollout.terminated,
                                                                    rollout.truncated, rollout.final_values)]
                hand_adv, hand_ret = hand_gae(case.gamma, case.gae_lambda, *column, float(rollout.last_values[agent, e]))
                np.testing.assert_allclose(advantages[:, agent, e].double().numpy(), hand_adv, rtol=1e-5, atol=1e-5)
                np.testing.assert_allclose(returns[:, agent, e].double().numpy(), hand_ret, rtol=1e-5, atol=1e-5)


def test_each_iteration_is_one_update_of_epochs_times_minibatches_steps(trained):
    case, task, _ = trained
    assert task.env_steps == ITERATIONS * NUM_STEPS * E and task.updates == ITERATIONS
    assert adam_steps(task.optimizers().optimizer) == ITERATIONS * case.epochs * case.minibatches

"""The hand-stepped reference of the iterate tests: plain gymnasium envs stepped with the actions an agent took.

`pipeline.rl.vector` documents the seeding it gives a K-agent batch: row i*E + e is agent i's env e, reset once with
seed `agent seed + (e << 32)`, then continuing its own generator (a finished episode restarts at once, unseeded).
`play` does exactly that with `gymnasium.make` and nothing of the pipeline's, so whatever an algorithm stored is
judged against what the env really did: the observation an action was taken in, the one it led to (the episode's
last, not the next episode's first), the reward, and whether the MDP ended (terminated) or only the clock ran out
(truncated: not terminal).
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import lightning as L
import numpy as np
import torch


@dataclass
class Played:
    """One env's steps [T, ...]: observation, the action's result (final obs where an episode ended), reward, flags."""

    obs: np.ndarray
    next_obs: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray

    def head(self, n: int) -> Played:
        """The first n steps."""
        return Played(self.obs[:n], self.next_obs[:n], self.reward[:n], self.terminated[:n], self.truncated[:n])


def row_seed(agent_seed: int, env: int) -> int:
    return int(agent_seed) + (int(env) << 32)


def play(env_id: str, kwargs: dict, seed: int, actions) -> Played:
    """Step a fresh `gymnasium.make(env_id, **kwargs)`, reset with `seed`, through `actions`, restarting finished episodes."""
    env = gym.make(env_id, **kwargs)
    obs, _ = env.reset(seed=seed)
    rows = []
    for action in actions:
        nxt, reward, terminated, truncated, _ = env.step(action)
        rows.append((np.asarray(obs, np.float32), np.asarray(nxt, np.float32), reward, terminated, truncated))
        obs = env.reset()[0] if terminated or truncated else nxt
    env.close()
    obs, nxt, reward, terminated, truncated = zip(*rows)
    return Played(np.stack(obs), np.stack(nxt), np.asarray(reward, np.float32), np.asarray(terminated), np.asarray(truncated))


def env_actions(actions: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Actions in [-1, 1] in an env's units: CleanRL's a * action_scale + action_bias (float32)."""
    scale, bias = ((high - low) / 2.0).astype(np.float32), ((high + low) / 2.0).astype(np.float32)
    return actions.astype(np.float32) * scale + bias


def check_replay_rows(replay: dict, agent: int, envs: int, played: list[Played], stored_actions=None) -> None:
    """Agent `agent`'s replay rows (`ReplayBuffer.state_dict()`: [K, size, ...], E lockstep rows a step) hold its env e's
    steps at rows t * E + e: the observations, rewards, and `dones` = terminated only."""
    for e, ref in enumerate(played):
        rows = torch.arange(len(ref.reward)) * envs + e
        where = f"agent {agent} env {e}"
        torch.testing.assert_close(replay["obs"][agent, rows], torch.from_numpy(ref.obs), rtol=0, atol=0, msg=f"{where}: obs")
        torch.testing.assert_close(replay["next_obs"][agent, rows], torch.from_numpy(ref.next_obs), rtol=0, atol=0,
                                   msg=f"{where}: next obs")
        torch.testing.assert_close(replay["rewards"][agent, rows], torch.from_numpy(ref.reward), rtol=0, atol=0, msg=f"{where}: rewards")
        stored = replay["dones"][agent, rows].bool().numpy()
        assert (stored == ref.terminated).all(), (f"{where}: stored terminal flags {stored.astype(int).tolist()} are not the env's "
                                                  f"terminations {ref.terminated.astype(int).tolist()} (truncations "
                                                  f"{ref.truncated.astype(int).tolist()} must be stored as not terminal)")


def endings(played: list[Played]) -> tuple[int, int]:
    """(terminations, truncations that were not terminations) over `played`."""
    return (sum(int(p.terminated.sum()) for p in played),
            sum(int((p.truncated & ~p.terminated).sum()) for p in played))


def fit(task) -> None:
    """The task's real training loop: Lightning calls `training_step` (`iterate()`, logging, evaluations) until the budget is spent."""
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(task)


def adam_steps(optimizer: torch.optim.Optimizer) -> int:
    """How many steps Adam took (its per-parameter step counter)."""
    steps = {int(state["step"]) for state in optimizer.state.values()}
    assert len(steps) == 1, steps
    return steps.pop()

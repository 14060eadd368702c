"""The replay buffer with continuous actions (SAC, TD3): any action shape and dtype, aligned, per agent, resumable."""

import pytest
import torch

from pipeline.rl.replay import ReplayBuffer


def _steps(start: int, T: int, K: int, action_dim: int = 2):
    """Agent k's step t carries the value 1000k + t in every field, so a sampled row names its agent and step."""
    value = 1000 * torch.arange(K).view(1, K).double() + torch.arange(start, start + T).view(T, 1).double()
    obs = value.unsqueeze(-1).expand(T, K, 3).float()
    actions = value.unsqueeze(-1) / 10_000 + torch.arange(action_dim) * 0.25  # [T, K, D], float64 in
    return obs, actions, value.float(), obs + 0.5, torch.zeros(T, K, dtype=torch.bool)


def test_continuous_actions_keep_their_shape_dtype_and_row():
    buf = ReplayBuffer(64, (3,), n_agents=2, action_shape=(2,), action_dtype=torch.float32)
    buf.add(*_steps(0, 20, 2))
    batch = buf.sample(3, 5, [torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)])
    assert batch.actions.shape == (3, 2, 5, 2) and batch.actions.dtype == torch.float32
    # The action sampled with a transition is the one stored with it (float64 in, float32 kept).
    expected = (batch.rewards.double().unsqueeze(-1) / 10_000 + torch.tensor([0.0, 0.25], dtype=torch.float64)).float()
    assert torch.equal(batch.actions, expected)
    assert torch.equal((batch.rewards // 1000).long(), torch.arange(2).view(1, 2, 1).expand(3, 2, 5))


def test_bytes_per_transition_counts_the_action_shape():
    # 2 observations of 17 float32, 6 float32 actions, a float32 reward and a float32 done.
    assert ReplayBuffer.bytes_per_transition((17,), torch.float32, (6,), torch.float32) == 2 * 68 + 24 + 8
    # DQN's default: one int64 action.
    assert ReplayBuffer.bytes_per_transition((4,)) == 2 * 16 + 8 + 8
    buf = ReplayBuffer(10, (17,), n_agents=3, action_shape=(6,), action_dtype=torch.float32)
    assert buf.nbytes == 3 * 10 * (2 * 68 + 24 + 8)


def test_a_round_trip_continues_exactly_and_refuses_another_action_shape():
    buf = ReplayBuffer(8, (3,), n_agents=2, action_shape=(2,), action_dtype=torch.float32)
    buf.add(*_steps(0, 11, 2))
    state = buf.state_dict()
    restored = ReplayBuffer(8, (3,), n_agents=2, action_shape=(2,), action_dtype=torch.float32)
    restored.load_state_dict(state)
    for b in (buf, restored):
        b.add(*_steps(11, 3, 2))
    a = buf.sample(2, 4, [torch.Generator().manual_seed(5), torch.Generator().manual_seed(6)])
    r = restored.sample(2, 4, [torch.Generator().manual_seed(5), torch.Generator().manual_seed(6)])
    assert all(torch.equal(x, y) for x, y in zip(a, r))
    other = ReplayBuffer(8, (3,), n_agents=2, action_shape=(6,), action_dtype=torch.float32)
    with pytest.raises(ValueError, match=r"actions shaped \(2,\), this buffer \(6,\)"):
        other.load_state_dict(state)


def test_keep_agents_keeps_their_continuous_actions():
    buf = ReplayBuffer(16, (3,), n_agents=3, action_shape=(2,), action_dtype=torch.float32)
    buf.add(*_steps(0, 6, 3))
    buf.keep_agents_(torch.tensor([2]))
    batch = buf.sample(1, 8, [torch.Generator().manual_seed(0)])
    assert batch.actions.shape == (1, 1, 8, 2)
    assert torch.equal((batch.rewards // 1000).long(), torch.full((1, 1, 8), 2))
    assert torch.allclose(batch.actions[..., 1] - batch.actions[..., 0], torch.full((1, 1, 8), 0.25))

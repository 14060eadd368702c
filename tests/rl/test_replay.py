"""The K-agent replay buffer: ring order, per-agent isolation, uint8 frames, checkpoint round trip."""

import pytest
import torch

from pipeline.rl.replay import ReplayBuffer, Transitions


def _steps(start: int, T: int, K: int, obs_dim: int = 3):
    """T lockstep steps for K agents; agent k's value at step t is 1000*k + t, so rows identify themselves."""
    t = torch.arange(start, start + T).view(T, 1).float()
    k = torch.arange(K).view(1, K).float()
    value = 1000 * k + t  # [T, K]
    obs = value.unsqueeze(-1).expand(T, K, obs_dim).clone()
    return obs, (value.long() % 2), value, obs + 0.5, (value.long() % 3 == 0)


def test_wraps_around_keeping_the_newest_per_agent():
    buf = ReplayBuffer(5, (3,), n_agents=2)
    buf.add(*_steps(0, 4, 2))
    buf.add(*_steps(4, 4, 2))
    assert len(buf) == 5
    held = buf.rewards.view(2, 5)
    assert sorted(held[0].tolist()) == [3.0, 4.0, 5.0, 6.0, 7.0]
    assert sorted(held[1].tolist()) == [1003.0, 1004.0, 1005.0, 1006.0, 1007.0]
    assert torch.equal(buf.next_obs[:, 0], buf.obs[:, 0] + 0.5)


def test_a_round_longer_than_the_capacity_keeps_its_tail():
    buf = ReplayBuffer(4, (3,), n_agents=1)
    buf.add(*_steps(0, 10, 1))
    assert len(buf) == 4
    assert sorted(buf.rewards.tolist()) == [6.0, 7.0, 8.0, 9.0]
    buf.add(*_steps(10, 1, 1))
    assert sorted(buf.rewards.tolist()) == [7.0, 8.0, 9.0, 10.0]


def test_sample_shapes_alignment_and_isolation():
    buf = ReplayBuffer(100, (3,), n_agents=3)
    buf.add(*_steps(0, 10, 3))
    gens = [torch.Generator().manual_seed(i) for i in range(3)]
    batch = buf.sample(7, 16, gens)
    assert isinstance(batch, Transitions)
    assert batch.obs.shape == (7, 3, 16, 3) and batch.obs.dtype == torch.float32
    assert batch.actions.shape == (7, 3, 16) and batch.actions.dtype == torch.int64
    # Fields stay aligned per transition, and agent k only sees its own rows (values 1000k + t, t < 10).
    assert torch.equal(batch.obs[..., 0], batch.rewards)
    assert torch.equal(batch.dones, (batch.rewards.long() % 3 == 0).float())
    agent = (batch.rewards // 1000).long()
    assert torch.equal(agent, torch.arange(3).view(1, 3, 1).expand_as(agent))
    assert (batch.rewards % 1000).max() < 10


def test_sample_is_reproducible_and_per_agent():
    buf = ReplayBuffer(100, (3,), n_agents=2)
    buf.add(*_steps(0, 50, 2))
    a = buf.sample(2, 8, [torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)])
    b = buf.sample(2, 8, [torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)])
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    with pytest.raises(ValueError, match="one generator per agent"):
        buf.sample(1, 1, [torch.Generator()])


def test_keep_agents_and_state_dict_round_trip():
    buf = ReplayBuffer(6, (3,), n_agents=3)
    buf.add(*_steps(0, 8, 3))
    buf.keep_agents_(torch.tensor([2, 0]))
    assert buf.n_agents == 2
    assert set((buf.rewards.view(2, 6)[0] // 1000).tolist()) == {2.0}
    state = buf.state_dict()
    other = ReplayBuffer(6, (3,), n_agents=3)
    other.load_state_dict(state)
    assert other.n_agents == 2 and other.pos == buf.pos and len(other) == len(buf)
    for name in ("obs", "next_obs", "actions", "rewards", "dones"):
        assert torch.equal(getattr(other, name), getattr(buf, name)), name
    # Continuing both gives the same buffer.
    nxt = _steps(8, 3, 2)
    buf.add(*nxt)
    other.add(*nxt)
    assert torch.equal(other.rewards, buf.rewards)


def test_uint8_frames_stay_uint8_and_nbytes_counts_them():
    buf = ReplayBuffer(10, (4, 84, 84), n_agents=1, obs_dtype=torch.uint8)
    frame = torch.full((1, 1, 4, 84, 84), 255, dtype=torch.uint8)
    buf.add(frame, torch.ones(1, 1), torch.ones(1, 1), frame, torch.zeros(1, 1, dtype=torch.bool))
    batch = buf.sample(1, 2, [torch.Generator()])
    assert buf.obs.dtype == torch.uint8 and batch.obs.dtype == torch.uint8
    assert batch.obs.max().item() == 255
    assert buf.nbytes == 2 * 10 * 4 * 84 * 84 + 10 * (8 + 4 + 4)
    assert ReplayBuffer.bytes_per_transition((4, 84, 84), torch.uint8) == 2 * 4 * 84 * 84 + 16


def test_sampling_an_empty_buffer_fails_clearly():
    with pytest.raises(ValueError, match="empty"):
        ReplayBuffer(4, (1,)).sample(1, 1, [torch.Generator()])

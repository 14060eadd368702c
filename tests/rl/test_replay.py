import numpy as np
import torch

from pipeline.rl.replay import ReplayBatch, ReplayBuffer


def _fill(buf: ReplayBuffer, n: int) -> None:
    for i in range(n):
        buf.add(np.full(3, i, np.float32), i % 2, float(i), np.full(3, i + 1, np.float32), i % 3 == 0)


def test_wraps_around_overwriting_the_oldest():
    buf = ReplayBuffer(5, (3,))
    _fill(buf, 8)
    assert len(buf) == 5
    # Transitions 0, 1, 2 were overwritten by 5, 6, 7.
    assert sorted(buf.rewards.tolist()) == [3.0, 4.0, 5.0, 6.0, 7.0]
    assert sorted(buf.obs[:, 0].tolist()) == [3.0, 4.0, 5.0, 6.0, 7.0]
    assert torch.equal(buf.next_obs[:, 0], buf.obs[:, 0] + 1)


def test_sample_shapes_and_dtypes():
    buf = ReplayBuffer(100, (3,))
    _fill(buf, 10)
    batch = buf.sample(16, generator=torch.Generator().manual_seed(0))
    assert isinstance(batch, ReplayBatch)
    assert batch.obs.shape == (16, 3) and batch.obs.dtype == torch.float32
    assert batch.next_obs.shape == (16, 3)
    assert batch.actions.shape == (16,) and batch.actions.dtype == torch.int64
    assert batch.rewards.shape == (16,) and batch.rewards.dtype == torch.float32
    assert batch.dones.shape == (16,) and batch.dones.dtype == torch.float32
    # Only filled slots are drawn, and fields stay aligned per transition.
    assert batch.rewards.max() < 10
    assert torch.equal(batch.obs[:, 0], batch.rewards)
    assert torch.equal(batch.dones, (batch.rewards.long() % 3 == 0).float())


def test_sample_is_reproducible_with_a_generator():
    buf = ReplayBuffer(100, (3,))
    _fill(buf, 50)
    a = buf.sample(8, generator=torch.Generator().manual_seed(1))
    b = buf.sample(8, generator=torch.Generator().manual_seed(1))
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_sample_many_shapes():
    buf = ReplayBuffer(100, (3,))
    _fill(buf, 40)
    batch = buf.sample_many(7, 16)
    assert batch.obs.shape == (7, 16, 3) and batch.next_obs.shape == (7, 16, 3)
    assert batch.actions.shape == (7, 16) and batch.rewards.shape == (7, 16) and batch.dones.shape == (7, 16)
    assert torch.equal(batch.obs[..., 0], batch.rewards)


def test_add_batch_wraps_and_matches_single_adds():
    single, batched = ReplayBuffer(6, (2,)), ReplayBuffer(6, (2,))
    obs = np.arange(18, dtype=np.float32).reshape(9, 2)
    for i in range(9):
        single.add(obs[i], i % 2, i, obs[i] + 1, i == 4)
    batched.add_batch(obs[:4], np.arange(4) % 2, np.arange(4), obs[:4] + 1, np.arange(4) == 4)
    batched.add_batch(obs[4:], np.arange(4, 9) % 2, np.arange(4, 9), obs[4:] + 1, np.arange(4, 9) == 4)
    assert len(single) == len(batched) == 6
    for name in ("obs", "next_obs", "actions", "rewards", "dones"):
        assert torch.equal(getattr(single, name), getattr(batched, name)), name


def test_uint8_frames_stay_uint8_and_nbytes_counts_them():
    buf = ReplayBuffer(10, (4, 84, 84), obs_dtype=torch.uint8)
    frame = np.full((4, 84, 84), 255, np.uint8)
    buf.add(frame, 1, 1.0, frame, False)
    batch = buf.sample(2)
    assert buf.obs.dtype == torch.uint8 and batch.obs.dtype == torch.uint8
    assert batch.obs.max().item() == 255
    frames = 2 * 10 * 4 * 84 * 84  # obs and next_obs, one byte each
    assert buf.nbytes == frames + 10 * (8 + 4 + 4)


def test_sampling_an_empty_buffer_fails_clearly():
    buf = ReplayBuffer(4, (1,))
    try:
        buf.sample(1)
    except ValueError as e:
        assert "empty" in str(e)
    else:
        raise AssertionError("expected ValueError")

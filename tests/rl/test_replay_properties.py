"""The K-agent replay buffer against a list-of-lists model, on generated capacities, agents and add sizes."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pipeline.rl.replay import ReplayBuffer

OBS_DIM = 2


@st.composite
def histories(draw, max_total: int = 120):
    """(capacity, K, [T per add]) and per-transition terminated/truncated flags."""
    capacity = draw(st.integers(1, 40))
    k = draw(st.integers(1, 4))
    sizes = draw(st.lists(st.integers(1, 2 * capacity + 3), min_size=1, max_size=8))
    total = 0
    kept = []
    for t in sizes:
        if total + t > max_total:
            break
        kept.append(t)
        total += t
    kept = kept or [1]
    flags = draw(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=sum(kept), max_size=sum(kept)))
    return capacity, k, kept, flags


def _value(k: int, t: int) -> float:
    """Transition t of agent k, encoded so any stored row names its agent and step; 0 is an empty slot."""
    return 1000.0 * k + t + 1


def _fill(capacity, k, sizes, flags):
    buf = ReplayBuffer(capacity, (OBS_DIM,), n_agents=k)
    model = [[] for _ in range(k)]  # per agent: (value, terminated) in arrival order
    t0 = 0
    for size in sizes:
        value = torch.tensor([[_value(a, t) for a in range(k)] for t in range(t0, t0 + size)])  # [T, K]
        terminated = torch.tensor([[flags[t][0]] * k for t in range(t0, t0 + size)])
        # The env's truncation flag never reaches the buffer: a truncated step still bootstraps.
        obs = value.unsqueeze(-1).expand(size, k, OBS_DIM).clone()
        buf.add(obs, value.long() % 3, value, obs + 0.5, terminated)
        for t in range(t0, t0 + size):
            for a in range(k):
                model[a].append((_value(a, t), flags[t][0]))
        t0 += size
    return buf, model


def _ring_order(buf: ReplayBuffer, field: str) -> torch.Tensor:
    """[K, len] of a field, oldest first, read through the write position."""
    per_agent = getattr(buf, field).view(buf.n_agents, buf.capacity, *getattr(buf, field).shape[1:])
    order = (torch.arange(len(buf)) + buf.pos - len(buf)) % buf.capacity
    return per_agent[:, order]


@given(histories())
def test_holds_the_newest_transitions_in_order(history):
    capacity, k, sizes, flags = history
    buf, model = _fill(capacity, k, sizes, flags)
    assert len(buf) == min(capacity, sum(sizes))
    rewards = _ring_order(buf, "rewards")
    dones = _ring_order(buf, "dones")
    for a in range(k):
        newest = model[a][-len(buf):]
        assert rewards[a].tolist() == [v for v, _ in newest]
        assert dones[a].tolist() == [float(d) for _, d in newest]
    obs = _ring_order(buf, "obs")
    assert torch.equal(obs[..., 0], rewards) and torch.equal(_ring_order(buf, "next_obs"), obs + 0.5)
    assert torch.equal(_ring_order(buf, "actions"), rewards.long() % 3)


@given(histories(), st.integers(0, 2**31 - 1))
def test_sampling_covers_every_filled_slot_and_nothing_else(history, seed):
    capacity, k, sizes, flags = history
    buf, model = _fill(capacity, k, sizes, flags)
    gens = [torch.Generator().manual_seed(seed + a) for a in range(k)]
    # 30 draws per held slot: the chance of missing a given slot is (1 - 1/n)^(30 n) < e^-30.
    batch = buf.sample(30, len(buf), gens)
    assert batch.obs.shape == (30, k, len(buf), OBS_DIM) and batch.rewards.shape == (30, k, len(buf))
    for a in range(k):
        held = {v for v, _ in model[a][-len(buf):]}
        drawn = set(batch.rewards[:, a].flatten().tolist())
        assert drawn == held  # every slot eventually, no empty slot (0), no other agent's row
    # Each sampled transition stays whole: its fields come from one row.
    assert torch.equal(batch.obs[..., 0], batch.rewards)
    assert torch.equal(batch.next_obs, batch.obs + 0.5)
    assert torch.equal(batch.actions, batch.rewards.long() % 3)
    done_of = {v: float(d) for a in range(k) for v, d in model[a]}
    assert batch.dones.flatten().tolist() == [done_of[v] for v in batch.rewards.flatten().tolist()]


@given(histories(), st.integers(0, 2**31 - 1))
def test_each_agent_draws_with_its_own_generator_only(history, seed):
    capacity, k, sizes, flags = history
    buf, _ = _fill(capacity, k, sizes, flags)
    gens = lambda: [torch.Generator().manual_seed(seed + a) for a in range(k)]  # noqa: E731
    a = buf.sample(3, 5, gens())
    b = buf.sample(3, 5, gens())
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    if k > 1:
        # Reseeding agent 0 alone changes nothing for the others.
        other = gens()
        other[0] = torch.Generator().manual_seed(seed + 10**6)
        c = buf.sample(3, 5, other)
        assert torch.equal(c.rewards[:, 1:], a.rewards[:, 1:])


@given(histories(), st.data())
def test_keep_agents_keeps_each_kept_agents_history(history, data):
    capacity, k, sizes, flags = history
    buf, model = _fill(capacity, k, sizes, flags)
    keep = data.draw(st.lists(st.integers(0, k - 1), min_size=1, max_size=k, unique=True))
    buf.keep_agents_(torch.tensor(keep))
    assert buf.n_agents == len(keep)
    rewards = _ring_order(buf, "rewards")
    for j, a in enumerate(keep):
        assert rewards[j].tolist() == [v for v, _ in model[a][-len(buf):]]


@given(histories(), st.integers(1, 30), st.integers(0, 2**31 - 1))
def test_state_dict_round_trip_continues_identically(history, more, seed):
    capacity, k, sizes, flags = history
    buf, _ = _fill(capacity, k, sizes, flags)
    restored = ReplayBuffer(capacity, (OBS_DIM,), n_agents=k)
    restored.load_state_dict(buf.state_dict())
    assert (restored.pos, len(restored), restored.n_agents) == (buf.pos, len(buf), buf.n_agents)
    for name in ("obs", "next_obs", "actions", "rewards", "dones"):
        assert torch.equal(_ring_order(restored, name), _ring_order(buf, name)), name
    # Both continue the same: the next writes land in the same slots, and sampling draws the same rows.
    value = torch.full((more, k), -7.0)
    obs = value.unsqueeze(-1).expand(more, k, OBS_DIM).clone()
    for b in (buf, restored):
        b.add(obs, value.long(), value, obs, torch.zeros(more, k, dtype=torch.bool))
    assert torch.equal(restored.rewards, buf.rewards) and restored.pos == buf.pos
    gens = lambda: [torch.Generator().manual_seed(seed + a) for a in range(k)]  # noqa: E731
    assert all(torch.equal(x, y) for x, y in zip(buf.sample(2, 4, gens()), restored.sample(2, 4, gens())))


# ---- The contract's edges: conversions, defaults, refusals with exact messages. ----


def test_inputs_of_other_dtypes_are_stored_in_the_buffers_dtypes():
    buf = ReplayBuffer(3, (OBS_DIM,))
    assert buf.n_agents == 1 and len(buf) == 0
    obs = torch.tensor([[[1.25, 2.5]]], dtype=torch.float64)  # [T=1, K=1, 2], as float64 envs give them
    buf.add(obs, torch.tensor([[1]], dtype=torch.int32), torch.tensor([[0.5]], dtype=torch.float64), obs * 2,
            torch.tensor([[True]]))
    assert (buf.obs.dtype, buf.next_obs.dtype, buf.actions.dtype, buf.rewards.dtype, buf.dones.dtype) == (
        torch.float32, torch.float32, torch.int64, torch.float32, torch.float32)
    assert buf.obs[0].tolist() == [1.25, 2.5] and buf.next_obs[0].tolist() == [2.5, 5.0]
    assert (buf.actions[0].item(), buf.rewards[0].item(), buf.dones[0].item()) == (1, 0.5, 1.0)
    frames = ReplayBuffer(2, (OBS_DIM,), obs_dtype=torch.uint8)
    frames.add(obs.to(torch.float32) * 100, torch.zeros(1, 1), torch.zeros(1, 1), obs * 100, torch.zeros(1, 1))
    assert frames.obs.dtype == torch.uint8 and frames.obs[0].tolist() == [125, 250]
    assert frames.next_obs.dtype == torch.uint8 and frames.next_obs[0].tolist() == [125, 250]


def test_memory_per_transition():
    # float32 obs of 4 values: 2 * 4 * 4 bytes, plus action (8), reward (4) and done (4).
    assert ReplayBuffer.bytes_per_transition((4,)) == 48
    assert ReplayBuffer(10, (4,), n_agents=3).nbytes == 3 * 10 * 48


def test_bad_arguments_are_refused_with_the_reason():
    for capacity, n_agents in ((0, 1), (1, 0), (-1, 2), (0, 0)):
        with pytest.raises(ValueError) as error:
            ReplayBuffer(capacity, (2,), n_agents=n_agents)
        assert str(error.value) == f"replay capacity and n_agents must be positive, got {capacity} and {n_agents}"
    buf = ReplayBuffer(4, (3,), n_agents=2)
    obs = torch.zeros(1, 3, 7)  # 3 agents' transitions (of the wrong size too) for a 2-agent buffer
    with pytest.raises(ValueError) as error:
        buf.add(obs, torch.zeros(1, 3), torch.zeros(1, 3), obs, torch.zeros(1, 3))
    assert str(error.value) == "replay holds 2 agents, got transitions for 3"
    with pytest.raises(ValueError) as error:
        buf.sample(1, 1, [torch.Generator(), torch.Generator()])
    assert str(error.value) == "cannot sample from an empty replay buffer"
    with pytest.raises(ValueError) as error:
        ReplayBuffer(5, (3,), n_agents=2).load_state_dict(buf.state_dict())
    assert str(error.value) == "checkpoint replay capacity 4 != task.buffer_size 5"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_buffer_on_an_accelerator_takes_cpu_inputs_and_cpu_generators():
    buf = ReplayBuffer(8, (OBS_DIM,), n_agents=2, device="cuda")
    value = torch.arange(10.0).view(5, 2) + 1
    obs = value.unsqueeze(-1).expand(5, 2, OBS_DIM).clone()
    buf.add(obs, value.long(), value, obs, torch.zeros(5, 2, dtype=torch.bool))
    batch = buf.sample(2, 3, [torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)])
    assert all(t.device.type == "cuda" for t in batch)
    restored = ReplayBuffer(8, (OBS_DIM,), n_agents=2, device="cuda")
    restored.load_state_dict(buf.state_dict())
    restored.keep_agents_(torch.tensor([1]))
    assert restored.rewards.device.type == "cuda" and set(restored.rewards[:5].tolist()) == {2.0, 4.0, 6.0, 8.0, 10.0}

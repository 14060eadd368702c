"""Target-network updates on generated weights: soft_update's direction and rate, hard_update's copy."""

import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from pipeline.nets.mlp import MLP
from pipeline.rl.targets import hard_update, soft_update

taus = st.floats(0.0, 1.0)
seeds = st.integers(0, 2**31 - 1)


def _pair(seed: int) -> tuple[nn.Module, nn.Module]:
    """Two float64 nets with different weights and float buffers (BatchNorm), so every tensor must move."""
    torch.manual_seed(seed)

    def net() -> nn.Module:
        module = nn.Sequential(MLP(3, 4, hidden=(5,)), nn.BatchNorm1d(4)).double()
        with torch.no_grad():
            module[1].running_mean.normal_()
            module[1].running_var.uniform_(0.5, 2.0)
        return module

    return net(), net()


def _tensors(module: nn.Module) -> list[torch.Tensor]:
    return [t.detach().clone() for t in module.state_dict().values()]


@given(tau=taus, seed=seeds)
def test_soft_update_moves_target_tau_of_the_way_to_online(tau, seed):
    target, online = _pair(seed)
    before_target, before_online = _tensors(target), _tensors(online)
    soft_update(target, online, tau)
    for t_new, t_old, o in zip(_tensors(target), before_target, before_online):
        if t_old.is_floating_point():
            expected = tau * o + (1 - tau) * t_old
            torch.testing.assert_close(t_new, expected, rtol=0, atol=1e-12)
        else:  # BatchNorm's step counter is copied, not averaged
            assert torch.equal(t_new, o)
    # The online network is the source: it never moves. With the arguments swapped it would.
    for o_new, o_old in zip(_tensors(online), before_online):
        assert torch.equal(o_new, o_old)


@given(tau=st.floats(0.01, 0.99), seed=seeds, n=st.integers(1, 20))
def test_repeated_soft_updates_close_the_gap_geometrically(tau, seed, n):
    target, online = _pair(seed)
    gap0 = [t - o for t, o in zip(_tensors(target), _tensors(online)) if t.is_floating_point()]
    for _ in range(n):
        soft_update(target, online, tau)
    gap = [t - o for t, o in zip(_tensors(target), _tensors(online)) if t.is_floating_point()]
    for g, g0 in zip(gap, gap0):
        torch.testing.assert_close(g, (1 - tau) ** n * g0, rtol=1e-9, atol=1e-12)


@given(seed=seeds)
def test_tau_zero_keeps_the_target_and_tau_one_copies_the_online_net(seed):
    target, online = _pair(seed)
    before = _tensors(target)
    soft_update(target, online, 0.0)
    assert all(torch.equal(a, b) for a, b in zip(_tensors(target), before))
    soft_update(target, online, 1.0)
    assert all(torch.equal(a, b) for a, b in zip(_tensors(target), _tensors(online)))


@given(tau=st.one_of(st.floats(max_value=-1e-9, allow_nan=False), st.floats(min_value=1.0 + 1e-9, allow_nan=False)))
def test_tau_outside_unit_interval_is_refused(tau):
    target, online = _pair(0)
    with pytest.raises(ValueError, match="tau must be in"):
        soft_update(target, online, tau)


def test_soft_update_refuses_different_structures():
    with pytest.raises(ValueError, match="different structures"):
        soft_update(MLP(3, 2, hidden=(4,)), MLP(3, 2, hidden=(4, 4)), 0.5)
    with pytest.raises(ValueError, match="different structures"):
        soft_update(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)), nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)), 0.5)


@given(seed=seeds)
def test_hard_update_copies_every_tensor_without_aliasing(seed):
    target, online = _pair(seed)
    with torch.no_grad():
        online[1].num_batches_tracked.fill_(seed % 1000 + 1)
    before_online = _tensors(online)
    hard_update(target, online)
    assert all(torch.equal(t, o) for t, o in zip(_tensors(target), before_online))
    assert all(torch.equal(o, b) for o, b in zip(_tensors(online), before_online))
    with torch.no_grad():
        for p in online.parameters():
            p.add_(1.0)
    assert not any(torch.equal(t, o) for t, o in zip(target.parameters(), online.parameters()))


def test_soft_update_keeps_the_targets_tensor_objects():
    # Updates are in place: an optimizer or a numpy mirror holding the target's tensors stays valid.
    target, online = _pair(1)
    ids = [id(p) for p in target.parameters()]
    storage = [p.data_ptr() for p in target.parameters()]
    soft_update(target, online, 0.3)
    hard_update(target, copy.deepcopy(online))
    assert ids == [id(p) for p in target.parameters()]
    assert storage == [p.data_ptr() for p in target.parameters()]

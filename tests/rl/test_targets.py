import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from pipeline.nets.mlp import MLP
from pipeline.rl.targets import freeze, hard_update, soft_update


def _linear(weight: float, bias: float) -> nn.Linear:
    layer = nn.Linear(2, 1)
    with torch.no_grad():
        layer.weight.fill_(weight)
        layer.bias.fill_(bias)
    return layer


def test_soft_update_arithmetic():
    target, online = _linear(1.0, 0.0), _linear(3.0, 10.0)
    soft_update(target, online, tau=0.1)
    # 0.1 * 3 + 0.9 * 1 = 1.2 and 0.1 * 10 + 0.9 * 0 = 1.0
    assert torch.allclose(target.weight, torch.full((1, 2), 1.2))
    assert torch.allclose(target.bias, torch.full((1,), 1.0))
    assert torch.equal(online.weight, torch.full((1, 2), 3.0))


def test_soft_update_rejects_bad_tau():
    with pytest.raises(ValueError):
        soft_update(_linear(0, 0), _linear(1, 1), tau=1.5)


def test_soft_update_averages_float_buffers_and_copies_integer_ones():
    target, online = nn.BatchNorm1d(3), nn.BatchNorm1d(3)
    online.running_mean.fill_(1.0)
    online.num_batches_tracked.fill_(7)
    soft_update(target, online, tau=0.5)
    assert torch.allclose(target.running_mean, torch.full((3,), 0.5))
    assert target.num_batches_tracked.item() == 7


def test_hard_update_makes_an_equal_copy():
    torch.manual_seed(0)
    target, online = MLP(4, 2, hidden=(8,)), MLP(4, 2, hidden=(8,))
    hard_update(target, online)
    for t, o in zip(target.state_dict().values(), online.state_dict().values()):
        assert torch.equal(t, o)
    # A copy, not an alias: training the online net leaves the target alone.
    with torch.no_grad():
        next(online.parameters()).add_(1.0)
    assert not torch.equal(next(target.parameters()), next(online.parameters()))


def test_target_network_receives_no_gradient():
    torch.manual_seed(0)
    online = MLP(4, 2, hidden=(16,))
    target = freeze(copy.deepcopy(online))
    before = [p.detach().clone() for p in target.parameters()]
    obs, next_obs = torch.randn(8, 4), torch.randn(8, 4)
    actions, rewards = torch.randint(0, 2, (8, 1)), torch.ones(8)
    with torch.no_grad():
        y = rewards + 0.99 * target(next_obs).max(dim=1).values
    loss = F.smooth_l1_loss(online(obs).gather(1, actions).squeeze(1), y)
    loss.backward()
    torch.optim.SGD(online.parameters(), lr=0.1).step()
    assert all(p.grad is not None for p in online.parameters())
    assert all(p.grad is None and not p.requires_grad for p in target.parameters())
    assert all(torch.equal(b, p) for b, p in zip(before, target.parameters()))


def test_updates_refuse_modules_of_different_structures():
    """A target that does not mirror the online net is an error, never a partial copy."""
    import pytest
    from torch import nn

    from pipeline.rl.targets import hard_update, soft_update

    small, big = nn.Sequential(nn.Linear(2, 2)), nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    with pytest.raises(ValueError):
        hard_update(small, big)
    with pytest.raises(ValueError):
        hard_update(big, small)
    with pytest.raises(ValueError, match="^target and online modules have different structures$"):
        soft_update(small, big, 0.5)
    # Same parameters, different buffers: also refused.
    plain, normed = nn.Sequential(nn.Linear(2, 2)), nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2, affine=False))
    with pytest.raises(ValueError):
        hard_update(plain, normed)
    with pytest.raises(ValueError):
        soft_update(normed, nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2, affine=False), nn.BatchNorm1d(2, affine=False)), 0.5)


def test_soft_update_copies_integer_buffers():
    from torch import nn

    from pipeline.rl.targets import soft_update

    target, online = nn.BatchNorm1d(2), nn.BatchNorm1d(2)
    online.num_batches_tracked.fill_(7)
    soft_update(target, online, 0.1)
    assert int(target.num_batches_tracked) == 7


def test_soft_update_refuses_a_missing_integer_buffer():
    import pytest
    import torch
    from torch import nn

    from pipeline.rl.targets import soft_update

    target, online = nn.Linear(2, 2), nn.Linear(2, 2)
    online.register_buffer("count", torch.zeros((), dtype=torch.int64))
    with pytest.raises(ValueError):
        soft_update(target, online, 0.5)

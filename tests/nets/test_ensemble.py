"""The ensemble is K ordinary networks: same outputs, same gradients, same Adam steps, no coupling."""

import functools

import pytest
import torch
from torch import nn

from pipeline.nets.ensemble import (
    EnsembleMLP,
    clip_grad_norm_per_member_,
    keep_optimizer_members_,
    per_member_grad_norm,
)
from pipeline.nets.mlp import MLP

K, N = 4, 32


def members(hidden=(16, 8), seed=0, **kwargs) -> list[MLP]:
    torch.manual_seed(seed)
    return [MLP(5, 3, hidden, **kwargs) for _ in range(K)]


def member_grads(mlp: MLP) -> dict[str, torch.Tensor]:
    return {name: p.grad for name, p in mlp.named_parameters()}


def test_outputs_and_gradients_equal_separate_linears():
    mlps = members()
    ensemble = EnsembleMLP(mlps)
    x = torch.randn(K, N, 5)
    out = ensemble(x)
    assert out.shape == (K, N, 3)
    for k, mlp in enumerate(mlps):
        assert torch.allclose(out[k], mlp(x[k]), atol=1e-6)
    # Sum over members of each member's own mean loss.
    (out**2).mean(dim=(1, 2)).sum().backward()
    for k, mlp in enumerate(mlps):
        (mlp(x[k]) ** 2).mean().backward()
        for pos in (0, 2, 4):
            layer = ensemble.net[pos]
            assert torch.allclose(layer.weight.grad[k], mlp.net[pos].weight.grad.t(), atol=1e-6)
            assert torch.allclose(layer.bias.grad[k, 0], mlp.net[pos].bias.grad, atol=1e-6)


def test_member_state_dict_loads_into_the_ordinary_network():
    mlps = members()
    ensemble = EnsembleMLP(mlps)
    x = torch.randn(N, 5)
    for k in range(K):
        fresh = MLP(5, 3, (16, 8))
        fresh.load_state_dict(ensemble.member_state_dict(k))  # strict: same keys, same shapes
        assert torch.allclose(fresh(x), mlps[k](x), atol=1e-6)
    other = EnsembleMLP(members(seed=1))
    other.load_member_state_dict(2, ensemble.member_state_dict(1))
    assert all(torch.equal(a, b) for a, b in zip(other.member_state_dict(2).values(), ensemble.member_state_dict(1).values()))


def test_from_factory_gives_each_member_its_seeds_weights_and_leaves_the_rng_alone():
    factory = functools.partial(MLP, hidden=(8,))
    torch.manual_seed(99)
    before = torch.random.get_rng_state()
    ensemble = EnsembleMLP.from_factory(factory, [3, 4], in_features=5, out_features=2)
    assert torch.equal(torch.random.get_rng_state(), before)
    for k, seed in enumerate([3, 4]):
        torch.manual_seed(seed)
        reference = factory(in_features=5, out_features=2)
        for name, value in reference.state_dict().items():
            assert torch.equal(ensemble.member_state_dict(k)[name], value)


def test_one_adam_over_the_stack_is_k_independent_adams():
    mlps = members()
    ensemble = EnsembleMLP(mlps)
    separate = [torch.optim.Adam(m.parameters(), lr=1e-2) for m in mlps]
    stacked = torch.optim.Adam(ensemble.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        x, y = torch.randn(K, N, 5, generator=gen), torch.randn(K, N, 3, generator=gen)
        stacked.zero_grad()
        # Mean within each member, SUM across members (a mean across members would scale every gradient by 1/K;
        # Adam is nearly scale-free, but its eps is not, and clipping or SGD would notice).
        ((ensemble(x) - y) ** 2).mean(dim=(1, 2)).sum().backward()
        stacked.step()
        for k, (mlp, opt) in enumerate(zip(mlps, separate)):
            opt.zero_grad()
            ((mlp(x[k]) - y[k]) ** 2).mean().backward()
            opt.step()
    for k, mlp in enumerate(mlps):
        for name, value in mlp.state_dict().items():
            assert torch.allclose(ensemble.member_state_dict(k)[name], value, atol=1e-5), (k, name)


def test_per_member_clipping_matches_torch_and_does_not_couple_members():
    ensemble = EnsembleMLP(members())
    x = torch.randn(K, N, 5)
    scale = torch.tensor([1000.0, 1.0, 1.0, 1.0]).view(K, 1, 1)  # member 0's gradient is huge
    (ensemble(x) * scale).sum().backward()
    params = list(ensemble.parameters())
    before = [p.grad.clone() for p in params]
    norms = per_member_grad_norm(params)
    returned = clip_grad_norm_per_member_(params, max_norm=5.0)
    assert torch.equal(norms, returned)
    for k in range(K):
        # The reference: torch's own clipping on member k alone.
        alone = [nn.Parameter(b[k].clone()) for b in before]
        for p, b in zip(alone, before):
            p.grad = b[k].clone()
        torch.nn.utils.clip_grad_norm_(alone, max_norm=5.0)
        for p, a in zip(params, alone):
            assert torch.allclose(p.grad[k], a.grad, rtol=1e-5, atol=1e-7)
        if norms[k] <= 5.0:
            # Unclipped members are untouched, whatever member 0 did.
            assert all(torch.equal(p.grad[k], b[k]) for p, b in zip(params, before))
    assert norms[0] > 5.0
    # A norm over the whole stack would have shrunk the small members too: what this function avoids.
    assert torch.linalg.vector_norm(norms) > 5.0 and (norms[1:] > 0).all()


def test_keep_members_carries_weights_and_optimizer_state():
    full = EnsembleMLP(members())
    kept = EnsembleMLP(members())
    opt_full = torch.optim.Adam(full.parameters(), lr=1e-2)
    opt_kept = torch.optim.Adam(kept.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)

    def step(net, opt, x):
        opt.zero_grad()
        (net(x) ** 2).mean(dim=(1, 2)).sum().backward()
        opt.step()

    for _ in range(5):
        x = torch.randn(K, N, 5, generator=gen)
        step(full, opt_full, x)
        step(kept, opt_kept, x)
    keep = torch.tensor([3, 1])
    pairs = kept.keep_members_(keep)
    keep_optimizer_members_(opt_kept, pairs, keep, n_before=K)
    assert kept.n_members == 2 and kept.net[0].weight.shape[0] == 2
    assert all(p in opt_kept.state for p in kept.parameters())
    for _ in range(5):
        x = torch.randn(K, N, 5, generator=gen)
        step(full, opt_full, x)
        step(kept, opt_kept, x[keep])
    for slot, member in enumerate(keep.tolist()):
        for name, value in full.member_state_dict(member).items():
            assert torch.allclose(kept.member_state_dict(slot)[name], value, atol=1e-6)


def test_dropout_and_activations_stack_but_other_layers_do_not():
    EnsembleMLP(members(act="tanh", dropout=0.1))
    with pytest.raises(ValueError, match="Linear layers and parameter-free"):
        EnsembleMLP([nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))])
    with pytest.raises(ValueError, match="expected an MLP"):
        EnsembleMLP([nn.Conv2d(1, 1, 3)])

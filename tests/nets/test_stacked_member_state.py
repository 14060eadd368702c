"""What a stacked module (ours by hand or `StackedModule`) hands out and keeps per member: a member's state_dict is a
copy of that member alone (later training does not reach it, and it holds no other member's numbers), shrinking keeps
every per-member tensor of the kept members (buffers as well as parameters), and a refusal that compares members
compares every one of them, at K = 2 too.

The modules are a user's own (BatchNorm, a plain tensor attribute), written here, beside our MLP.
"""

import functools

import pytest
import torch
from test_stacked import BatchNormNet  # a user's net with running statistics (buffers) beside its weights
from torch import nn

from pipeline.nets.ensemble import make_ensemble
from pipeline.nets.mlp import MLP
from pipeline.nets.stacked import StackedModule

IN, OUT, N = 4, 2, 32


class Projected(nn.Module):
    """Keeps a random projection as a plain attribute (not a buffer): vmap cannot give it a member axis."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.proj = torch.randn(in_features, out_features)

    def forward(self, x):
        return x @ self.proj


NETS = {"ours-EnsembleMLP": functools.partial(MLP, hidden=(8,)), "generic-StackedModule": BatchNormNet}


def member_inputs(k, seed):
    """[k, N, IN] with each member's inputs on a scale of its own, so each member's statistics differ."""
    x = torch.randn(k, N, IN, generator=torch.Generator().manual_seed(seed))
    return x * (1.0 + torch.arange(float(k))).view(k, 1, 1) + torch.arange(float(k)).view(k, 1, 1)


def train_steps(net, steps, seed=0):
    """A few Adam steps on each member's own loss (in train mode, so running statistics move too)."""
    opt = torch.optim.Adam(net.parameters(), lr=0.05)
    k = net.n_members
    for t in range(steps):
        out = net(member_inputs(k, seed + t))
        opt.zero_grad()
        ((out**2).mean(dim=(1, 2)) * torch.arange(1.0, k + 1)).sum().backward()
        opt.step()


@pytest.mark.parametrize("factory", NETS.values(), ids=NETS.keys())
def test_a_members_state_dict_is_a_copy_of_that_member_alone(factory):
    net = make_ensemble(factory, [1, 2, 3], (IN,), OUT)
    train_steps(net, 2)
    taken = net.member_state_dict(1)
    before = {k: v.clone() for k, v in taken.items()}
    train_steps(net, 3, seed=10)
    moved = net.member_state_dict(1)
    assert any(not torch.equal(moved[k], before[k]) for k in before)  # training moved member 1
    for name, value in taken.items():
        assert torch.equal(value, before[name]), f"{name}: the state_dict taken earlier changed with the weights"
        # What torch.save writes is the whole storage: a view of the stack would carry every member into model.pt.
        assert value.untyped_storage().nbytes() == value.numel() * value.element_size(), name


def test_keep_members_keeps_the_kept_members_buffers_with_their_weights():
    full = make_ensemble(BatchNormNet, [1, 2, 3], (IN,), OUT)
    train_steps(full, 3)
    states = [full.member_state_dict(i) for i in range(3)]
    assert not torch.equal(states[0]["bn.running_mean"], states[2]["bn.running_mean"])  # members' statistics differ
    keep = [2, 0]
    full.keep_members_(torch.tensor(keep))
    assert full.n_members == 2
    for slot, member in enumerate(keep):
        kept = full.member_state_dict(slot)
        assert kept.keys() == states[member].keys()
        for name, value in states[member].items():
            assert torch.equal(kept[name], value), (slot, name)
    # In eval mode the running statistics decide the outputs: each kept slot answers as its member alone.
    full.eval()
    x = member_inputs(2, 99)
    for slot, member in enumerate(keep):
        alone = BatchNormNet(IN, OUT)
        alone.load_state_dict(states[member])
        # vmap's batched kernels against the plain module's: float32 sums of <= 6 products of O(1-10) values, in
        # another order: a few eps of rounding (~1e-6); 1e-5 leaves room, another member's statistics move it by O(0.1).
        assert torch.allclose(full(x)[slot], alone.eval()(x[slot]), atol=1e-5), slot


@pytest.mark.parametrize("k", [2, 3, 4])
def test_a_plain_attribute_differing_in_any_one_member_is_refused(k):
    for odd in range(1, k):
        torch.manual_seed(0)
        same = Projected(IN, OUT)
        members = [Projected(IN, OUT) for _ in range(k)]
        for m in members:
            m.proj = same.proj.clone()
        members[odd].proj = same.proj + 1.0
        with pytest.raises(ValueError, match=r"^Projected keeps proj as a plain tensor attribute that differs between members"):
            StackedModule(members)
    equal = [Projected(IN, OUT) for _ in range(k)]
    for m in equal:
        m.proj = equal[0].proj.clone()
    assert StackedModule(equal)(torch.ones(k, 3, IN)).shape == (k, 3, OUT)  # equal attributes are no reason to refuse

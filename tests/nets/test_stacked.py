"""Any module as K members (`StackedModule`): member i is the plain module of its seed (outputs, gradients, Adam steps,
clipping, running statistics), its state_dict is the plain module's, and nothing couples the members.

The modules are written here as a user would (a skip connection, LayerNorm, Dropout, a scalar parameter, BatchNorm,
tied weights), never taken from pipeline.nets.
"""

import copy
import functools

import pytest
import torch
from torch import nn

from pipeline.nets.ensemble import (
    EnsembleMLP,
    clip_grad_norm_per_member_,
    compile_over_members,
    compiled_graphs,
    keep_optimizer_members_,
    make_ensemble,
)
from pipeline.nets.mlp import MLP
from pipeline.nets.stacked import StackedActorCritic, StackedModule, check_outputs, output_shapes

SEEDS = [3, 7, 11]
IN, OUT, N = 5, 3, 16
# float32 sums of at most ~32 products of O(1) values, in another order (vmap's batched kernels against the plain
# module's): a few dozen eps of rounding, ~4e-6; 1e-5 leaves room, and a member's own signal is O(0.1) or more.
TOL = 1e-5


class ResMLP(nn.Module):
    """in -> width, then a residual block (LayerNorm, Linear, ReLU, Dropout), then out; scaled by a learnt scalar."""

    def __init__(self, in_features, out_features, width=16, dropout=0.0):
        super().__init__()
        self.inp = nn.Linear(in_features, width)
        self.norm = nn.LayerNorm(width)
        self.hidden = nn.Linear(width, width)
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(width, out_features)
        self.scale = nn.Parameter(torch.rand(()) + 0.5)  # a scalar: its stacked form is [K]

    def forward(self, x):
        h = torch.relu(self.inp(x))
        h = h + self.drop(torch.relu(self.hidden(self.norm(h))))
        return self.out(h) * self.scale


class BatchNormNet(nn.Module):
    def __init__(self, in_features, out_features, momentum=0.1):
        super().__init__()
        self.inp = nn.Linear(in_features, 8)
        self.bn = nn.BatchNorm1d(8, momentum=momentum)
        self.out = nn.Linear(8, out_features)

    def forward(self, x):
        return self.out(torch.relu(self.bn(self.inp(x))))


class TwoHeads(nn.Module):
    """A tuple of outputs and a method besides forward."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.body = nn.Linear(in_features, 8)
        self.a = nn.Linear(8, out_features)
        self.b = nn.Linear(8, 1)

    def features(self, x):
        return torch.tanh(self.body(x))

    def forward(self, x):
        h = self.features(x)
        return self.a(h), self.b(h).squeeze(-1)


class Tied(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.enc = nn.Linear(in_features, 6, bias=False)
        self.dec = nn.Linear(6, in_features, bias=False)
        self.dec.weight = self.enc.weight  # shapes differ: dec uses it transposed below
        self.head = nn.Linear(in_features, out_features)

    def forward(self, x):
        return self.head(nn.functional.linear(torch.relu(self.enc(x)), self.dec.weight.t()))


def plain(cls, seed, **kwargs):
    """The single run's module: built right after seeding, as the pipeline's single-seed run builds it."""
    torch.manual_seed(seed)
    return cls(in_features=IN, out_features=OUT, **kwargs)


def stacked(cls, seeds=SEEDS, **kwargs):
    return make_ensemble(functools.partial(cls, **kwargs), seeds, (IN,), OUT)


def inputs(k=3, n=N, seed=0):
    return torch.randn(k, n, IN, generator=torch.Generator().manual_seed(seed))


def member_losses(out):
    """Each member's own loss [K], unequal across members so a leak between them shows."""
    weights = torch.arange(1.0, out.shape[0] + 1).view(-1, 1, 1)
    return (weights * out**2).mean(dim=(1, 2))


# ---- construction ------------------------------------------------------------------------------------


def test_any_module_other_than_our_exact_classes_is_stacked_generically():
    class MyMLP(MLP):  # a subclass may change forward: the hand-written ensemble would drop the change
        def forward(self, x):
            return 2 * super().forward(x)

    assert type(make_ensemble(functools.partial(MLP, hidden=(4,)), SEEDS, (IN,), OUT)) is EnsembleMLP
    sub = make_ensemble(functools.partial(MyMLP, hidden=(4,)), SEEDS, (IN,), OUT)
    assert type(sub) is StackedModule and sub.n_members == 3
    x = inputs()
    with torch.no_grad():
        for i, seed in enumerate(SEEDS):
            torch.manual_seed(seed)
            single = MyMLP(IN, OUT, hidden=(4,))
            assert torch.allclose(sub(x)[i], single(x[i]), atol=TOL)  # the subclass's forward, doubled
    assert type(stacked(ResMLP)) is StackedModule
    assert type(make_ensemble(nn.Linear, SEEDS, (IN,), OUT)) is StackedModule


def test_each_member_starts_as_the_plain_module_of_its_seed_and_the_rng_is_left_alone():
    torch.manual_seed(99)
    before = torch.random.get_rng_state()
    net = stacked(ResMLP)
    assert torch.equal(torch.random.get_rng_state(), before)
    for i, seed in enumerate(SEEDS):
        mine, single = net.member_state_dict(i), plain(ResMLP, seed).state_dict()
        assert mine.keys() == single.keys() and all(torch.equal(mine[k], single[k]) for k in single)
    assert not torch.equal(net.member_state_dict(0)["inp.weight"], net.member_state_dict(1)["inp.weight"])


def test_every_tensor_has_the_member_axis_first_and_the_callers_modules_are_untouched():
    members = [plain(ResMLP, s) for s in SEEDS]
    before = [copy.deepcopy(m.state_dict()) for m in members]
    net = StackedModule(members)
    assert all(t.shape[0] == 3 for t in [*net.parameters(), *net.buffers()])
    assert net.module.scale.shape == (3,)
    for m, was in zip(members, before):
        assert all(torch.equal(v, was[k]) for k, v in m.state_dict().items()) and m.scale.shape == ()


# ---- running the members --------------------------------------------------------------------------------


def test_outputs_and_gradients_are_each_plain_modules_own():
    net, singles = stacked(ResMLP), [plain(ResMLP, s) for s in SEEDS]
    x = inputs()
    out = net(x)
    assert out.shape == (3, N, OUT)
    member_losses(out).sum().backward()
    for i, single in enumerate(singles):
        ref = single(x[i])
        assert torch.allclose(out[i], ref, atol=TOL)
        ((i + 1) * ref**2).mean().backward()
        for name, p in single.named_parameters():
            assert torch.allclose(net.stacked(name).grad[i], p.grad, atol=TOL), (i, name)


def test_one_member_is_the_plain_module_bitwise_dropout_draws_included():
    """K = 1 runs the plain module on member 0's tensors (no vmap): the single run's kernels and random draws."""
    net, single = stacked(ResMLP, seeds=[5], dropout=0.5), plain(ResMLP, 5, dropout=0.5)
    x = inputs(k=1)
    torch.manual_seed(1)
    out = net(x)
    torch.manual_seed(1)
    ref = single(x[0])
    assert torch.equal(out[0], ref)
    out.pow(2).mean().backward()
    ref.pow(2).mean().backward()
    assert all(torch.equal(net.stacked(n).grad[0], p.grad) for n, p in single.named_parameters())


def test_dropout_draws_its_own_mask_per_member_and_eval_turns_it_off():
    net = stacked(ResMLP, seeds=[4, 4, 4], dropout=0.5)  # three identical members: only their masks can differ
    x = inputs(seed=2)
    x = x[:1].expand(3, -1, -1)
    out = net(x)
    assert not torch.allclose(out[0], out[1]) and not torch.allclose(out[1], out[2])
    net.eval()
    out = net(x)
    assert torch.equal(out[0], out[1]) and torch.equal(out[1], out[2])
    assert torch.allclose(out[0], plain(ResMLP, 4, dropout=0.5).eval()(x[0]), atol=TOL)


def test_one_adam_with_per_member_clipping_is_k_independent_runs():
    """Adam and a per-member clip (one member's gradients far larger): each member's steps are its plain module's."""
    net, singles = stacked(ResMLP), [plain(ResMLP, s) for s in SEEDS]
    with torch.no_grad():
        net.module.out.weight[1].mul_(50.0)
        singles[1].out.weight.mul_(50.0)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    opts = [torch.optim.Adam(s.parameters(), lr=1e-2) for s in singles]
    for t in range(4):
        x = inputs(seed=t)
        opt.zero_grad()
        member_losses(net(x)).sum().backward()
        norms = clip_grad_norm_per_member_(list(net.parameters()), 0.5)
        opt.step()
        for i, (single, o) in enumerate(zip(singles, opts)):
            o.zero_grad()
            ((i + 1) * single(x[i]) ** 2).mean().backward()
            norm = nn.utils.clip_grad_norm_(single.parameters(), 0.5)
            assert torch.allclose(norms[i], norm, rtol=1e-5), (t, i)
            o.step()
    assert norms[1] > 10 * norms[0]  # the clip mattered, and per member
    for i, single in enumerate(singles):
        for name, value in single.state_dict().items():
            assert torch.allclose(net.member_state_dict(i)[name], value, atol=1e-5), (i, name)


def test_batchnorm_keeps_each_members_running_statistics():
    """vmap updates each member's stacked buffers in place: K BatchNorm modules, each as its plain module."""
    net, singles = stacked(BatchNormNet), [plain(BatchNormNet, s) for s in SEEDS]
    for t in range(3):
        x = inputs(seed=t) * (1 + torch.arange(3.0)).view(3, 1, 1)  # each member sees its own statistics
        out = net(x)
        for i, single in enumerate(singles):
            assert torch.allclose(out[i], single(x[i]), atol=TOL)
    for i, single in enumerate(singles):
        for name, value in single.state_dict().items():
            assert torch.allclose(net.member_state_dict(i)[name].to(value.dtype), value, atol=TOL), (i, name)
    assert net.member_state_dict(2)["bn.num_batches_tracked"] == 3
    net.eval()
    x = inputs(seed=9)
    for i, single in enumerate(singles):
        assert torch.allclose(net(x)[i], single.eval()(x[i]), atol=TOL)


def test_tuples_of_outputs_and_declared_methods_run_per_member():
    net = make_ensemble(TwoHeads, SEEDS, (IN,), OUT, stacked=functools.partial(StackedModule, methods=("features",)))
    x = inputs()
    a, b = net(x)
    h = net.features(x)
    assert a.shape == (3, N, OUT) and b.shape == (3, N) and h.shape == (3, N, 8)
    for i, seed in enumerate(SEEDS):
        single = plain(TwoHeads, seed)
        assert torch.allclose(a[i], single(x[i])[0], atol=TOL) and torch.allclose(b[i], single(x[i])[1], atol=TOL)
        assert torch.allclose(h[i], single.features(x[i]), atol=TOL)
    assert output_shapes(net, (IN,)) == [("N", OUT), ("N",)]
    assert not hasattr(net, "a") and not hasattr(net, "body")  # undeclared names do not reach the template
    with pytest.raises(ValueError, match=r"^TwoHeads has no unit$"):
        StackedModule([plain(TwoHeads, 0)], methods=("unit",))


def test_tied_weights_stay_tied_in_the_stack_and_in_each_members_state_dict():
    net, singles = stacked(Tied), [plain(Tied, s) for s in SEEDS]
    assert net.module.dec.weight is net.module.enc.weight
    x = inputs()
    member_losses(net(x)).sum().backward()
    for i, single in enumerate(singles):
        ((i + 1) * single(x[i]) ** 2).mean().backward()
        assert torch.allclose(net.module.enc.weight.grad[i], single.enc.weight.grad, atol=TOL)
        fresh = Tied(IN, OUT)
        fresh.load_state_dict(net.member_state_dict(i))
        assert torch.allclose(fresh(x[i]), single(x[i]), atol=TOL)
    pairs = net.keep_members_(torch.tensor([1]))
    assert len(pairs) == 3 and net.module.dec.weight is net.module.enc.weight  # the tied one, head.weight, head.bias
    assert net.module.enc.weight.shape == (1, 6, IN)


# ---- members in and out ---------------------------------------------------------------------------------


def test_member_state_dict_loads_into_the_users_own_class_and_back():
    net = stacked(ResMLP)
    x = inputs()[0]
    for i in range(3):
        mine = ResMLP(IN, OUT)
        mine.load_state_dict(net.member_state_dict(i))  # strict: the plain module's keys and shapes
        assert torch.allclose(mine(x), net(x.expand(3, -1, -1))[i], atol=TOL)
    other = stacked(ResMLP, seeds=[20, 21, 22])
    other.load_member_state_dict(1, net.member_state_dict(2))
    assert all(torch.equal(a, b) for a, b in zip(other.member_state_dict(1).values(), net.member_state_dict(2).values()))
    assert not torch.equal(other.member_state_dict(0)["inp.weight"], net.member_state_dict(0)["inp.weight"])
    with pytest.raises(ValueError, match=r"^ResMLP: the state_dict's keys \['extra'\] do not fit this model"):
        other.load_member_state_dict(0, {**net.member_state_dict(0), "extra": torch.zeros(1)})
    bad = {**net.member_state_dict(0), "scale": torch.zeros(2)}
    with pytest.raises(ValueError, match=r"^ResMLP: 'scale' has shape \(2,\), expected \(\)$"):
        other.load_member_state_dict(0, bad)


def test_keep_members_keeps_the_right_members_and_their_optimizer_state():
    full, kept = stacked(ResMLP), stacked(ResMLP)
    opt_full, opt_kept = torch.optim.Adam(full.parameters(), lr=1e-2), torch.optim.Adam(kept.parameters(), lr=1e-2)

    def step(net, opt, x, weights):
        opt.zero_grad()
        (torch.tensor(weights) * (net(x) ** 2).mean(dim=(1, 2))).sum().backward()
        opt.step()

    for t in range(3):
        step(full, opt_full, inputs(seed=t), [1.0, 2.0, 3.0])
        step(kept, opt_kept, inputs(seed=t), [1.0, 2.0, 3.0])
    keep = torch.tensor([2, 0])
    pairs = kept.keep_members_(keep)
    keep_optimizer_members_(opt_kept, pairs, keep, n_before=3)
    assert kept.n_members == 2 and all(t.shape[0] == 2 for t in kept.parameters())
    assert all(p in opt_kept.state for p in kept.parameters())
    for t in range(3, 6):
        x = inputs(seed=t)
        step(full, opt_full, x, [5.0, 1.0, 4.0])  # members 2 and 0 get what the kept slots 0 and 1 get
        step(kept, opt_kept, x[keep], [4.0, 5.0])
    for slot, member in enumerate(keep.tolist()):
        for name, value in full.member_state_dict(member).items():
            assert torch.allclose(kept.member_state_dict(slot)[name], value, atol=1e-5), (slot, name)


def test_a_deep_copy_is_an_independent_stack():
    net = stacked(ResMLP)
    target = copy.deepcopy(net)
    with torch.no_grad():
        net.module.inp.weight.add_(1.0)
    x = inputs()
    assert not torch.allclose(net(x), target(x))
    target.keep_members_(torch.tensor([0]))
    assert target(x[:1]).shape == (1, N, OUT) and net.n_members == 3


# ---- refusals, one line each ----------------------------------------------------------------------------


def test_a_forward_vmap_cannot_run_is_refused_in_one_line():
    class Branchy(nn.Module):
        def __init__(self, in_features, out_features):
            super().__init__()
            self.lin = nn.Linear(in_features, out_features)

        def forward(self, x):
            return self.lin(x) if x.sum().item() > 0 else -self.lin(x)

    net = make_ensemble(Branchy, SEEDS, (IN,), OUT)
    with pytest.raises(RuntimeError, match=r"^Branchy.forward cannot run as 3 members under torch.func.vmap \(.*\); .*seeds_per_process=1$") as err:
        net(inputs())
    assert "\n" not in str(err.value)
    assert make_ensemble(Branchy, [0], (IN,), OUT)(inputs(k=1)).shape == (1, N, OUT)  # one member needs no vmap


def test_a_plain_tensor_attribute_that_differs_between_members_is_refused():
    class Projected(nn.Module):
        def __init__(self, in_features, out_features):
            super().__init__()
            self.proj = torch.randn(in_features, out_features)  # not a buffer: vmap could not give it a member axis

        def forward(self, x):
            return x @ self.proj

    with pytest.raises(ValueError, match=r"^Projected keeps proj as a plain tensor attribute .*register it as a buffer"):
        make_ensemble(Projected, SEEDS, (IN,), OUT)


def test_members_of_different_shapes_or_classes_are_refused():
    with pytest.raises(ValueError, match="differ in their state_dict's keys or shapes"):
        StackedModule([ResMLP(IN, OUT, width=4), ResMLP(IN, OUT, width=5)])
    with pytest.raises(ValueError, match="share one class"):
        StackedModule([ResMLP(IN, OUT), Tied(IN, OUT)])


def test_check_outputs_names_what_the_module_returned_and_what_the_task_needs():
    net = stacked(TwoHeads)
    with pytest.raises(ValueError, match=r"^task=dqn needs Q-values; TwoHeads.forward\(x \[N, 5\]\) returned \(\[N, 3\], \[N\]\), expected \[N, 3\]$"):
        check_outputs(net, "dqn", "Q-values", (IN,), ("N", OUT))
    check_outputs(net, "ppo", "an actor-critic", (IN,), [("N", OUT), ("N",)])
    check_outputs(make_ensemble(functools.partial(MLP, hidden=(4,)), SEEDS, (IN,), OUT), "ppo", "x", (IN,), "never")  # ours: not probed


def test_a_stacked_actor_critic_reads_its_members_log_std_as_k_1_d():
    class Gaussian(nn.Module):
        def __init__(self, in_features, out_features, continuous=True):
            super().__init__()
            self.mean = nn.Linear(in_features, out_features)
            self.value = nn.Linear(in_features, 1)
            self.log_std = nn.Module()
            self.log_std.value = nn.Parameter(torch.randn(out_features))

        def forward(self, x):
            return self.mean(x), self.value(x).squeeze(-1)

    net = make_ensemble(Gaussian, SEEDS, (IN,), OUT, stacked=StackedActorCritic)
    assert net.log_std.value.shape == (3, 1, OUT)
    for i, seed in enumerate(SEEDS):
        assert torch.equal(net.log_std.value[i, 0], plain(Gaussian, seed).log_std.value)
    net.log_std.value.sum().backward()  # a view of the stacked parameter: its gradient reaches it
    assert torch.equal(net.module.log_std.value.grad, torch.ones(3, OUT))
    assert make_ensemble(TwoHeads, SEEDS, (IN,), OUT, stacked=StackedActorCritic).log_std is None


# ---- torch.compile ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_compile_over_members_runs_the_generic_form_and_keeps_k_symbolic_after_the_first_shrink():
    """A subclass of MLP (Linear, ReLU, Dropout: ops whose vmap rules keep the batch size symbolic): the compiled
    update's values are eager's, one static graph, then one graph for every K >= 2 and one for K = 1."""

    class MyMLP(MLP):
        pass

    net = make_ensemble(functools.partial(MyMLP, hidden=(8,)), [0, 1, 2, 3], (IN,), OUT)
    net.eval()  # no dropout draws: compiled and eager values comparable

    def loss_of(net, x):
        return member_losses(net(x))

    compiled = compile_over_members(loss_of, "cpu")
    graphs = compiled_graphs()
    x = inputs(k=4)
    assert torch.allclose(compiled(net, x), loss_of(net, x), atol=TOL)
    assert compiled_graphs() == graphs + 1
    for k, new_graphs in ((3, 1), (2, 0), (1, 1)):
        net.keep_members_(torch.arange(k))
        before = compiled_graphs()
        got = compiled(net, x[:k].clone())
        assert torch.allclose(got, loss_of(net, x[:k]), atol=TOL)
        assert compiled_graphs() - before == new_graphs, k


def test_our_tanh_in_a_stacked_module_gets_the_plain_gradients_wherever_the_sigmoid_form_runs(monkeypatch):
    """`pipeline.nets.mlp.Tanh` picks an in-place form where no gradient seems needed; under vmap an input that autograd
    records says requires_grad=False. Forced to the sigmoid form (AMD, AVX2-only CPUs), above its size thresholds."""
    from pipeline.nets import mlp
    from pipeline.nets.actor_critic import ActorCritic

    monkeypatch.setattr(mlp, "eager_tanh_form", lambda: "sigmoid")

    class MyActorCritic(ActorCritic):  # a subclass: stacked generically
        pass

    factory = functools.partial(MyActorCritic, hidden=(64,), act="tanh")
    net = make_ensemble(factory, [0, 1], (IN,), OUT)
    assert type(net) is StackedModule
    x = torch.randn(2, mlp.FAST_TANH_MIN_NUMEL // 64, IN)
    logits, values = net(x)
    (member_losses(logits) + values.mean(1)).sum().backward()
    for i in range(2):
        torch.manual_seed(i)
        single = factory(in_features=IN, out_features=OUT)
        p, v = single(x[i])
        ((i + 1) * (p**2).mean() + v.mean()).backward()
        for name, param in single.named_parameters():
            assert torch.allclose(net.stacked(name).grad[i], param.grad, atol=TOL), (i, name)

"""The ensemble is K ordinary networks: same outputs, same gradients, same Adam steps, no coupling."""

import copy
import functools
import math

import pytest
import torch
from torch import nn

from pipeline.nets.cnn import AtariCNN
from pipeline.nets.ensemble import (
    EnsembleAtariCNN,
    EnsembleConv2d,
    EnsembleDuelingQNet,
    EnsembleLinear,
    EnsembleMLP,
    EnsembleNoisyLinear,
    clip_grad_norm_per_member_,
    keep_optimizer_members_,
    make_ensemble,
    per_member_grad_norm,
)
from pipeline.nets.factory import make_net
from pipeline.nets.heads import DuelingQNet, NoisyQNet
from pipeline.nets.mlp import MLP

K, N = 4, 32


def members(hidden=(16, 8), seed=0, **kwargs) -> list[MLP]:
    torch.manual_seed(seed)
    return [MLP(5, 3, hidden, **kwargs) for _ in range(K)]


def step(net, opt, x):
    """One optimizer step on the sum over members of each member's own loss."""
    opt.zero_grad()
    (net(x) ** 2).mean(dim=(1, 2)).sum().backward()
    opt.step()


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
    assert all(
        torch.equal(a, b)
        for a, b in zip(other.member_state_dict(2).values(), ensemble.member_state_dict(1).values())
    )


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


def shrink_midway(full, kept, opt_full, opt_kept, keep: torch.Tensor, steps: int) -> None:
    """Train both alike, shrink `kept` to `keep` (weights and optimizer state), train on: its members follow `full`'s."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x = torch.randn(K, N, 5, generator=gen)
        step(full, opt_full, x)
        step(kept, opt_kept, x)
    keep_optimizer_members_(opt_kept, kept.keep_members_(keep), keep, n_before=K)
    for _ in range(steps):
        x = torch.randn(K, N, 5, generator=gen)
        step(full, opt_full, x)
        step(kept, opt_kept, x[keep])
    for slot, member in enumerate(keep.tolist()):
        for name, value in full.member_state_dict(member).items():
            assert torch.allclose(kept.member_state_dict(slot)[name], value, atol=1e-6), (slot, name)


def test_keep_members_carries_weights_and_optimizer_state():
    full = EnsembleMLP(members())
    kept = EnsembleMLP(members())
    opt_full = torch.optim.Adam(full.parameters(), lr=1e-2)
    opt_kept = torch.optim.Adam(kept.parameters(), lr=1e-2)
    shrink_midway(full, kept, opt_full, opt_kept, torch.tensor([3, 1]), steps=5)
    assert kept.n_members == 2 and kept.net[0].weight.shape[0] == 2
    assert all(p in opt_kept.state for p in kept.parameters())


def test_dropout_and_activations_stack_but_other_layers_do_not():
    EnsembleMLP(members(act="tanh", dropout=0.1))
    with pytest.raises(
        ValueError,
        match=r"^EnsembleMLP stacks Linear layers and parameter-free activations; got BatchNorm1d\. "
        r"Use model=mlp for seed-batched runs\.$",
    ):
        EnsembleMLP([nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))])
    with pytest.raises(ValueError, match=r"^cannot stack Conv2d: expected an MLP"):
        EnsembleMLP([nn.Conv2d(1, 1, 3)])
    with pytest.raises(ValueError, match="^an ensemble needs at least one member$"):
        EnsembleMLP([])


# ---- make_ensemble: every Q-network's ensemble is K ordinary networks --------------------------------

SEEDS = [7, 8, 9]
N_ACTIONS = 4
MODELS = {
    "mlp": (functools.partial(MLP, hidden=(16, 8)), (2, 3)),
    "dueling": (functools.partial(DuelingQNet, hidden=(16, 8)), (2, 3)),
    "noisy": (functools.partial(NoisyQNet, hidden=(16, 8)), (2, 3)),
    "atari_cnn": (functools.partial(AtariCNN, in_channels=2), (2, 84, 84)),
}


def single_nets(factory, obs_shape) -> list[nn.Module]:
    """What each single-seed run builds: make_net right after seeding."""
    nets = []
    for s in SEEDS:
        torch.manual_seed(s)
        nets.append(make_net(factory, math.prod(obs_shape), N_ACTIONS))
    return nets


def observations(obs_shape, n: int, gen: torch.Generator) -> torch.Tensor:
    if len(obs_shape) == 3:  # frames: uint8, scaled inside the network
        return torch.randint(0, 256, (len(SEEDS), n, *obs_shape), generator=gen, dtype=torch.uint8)
    return torch.randn(len(SEEDS), n, *obs_shape, generator=gen)


def grads_as_state(ensemble, i: int) -> dict[str, torch.Tensor]:
    """Member i's gradients named and shaped as the ordinary network's state_dict."""
    shadow = copy.deepcopy(ensemble)
    for p, q in zip(shadow.parameters(), ensemble.parameters()):
        p.data = q.grad.clone() if q.grad is not None else torch.zeros_like(q)
    return shadow.member_state_dict(i)


@pytest.fixture(params=list(MODELS))
def model(request):
    return MODELS[request.param]


def test_make_ensemble_members_start_as_the_single_seed_runs_and_the_rng_is_left_alone(model):
    factory, obs_shape = model
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    ensemble = make_ensemble(factory, SEEDS, obs_shape, N_ACTIONS)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert ensemble.n_members == len(SEEDS)
    for i, net in enumerate(single_nets(factory, obs_shape)):
        state = ensemble.member_state_dict(i)
        assert state.keys() == net.state_dict().keys()
        assert all(torch.equal(state[k], v) for k, v in net.state_dict().items())


def test_make_ensemble_leaves_the_accelerators_generators_alone(monkeypatch):
    """Members are built on the CPU: seeding them must not reseed CUDA's generators (torch.manual_seed
    does, and fork_rng(devices=[]) would not restore them: a GPU run's CUDA stream ended seeded to seeds[-1])."""
    reseeded = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: reseeded.append(seed))
    monkeypatch.setattr(torch.cuda, "manual_seed", lambda seed: reseeded.append(seed))
    make_ensemble(*MODELS["mlp"], SEEDS, N_ACTIONS)
    assert reseeded == []
    if torch.cuda.is_available():
        monkeypatch.undo()
        before = torch.cuda.get_rng_state()
        make_ensemble(*MODELS["mlp"], SEEDS, N_ACTIONS)
        assert torch.equal(torch.cuda.get_rng_state(), before)


@pytest.mark.parametrize("train", [True, False])
def test_member_outputs_equal_the_single_networks(model, train):
    factory, obs_shape = model
    ensemble, nets = make_ensemble(factory, SEEDS, obs_shape, N_ACTIONS), single_nets(factory, obs_shape)
    ensemble.train(train)
    x = observations(obs_shape, 5, torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = ensemble(x)
        assert out.shape == (len(SEEDS), 5, N_ACTIONS)
        for i, net in enumerate(nets):
            net.train(train)
            assert torch.allclose(out[i], net(x[i]), atol=1e-6)


def test_member_state_dict_loads_into_the_plain_net_and_round_trips(model, tmp_path):
    factory, obs_shape = model
    ensemble = make_ensemble(factory, SEEDS, obs_shape, N_ACTIONS)
    x = observations(obs_shape, 5, torch.Generator().manual_seed(1))
    for i in range(len(SEEDS)):
        torch.save(ensemble.member_state_dict(i), tmp_path / "model.pt")
        plain = make_net(factory, math.prod(obs_shape), N_ACTIONS).eval()
        plain.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))  # strict
        with torch.no_grad():
            assert torch.allclose(plain(x[i]), ensemble.eval()(x)[i], atol=1e-6)
    other = make_ensemble(factory, [0, 1, 2], obs_shape, N_ACTIONS)
    other.load_member_state_dict(0, ensemble.member_state_dict(2))
    for k, v in ensemble.member_state_dict(2).items():
        assert torch.equal(other.member_state_dict(0)[k], v)
    assert not torch.equal(other.member_state_dict(1)[k], v)  # only member 0 was overwritten
    with pytest.raises(ValueError, match="no place for"):
        other.load_member_state_dict(0, {**ensemble.member_state_dict(2), "extra.weight": v})


def test_every_tensor_has_the_member_axis_first_and_none_is_shared(model):
    factory, obs_shape = model
    ensemble = make_ensemble(factory, SEEDS, obs_shape, N_ACTIONS)
    tensors = [*ensemble.parameters(), *ensemble.buffers()]
    assert all(t.shape[0] == len(SEEDS) for t in tensors)
    assert len({t.data_ptr() for t in tensors}) == len(tensors)


def test_gradients_are_per_member(model):
    factory, obs_shape = model
    ensemble, nets = make_ensemble(factory, SEEDS, obs_shape, N_ACTIONS), single_nets(factory, obs_shape)
    x = observations(obs_shape, 6, torch.Generator().manual_seed(2))
    j = 1
    ensemble(x)[j].square().mean().backward()  # only member j's loss
    for p in ensemble.parameters():
        others = torch.cat([p.grad[:j].flatten(), p.grad[j + 1 :].flatten()])
        assert torch.count_nonzero(others) == 0
    nets[j](x[j]).square().mean().backward()
    expected = {name: p.grad for name, p in nets[j].named_parameters()}
    got = grads_as_state(ensemble, j)
    assert any(g.abs().sum() > 0 for g in expected.values())
    for name, g in expected.items():
        assert torch.allclose(got[name], g, atol=1e-6), name


def test_one_adam_with_per_member_clipping_is_k_independent_runs(model):
    factory, obs_shape = model
    ensemble, nets = make_ensemble(factory, SEEDS, obs_shape, N_ACTIONS), single_nets(factory, obs_shape)
    # eps well above float rounding: with eps=1e-8 Adam turns a gradient that is 1e-8 either side of zero
    # (rounding in the conv, different in the batched and the plain kernel) into a full +-lr step.
    stacked = torch.optim.Adam(ensemble.parameters(), lr=1e-2, eps=1e-3)
    separate = [torch.optim.Adam(net.parameters(), lr=1e-2, eps=1e-3) for net in nets]
    gen = torch.Generator().manual_seed(3)
    for _ in range(4):
        x = observations(obs_shape, 6, gen)
        y = torch.randn(len(SEEDS), 6, N_ACTIONS, generator=gen) * 10  # large errors: clipping bites
        stacked.zero_grad()
        ((ensemble(x) - y) ** 2).mean(dim=(1, 2)).sum().backward()
        clip_grad_norm_per_member_(list(ensemble.parameters()), max_norm=1.0)
        stacked.step()
        for i, (net, opt) in enumerate(zip(nets, separate)):
            opt.zero_grad()
            ((net(x[i]) - y[i]) ** 2).mean().backward()
            nn.utils.clip_grad_norm_(net.parameters(), max_norm=1.0)
            opt.step()
    for i, net in enumerate(nets):
        for name, value in net.state_dict().items():
            assert torch.allclose(ensemble.member_state_dict(i)[name], value, atol=1e-5), (i, name)


def test_keep_members_keeps_the_right_members_and_their_optimizer_state(model):
    factory, obs_shape = model
    full, kept = (make_ensemble(factory, SEEDS, obs_shape, N_ACTIONS) for _ in range(2))
    opt_full, opt_kept = (
        torch.optim.Adam(full.parameters(), lr=1e-2),
        torch.optim.Adam(kept.parameters(), lr=1e-2),
    )
    gen = torch.Generator().manual_seed(4)
    for _ in range(3):
        x = observations(obs_shape, 4, gen)
        step(full, opt_full, x)
        step(kept, opt_kept, x)
    keep = torch.tensor([2, 0])
    pairs = kept.keep_members_(keep)
    keep_optimizer_members_(opt_kept, pairs, keep, n_before=len(SEEDS))
    assert kept.n_members == 2
    assert all(t.shape[0] == 2 for t in [*kept.parameters(), *kept.buffers()])
    assert all(p in opt_kept.state for p in kept.parameters())
    for _ in range(3):
        x = observations(obs_shape, 4, gen)
        step(full, opt_full, x)
        step(kept, opt_kept, x[keep])
    for slot, member in enumerate(keep.tolist()):
        for name, value in full.member_state_dict(member).items():
            assert torch.allclose(kept.member_state_dict(slot)[name], value, atol=1e-6), (slot, name)


def test_noisy_members_draw_their_own_noise_as_the_single_net_would():
    factory, obs_shape = MODELS["noisy"]
    ensemble, nets = make_ensemble(factory, SEEDS, obs_shape, N_ACTIONS), single_nets(factory, obs_shape)
    ensemble.reset_noise([torch.Generator().manual_seed(s) for s in (0, 1, 0)])
    for i, s in enumerate((0, 1, 0)):
        nets[i].reset_noise(torch.Generator().manual_seed(s))
        for name, value in nets[i].state_dict().items():
            if "eps" in name:
                assert torch.equal(ensemble.member_state_dict(i)[name], value), (i, name)
    eps = ensemble.layers[0].eps_in
    assert torch.equal(eps[0], eps[2]) and not torch.equal(eps[0], eps[1])  # each member its own stream
    ensemble.reset_noise()  # from the global RNG: still one draw per member
    assert not torch.equal(ensemble.layers[0].eps_in[0], ensemble.layers[0].eps_in[2])
    with pytest.raises(ValueError, match="2 generators for 3 members"):
        ensemble.reset_noise([torch.Generator(), torch.Generator()])


def test_noisy_eval_is_deterministic_and_train_is_not():
    factory, obs_shape = MODELS["noisy"]
    ensemble = make_ensemble(factory, SEEDS, obs_shape, N_ACTIONS)
    x = observations(obs_shape, 5, torch.Generator().manual_seed(5))
    with torch.no_grad():
        ensemble.eval()
        greedy = ensemble(x)
        ensemble.reset_noise()
        assert torch.equal(ensemble(x), greedy)
        ensemble.train()
        noisy = ensemble(x)
        assert not torch.allclose(noisy, greedy)
        ensemble.reset_noise()
        assert not torch.allclose(ensemble(x), noisy)


def test_make_ensemble_needs_a_seed():
    # (Modules without a hand-written ensemble are stacked generically: tests/nets/test_stacked.py.)
    with pytest.raises(ValueError, match="^an ensemble needs at least one seed$"):
        make_ensemble(MODELS["mlp"][0], [], (3,), N_ACTIONS)


def test_atari_cnn_ensemble_checks_the_frame_shape():
    with pytest.raises(ValueError, match=r"AtariCNN takes frames shaped \(in_channels=4, 84, 84\)"):
        make_ensemble(AtariCNN, SEEDS, (3, 84, 84), N_ACTIONS)
    with pytest.raises(ValueError, match=r"AtariCNN takes frames shaped \(in_channels=4, 84, 84\)"):
        make_ensemble(AtariCNN, SEEDS[:1], (3, 84, 84), N_ACTIONS)  # one member


def test_a_state_dict_of_another_model_is_refused():
    mlp, dueling = (make_ensemble(MODELS[m][0], SEEDS, (2, 3), N_ACTIONS) for m in ("mlp", "dueling"))
    with pytest.raises(
        ValueError, match=r"^EnsembleMLP has no place for \['advantage\.bias', 'advantage\.weight'"
    ):
        mlp.load_member_state_dict(0, dueling.member_state_dict(0))
    with pytest.raises(KeyError, match="lacks 'bias'"):
        mlp.load_member_state_dict(
            0, {k: v for k, v in mlp.member_state_dict(0).items() if k != "net.0.bias"}
        )


# ---- the stacked layers on their own, and the edges of the ensembles ---------------------------------


def test_an_ensemble_of_one_member_is_that_member(model):
    factory, obs_shape = model
    ensemble, (net,) = (
        make_ensemble(factory, SEEDS[:1], obs_shape, N_ACTIONS),
        single_nets(factory, obs_shape)[:1],
    )
    x = observations(obs_shape, 3, torch.Generator().manual_seed(6))[:1]
    with torch.no_grad():
        assert torch.allclose(ensemble.eval()(x)[0], net.eval()(x[0]), atol=1e-6)
    if isinstance(ensemble, EnsembleMLP):
        assert (ensemble.in_features, ensemble.out_features) == (6, N_ACTIONS)


def test_ensemble_mlp_sizes_are_the_members_first_input_and_last_output():
    ensemble = EnsembleMLP(members(hidden=(16, 8)))
    assert (ensemble.in_features, ensemble.out_features, ensemble.n_members) == (5, 3, K)


def test_linear_layers_without_bias_stack():
    torch.manual_seed(0)
    nets = [nn.Sequential(nn.Linear(5, 8, bias=False), nn.ReLU(), nn.Linear(8, 3)) for _ in range(K)]
    ensemble = EnsembleMLP(nets)
    assert ensemble.net[0].bias is None
    x = torch.randn(K, N, 5)
    for k, net in enumerate(nets):
        assert torch.allclose(ensemble(x)[k], net(x[k]), atol=1e-6)
        assert ensemble.member_state_dict(k).keys() == {f"net.{name}" for name in net.state_dict()}


def test_a_new_ensemble_linear_is_initialised_as_nn_linear_member_by_member():
    torch.manual_seed(0)
    layer = EnsembleLinear(3, 16, 64)  # with a bias, initialised, unless asked otherwise
    bound = 1 / 16**0.5
    assert layer.weight.shape == (3, 16, 64) and layer.bias.shape == (3, 1, 64)
    for t in (layer.weight, layer.bias):
        assert t.abs().max() <= bound and t.min() < -bound / 2 and t.max() > bound / 2
    one_input = EnsembleLinear(2, 1, 64)  # bound 1/sqrt(1) = 1
    assert (
        one_input.weight.abs().max() <= 1 and one_input.weight.min() < -0.5 and one_input.weight.max() > 0.5
    )
    no_inputs = EnsembleLinear(2, 0, 3)  # as nn.Linear(0, 3): bound 0, a zero bias
    assert torch.equal(no_inputs.bias.detach(), torch.zeros(2, 1, 3))
    assert torch.equal(no_inputs(torch.zeros(2, 4, 0)), torch.zeros(2, 4, 3))


def test_noisy_ensembles_keep_the_members_sigma0():
    ensemble = make_ensemble(functools.partial(NoisyQNet, hidden=(8,), sigma0=0.2), SEEDS, (3,), N_ACTIONS)
    assert [layer.sigma0 for layer in ensemble.layers] == [0.2, 0.2]
    assert "sigma0=0.2" in repr(ensemble)
    assert EnsembleNoisyLinear(2, 3, 4).sigma0 == 0.5  # NoisyLinear's default


def _conv_members(**kwargs) -> list[nn.Conv2d]:
    torch.manual_seed(0)
    return [nn.Conv2d(2, 4, kernel_size=3, stride=2, **kwargs) for _ in range(2)]


@pytest.mark.parametrize("bias", [True, False])
def test_stacked_convolutions_are_the_members_convolutions(bias):
    convs = _conv_members(bias=bias)
    stacked = EnsembleConv2d(2, convs[0])
    for i, conv in enumerate(convs):
        stacked.load_member(i, conv.state_dict())
    x = torch.randn(2, 3, 2, 9, 9)
    out = stacked(x)
    assert out.shape == (2, 3, 4, 4, 4)
    for i, conv in enumerate(convs):
        assert torch.allclose(out[i], conv(x[i]), atol=1e-6)
        assert stacked.member_state(i).keys() == conv.state_dict().keys()
    assert "n_members=2, weight=(4, 2, 3, 3), stride=(2, 2)" in repr(stacked)


@pytest.mark.parametrize(
    "kwargs", [{"groups": 2}, {"dilation": 2}, {"padding": 1}, {"padding_mode": "reflect", "padding": 1}]
)
def test_convolutions_the_stack_would_run_wrongly_are_refused(kwargs):
    (conv, _) = _conv_members(**kwargs)
    with pytest.raises(ValueError, match=r"^EnsembleConv2d stacks plain convolutions .*; got Conv2d\(2, 4"):
        EnsembleConv2d(2, conv)


@pytest.mark.parametrize("kind", ["dueling", "atari_cnn"])
def test_a_member_with_a_layer_the_stack_cannot_run_is_refused_by_name(kind):
    factory, obs_shape = MODELS[kind]
    nets = single_nets(factory, obs_shape)[:1]
    seq = nets[0].trunk if kind == "dueling" else nets[0].head
    seq.append(nn.LayerNorm(seq[-1].out_features if kind == "atari_cnn" else 8))
    owner = {"dueling": EnsembleDuelingQNet, "atari_cnn": EnsembleAtariCNN}[kind]
    with pytest.raises(ValueError, match=rf"^{owner.__name__} stacks Linear layers .*; got LayerNorm\."):
        owner(nets)


def test_shrinking_keeps_frozen_layers_frozen():
    ensemble = EnsembleMLP(members())
    ensemble.net[0].requires_grad_(False)
    ensemble.keep_members_(torch.tensor([1]))
    assert [p.requires_grad for p in ensemble.parameters()] == [False, False, True, True, True, True]


def test_shrinking_before_any_step_and_an_optimizer_over_part_of_the_net():
    """Parameters the optimizer holds no state for (yet), or does not hold at all, are passed over."""

    def optimizer(net):
        # Only the last layer is trained; the group of an outside parameter (no gradient, so no state) stays.
        head = list(net.net[4].parameters())
        return torch.optim.Adam([{"params": head}, {"params": [nn.Parameter(torch.ones(3))]}], lr=1e-2)

    keep = torch.tensor([2, 0])
    fresh = EnsembleMLP(members())
    fresh_opt = optimizer(fresh)
    outside = fresh_opt.param_groups[1]["params"][0]
    keep_optimizer_members_(fresh_opt, fresh.keep_members_(keep), keep, n_before=K)  # no state at all yet
    assert fresh_opt.param_groups[0]["params"] == list(fresh.net[4].parameters())
    assert fresh_opt.param_groups[1]["params"][0] is outside
    full, kept = EnsembleMLP(members()), EnsembleMLP(members())
    shrink_midway(full, kept, optimizer(full), optimizer(kept), keep, steps=3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_an_ensemble_on_the_accelerator_shrinks_with_a_cpu_index():
    ensemble = EnsembleMLP(members()).cuda()
    opt = torch.optim.Adam(ensemble.parameters(), lr=1e-2)
    step(ensemble, opt, torch.randn(K, N, 5, device="cuda"))
    before = ensemble.member_state_dict(2)
    keep = torch.tensor([2, 0])
    keep_optimizer_members_(opt, ensemble.keep_members_(keep), keep, n_before=K)
    assert all(torch.equal(ensemble.member_state_dict(0)[k], v) for k, v in before.items())
    assert all(v.shape[0] == 2 for p in ensemble.parameters() for v in opt.state[p].values() if v.dim() > 0)


@pytest.mark.parametrize("n_members, rows", [(4, 256), (2, 100)])  # over and under the narrow form's row threshold
@pytest.mark.parametrize("out_features", [1, 2, 8, 9])
@pytest.mark.parametrize("bias", [True, False])
def test_ensemble_linear_equals_float64_linears_in_both_forms(n_members, rows, out_features, bias):
    """Outputs and all three gradients within float32's rounding of a float64 recomputation, member by member.

    Bounds: a sum of n float32 products is within about n * eps * sum|terms| of the exact value.
    """
    gen = torch.Generator().manual_seed(out_features)
    layer = EnsembleLinear(n_members, 64, out_features, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen))
        if bias:
            layer.bias.copy_(torch.randn(layer.bias.shape, generator=gen))
    x = torch.randn(n_members, rows, 64, generator=gen, requires_grad=True)
    g = torch.randn(n_members, rows, out_features, generator=gen)
    y = layer(x)
    y.backward(g)
    eps = torch.finfo(torch.float32).eps
    x64, w64, g64 = x.detach().double(), layer.weight.detach().double(), g.double()
    want = x64 @ w64 + (layer.bias.detach().double() if bias else 0)
    assert (y.double() - want).abs().le(64 * eps * (x64.abs() @ w64.abs() + 1) + 1e-30).all()
    want_gx = g64 @ w64.transpose(1, 2)
    assert (x.grad.double() - want_gx).abs().le(out_features * eps * (g64.abs() @ w64.abs().transpose(1, 2)) + 1e-30).all()
    want_gw = x64.transpose(1, 2) @ g64
    assert (layer.weight.grad.double() - want_gw).abs().le(rows * eps * (x64.abs().transpose(1, 2) @ g64.abs()) + 1e-30).all()
    if bias:
        assert (layer.bias.grad.double() - g64.sum(1, keepdim=True)).abs().le(rows * eps * g64.abs().sum(1, keepdim=True)).all()


@pytest.mark.parametrize("out_features", [1, 3])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("x_grad", [True, False])
def test_the_narrow_form_passes_gradcheck(out_features, bias, x_grad):
    from pipeline.nets.ensemble import _NarrowLinear

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 4, dtype=torch.float64, generator=gen, requires_grad=x_grad)
    w = torch.randn(3, 4, out_features, dtype=torch.float64, generator=gen, requires_grad=True)
    b = torch.randn(3, 1, out_features, dtype=torch.float64, generator=gen, requires_grad=True) if bias else None
    assert torch.autograd.gradcheck(_NarrowLinear.apply, (x, w, b))


@pytest.mark.parametrize(
    ("factory", "fused"),
    [
        (functools.partial(torch.optim.Adam, lr=1e-3), True),  # torch's default (a loop on CPU) becomes fused
        (functools.partial(torch.optim.AdamW, lr=1e-3, fused=None), True),
        (functools.partial(torch.optim.Adam, lr=1e-3, fused=False), False),  # an explicit choice is kept
        (functools.partial(torch.optim.Adam, lr=1e-3, foreach=True), None),
    ],
    ids=["adam-default", "adamw-null", "adam-false", "adam-foreach"],
)
def test_adam_over_stacked_weights_is_fused_unless_told_otherwise(factory, fused):
    from pipeline.nets.ensemble import stacked_optimizer

    net = make_ensemble(functools.partial(MLP, hidden=(4,)), [0, 1], (3,), 2)
    opt = stacked_optimizer(factory, net.parameters())
    assert type(opt) is factory.func
    assert opt.param_groups[0]["fused"] is fused
    assert opt.param_groups[0]["lr"] == 1e-3
    sgd = stacked_optimizer(functools.partial(torch.optim.SGD, lr=0.1), net.parameters())
    assert "fused" not in sgd.defaults or sgd.defaults["fused"] is None

"""The actor-critic: shapes, CleanRL's orthogonal initialisation, separate or shared torso, its ensemble form
(member i is the ordinary network of seed i: same outputs, same gradients), and the policy distributions
against torch.distributions."""

import functools
import math

import pytest
import torch
from torch import distributions as D

from pipeline.nets.actor_critic import (
    ActorCritic,
    LogStd,
    categorical_entropy,
    categorical_log_prob,
    categorical_log_prob_and_entropy,
    categorical_sample,
    gaussian_entropy,
    gaussian_log_prob,
    gaussian_sample,
    orthogonal_linear,
)
from pipeline.nets.ensemble import EnsembleActorCritic, make_ensemble


def linears(seq):
    return [m for m in seq if isinstance(m, torch.nn.Linear)]


def assert_orthogonal(layer: torch.nn.Linear, gain: float):
    """Rows (or columns, whichever are fewer) orthonormal up to `gain`, bias zero."""
    w = layer.weight.detach().double()
    gram = w @ w.t() if w.shape[0] <= w.shape[1] else w.t() @ w
    assert torch.allclose(gram, gain**2 * torch.eye(gram.shape[0], dtype=torch.float64), atol=1e-5 * max(gain**2, 1e-3))
    assert torch.equal(layer.bias, torch.zeros_like(layer.bias))


@pytest.mark.parametrize("shared", [False, True])
def test_shapes_and_cleanrls_orthogonal_gains(shared):
    torch.manual_seed(0)
    net = ActorCritic(4, 2, hidden=(64, 64), shared_torso=shared)
    logits, value = net(torch.randn(7, 4))
    assert logits.shape == (7, 2) and value.shape == (7,) and net.log_std is None
    hidden = linears(net.torso) if shared else linears(net.actor)[:-1] + linears(net.critic)[:-1]
    assert len(hidden) == (2 if shared else 4)
    for layer in hidden:
        assert_orthogonal(layer, math.sqrt(2))
    assert_orthogonal(linears(net.actor)[-1], 0.01)
    assert_orthogonal(linears(net.critic)[-1], 1.0)
    assert all(isinstance(m, torch.nn.Tanh) for m in (net.torso if shared else net.actor) if not isinstance(m, torch.nn.Linear))
    # Separate torsos: the actor's parameters do not move the value, and the other way round.
    if not shared:
        assert not set(map(id, net.actor.parameters())) & set(map(id, net.critic.parameters()))


def test_a_shared_torso_feeds_both_heads():
    torch.manual_seed(1)
    net = ActorCritic(3, 2, hidden=(8,), shared_torso=True)
    x = torch.randn(5, 3)
    _, value = net(x)
    value.sum().backward()
    assert net.torso[0].weight.grad.abs().sum() > 0 and net.actor[0].weight.grad is None
    with pytest.raises(ValueError, match="shared_torso=true needs at least one hidden layer"):
        ActorCritic(3, 2, hidden=(), shared_torso=True)


def test_a_continuous_policy_has_a_state_independent_log_std():
    net = ActorCritic(3, 2, continuous=True, log_std_init=-0.5)
    mean, value = net(torch.randn(6, 3))
    assert mean.shape == (6, 2) and value.shape == (6,)
    assert net.log_std.value.tolist() == [-0.5, -0.5] and net.log_std.value.requires_grad
    assert "log_std.value" in net.state_dict()


def test_orthogonal_linear_for_wide_and_tall_layers():
    torch.manual_seed(2)
    assert_orthogonal(orthogonal_linear(3, 16, 2.0), 2.0)
    assert_orthogonal(orthogonal_linear(16, 3, 0.5), 0.5)


@pytest.mark.parametrize("continuous", [False, True])
@pytest.mark.parametrize("shared", [False, True])
def test_the_ensemble_is_k_seeded_networks_same_outputs_and_gradients(continuous, shared):
    factory = functools.partial(ActorCritic, continuous=continuous, hidden=(16, 8), shared_torso=shared, log_std_init=0.3)
    seeds = [5, 6, 7]
    ens = make_ensemble(factory, seeds, (3,), 2)
    assert isinstance(ens, EnsembleActorCritic) and ens.n_members == 3
    singles = []
    for s in seeds:
        torch.manual_seed(s)
        singles.append(factory(in_features=3, out_features=2))
    x = torch.randn(3, 10, 3)
    out, value = ens(x)
    assert out.shape == (3, 10, 2) and value.shape == (3, 10)
    loss = (out**2).mean((1, 2)) + value.pow(2).mean(1)
    if continuous:
        assert ens.log_std.value.shape == (3, 1, 2)
        loss = loss + ens.log_std.value.pow(2).sum((1, 2))
    loss.sum().backward()
    for k, single in enumerate(singles):
        assert {n: t.shape for n, t in ens.member_state_dict(k).items()} == {n: t.shape for n, t in single.state_dict().items()}
        for name, t in single.state_dict().items():
            assert torch.equal(ens.member_state_dict(k)[name], t), name
        o, v = single(x[k])
        assert torch.allclose(out[k], o, atol=1e-6) and torch.allclose(value[k], v, atol=1e-6)
        single_loss = (o**2).mean() + v.pow(2).mean()
        if continuous:
            single_loss = single_loss + single.log_std.value.pow(2).sum()
        single_loss.backward()
        last_actor = linears(single.actor)[-1]
        ens_actor = [m for m in ens.actor if hasattr(m, "weight")][-1]
        assert torch.allclose(ens_actor.weight.grad[k], last_actor.weight.grad.t(), atol=1e-6)
        if continuous:
            assert torch.allclose(ens.log_std.value.grad[k, 0], single.log_std.value.grad, atol=1e-6)


def test_an_ensemble_member_loads_back_into_the_ordinary_network():
    factory = functools.partial(ActorCritic, continuous=True, hidden=(8,))
    ens = make_ensemble(factory, [0, 1], (4,), 1)
    with torch.no_grad():
        ens.log_std.value.fill_(-1.25)
    single = factory(in_features=4, out_features=1)
    single.load_state_dict(ens.member_state_dict(1))
    assert single.log_std.value.item() == -1.25
    fresh = make_ensemble(factory, [9, 9], (4,), 1)
    fresh.load_member_state_dict(0, single.state_dict())
    x = torch.randn(1, 5, 4).expand(2, 5, 4)
    (mean_fresh, value_fresh), (mean, value) = fresh(x), ens(x)
    assert torch.allclose(mean_fresh[0], mean[1], atol=1e-6) and torch.allclose(value_fresh[0], value[1], atol=1e-6)
    assert not torch.allclose(mean_fresh[1], mean[1], atol=1e-6)  # member 1 of `fresh` was not loaded


def test_categorical_functions_are_torch_distributions():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 4, generator=g, dtype=torch.float64) * 3
    actions = torch.randint(0, 4, (3, 5), generator=g)
    dist = D.Categorical(logits=logits)
    assert torch.allclose(categorical_log_prob(logits, actions), dist.log_prob(actions), atol=1e-12)
    assert torch.allclose(categorical_entropy(logits), dist.entropy(), atol=1e-12)
    log_prob, entropy = categorical_log_prob_and_entropy(logits, actions)
    assert torch.allclose(log_prob, dist.log_prob(actions), atol=1e-12)
    assert torch.allclose(entropy, dist.entropy(), atol=1e-12)


def test_the_joint_log_prob_and_entropy_have_the_distributions_gradients():
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(2, 6, 3, generator=g, dtype=torch.float64) * 2).requires_grad_()
    actions = torch.randint(0, 3, (2, 6), generator=g)
    w_lp, w_ent = torch.randn(2, 6, generator=g, dtype=torch.float64), torch.randn(2, 6, generator=g, dtype=torch.float64)
    log_prob, entropy = categorical_log_prob_and_entropy(logits, actions)
    (grad,) = torch.autograd.grad((w_lp * log_prob + w_ent * entropy).sum(), logits)
    ref_logits = logits.detach().clone().requires_grad_()
    dist = D.Categorical(logits=ref_logits)
    (ref,) = torch.autograd.grad((w_lp * dist.log_prob(actions) + w_ent * dist.entropy()).sum(), ref_logits)
    assert torch.allclose(grad, ref, atol=1e-12)


def test_categorical_samples_follow_the_softmax():
    logits = torch.tensor([[0.0, 1.0, -1.0, 2.0]], dtype=torch.float64).expand(200_000, 4)
    draws = categorical_sample(logits, torch.Generator().manual_seed(1))
    freq = torch.bincount(draws, minlength=4).double() / draws.numel()
    p = torch.softmax(logits[0], 0)
    # 5 standard errors of a frequency from 200k draws.
    assert torch.all((freq - p).abs() < 5 * torch.sqrt(p * (1 - p) / draws.numel()))
    again = categorical_sample(logits[:10], torch.Generator().manual_seed(1))
    assert torch.equal(again, draws[:10])


def test_gaussian_functions_are_torch_distributions():
    g = torch.Generator().manual_seed(2)
    mean = torch.randn(3, 6, 2, generator=g, dtype=torch.float64)
    log_std = torch.tensor([[[-0.7, 0.4]]], dtype=torch.float64).expand(3, 1, 2)
    actions = torch.randn(3, 6, 2, generator=g, dtype=torch.float64) * 2
    dist = D.Independent(D.Normal(mean, log_std.exp()), 1)
    assert torch.allclose(gaussian_log_prob(mean, log_std, actions), dist.log_prob(actions), atol=1e-12)
    assert torch.allclose(gaussian_entropy(mean, log_std), dist.entropy(), atol=1e-12)
    assert gaussian_entropy(mean, log_std).shape == (3, 6)


def test_gaussian_samples_have_the_mean_and_std_asked_for():
    mean = torch.tensor([[1.0, -2.0]], dtype=torch.float64).expand(100_000, 2)
    log_std = torch.log(torch.tensor([0.5, 3.0], dtype=torch.float64))
    draws = gaussian_sample(mean, log_std, torch.Generator().manual_seed(3))
    n = draws.shape[0]
    assert torch.all((draws.mean(0) - mean[0]).abs() < 5 * log_std.exp() / math.sqrt(n))
    # The sample std's standard error is about std / sqrt(2n).
    assert torch.all((draws.std(0) - log_std.exp()).abs() < 5 * log_std.exp() / math.sqrt(2 * n))


def test_a_sample_beyond_the_bounds_keeps_its_own_log_probability():
    """The policy's density is of the unclipped sample: clipping to the action bounds is for the env only."""
    mean, log_std = torch.zeros(1, 1), torch.zeros(1)
    far = torch.tensor([[3.0]])
    assert gaussian_log_prob(mean, log_std, far).item() == pytest.approx(-4.5 - 0.5 * math.log(2 * math.pi), abs=1e-6)
    assert gaussian_log_prob(mean, log_std, far) < gaussian_log_prob(mean, log_std, far.clamp(-2, 2))


# ---- pinned from the outside: CleanRL's defaults, the reparameterised draws, any leading axes ------------


def test_defaults_are_cleanrls_separate_torsos_and_a_log_std_of_zero():
    net = ActorCritic(3, 2, continuous=True)
    assert net.shared_torso is False and len(net.torso) == 0  # separate actor and critic torsos
    assert torch.equal(net.log_std.value.detach(), torch.zeros(2))
    assert ActorCritic(3, 2, shared_torso=True).shared_torso is True
    assert torch.equal(LogStd(3).value.detach(), torch.zeros(3))


def test_no_hidden_layers_gives_linear_heads_on_the_observation():
    net = ActorCritic(5, 2, hidden=())
    assert [tuple(m.weight.shape) for m in linears(net.actor)] == [(2, 5)]
    assert [tuple(m.weight.shape) for m in linears(net.critic)] == [(1, 5)]
    logits, value = net(torch.randn(4, 5))
    assert logits.shape == (4, 2) and value.shape == (4,)
    with pytest.raises(ValueError, match=r"^model\.shared_torso=true needs at least one hidden layer \(model\.hidden\)$"):
        ActorCritic(5, 2, hidden=(), shared_torso=True)


@pytest.mark.parametrize("shared", [False, True])
def test_observations_with_more_axes_are_flattened_per_sample(shared):
    net = ActorCritic(12, 3, hidden=(8,), shared_torso=shared)
    obs = torch.randn(4, 3, 4)
    logits, value = net(obs)
    flat_logits, flat_value = net(obs.reshape(4, 12))
    assert torch.equal(logits, flat_logits) and torch.equal(value, flat_value)
    assert net(torch.randn(2, 3, 2, 2))[0].shape == (2, 3)


def test_categorical_samples_over_leading_axes_pick_along_the_last():
    logits = torch.zeros(2, 5, 3)
    best = torch.tensor([[0, 1, 2, 1, 0], [2, 2, 0, 1, 1]])
    logits.scatter_(-1, best.unsqueeze(-1), 1e4)  # one action certain per (agent, env)
    assert torch.equal(categorical_sample(logits, torch.Generator().manual_seed(0)), best)


def test_categorical_draws_come_from_the_given_generator():
    logits = torch.zeros(3, 1000, 4, dtype=torch.float64)
    a = categorical_sample(logits, torch.Generator().manual_seed(5))
    assert torch.equal(a, categorical_sample(logits, torch.Generator().manual_seed(5)))
    assert not torch.equal(a, categorical_sample(logits, torch.Generator().manual_seed(6)))
    # Gumbel-max over the generator's next uniforms, drawn in the logits' dtype.
    u = torch.rand(logits.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    assert torch.equal(a, (logits - torch.log(-torch.log(u))).argmax(-1))


def test_a_gaussian_sample_is_mean_plus_std_times_the_generators_next_normals():
    """The reparameterised draw: a = mean + exp(log_std) * eps, eps the generator's next standard normals in
    the mean's dtype (what makes agent i's actions its own stream's)."""
    mean = torch.tensor([[0.5, -1.0], [2.0, 0.0], [0.0, 3.0]], dtype=torch.float64)
    log_std = torch.tensor([0.0, math.log(2.0)], dtype=torch.float64)
    eps = torch.randn(mean.shape, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    drawn = gaussian_sample(mean, log_std, torch.Generator().manual_seed(11))
    assert drawn.dtype == torch.float64
    assert torch.allclose(drawn, mean + torch.tensor([1.0, 2.0], dtype=torch.float64) * eps, atol=1e-12, rtol=0)
    assert not torch.equal(drawn, gaussian_sample(mean, log_std, torch.Generator().manual_seed(12)))


def test_the_cnn_ensembles_member_i_is_the_single_cnn_with_its_weights():
    """EnsembleActorCriticCNN over K = 2 seeds: member i starts as the single net built under its seed, its state_dict
    loads strictly into ActorCriticCNN, and on the same uint8 frames both give the same logits, values and gradients."""
    from pipeline.nets.actor_critic_cnn import ActorCriticCNN, EnsembleActorCriticCNN

    seeds, n_actions = [3, 7], 6
    factory = functools.partial(ActorCriticCNN, in_channels=4)
    ens = EnsembleActorCriticCNN.from_factory(factory, seeds, (4, 84, 84), n_actions)
    frames = torch.randint(0, 256, (2, 5, 4, 84, 84), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    logits, values = ens(frames)
    assert logits.shape == (2, 5, n_actions) and values.shape == (2, 5)
    (logits.square().sum() + values.sum()).backward()
    for i, seed in enumerate(seeds):
        torch.manual_seed(seed)
        fresh = ActorCriticCNN(n_actions, in_channels=4, in_features=4 * 84 * 84)
        single = ActorCriticCNN(n_actions)
        single.load_state_dict(ens.member_state_dict(i))  # strict: the same keys and shapes
        for key, value in fresh.state_dict().items():
            assert torch.equal(value, single.state_dict()[key]), key
        one_logits, one_value = single(frames[i])
        scale = float(one_logits.abs().max() + one_value.abs().max())
        assert torch.allclose(logits[i], one_logits, rtol=1e-5, atol=1e-5 * scale)
        assert torch.allclose(values[i], one_value, rtol=1e-5, atol=1e-5 * scale)
        (one_logits.square().sum() + one_value.sum()).backward()
        first_conv, head = ens.torso[0], ens.critic[0]
        g = single.torso[0].weight.grad
        assert torch.allclose(first_conv.weight.grad[i], g, rtol=1e-4, atol=1e-4 * float(g.abs().max()))
        g = single.critic[0].weight.grad
        # EnsembleLinear keeps weights transposed ([in, out]); the single layer's are [out, in].
        assert torch.allclose(head.weight.grad[i].t(), g, rtol=1e-4, atol=1e-4 * float(g.abs().max()))
    # The two members differ (their own seeds), so the equality above is not one network compared with itself.
    assert not torch.allclose(logits[0], logits[1])


def test_the_cnn_refuses_frames_of_another_size_and_continuous_actions():
    from pipeline.nets.actor_critic_cnn import ActorCriticCNN

    with pytest.raises(ValueError, match="frames shaped"):
        ActorCriticCNN(6, in_features=4)
    with pytest.raises(ValueError, match="discrete"):
        ActorCriticCNN(2, continuous=True)

import pytest
import torch
from torch.nn import functional as F

from pipeline.nets.heads import DuelingQNet, NoisyLinear, NoisyQNet


def test_dueling_shape_and_mean_q_equals_value():
    torch.manual_seed(0)
    net = DuelingQNet(4, 3, hidden=(32, 32))
    x = torch.randn(5, 4)
    q = net(x)
    v, a = net.value_and_advantage(x)
    assert q.shape == (5, 3) and v.shape == (5, 1) and a.shape == (5, 3)
    assert torch.allclose(q.mean(dim=1, keepdim=True), v, atol=1e-6)
    # Q(s, a) = V(s) + A(s, a) - mean_a A(s, a), term by term.
    assert torch.allclose(q, v + a - a.mean(dim=1, keepdim=True), atol=1e-6)
    # Image-shaped inputs are flattened, not rejected.
    assert torch.allclose(net(x.view(5, 2, 2)), q)


def test_noisy_linear_train_output_is_the_factorised_noisy_weight():
    torch.manual_seed(0)
    layer = NoisyLinear(4, 3)
    x = torch.randn(2, 4)
    f = lambda e: e.sign() * e.abs().sqrt()  # noqa: E731  the factorised-noise transform of Fortunato et al.
    g = torch.Generator().manual_seed(5)
    layer.reset_noise(g)
    g = torch.Generator().manual_seed(5)
    eps_in, eps_out = f(torch.randn(4, generator=g)), f(torch.randn(3, generator=g))
    weight = layer.weight_mu + layer.weight_sigma * torch.outer(eps_out, eps_in)
    bias = layer.bias_mu + layer.bias_sigma * eps_out
    assert torch.allclose(layer(x), F.linear(x, weight, bias), atol=1e-6)


def test_noisy_linear_noise_in_train_mode_only():
    torch.manual_seed(0)
    layer = NoisyLinear(4, 3)
    x = torch.randn(2, 4)
    mean_only = F.linear(x, layer.weight_mu, layer.bias_mu)
    # Train mode: the output carries noise, and a new draw changes it.
    first = layer(x)
    assert not torch.allclose(first, mean_only)
    layer.reset_noise()
    assert not torch.allclose(first, layer(x))
    # Eval mode: the same new draw changes nothing, and the output is the mean weights'.
    layer.eval()
    a = layer(x)
    layer.reset_noise()
    assert torch.equal(a, layer(x))
    assert torch.allclose(a, mean_only)


def test_noisy_sigma_init_and_trainable():
    torch.manual_seed(0)
    layer = NoisyLinear(16, 64)  # sigma0 defaults to Fortunato et al.'s 0.5: sigma = 0.5 / sqrt(16)
    # One learned noise scale per weight and per bias (torch.equal: no broadcasting hides a wrong shape).
    assert torch.equal(layer.weight_sigma.detach(), torch.full((64, 16), 0.125))
    assert torch.equal(layer.bias_sigma.detach(), torch.full((64,), 0.125))
    # The mean weights are uniform on [-1/sqrt(in), 1/sqrt(in)]: inside it, and spread over both halves.
    bound = 1 / 16**0.5
    for mu in (layer.weight_mu, layer.bias_mu):
        assert mu.abs().max() <= bound and mu.min() < -bound / 2 and mu.max() > bound / 2
    names = {n for n, _ in layer.named_parameters()}
    assert names == {"weight_mu", "weight_sigma", "bias_mu", "bias_sigma"}
    assert {n for n, _ in layer.named_buffers()} == {"eps_in", "eps_out"}


def test_noisy_qnet_is_noisy_in_train_mode_and_its_mean_net_in_eval_mode():
    torch.manual_seed(0)
    net = NoisyQNet(4, 2, hidden=(32, 32))
    x = torch.randn(3, 4)
    first = net(x)
    assert first.shape == (3, 2)
    net.reset_noise()
    assert not torch.allclose(first, net(x))  # train mode: each draw gives other Q-values
    net.eval()
    evaluated = net(x)
    net.reset_noise()
    assert torch.equal(evaluated, net(x))  # eval mode: a new draw changes nothing
    h = x
    for layer in net.layers[:-1]:
        h = F.relu(F.linear(h, layer.weight_mu, layer.bias_mu))
    last = net.layers[-1]
    assert torch.allclose(evaluated, F.linear(h, last.weight_mu, last.bias_mu), atol=1e-6)


def test_noisy_qnet_reset_noise_with_a_generator_is_reproducible():
    torch.manual_seed(0)
    net = NoisyQNet(4, 2, hidden=(8,))
    x = torch.randn(3, 4)
    net.reset_noise(torch.Generator().manual_seed(1))
    a = net(x)
    net.reset_noise(torch.Generator().manual_seed(2))
    b = net(x)
    net.reset_noise(torch.Generator().manual_seed(1))
    assert torch.equal(a, net(x)) and not torch.allclose(a, b)


def test_noisy_qnet_layers_run_in_to_hidden_to_actions_with_the_given_sigma():
    net = NoisyQNet(4, 2, hidden=(8, 16), sigma0=0.2)
    assert [(layer.in_features, layer.out_features) for layer in net.layers] == [(4, 8), (8, 16), (16, 2)]
    for layer in net.layers:
        assert torch.allclose(
            layer.weight_sigma, torch.full_like(layer.weight_sigma, 0.2 / layer.in_features**0.5)
        )
    assert all(layer.sigma0 == 0.5 for layer in NoisyQNet(4, 2, hidden=(8,)).layers)


def test_image_shaped_and_unbatched_states_give_the_q_values_of_the_flat_batch():
    torch.manual_seed(0)
    x = torch.randn(5, 2, 2)
    for net in (DuelingQNet(4, 3, hidden=(8,)), NoisyQNet(4, 3, hidden=(8,))):
        batch = net(x.view(5, 4))
        assert torch.equal(net(x), batch)  # [N, 2, 2] is flattened to [N, 4]
        # One state without a batch axis gives that state's Q-values (the mean advantage over its actions).
        assert torch.allclose(net(x[1].view(4)), batch[1], atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_noise_is_drawn_on_the_layer_s_device_from_its_generator():
    layer = NoisyLinear(4, 3).cuda()
    layer.reset_noise(torch.Generator("cuda").manual_seed(5))
    g = torch.Generator("cuda").manual_seed(5)
    f = lambda e: e.sign() * e.abs().sqrt()  # noqa: E731
    assert torch.equal(layer.eps_in, f(torch.randn(4, device="cuda", generator=g)))
    assert torch.equal(layer.eps_out, f(torch.randn(3, device="cuda", generator=g)))

import torch

from pipeline.nets.heads import DuelingQNet, NoisyLinear, NoisyQNet


def test_dueling_shape_and_mean_q_equals_value():
    torch.manual_seed(0)
    net = DuelingQNet(4, 3, hidden=(32, 32))
    x = torch.randn(5, 4)
    q = net(x)
    v, _ = net.value_and_advantage(x)
    assert q.shape == (5, 3)
    assert torch.allclose(q.mean(dim=1, keepdim=True), v, atol=1e-6)


def test_noisy_linear_noise_in_train_mode_only():
    torch.manual_seed(0)
    layer = NoisyLinear(4, 3)
    x = torch.randn(2, 4)
    first = layer(x)
    layer.reset_noise()
    assert not torch.allclose(first, layer(x))
    layer.eval()
    a = layer(x)
    layer.reset_noise()
    assert torch.equal(a, layer(x))
    assert torch.allclose(a, torch.nn.functional.linear(x, layer.weight_mu, layer.bias_mu))


def test_noisy_sigma_init_and_trainable():
    layer = NoisyLinear(16, 2, sigma0=0.5)
    assert torch.allclose(layer.weight_sigma, torch.full((2, 16), 0.125))
    names = {n for n, _ in layer.named_parameters()}
    assert names == {"weight_mu", "weight_sigma", "bias_mu", "bias_sigma"}


def test_noisy_qnet_reset_noise_changes_train_outputs():
    torch.manual_seed(0)
    net = NoisyQNet(4, 2, hidden=(32, 32))
    x = torch.randn(3, 4)
    first = net(x)
    net.reset_noise()
    assert first.shape == (3, 2)
    assert not torch.allclose(first, net(x))
    net.eval()
    assert torch.equal(net(x), net(x))

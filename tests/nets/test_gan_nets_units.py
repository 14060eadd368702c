"""The GAN pairs' nets (pipeline.nets.gan): their layers as the DCGAN and PyTorch-GAN papers give them, shapes, init."""

import pytest
import torch
from torch import nn

from pipeline.nets.gan import (
    DCGAN,
    MLPGAN,
    DCGANDiscriminator,
    DCGANGenerator,
    GANPair,
    MLPDiscriminator,
    MLPGenerator,
    dcgan_init,
)


def _types(net):
    return [type(m) for m in net.net]


def test_mlp_generator_layers_batch_norm_after_all_but_the_first_and_images_of_the_given_shape():
    g = MLPGenerator(3, (2, 2), hidden=(5, 6, 7), negative_slope=0.1)
    assert _types(g) == [
        nn.Linear, nn.LeakyReLU,
        nn.Linear, nn.BatchNorm1d, nn.LeakyReLU,
        nn.Linear, nn.BatchNorm1d, nn.LeakyReLU,
        nn.Linear, nn.Tanh,
    ]
    linears = [m for m in g.net if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(3, 5), (5, 6), (6, 7), (7, 4)]
    assert [m.num_features for m in g.net if isinstance(m, nn.BatchNorm1d)] == [6, 7]
    assert all(m.negative_slope == 0.1 for m in g.net if isinstance(m, nn.LeakyReLU))
    assert g.latent_dim == 3 and g.image_shape == (1, 2, 2)
    g.eval()
    z = torch.randn(4, 3)
    x = g(z)
    assert x.shape == (4, 1, 2, 2)
    # the last layers by hand: tanh(linear(h)) viewed as images
    h = g.net[:-2](z)
    assert torch.allclose(x, torch.tanh(linears[-1](h)).view(4, 1, 2, 2))


def test_mlp_generator_defaults_and_no_batch_norm_when_switched_off():
    g = MLPGenerator("8", [3, 4, 4])
    assert [m.out_features for m in g.net if isinstance(m, nn.Linear)] == [128, 256, 512, 48]
    assert all(m.negative_slope == 0.2 for m in g.net if isinstance(m, nn.LeakyReLU))
    assert g.latent_dim == 8 and isinstance(g.latent_dim, int)
    assert g.image_shape == (3, 4, 4)
    off = MLPGenerator(2, (2, 2), hidden=(3, 3), batch_norm=False)
    assert _types(off) == [nn.Linear, nn.LeakyReLU, nn.Linear, nn.LeakyReLU, nn.Linear, nn.Tanh]


def test_mlp_discriminator_layers_dropout_and_one_logit_per_image():
    d = MLPDiscriminator((1, 2, 3), hidden=(5, 4), negative_slope=0.05, dropout=0.4)
    assert _types(d) == [nn.Linear, nn.LeakyReLU, nn.Dropout, nn.Linear, nn.LeakyReLU, nn.Dropout, nn.Linear]
    linears = [m for m in d.net if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(6, 5), (5, 4), (4, 1)]
    assert all(m.p == 0.4 for m in d.net if isinstance(m, nn.Dropout))
    assert all(m.negative_slope == 0.05 for m in d.net if isinstance(m, nn.LeakyReLU))
    d.eval()
    x = torch.randn(3, 1, 2, 3)
    assert d(x).shape == (3,)
    assert torch.allclose(d(x), d.net(x.reshape(3, 6))[:, 0])
    one = torch.randn(1, 1, 2, 3)
    assert d(one).shape == (1,)


def test_mlp_discriminator_defaults_and_no_dropout_layer_at_zero():
    d = MLPDiscriminator((2, 2))
    assert [m.out_features for m in d.net if isinstance(m, nn.Linear)] == [512, 256, 1]
    assert [m.p for m in d.net if isinstance(m, nn.Dropout)] == [0.3, 0.3]
    assert all(m.negative_slope == 0.2 for m in d.net if isinstance(m, nn.LeakyReLU))
    assert d.image_shape == (1, 2, 2)
    assert _types(MLPDiscriminator((2, 2), hidden=(3,), dropout=0.0)) == [nn.Linear, nn.LeakyReLU, nn.Linear]


@pytest.mark.parametrize("shape", [(1, 2, 2, 2), (2,), (0, 4), (1, 0, 4), (-1, 2, 2)])
def test_bad_image_shapes_are_refused_with_the_expected_forms(shape):
    with pytest.raises(ValueError, match=r"^image_shape must be \(channels, height, width\) or \(height, width\); got "):
        MLPDiscriminator(shape)


def test_dcgan_generator_layers_for_32x32_and_its_output():
    g = DCGANGenerator(5, (3, 32, 32), base_channels=4)
    assert _types(g) == [
        nn.ConvTranspose2d, nn.BatchNorm2d, nn.ReLU,
        nn.ConvTranspose2d, nn.BatchNorm2d, nn.ReLU,
        nn.ConvTranspose2d, nn.BatchNorm2d, nn.ReLU,
        nn.ConvTranspose2d, nn.Tanh,
    ]
    convs = [m for m in g.net if isinstance(m, nn.ConvTranspose2d)]
    assert [(m.in_channels, m.out_channels) for m in convs] == [(5, 16), (16, 8), (8, 4), (4, 3)]
    assert [(m.kernel_size, m.stride, m.padding) for m in convs] == [
        ((4, 4), (1, 1), (0, 0)),
        ((4, 4), (2, 2), (1, 1)),
        ((4, 4), (2, 2), (1, 1)),
        ((4, 4), (2, 2), (1, 1)),
    ]
    assert [m.bias is None for m in convs] == [True, True, True, False]
    assert [m.num_features for m in g.net if isinstance(m, nn.BatchNorm2d)] == [16, 8, 4]
    assert g.latent_dim == 5 and g.image_shape == (3, 32, 32)
    g.eval()
    z = torch.randn(2, 5)
    x = g(z)
    assert x.shape == (2, 3, 32, 32)
    assert torch.equal(x, g.net(z.reshape(2, 5, 1, 1)))
    assert x.abs().max() <= 1


def test_dcgan_generator_default_channels_and_8x8_has_one_doubling():
    g = DCGANGenerator(2, (8, 8))
    convs = [m for m in g.net if isinstance(m, nn.ConvTranspose2d)]
    assert [(m.in_channels, m.out_channels) for m in convs] == [(2, 64), (64, 1)]
    g16 = DCGANGenerator(2, (1, 16, 16), base_channels=3)
    assert [m.out_channels for m in g16.net if isinstance(m, nn.ConvTranspose2d)] == [6, 3, 1]


def test_dcgan_discriminator_layers_for_32x32_and_one_logit_per_image():
    d = DCGANDiscriminator((3, 32, 32), base_channels=4, negative_slope=0.1, dropout=0.25)
    assert _types(d) == [
        nn.Conv2d, nn.LeakyReLU,
        nn.Conv2d, nn.BatchNorm2d, nn.LeakyReLU,
        nn.Conv2d, nn.BatchNorm2d, nn.LeakyReLU,
        nn.Dropout, nn.Conv2d,
    ]
    convs = [m for m in d.net if isinstance(m, nn.Conv2d)]
    assert [(m.in_channels, m.out_channels) for m in convs] == [(3, 4), (4, 8), (8, 16), (16, 1)]
    assert [(m.kernel_size, m.stride, m.padding) for m in convs] == [
        ((4, 4), (2, 2), (1, 1)),
        ((4, 4), (2, 2), (1, 1)),
        ((4, 4), (2, 2), (1, 1)),
        ((4, 4), (1, 1), (0, 0)),
    ]
    assert [m.bias is None for m in convs] == [False, True, True, False]
    assert [m.num_features for m in d.net if isinstance(m, nn.BatchNorm2d)] == [8, 16]
    assert all(m.negative_slope == 0.1 for m in d.net if isinstance(m, nn.LeakyReLU))
    assert [m.p for m in d.net if isinstance(m, nn.Dropout)] == [0.25]
    d.eval()
    x = torch.randn(3, 3, 32, 32)
    assert d(x).shape == (3,)
    assert torch.equal(d(x), d.net(x).reshape(3))


def test_dcgan_discriminator_defaults():
    d = DCGANDiscriminator((8, 8))
    assert _types(d) == [nn.Conv2d, nn.LeakyReLU, nn.Conv2d]
    assert [m.out_channels for m in d.net if isinstance(m, nn.Conv2d)] == [64, 1]
    assert all(m.negative_slope == 0.2 for m in d.net if isinstance(m, nn.LeakyReLU))
    assert d.image_shape == (1, 8, 8)


@pytest.mark.parametrize("shape", [(1, 4, 4), (1, 12, 12), (1, 8, 16), (1, 16, 8), (1, 6, 6), (1, 2, 2), (1, 24, 24)])
def test_dcgan_needs_square_sides_of_4_times_a_power_of_two(shape):
    msg = r"^the DCGAN pair needs square images with sides 8, 16, 32, 64, \.\.\.; got "
    with pytest.raises(ValueError, match=msg):
        DCGANGenerator(2, shape)
    with pytest.raises(ValueError, match=msg):
        DCGANDiscriminator(shape)


def test_dcgan_init_draws_conv_weights_around_0_and_batch_norm_scales_around_1_with_sd_0_02():
    torch.manual_seed(0)
    g = DCGANGenerator(64, (1, 32, 32), base_channels=32)
    d = DCGANDiscriminator((1, 32, 32), base_channels=32)
    for net in (g, d):
        w = torch.cat([m.weight.flatten() for m in net.modules() if isinstance(m, nn.Conv2d | nn.ConvTranspose2d)])
        assert abs(w.mean().item()) < 0.002 and 0.019 < w.std().item() < 0.021
        bn = torch.cat([m.weight.flatten() for m in net.modules() if isinstance(m, nn.BatchNorm2d)])
        assert abs(bn.mean().item() - 1) < 0.01 and 0.01 < bn.std().item() < 0.03
        for m in net.modules():
            if isinstance(m, nn.Conv2d | nn.ConvTranspose2d | nn.BatchNorm2d) and m.bias is not None:
                assert torch.equal(m.bias, torch.zeros_like(m.bias))


def test_dcgan_init_leaves_other_layers_alone():
    lin = nn.Linear(30, 30)
    bn1 = nn.BatchNorm1d(3)
    before = lin.weight.detach().clone(), lin.bias.detach().clone()
    nn.init.constant_(bn1.weight, 5.0)
    dcgan_init(nn.Sequential(lin, bn1))
    assert torch.equal(lin.weight, before[0]) and torch.equal(lin.bias, before[1])
    assert torch.equal(bn1.weight, torch.full((3,), 5.0))


class _G(nn.Module):
    latent_dim = "3"
    image_shape = [1, 2, 2]

    def forward(self, z):
        return z[:, :1].repeat(1, 4).view(-1, 1, 2, 2)


class _D(nn.Module):
    def forward(self, x):
        return x.flatten(1).sum(1)


def test_gan_pair_children_noise_and_the_adversarial_path():
    pair = GANPair(_G(), _D())
    assert pair.latent_dim == 3 and pair.image_shape == (1, 2, 2)
    assert sorted(dict(pair.named_children())) == ["discriminator", "generator"]
    z = pair.sample_noise(5, generator=torch.Generator().manual_seed(7))
    assert z.shape == (5, 3) and z.dtype == torch.float32
    assert torch.equal(z, torch.randn(5, 3, generator=torch.Generator().manual_seed(7)))
    assert torch.equal(pair(z), 4 * z[:, 0])
    # the device is handed on (the meta device stands in for an accelerator on a CPU machine)
    assert pair.sample_noise(2, device="meta").device.type == "meta"
    assert pair.sample_noise(2, torch.device("meta")).shape == (2, 3)


def test_mlpgan_and_dcgan_hand_their_settings_to_both_nets():
    m = MLPGAN((2, 2), latent_dim=3, generator_hidden=(4, 6), discriminator_hidden=(5,), negative_slope=0.3,
               batch_norm=False, dropout=0.1)
    assert m.latent_dim == 3 and m.image_shape == (1, 2, 2)
    assert _types(m.generator) == [nn.Linear, nn.LeakyReLU, nn.Linear, nn.LeakyReLU, nn.Linear, nn.Tanh]
    assert [x.out_features for x in m.generator.net if isinstance(x, nn.Linear)] == [4, 6, 4]
    assert [x.out_features for x in m.discriminator.net if isinstance(x, nn.Linear)] == [5, 1]
    assert {x.negative_slope for x in m.modules() if isinstance(x, nn.LeakyReLU)} == {0.3}
    assert [x.p for x in m.discriminator.net if isinstance(x, nn.Dropout)] == [0.1]
    m2 = MLPGAN((2, 2), generator_hidden=(4, 4))
    assert m2.latent_dim == 64
    assert nn.BatchNorm1d in _types(m2.generator)
    assert [x.p for x in m2.discriminator.net if isinstance(x, nn.Dropout)] == [0.3, 0.3]
    assert [x.out_features for x in MLPGAN((2, 2)).discriminator.net if isinstance(x, nn.Linear)] == [512, 256, 1]
    assert [x.out_features for x in MLPGAN((2, 2)).generator.net if isinstance(x, nn.Linear)] == [128, 256, 512, 4]
    assert {x.negative_slope for x in m2.modules() if isinstance(x, nn.LeakyReLU)} == {0.2}

    d = DCGAN((16, 16), latent_dim=5, generator_channels=3, discriminator_channels=2, negative_slope=0.1, dropout=0.2)
    assert d.latent_dim == 5 and d.image_shape == (1, 16, 16)
    assert [x.out_channels for x in d.generator.net if isinstance(x, nn.ConvTranspose2d)] == [6, 3, 1]
    assert [x.out_channels for x in d.discriminator.net if isinstance(x, nn.Conv2d)] == [2, 4, 1]
    assert {x.negative_slope for x in d.discriminator.modules() if isinstance(x, nn.LeakyReLU)} == {0.1}
    assert [x.p for x in d.discriminator.net if isinstance(x, nn.Dropout)] == [0.2]
    d0 = DCGAN((8, 8))
    assert d0.latent_dim == 64
    assert [x.out_channels for x in d0.generator.net if isinstance(x, nn.ConvTranspose2d)] == [64, 1]
    assert [x.out_channels for x in d0.discriminator.net if isinstance(x, nn.Conv2d)] == [64, 1]
    assert not any(isinstance(x, nn.Dropout) for x in d0.modules())
    assert {x.negative_slope for x in d0.discriminator.modules() if isinstance(x, nn.LeakyReLU)} == {0.2}

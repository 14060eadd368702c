"""Generator / discriminator pairs for GANs: the classic MLP pair and a small DCGAN-style convolutional pair.

A pair is one `nn.Module` with `generator` and `discriminator` children, so its `state_dict` keys say which
net a weight belongs to (`generator.*`, `discriminator.*`). Generators map `(B, latent_dim)` noise to images
in [-1, 1] (Tanh); discriminators map images to `(B,)` logits, so the adversarial loss is BCE-with-logits
(or any loss on logits and 0/1 targets, e.g. least squares).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn


def _image_shape(image_shape: Sequence[int]) -> tuple[int, int, int]:
    shape = tuple(int(s) for s in image_shape)
    if len(shape) == 2:
        shape = (1, *shape)
    if len(shape) != 3 or min(shape) <= 0:
        raise ValueError(f"image_shape must be (channels, height, width) or (height, width); got {image_shape}")
    return shape


class MLPGenerator(nn.Module):
    """noise -> hidden[0] -> ... -> hidden[-1] -> image, LeakyReLU between layers, BatchNorm after all but the first.

    The first layer has no BatchNorm (as in the reference implementations): normalising the raw noise
    projection only removes its scale.
    """

    def __init__(
        self,
        latent_dim: int,
        image_shape: Sequence[int],
        hidden: Sequence[int] = (128, 256, 512),
        negative_slope: float = 0.2,
        batch_norm: bool = True,
    ):
        super().__init__()
        self.latent_dim = int(latent_dim)
        self.image_shape = _image_shape(image_shape)
        layers: list[nn.Module] = []
        width = self.latent_dim
        for i, h in enumerate(hidden):
            layers.append(nn.Linear(width, int(h)))
            if batch_norm and i > 0:
                layers.append(nn.BatchNorm1d(int(h)))
            layers.append(nn.LeakyReLU(negative_slope))
            width = int(h)
        layers += [nn.Linear(width, math.prod(self.image_shape)), nn.Tanh()]
        self.net = nn.Sequential(*layers)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z).view(z.shape[0], *self.image_shape)


class MLPDiscriminator(nn.Module):
    """image -> hidden[0] -> ... -> hidden[-1] -> logit, LeakyReLU and Dropout between layers."""

    def __init__(
        self,
        image_shape: Sequence[int],
        hidden: Sequence[int] = (512, 256),
        negative_slope: float = 0.2,
        dropout: float = 0.3,
    ):
        super().__init__()
        self.image_shape = _image_shape(image_shape)
        layers: list[nn.Module] = []
        width = math.prod(self.image_shape)
        for h in hidden:
            layers += [nn.Linear(width, int(h)), nn.LeakyReLU(negative_slope)]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width = int(h)
        layers.append(nn.Linear(width, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1)).squeeze(1)


def _n_doublings(image_shape: tuple[int, int, int]) -> int:
    """How many stride-2 layers lead from 4x4 to the image: DCGAN nets need square sides of 4 * 2**k, k >= 1."""
    _, h, w = image_shape
    k = int(round(math.log2(h / 4))) if h >= 8 else 0
    if h != w or k < 1 or 4 * 2**k != h:
        raise ValueError(f"the DCGAN pair needs square images with sides 8, 16, 32, 64, ...; got {image_shape}")
    return k


class DCGANGenerator(nn.Module):
    """noise -> 4x4 feature map (transposed conv) -> doubled k times (transposed conv 4x4, stride 2) -> Tanh image.

    BatchNorm + ReLU between layers (Radford et al. 2016); channels halve as the map doubles, ending at
    `base_channels` before the output layer.
    """

    def __init__(self, latent_dim: int, image_shape: Sequence[int], base_channels: int = 64):
        super().__init__()
        self.latent_dim = int(latent_dim)
        self.image_shape = _image_shape(image_shape)
        k = _n_doublings(self.image_shape)
        channels = [int(base_channels) * 2 ** (k - 1 - i) for i in range(k)]
        layers: list[nn.Module] = [
            nn.ConvTranspose2d(self.latent_dim, channels[0], 4, 1, 0, bias=False),
            nn.BatchNorm2d(channels[0]),
            nn.ReLU(),
        ]
        for c_in, c_out in zip(channels[:-1], channels[1:]):
            layers += [nn.ConvTranspose2d(c_in, c_out, 4, 2, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]
        layers += [nn.ConvTranspose2d(channels[-1], self.image_shape[0], 4, 2, 1), nn.Tanh()]
        self.net = nn.Sequential(*layers)
        dcgan_init(self)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z.view(z.shape[0], self.latent_dim, 1, 1))


class DCGANDiscriminator(nn.Module):
    """image -> halved k times (conv 4x4, stride 2) to 4x4 -> conv 4x4 -> logit; LeakyReLU, BatchNorm after the first."""

    def __init__(self, image_shape: Sequence[int], base_channels: int = 64, negative_slope: float = 0.2, dropout: float = 0.0):
        super().__init__()
        self.image_shape = _image_shape(image_shape)
        k = _n_doublings(self.image_shape)
        channels = [int(base_channels) * 2**i for i in range(k)]
        layers: list[nn.Module] = [nn.Conv2d(self.image_shape[0], channels[0], 4, 2, 1), nn.LeakyReLU(negative_slope)]
        for c_in, c_out in zip(channels[:-1], channels[1:]):
            layers += [nn.Conv2d(c_in, c_out, 4, 2, 1, bias=False), nn.BatchNorm2d(c_out), nn.LeakyReLU(negative_slope)]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        layers.append(nn.Conv2d(channels[-1], 1, 4, 1, 0))
        self.net = nn.Sequential(*layers)
        dcgan_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).flatten()


def dcgan_init(module: nn.Module) -> None:
    """N(0, 0.02) conv weights and N(1, 0.02) BatchNorm scales: the DCGAN paper's initialisation."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d | nn.ConvTranspose2d):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.normal_(m.weight, 1.0, 0.02)
            nn.init.zeros_(m.bias)


class GANPair(nn.Module):
    """A generator and a discriminator for images of one shape; `latent_dim` is the generator's noise size."""

    def __init__(self, generator: nn.Module, discriminator: nn.Module):
        super().__init__()
        self.generator = generator
        self.discriminator = discriminator
        self.latent_dim = int(generator.latent_dim)
        self.image_shape = tuple(generator.image_shape)

    def sample_noise(self, n: int, device=None, generator: torch.Generator | None = None) -> torch.Tensor:
        return torch.randn(n, self.latent_dim, device=device, generator=generator)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """D(G(z)): the whole adversarial path, e.g. for drawing the graph."""
        return self.discriminator(self.generator(z))


class MLPGAN(GANPair):
    """The classic fully connected pair (Goodfellow et al. 2014, as in PyTorch-GAN's `gan.py`)."""

    def __init__(
        self,
        image_shape: Sequence[int],
        latent_dim: int = 64,
        generator_hidden: Sequence[int] = (128, 256, 512),
        discriminator_hidden: Sequence[int] = (512, 256),
        negative_slope: float = 0.2,
        batch_norm: bool = True,
        dropout: float = 0.3,
    ):
        super().__init__(
            MLPGenerator(latent_dim, image_shape, generator_hidden, negative_slope, batch_norm),
            MLPDiscriminator(image_shape, discriminator_hidden, negative_slope, dropout),
        )


class DCGAN(GANPair):
    """The small convolutional pair (Radford et al. 2016), for square images with sides 8, 16, 32, 64, ..."""

    def __init__(
        self,
        image_shape: Sequence[int],
        latent_dim: int = 64,
        generator_channels: int = 64,
        discriminator_channels: int = 64,
        negative_slope: float = 0.2,
        dropout: float = 0.0,
    ):
        super().__init__(
            DCGANGenerator(latent_dim, image_shape, generator_channels),
            DCGANDiscriminator(image_shape, discriminator_channels, negative_slope, dropout),
        )

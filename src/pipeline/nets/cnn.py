"""The Nature DQN convolutional network for 84x84 Atari frame stacks (Mnih et al. 2015)."""

from __future__ import annotations

import torch
from torch import nn


class AtariCNN(nn.Module):
    """conv 32x8s4 -> 64x4s2 -> 64x3s1 -> fc 512 -> out_features (one Q-value per action).

    Takes raw uint8 frames (B, in_channels, 84, 84) and scales them inside
    forward, so the replay buffer can keep frames as uint8 (4x less memory).
    `in_features` (the flat frame-stack size every model factory is given) is not needed: the frames' shape is
    checked where it is known (`nets.ensemble.make_ensemble`).
    """

    def __init__(self, out_features: int, in_channels: int = 4, in_features: int | None = None):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(int(in_channels), 32, kernel_size=8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, kernel_size=3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
        )
        self.head = nn.Sequential(nn.Linear(64 * 7 * 7, 512), nn.ReLU(), nn.Linear(512, int(out_features)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.float() / 255.0))

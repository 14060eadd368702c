"""The Nature-CNN actor-critic for Atari frame stacks (CleanRL's ppo_atari.py `Agent`), and its K-agent form.

`ActorCriticCNN(out_features)` maps uint8 frames [N, C, 84, 84] to categorical logits [N, out_features] and the
state value [N]: one torso (conv 32x8s4 -> 64x4s2 -> 64x3s1 -> fc 512, ReLU) shared by a linear actor and a linear
critic. Frames are scaled by 1/255 inside, so rollouts keep them uint8 (4x less memory than float32).
Initialisation is CleanRL's: orthogonal weights with gain sqrt(2) in the torso, 0.01 for the actor and 1 for the
critic, zero biases.

`EnsembleActorCriticCNN` stacks K of them (weights [K, ...]): [K, N, C, 84, 84] -> ([K, N, A], [K, N]); member i's
`state_dict` is the ordinary network's, as for every `pipeline.nets.ensemble.Ensemble`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from pipeline.nets.actor_critic import ACTOR_GAIN, CRITIC_GAIN, HIDDEN_GAIN, orthogonal_linear
from pipeline.nets.ensemble import Ensemble, EnsembleConv2d, EnsembleLinear, seeded_members

FRAME_SIZE = 84


def _orthogonal_conv(in_channels: int, out_channels: int, kernel_size: int, stride: int) -> nn.Conv2d:
    conv = nn.Conv2d(in_channels, out_channels, kernel_size=kernel_size, stride=stride)
    nn.init.orthogonal_(conv.weight, HIDDEN_GAIN)
    nn.init.zeros_(conv.bias)
    return conv


class ActorCriticCNN(nn.Module):
    """uint8 frames [N, in_channels, 84, 84] -> (categorical logits [N, out_features], value [N]).

    `in_features` and `continuous` are what every actor-critic factory is given; the frames' shape is checked in
    `forward`'s first layer, and a continuous policy is refused (Atari actions are discrete).
    """

    def __init__(self, out_features: int, in_channels: int = 4, hidden: int = 512, in_features: int | None = None,
                 continuous: bool = False):
        super().__init__()
        if continuous:
            raise ValueError("model=actor_critic_cnn is a categorical policy over Atari's discrete actions; "
                             "continuous actions need model=actor_critic")
        self.in_channels, self.out_features, self.continuous = int(in_channels), int(out_features), False
        if in_features is not None and int(in_features) != self.in_channels * FRAME_SIZE * FRAME_SIZE:
            raise ValueError(f"model=actor_critic_cnn takes frames shaped ({self.in_channels}, 84, 84), i.e. "
                             f"{self.in_channels * FRAME_SIZE * FRAME_SIZE} values; the env gives {int(in_features)}: "
                             "use env=atari (its wrappers) or set model.in_channels")
        self.torso = nn.Sequential(
            _orthogonal_conv(self.in_channels, 32, 8, 4), nn.ReLU(),
            _orthogonal_conv(32, 64, 4, 2), nn.ReLU(),
            _orthogonal_conv(64, 64, 3, 1), nn.ReLU(),
            nn.Flatten(),
            orthogonal_linear(64 * 7 * 7, int(hidden), HIDDEN_GAIN), nn.ReLU(),
        )
        self.actor = nn.Sequential(orthogonal_linear(int(hidden), self.out_features, ACTOR_GAIN))
        self.critic = nn.Sequential(orthogonal_linear(int(hidden), 1, CRITIC_GAIN))
        self.log_std = None

    def forward(self, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.torso(frames.float() / 255.0)
        return self.actor(h), self.critic(h).squeeze(-1)


def _stack_conv_sequential(sequentials: Sequence[nn.Sequential]) -> nn.Sequential:
    """One Sequential running all members' convolutions, linears and activations; Flatten keeps the member axis."""
    layers: list[nn.Module] = []
    for pos, layer in enumerate(sequentials[0]):
        if isinstance(layer, nn.Conv2d):
            stacked: nn.Module = EnsembleConv2d(len(sequentials), layer)
        elif isinstance(layer, nn.Linear):
            stacked = EnsembleLinear(len(sequentials), layer.in_features, layer.out_features, init=False)
        elif isinstance(layer, nn.Flatten):
            layers.append(nn.Flatten(start_dim=2))  # [K, N, C, H, W] -> [K, N, C*H*W]
            continue
        elif isinstance(layer, nn.ReLU):
            layers.append(layer)
            continue
        else:
            raise ValueError(f"EnsembleActorCriticCNN stacks Conv2d, Linear, Flatten and ReLU; got {type(layer).__name__}")
        for i, seq in enumerate(sequentials):
            stacked.load_member(i, seq[pos].state_dict())
        layers.append(stacked)
    return nn.Sequential(*layers)


class EnsembleActorCriticCNN(Ensemble):
    """K `ActorCriticCNN`s: uint8 frames [K, N, C, 84, 84] -> (logits [K, N, A], values [K, N])."""

    def __init__(self, members: Sequence[ActorCriticCNN]):
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one member")
        self.n_members = len(members)
        self.continuous = False
        self.torso = _stack_conv_sequential([m.torso for m in members])
        self.actor = _stack_conv_sequential([m.actor for m in members])
        self.critic = _stack_conv_sequential([m.critic for m in members])
        self.log_std = None

    @classmethod
    def from_factory(cls, factory: Callable[..., nn.Module], seeds: Sequence[int], obs_shape: tuple[int, ...],
                     out_features: int) -> EnsembleActorCriticCNN:
        """Member i initialised exactly as `factory` builds it under `torch.manual_seed(seeds[i])` (the single run of
        that seed); the global RNG is left as it was."""
        in_features = 1
        for d in obs_shape:
            in_features *= int(d)
        return cls(seeded_members(factory, seeds, in_features, out_features))

    def forward(self, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.torso(frames.float() / 255.0)
        return self.actor(h), self.critic(h).squeeze(-1)

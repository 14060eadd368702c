"""Networks of a user's own, for docs/bring_your_own.md: any nn.Module whose constructor takes the sizes the task
passes (in_features, out_features, ...) and whose forward returns what the task reads."""

import torch
from torch import nn

from pipeline.nets.actor_critic import LogStd


class ResMLP(nn.Module):
    """A classifier or Q-network: in -> width, `blocks` pre-norm residual blocks (LayerNorm, GELU, Dropout), -> out."""

    def __init__(self, in_features: int, out_features: int, width: int = 64, blocks: int = 2, dropout: float = 0.1):
        super().__init__()
        self.inp = nn.Linear(in_features, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU(), nn.Dropout(dropout)) for _ in range(blocks))
        self.out = nn.Linear(width, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x.flatten(1))
        for block in self.blocks:
            h = h + block(h)
        return self.out(h)


class ResActorCritic(nn.Module):
    """PPO's network: (logits, or a Gaussian's mean when continuous, [N, out_features]; value [N]); a continuous policy
    keeps its state-independent log-std as the parameter `log_std.value`."""

    def __init__(self, in_features: int, out_features: int, continuous: bool = False, width: int = 64):
        super().__init__()
        self.torso = nn.Sequential(nn.Linear(in_features, width), nn.Tanh(), nn.LayerNorm(width),
                                   nn.Linear(width, width), nn.Tanh())
        self.pi = nn.Linear(width, out_features)
        self.v = nn.Linear(width, 1)
        self.log_std = LogStd(out_features, 0.0) if continuous else None

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.torso(obs.flatten(1))
        return self.pi(h), self.v(h).squeeze(-1)

"""An actor and a critic as one plain module, and the two policy distributions PPO needs.

`ActorCritic(in_features, out_features, continuous)` maps observations [N, F] to the policy's
parameters [N, out_features] (categorical logits, or a Gaussian's mean) and the state value [N].
The actor and the critic have their own torsos (the default, as CleanRL's ppo.py) or share one
(`shared_torso=True`); a continuous policy has a state-independent log-std (`log_std.value`, one per
action dimension). Initialisation is CleanRL's: orthogonal weights with gain sqrt(2) in the hidden
layers, 0.01 for the actor's output and 1 for the critic's, zero biases.

Its ensemble form (K networks with weights [K, ...], `EnsembleActorCritic` in pipeline.nets.ensemble)
maps [K, N, F] to [K, N, out_features] and [K, N].

The distribution functions take the policy's parameters with any leading axes, so they serve both.
They are written out rather than built from torch.distributions: each is one or two kernels, and
`tests/nets/test_actor_critic.py` checks them against torch.distributions. Actions are not clipped
here: a Gaussian's sample is what its log-probability is of; the env gets the sample clipped to its
bounds (the caller's job), as in CleanRL and SB3.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from pipeline.nets.mlp import activation

HIDDEN_GAIN = math.sqrt(2.0)
ACTOR_GAIN = 0.01
CRITIC_GAIN = 1.0
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def orthogonal_linear(in_features: int, out_features: int, gain: float) -> nn.Linear:
    """nn.Linear with orthogonal weights scaled by `gain` and zero bias (CleanRL's layer_init)."""
    layer = nn.Linear(in_features, out_features)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def _hidden_layers(in_features: int, hidden: Sequence[int], act: str) -> list[nn.Module]:
    layers: list[nn.Module] = []
    width = in_features
    for h in hidden:
        layers += [orthogonal_linear(width, int(h), HIDDEN_GAIN), activation(act)()]
        width = int(h)
    return layers


class LogStd(nn.Module):
    """A state-independent log standard deviation, one per action dimension (the parameter `value`)."""

    def __init__(self, action_dim: int, init: float = 0.0):
        super().__init__()
        self.value = nn.Parameter(torch.full((int(action_dim),), float(init)))

    def forward(self) -> torch.Tensor:
        return self.value


class ActorCritic(nn.Module):
    """obs [N, *obs_shape] -> (policy parameters [N, out_features], value [N]).

    `continuous=False`: the parameters are the logits of a categorical policy over `out_features`
    actions. `continuous=True`: they are the mean of a diagonal Gaussian over `out_features` action
    dimensions, whose log-std is `log_std.value` (starting at `log_std_init`).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        continuous: bool = False,
        hidden: Sequence[int] = (64, 64),
        act: str = "tanh",
        shared_torso: bool = False,
        log_std_init: float = 0.0,
    ):
        super().__init__()
        if not hidden and shared_torso:
            raise ValueError("model.shared_torso=true needs at least one hidden layer (model.hidden)")
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.continuous, self.shared_torso = bool(continuous), bool(shared_torso)
        width = int(hidden[-1]) if hidden else self.in_features
        if shared_torso:
            self.torso = nn.Sequential(*_hidden_layers(self.in_features, hidden, act))
            self.critic = nn.Sequential(orthogonal_linear(width, 1, CRITIC_GAIN))
            self.actor = nn.Sequential(orthogonal_linear(width, self.out_features, ACTOR_GAIN))
        else:
            # CleanRL's order: the critic's layers first, then the actor's.
            self.torso = nn.Sequential()
            self.critic = nn.Sequential(*_hidden_layers(self.in_features, hidden, act), orthogonal_linear(width, 1, CRITIC_GAIN))
            self.actor = nn.Sequential(
                *_hidden_layers(self.in_features, hidden, act), orthogonal_linear(width, self.out_features, ACTOR_GAIN)
            )
        self.log_std = LogStd(self.out_features, log_std_init) if self.continuous else None

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.torso(obs.flatten(1) if obs.dim() > 2 else obs)
        return self.actor(h), self.critic(h).squeeze(-1)


# ---- the policy distributions, over any leading axes ---------------------------------------------


def categorical_sample(logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Actions [...] drawn from softmax(logits [..., A]) by the Gumbel-max trick (one uniform per logit)."""
    return categorical_sample_given(logits, torch.rand(logits.shape, generator=generator, device=logits.device, dtype=logits.dtype))


def categorical_sample_given(logits: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """`categorical_sample` with its uniforms [..., A] on [0, 1) drawn by the caller (a compiled step takes them as input)."""
    # -log(-log u) is a standard Gumbel; u = 0 would give -inf, which argmax simply never picks.
    return (logits - torch.log(-torch.log(uniforms))).argmax(-1)


def categorical_log_prob(logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """log pi(a) [...] of integer actions [...] under logits [..., A]."""
    return F.log_softmax(logits, -1).gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)


def categorical_entropy(logits: torch.Tensor) -> torch.Tensor:
    """The entropy [...] of softmax(logits [..., A])."""
    return _entropy_of(F.log_softmax(logits, -1))


def categorical_log_prob_and_entropy(logits: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`categorical_log_prob` and `categorical_entropy` from one log-softmax (PPO's update needs both: over a K = 16
    CartPole minibatch, [16, 256, 2], the second log-softmax and its backward were ~170 us of a ~6.9 ms step)."""
    log_p = F.log_softmax(logits, -1)
    return log_p.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1), _entropy_of(log_p)


def _entropy_of(log_p: torch.Tensor) -> torch.Tensor:
    return -(log_p.exp() * log_p).sum(-1)


def gaussian_sample(mean: torch.Tensor, log_std: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Actions [..., D] drawn from N(mean, exp(log_std)^2) per dimension (log_std broadcasts against mean)."""
    return gaussian_sample_given(mean, log_std, torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype))


def gaussian_sample_given(mean: torch.Tensor, log_std: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """`gaussian_sample` with its standard normals [..., D] drawn by the caller (a compiled step takes them as input)."""
    return mean + torch.exp(log_std) * noise


def gaussian_log_prob(mean: torch.Tensor, log_std: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """log pi(a) [...] of the diagonal Gaussian: the sum over the last axis of each dimension's log-density."""
    z = (actions - mean) * torch.exp(-log_std)
    return (-0.5 * z**2 - log_std - _HALF_LOG_2PI).sum(-1)


def gaussian_entropy(mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """The entropy [...] of the diagonal Gaussian: sum over dimensions of 1/2 + log(2 pi)/2 + log_std."""
    per_dim = (0.5 + _HALF_LOG_2PI + log_std).expand(mean.shape)
    return per_dim.sum(-1)

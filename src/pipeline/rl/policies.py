"""How a trained network acts: one policy class per algorithm family, declared by its task (`RLTask.policy`).

A policy is the plain network (or a K-member ensemble of it) plus what else the agent acts with (its files beside
model.pt, e.g. PPO's observation statistics, and the run's task settings, e.g. DQN's final epsilon):

- `forward(obs)`: the deterministic action (the highest-scoring one, or the action clipped to the env's bounds); what
  training evaluations, `python -m pipeline.eval`, videos, `pipeline.load(...).act` and `python -m pipeline.export`
  play;
- `sample(obs, generator)`: the stochastic action (`act(obs, deterministic=False)`), drawn from `generator` (None:
  torch's global stream);
- `outputs(obs)`: the real-valued outputs the deterministic action is read from (what an export's rounding check
  bounds);
- `network(factory, observation_space, action_space)`: the plain network a run's `model:` factory builds for these
  spaces (model.pt's weights load into it), and `files_needed(settings)`: the agent files it acts with.

Shapes: observations [*batch, *obs_shape] -> actions [*batch] (Discrete) or [*batch, D] (Box); batch is [N] for a
plain network, [K, N] for an ensemble of K members (its per-member files stacked by `member_files`). uint8 frames
stay uint8 (the network scales them); anything else becomes float32. No Lightning, no config objects here: a replay
or a load starts in about the time torch and gymnasium take to import.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from pipeline.nets.actor_critic import categorical_sample_given, gaussian_sample_given
from pipeline.nets.factory import make_net
from pipeline.rl.ppo import normalize_observation
from pipeline.rl.squashed_gaussian import squashed_gaussian_from_noise

# The observation statistics a PPO agent with task.normalize_obs acts with (RunningMeanStd.agent_state), under the
# name store.layout.OBS_NORM gives the file (the rl layer sits below the store and cannot import it).
OBS_NORM = "obs_norm.pt"


def n_outputs(action_space: gym.spaces.Space) -> int:
    """The network's output size for an action space: the number of actions, or of a flat Box's dimensions."""
    return int(action_space.n) if isinstance(action_space, gym.spaces.Discrete) else int(math.prod(action_space.shape))


def _draws(draw: Callable, shape: Sequence[int], like: torch.Tensor, generator: torch.Generator | None, **kwargs) -> torch.Tensor:
    """`draw(shape)` (torch.rand, torch.randn) from `generator` on its own device, moved to `like`'s."""
    device = like.device if generator is None else generator.device
    return draw(tuple(shape), generator=generator, device=device, **kwargs).to(like.device)


class Policy(nn.Module):
    """A trained network as a policy. A subclass defines `outputs` and `sample` (and, when its network or files
    differ from a plain `model(in_features, out_features)`, `network` and `files_needed`)."""

    def __init__(self, net: Callable, action_space: gym.spaces.Space, files: Mapping[str, Mapping[str, Any]] | None = None,
                 settings: Mapping[str, Any] | None = None):
        super().__init__()
        self.net = net
        self.action_space = action_space
        self.settings = dict(settings or {})
        device = next((p.device for p in net.parameters()), None) if isinstance(net, nn.Module) else None
        self.files = {name: {k: v.to(device) if device is not None and torch.is_tensor(v) else v for k, v in state.items()}
                      for name, state in (files or {}).items()}
        if missing := [f"{name} ({why})" for name, why in self.files_needed(self.settings).items() if name not in self.files]:
            raise ValueError(f"{type(self).__name__} acts with {', '.join(missing)}, not given")
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        if isinstance(action_space, gym.spaces.Box):
            self.register_buffer("low", torch.as_tensor(action_space.low, dtype=torch.float32, device=device))
            self.register_buffer("high", torch.as_tensor(action_space.high, dtype=torch.float32, device=device))
        elif not self.discrete:
            raise ValueError(f"{type(self).__name__} acts in Discrete or Box action spaces; got {action_space}")
        if isinstance(net, nn.Module):
            self.train(net.training)  # an evaluation switches the policy (and so the net) to eval() and back

    # ---- what an algorithm family declares ----------------------------------------------------------------
    @classmethod
    def network(cls, factory: Callable[..., nn.Module], observation_space: gym.spaces.Space,
                action_space: gym.spaces.Space) -> nn.Module:
        """The plain network of the run's model factory for these spaces (model.pt's weights load into it)."""
        return make_net(factory, math.prod(observation_space.shape), n_outputs(action_space))

    @classmethod
    def files_needed(cls, settings: Mapping[str, Any]) -> dict[str, str]:
        """The agent files (beside model.pt) it acts with under the run's task settings: {file name: why}."""
        return {}

    def outputs(self, obs: torch.Tensor) -> torch.Tensor:
        """Scores [*batch, A] whose argmax is the deterministic action (Discrete), or that action [*batch, D] before
        it is clipped to the bounds (Box)."""
        raise TypeError(f"{type(self).__name__} must define outputs")

    def sample(self, obs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Stochastic actions of observations [*batch, *obs_shape], drawn from `generator`."""
        raise TypeError(f"{type(self).__name__} must define sample")

    # ---- shared -----------------------------------------------------------------------------------------------
    def observations(self, obs: torch.Tensor) -> torch.Tensor:
        """What the network sees: uint8 frames as they are, anything else as float32."""
        return obs if obs.dtype == torch.uint8 else obs.float()

    def clip(self, actions: torch.Tensor) -> torch.Tensor:
        """Actions clipped to the Box's bounds (what the env is sent)."""
        return torch.maximum(torch.minimum(actions, self.high), self.low)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        out = self.outputs(obs)
        return out.argmax(-1) if self.discrete else self.clip(out)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True, generator: torch.Generator | None = None) -> torch.Tensor:
        """Actions of observations [*batch, *obs_shape]: `forward`'s, or `sample`'s drawn from `generator`."""
        return self(obs) if deterministic else self.sample(obs, generator)


class QValuePolicy(Policy):
    """DQN: the network's Q-values [*batch, A]; deterministic: the highest-valued action; stochastic: epsilon-greedy
    with the run's final epsilon (`task.eps_end`), as SB3's DQN.predict explores."""

    def outputs(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(self.observations(obs))

    def sample(self, obs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        if hasattr(self.net, "reset_noise"):
            raise ValueError("a NoisyNet DQN explores through weight noise, which it draws only while training; "
                             "use act(obs, deterministic=True)")
        epsilon = self.settings.get("eps_end")
        if epsilon is None:
            raise ValueError(f"{type(self).__name__} samples epsilon-greedily with the task's eps_end, which this run has not")
        q = self.outputs(obs)
        greedy = q.argmax(-1)
        explore = _draws(torch.rand, greedy.shape, greedy, generator) < float(epsilon)
        random = _draws(lambda shape, **kw: torch.randint(0, q.shape[-1], shape, **kw), greedy.shape, greedy, generator)
        return torch.where(explore, random, greedy)


class CategoricalPolicy(Policy):
    """A network of logits [*batch, A] (CEM, REINFORCE): deterministic: the most likely action; stochastic: a draw
    from softmax(logits)."""

    def outputs(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(self.observations(obs))

    def sample(self, obs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        logits = self.outputs(obs)
        return categorical_sample_given(logits, _draws(torch.rand, logits.shape, logits, generator, dtype=logits.dtype))


class ActorCriticPolicy(Policy):
    """PPO: an actor-critic's policy parameters (its first output; the value is not used), categorical logits or a
    Gaussian's mean with the network's state-independent `log_std.value`. Deterministic: the most likely action, or
    the mean clipped to the bounds; stochastic: a categorical draw, or a Gaussian draw clipped to the bounds. With
    `task.normalize_obs` the observations are normalised by the agent's statistics (obs_norm.pt) first."""

    @classmethod
    def network(cls, factory, observation_space, action_space) -> nn.Module:
        continuous = isinstance(action_space, gym.spaces.Box)
        return make_net(lambda **sizes: factory(**sizes, continuous=continuous), math.prod(observation_space.shape),
                        n_outputs(action_space))

    @classmethod
    def files_needed(cls, settings):
        if not settings.get("normalize_obs"):
            return {}
        return {OBS_NORM: "this run normalised its observations (task.normalize_obs=true) and its policy needs their statistics"}

    def observations(self, obs: torch.Tensor) -> torch.Tensor:
        x = super().observations(obs)
        return normalize_observation(x, self.files[OBS_NORM]) if OBS_NORM in self.files else x

    def outputs(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(self.observations(obs))[0]

    def sample(self, obs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        params = self.outputs(obs)
        if self.discrete:
            return categorical_sample_given(params, _draws(torch.rand, params.shape, params, generator, dtype=params.dtype))
        noise = _draws(torch.randn, params.shape, params, generator, dtype=params.dtype)
        return self.clip(gaussian_sample_given(params, self.net.log_std.value, noise))


class BoundedActorPolicy(Policy):
    """An actor whose `forward` is its deterministic action in the env's units and which keeps the env's bounds
    (`bounds`: [-1, 1] -> [low, high]; SAC's and TD3's). Its network is built with the env's bounds, as training
    builds it."""

    @classmethod
    def network(cls, factory, observation_space, action_space) -> nn.Module:
        low, high = action_space.low.tolist(), action_space.high.tolist()
        return make_net(lambda **sizes: factory(**sizes, action_low=low, action_high=high), math.prod(observation_space.shape),
                        n_outputs(action_space))

    def outputs(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(self.observations(obs))


class SquashedGaussianPolicy(BoundedActorPolicy):
    """SAC: deterministic: tanh(mean) in the env's units; stochastic: tanh(u), u ~ N(mean, std^2) of the actor's
    `distribution(obs)`, in the env's units (the squashed Gaussian it trained and explored with)."""

    def sample(self, obs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        mean, log_std = self.net.distribution(self.observations(obs))
        unit, _ = squashed_gaussian_from_noise(mean, log_std, _draws(torch.randn, mean.shape, mean, generator, dtype=mean.dtype))
        return self.clip(self.net.bounds(unit))


class DeterministicActorPolicy(BoundedActorPolicy):
    """TD3: deterministic: the actor's action; stochastic: its exploration while training, the actor's action in
    [-1, 1] (`unit`) plus N(0, exploration_noise^2) per dimension, clipped to [-1, 1], in the env's units."""

    def sample(self, obs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        std = self.settings.get("exploration_noise")
        if std is None:
            raise ValueError(f"{type(self).__name__} samples with the task's exploration_noise, which this run has not")
        unit = self.net.unit(self.observations(obs))
        # pipeline.rl.offpolicy.exploration_actions, with the caller's generator.
        noisy = (unit + _draws(torch.randn, unit.shape, unit, generator, dtype=unit.dtype) * float(std)).clamp(-1.0, 1.0)
        return self.clip(self.net.bounds(noisy))


def member_files(per_member: Sequence[Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The agent files of K members as one policy over an ensemble reads them: a value every member shares stays as
    it is; per-member tensors are stacked [K, 1, *shape], broadcasting over the members' observations [K, N, ...]."""
    if not per_member:
        return {}
    stacked: dict[str, dict[str, Any]] = {}
    for name in per_member[0]:
        states = [files[name] for files in per_member]
        stacked[name] = {}
        for key, first in states[0].items():
            values = [s[key] for s in states]
            if torch.is_tensor(first):
                same = all(torch.equal(v, first) for v in values[1:])
                stacked[name][key] = first if same else torch.stack(values).unsqueeze(1)
            elif all(v == first for v in values[1:]):
                stacked[name][key] = first
            else:
                raise ValueError(f"{name}: {key} differs between agents and is not a tensor; it cannot be stacked")
    return stacked

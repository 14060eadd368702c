"""Actors and twin Q critics for continuous actions (SAC, TD3), and their K-agent forms.

The plain networks are CleanRL's (sac_continuous_action.py, td3_continuous_action.py): ReLU MLPs of
256-256 by default, PyTorch's default initialisation.

- `QNet`: Q(s, a) from the concatenation [obs, action] (DDPG's one critic); `TwinQ`: two of them (`q1`, `q2`).
- `SquashedGaussianActor`: `distribution(obs)` -> (mean, log_std) of the Gaussian that tanh squashes into
  (-1, 1), log_std bounded smoothly to [-5, 2] (`bounded_log_std`, CleanRL's form).
- `DeterministicActor`: `unit(obs)` -> tanh(...) in [-1, 1] (TD3's policy).
Both keep the env's action bounds (`ActionBounds`, buffers in their state_dict) and their `forward` is the
deterministic action in the env's units: what evaluation, `python -m pipeline.eval` and the record's model.pt
play. Learning works in [-1, 1] (the replay stores those actions, the critics take them).

The ensemble forms take [K, N, ...] and keep member i's tensors under the plain network's names
(`member_state_dict(i)` loads into the plain network). `EnsembleTwinQ` runs both critics of all K
agents as one stack of 2K members (q1 of every agent, then q2), so a critic forward is one batched
matmul per layer. `make_offpolicy_agents` builds K agents, agent i's actor and critics initialised as
the single run of seed `seeds[i]` builds them; an actor or critic of another class (a user's own actor, a `QNet`) is
stacked generically (`pipeline.nets.stacked.StackedModule`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from pipeline.nets.ensemble import Ensemble, StackedLayer, flat_features, stack_sequential
from pipeline.nets.factory import make_net
from pipeline.nets.stacked import StackedModule

LOG_STD_BOUNDS = (-5.0, 2.0)


def bounded_log_std(raw: torch.Tensor, low: float = LOG_STD_BOUNDS[0], high: float = LOG_STD_BOUNDS[1]) -> torch.Tensor:
    """An actor's raw output mapped smoothly into [low, high] (CleanRL's form: low + (high - low) (tanh(raw) + 1) / 2)."""
    return low + 0.5 * (high - low) * (torch.tanh(raw) + 1.0)


def _hidden(in_features: int, hidden: Sequence[int]) -> list[nn.Module]:
    layers: list[nn.Module] = []
    width = int(in_features)
    for h in hidden:
        layers += [nn.Linear(width, int(h)), nn.ReLU()]
        width = int(h)
    return layers


def relu_mlp(in_features: int, out_features: int, hidden: Sequence[int]) -> nn.Sequential:
    width = int(hidden[-1]) if hidden else int(in_features)
    return nn.Sequential(*_hidden(in_features, hidden), nn.Linear(width, int(out_features)))


def _cat(obs: torch.Tensor, actions: torch.Tensor, batch_dims: int) -> torch.Tensor:
    obs = obs.flatten(batch_dims) if obs.dim() > batch_dims + 1 else obs
    return torch.cat([obs, actions.to(obs.dtype)], -1)


class QNet(nn.Module):
    """(obs [N, F], actions [N, D]) -> Q [N]."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: Sequence[int] = (256, 256)):
        super().__init__()
        self.net = relu_mlp(int(obs_dim) + int(action_dim), 1, hidden)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.net(_cat(obs, actions, 1)).squeeze(-1)


class TwinQ(nn.Module):
    """Two independent critics: (obs, actions) -> (Q1 [N], Q2 [N])."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: Sequence[int] = (256, 256)):
        super().__init__()
        self.q1 = QNet(obs_dim, action_dim, hidden)
        self.q2 = QNet(obs_dim, action_dim, hidden)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q1(obs, actions), self.q2(obs, actions)


class ActionBounds(nn.Module):
    """Actions in [-1, 1] -> [low, high] per dimension: a * scale + bias (CleanRL's action_scale and action_bias)."""

    def __init__(self, action_dim: int, low: Sequence[float] | None = None, high: Sequence[float] | None = None):
        super().__init__()
        low_t = torch.full((int(action_dim),), -1.0) if low is None else torch.as_tensor(low, dtype=torch.float32).reshape(-1)
        high_t = torch.full((int(action_dim),), 1.0) if high is None else torch.as_tensor(high, dtype=torch.float32).reshape(-1)
        if low_t.shape != (int(action_dim),) or high_t.shape != low_t.shape or not bool((high_t > low_t).all()):
            raise ValueError(f"action bounds must be {action_dim} finite pairs with low < high; got {low} and {high}")
        self.register_buffer("scale", (high_t - low_t) / 2.0)
        self.register_buffer("bias", (high_t + low_t) / 2.0)

    def forward(self, actions: torch.Tensor) -> torch.Tensor:
        return actions * self.scale + self.bias


class SquashedGaussianActor(nn.Module):
    """SAC's policy. `distribution(obs [N, F])` -> (mean, log_std) [N, D] of the pre-tanh Gaussian; `forward(obs)` is
    the deterministic action tanh(mean) in the env's units (what evaluation and `python -m pipeline.eval` play).
    """

    def __init__(self, in_features: int, out_features: int, hidden: Sequence[int] = (256, 256),
                 action_low: Sequence[float] | None = None, action_high: Sequence[float] | None = None):
        super().__init__()
        self.trunk = nn.Sequential(*_hidden(in_features, hidden))
        width = int(hidden[-1]) if hidden else int(in_features)
        self.mean = nn.Linear(width, int(out_features))
        self.log_std = nn.Linear(width, int(out_features))
        self.bounds = ActionBounds(out_features, action_low, action_high)

    def distribution(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(obs.flatten(1) if obs.dim() > 2 else obs)
        return self.mean(h), bounded_log_std(self.log_std(h))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.bounds(torch.tanh(self.distribution(obs)[0]))


class DeterministicActor(nn.Module):
    """TD3's policy. `unit(obs [N, F])` -> actions in [-1, 1] [N, D]; `forward(obs)` the same in the env's units."""

    def __init__(self, in_features: int, out_features: int, hidden: Sequence[int] = (256, 256),
                 action_low: Sequence[float] | None = None, action_high: Sequence[float] | None = None):
        super().__init__()
        self.net = relu_mlp(in_features, out_features, hidden)
        self.bounds = ActionBounds(out_features, action_low, action_high)

    def unit(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(obs.flatten(1) if obs.dim() > 2 else obs))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.bounds(self.unit(obs))


# ---- K agents --------------------------------------------------------------------------------------


class EnsembleActionBounds(StackedLayer):
    """K `ActionBounds`: `scale` and `bias` [K, 1, D], applied to actions [K, N, D]."""

    def __init__(self, members: Sequence[ActionBounds]):
        super().__init__(len(members))
        dim = members[0].scale.numel()
        self.register_buffer("scale", torch.stack([m.scale for m in members]).view(self.n_members, 1, dim).clone())
        self.register_buffer("bias", torch.stack([m.bias for m in members]).view(self.n_members, 1, dim).clone())
        self.single_shapes = {"scale": (dim,), "bias": (dim,)}

    def forward(self, actions: torch.Tensor) -> torch.Tensor:
        return actions * self.scale + self.bias


class EnsembleSquashedGaussianActor(Ensemble):
    """K `SquashedGaussianActor`s: `distribution(obs [K, N, F])` -> (mean, log_std) [K, N, D]; `forward` the
    deterministic actions in the env's units [K, N, D]."""

    def __init__(self, members: Sequence[SquashedGaussianActor]):
        super().__init__()
        self.n_members = len(members)
        self.trunk = stack_sequential([m.trunk for m in members], type(self).__name__)
        self.mean = stack_sequential([nn.Sequential(m.mean) for m in members], type(self).__name__)[0]
        self.log_std = stack_sequential([nn.Sequential(m.log_std) for m in members], type(self).__name__)[0]
        self.bounds = EnsembleActionBounds([m.bounds for m in members])

    def distribution(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(flat_features(obs))
        return self.mean(h), bounded_log_std(self.log_std(h))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.bounds(torch.tanh(self.distribution(obs)[0]))


class EnsembleDeterministicActor(Ensemble):
    """K `DeterministicActor`s: `unit(obs [K, N, F])` -> actions in [-1, 1] [K, N, D]; `forward` in the env's units."""

    def __init__(self, members: Sequence[DeterministicActor]):
        super().__init__()
        self.n_members = len(members)
        self.net = stack_sequential([m.net for m in members], type(self).__name__)
        self.bounds = EnsembleActionBounds([m.bounds for m in members])

    def unit(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(flat_features(obs)))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.bounds(self.unit(obs))


class EnsembleTwinQ(Ensemble):
    """K `TwinQ`s as one stack of 2K critics (every agent's q1, then every agent's q2).

    (obs [K, N, F], actions [K, N, D]) -> (Q1 [K, N], Q2 [K, N]).
    """

    def __init__(self, members: Sequence[TwinQ]):
        super().__init__()
        self.n_members = len(members)
        self.q = stack_sequential([m.q1.net for m in members] + [m.q2.net for m in members], type(self).__name__)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = _cat(obs, actions, 2)
        q = self.q(torch.cat([x, x], 0)).squeeze(-1)
        k = x.shape[0]  # not n_members: a compiled step keeps the member count symbolic (an int attribute would pin it)
        return q[:k], q[k:]

    def _layers(self) -> list[tuple[str, StackedLayer]]:
        return [(f"net.{pos}", layer) for pos, layer in enumerate(self.q) if isinstance(layer, StackedLayer)]

    def member_state_dict(self, i: int) -> dict[str, torch.Tensor]:
        """Agent i's two critics as `TwinQ`'s state_dict (`q1.net.0.weight`, ..., `q2.net.4.bias`)."""
        state = {}
        for critic, member in (("q1", i), ("q2", self.n_members + i)):
            for path, layer in self._layers():
                state.update({f"{critic}.{path}.{k}": v for k, v in layer.member_state(member).items()})
        return state

    def load_member_state_dict(self, i: int, state: dict[str, torch.Tensor]) -> None:
        expected = set(self.member_state_dict(i))
        if set(state) != expected:
            raise ValueError(f"EnsembleTwinQ: the state has keys {sorted(set(state) ^ expected)} that do not fit a TwinQ")
        for critic, member in (("q1", i), ("q2", self.n_members + i)):
            for path, layer in self._layers():
                prefix = f"{critic}.{path}."
                layer.load_member(member, {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})

    def keep_members_(self, members: torch.Tensor) -> list[tuple[nn.Parameter, nn.Parameter]]:
        """Keep agents `members` (both their critics); returns the (old, new) parameter pairs for the optimizer."""
        members = members.to(torch.int64)
        both = torch.cat([members, members + self.n_members])
        pairs = [pair for _, layer in self._layers() for pair in layer.keep_members_(both)]
        self.n_members = int(members.numel())
        return pairs


_ENSEMBLE_ACTOR = {SquashedGaussianActor: EnsembleSquashedGaussianActor, DeterministicActor: EnsembleDeterministicActor}


def make_offpolicy_agents(
    actor: Callable[..., nn.Module], critic: Callable[[int, int], nn.Module], seeds: Sequence[int], obs_dim: int,
    action_dim: int, methods: Sequence[str] = ("distribution", "unit", "bounds"),
) -> tuple[Ensemble | StackedModule, EnsembleTwinQ | StackedModule]:
    """K agents' actors and critics; agent i's are what `torch.manual_seed(seeds[i])`, then
    `make_net(actor, obs_dim, action_dim)`, then `critic(obs_dim, action_dim)` build (the single run's order).
    Our actors and `TwinQ` critics are stacked by hand (`EnsembleTwinQ`: 2K critics); any other actor or critic
    generically (`StackedModule`: K members, one per agent; DDPG's one `QNet`), an actor running those of `methods` it
    has over the members (`stacked.unit(obs)`). The global RNG is left as it was."""
    if len(seeds) == 0:
        raise ValueError("make_offpolicy_agents needs at least one seed")
    actors, critics = [], []
    with torch.random.fork_rng(devices=[]):
        for s in seeds:
            torch.default_generator.manual_seed(int(s))
            actors.append(make_net(actor, obs_dim, action_dim))
            critics.append(critic(int(obs_dim), int(action_dim)))
    if not isinstance(critics[0], nn.Module):
        raise ValueError(f"make_offpolicy_agents needs critics that are nn.Modules; got {type(critics[0]).__name__}")
    # Exact types: a subclass may change a method, which stacking the weights by hand would silently drop.
    stacked_critics = EnsembleTwinQ(critics) if type(critics[0]) is TwinQ else StackedModule(critics)
    build = _ENSEMBLE_ACTOR.get(type(actors[0]))
    if build is None:
        return StackedModule(actors, methods=[m for m in methods if hasattr(actors[0], m)]), stacked_critics
    return build(actors), stacked_critics

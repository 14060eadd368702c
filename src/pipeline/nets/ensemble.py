"""K networks of one architecture as one module: weights stacked on a leading member axis.

Training many seeds in one process needs K independent networks that run as a handful of batched
kernels. On one CPU thread a hand-batched layer (weights [K, in, out], one `baddbmm`) beat both a
Python loop over K modules and `torch.func.vmap` (which adds ~300-400 us per call), so the ensemble
is built from ordinary networks by stacking their weights, and each member can be written back out
as the ordinary network's `state_dict`.

Members stay independent under one ordinary optimizer as long as
- the loss is the SUM over members of each member's own loss (e.g. its mean over its batch): the
  gradient of member i is then exactly the gradient it would get alone, and elementwise optimizers
  (Adam, SGD, RMSprop, weight decay) update each member as if it were trained alone;
- gradient-norm clipping is done per member (`clip_grad_norm_per_member_`): a norm over the whole
  stack would let one member's large gradient shrink every other member's step.
Every parameter and buffer of an ensemble has the member axis first, and none is shared by members.

`make_ensemble` builds the ensemble form of any of our Q-networks and of the actor-critic; each ensemble keeps its stacked
layers at the module paths the ordinary network has them, which is what lets `member_state_dict`
name member i's tensors exactly as the ordinary network's `state_dict` does. Any other module (a user's own, a
subclass of ours) is stacked generically (`pipeline.nets.stacked.StackedModule`: vmap over functional_call).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from pipeline.nets.actor_critic import ActorCritic, LogStd
from pipeline.nets.cnn import AtariCNN
from pipeline.nets.factory import make_net
from pipeline.nets.heads import DuelingQNet, NoisyQNet
from pipeline.nets.mlp import MLP
from pipeline.nets.stacked import StackedModule

# Modules that act elementwise (or per row) and hold no parameters: they apply to a [K, N, F] batch as is.
_STATELESS = (nn.ReLU, nn.Tanh, nn.LeakyReLU, nn.GELU, nn.ELU, nn.Sigmoid, nn.Identity, nn.Dropout)


class StackedLayer(nn.Module):
    """A layer holding K members' tensors (parameters and buffers), each with the member axis first.

    Tensors carry the ordinary layer's names; `single_shapes` gives each one's shape in the ordinary
    layer and `transposed` the names stored as the transpose of it (so a bmm reads them as they are).
    """

    transposed: tuple[str, ...] = ()

    def __init__(self, n_members: int):
        super().__init__()
        self.n_members = int(n_members)
        self.single_shapes: dict[str, tuple[int, ...]] = {}

    def _member_tensor(self, name: str, i: int) -> torch.Tensor:
        return getattr(self, name)[i]

    def member_state(self, i: int) -> dict[str, torch.Tensor]:
        """Member i as the ordinary layer's state (its names and shapes)."""
        state = {}
        for name, shape in self.single_shapes.items():
            value = self._member_tensor(name, i).detach()
            state[name] = (value.t() if name in self.transposed else value).reshape(shape).clone()
        return state

    @torch.no_grad()
    def load_member(self, i: int, state: dict[str, torch.Tensor]) -> None:
        """Member i from the ordinary layer's state."""
        for name, shape in self.single_shapes.items():
            if name not in state:
                raise KeyError(f"{type(self).__name__}: the member state lacks {name!r} (it has {sorted(state)})")
            if tuple(state[name].shape) != shape:
                raise ValueError(f"{type(self).__name__}: {name!r} has shape {tuple(state[name].shape)}, expected {shape}")
            target = self._member_tensor(name, i)
            value = state[name].t() if name in self.transposed else state[name]
            target.copy_(value.reshape(target.shape))

    def keep_members_(self, members: torch.Tensor) -> list[tuple[nn.Parameter, nn.Parameter]]:
        """Keep only `members` (indices), in that order; returns (old, new) parameter pairs for the optimizer."""
        pairs = []
        for name, old in list(self.named_parameters(recurse=False)):
            new = nn.Parameter(old.detach().index_select(0, members.to(old.device)), requires_grad=old.requires_grad)
            setattr(self, name, new)
            pairs.append((old, new))
        for name, old in list(self.named_buffers(recurse=False)):
            setattr(self, name, old.index_select(0, members.to(old.device)))
        self.n_members = int(members.numel())
        return pairs


# A layer with at most this many outputs, over at least NARROW_MIN_ROWS rows (K x N), takes `_NarrowLinear`.
NARROW_MAX_OUT = 8
NARROW_MIN_ROWS = 1024


class _NarrowLinear(torch.autograd.Function):
    """x @ weight + bias for few outputs, computed in the transposed form (weight^T @ x^T)^T.

    On this torch CPU build (one thread) `baddbmm` and its backward are slow when the output is narrow: an actor's
    2 logits or a critic's value over a [16, 256, 64] minibatch took 747 / 840 us forward + backward, against 341 /
    259 us in the transposed form (weight's gradient as (g^T @ x)^T, and x's as g * weight^T for one output);
    at K = 1 and a few hundred rows the two are even (the Function's overhead), hence NARROW_MIN_ROWS.
    Same values up to float32 summation order.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        y = torch.bmm(weight.transpose(1, 2), x.transpose(1, 2))
        if bias is not None:
            y = y + bias.transpose(1, 2)
        return y.transpose(1, 2).contiguous()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = grad * weight.transpose(1, 2) if weight.shape[2] == 1 else torch.bmm(grad, weight.transpose(1, 2))
        if ctx.needs_input_grad[1]:
            grad_weight = torch.bmm(grad.transpose(1, 2), x).transpose(1, 2)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.sum(1, keepdim=True)
        return grad_x, grad_weight, grad_bias


class EnsembleLinear(StackedLayer):
    """K independent affine maps: x [K, N, in] -> x @ weight[k] + bias[k], as one `baddbmm`."""

    transposed = ("weight",)

    def __init__(self, n_members: int, in_features: int, out_features: int, bias: bool = True, init: bool = True):
        super().__init__(n_members)
        self.in_features, self.out_features = int(in_features), int(out_features)
        # [K, in, out] rather than nn.Linear's [out, in]: the bmm reads it without a transpose.
        self.weight = nn.Parameter(torch.empty(self.n_members, self.in_features, self.out_features))
        self.bias = nn.Parameter(torch.empty(self.n_members, 1, self.out_features)) if bias else None
        self.single_shapes = {"weight": (self.out_features, self.in_features)}
        if bias:
            self.single_shapes["bias"] = (self.out_features,)
        if init:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        # nn.Linear's default initialisation, member by member.
        bound = 1.0 / math.sqrt(self.in_features) if self.in_features > 0 else 0.0
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            # The bias added after the bmm: inductor fuses it into the next element-wise kernel (the activation) and
            # its gradient into a reduction, where `baddbmm` first copies it into the output. PPO's compiled iterations
            # (PureJaxRL's CartPole recipe, one core, two tasks interleaved in one process): 0.93x, 0.90x, 0.96x the
            # CPU of `baddbmm`'s at K = 16, 64, 256. (The narrow form below is eager's: its size test would pin K.)
            y = torch.bmm(x, self.weight)
            return y if self.bias is None else y + self.bias
        if (self.out_features <= NARROW_MAX_OUT and x.shape[0] * x.shape[1] >= NARROW_MIN_ROWS
                and x.device.type == "cpu" and x.dtype == torch.float32):
            return _NarrowLinear.apply(x, self.weight, self.bias)
        if self.bias is None:
            return torch.bmm(x, self.weight)
        return torch.baddbmm(self.bias, x, self.weight)

    def extra_repr(self) -> str:
        return f"n_members={self.n_members}, in_features={self.in_features}, out_features={self.out_features}"


class EnsembleNoisyLinear(StackedLayer):
    """K independent `NoisyLinear` layers: factorised Gaussian weight noise, member i with its own noise.

    In eval() mode every member uses its mean weights, as the ordinary layer does.
    """

    transposed = ("weight_mu", "weight_sigma")

    def __init__(self, n_members: int, in_features: int, out_features: int, sigma0: float = 0.5):
        super().__init__(n_members)
        K, self.in_features, self.out_features, self.sigma0 = self.n_members, int(in_features), int(out_features), float(sigma0)
        self.weight_mu = nn.Parameter(torch.zeros(K, self.in_features, self.out_features))
        self.weight_sigma = nn.Parameter(torch.zeros(K, self.in_features, self.out_features))
        self.bias_mu = nn.Parameter(torch.zeros(K, 1, self.out_features))
        self.bias_sigma = nn.Parameter(torch.zeros(K, 1, self.out_features))
        self.register_buffer("eps_in", torch.zeros(K, self.in_features))
        self.register_buffer("eps_out", torch.zeros(K, self.out_features))
        out_in, out = (self.out_features, self.in_features), (self.out_features,)
        self.single_shapes = {"weight_mu": out_in, "weight_sigma": out_in, "bias_mu": out, "bias_sigma": out,
                              "eps_in": (self.in_features,), "eps_out": out}

    @torch.no_grad()
    def reset_noise(self, generators: Sequence[torch.Generator] | None = None) -> None:
        """New noise: member i's from generators[i] (the draws `NoisyLinear.reset_noise(generators[i])` makes).

        Without generators, all members' noise comes from the global RNG in one draw per tensor.
        """
        K, device = self.n_members, self.eps_in.device
        if generators is None:
            raw_in, raw_out = torch.randn(K, self.in_features, device=device), torch.randn(K, self.out_features, device=device)
        else:
            if len(generators) != K:
                raise ValueError(f"reset_noise got {len(generators)} generators for {K} members; pass one per member")
            # One stack per tensor: ~2.5x cheaper than writing each member's row in place (K=64).
            raw_in = torch.stack([torch.randn(self.in_features, generator=g, device=g.device) for g in generators])
            raw_out = torch.stack([torch.randn(self.out_features, generator=g, device=g.device) for g in generators])
        # NoisyLinear's f(x) = sign(x) sqrt(|x|), on all members at once.
        self.eps_in.copy_(raw_in.sign() * raw_in.abs().sqrt())
        self.eps_out.copy_(raw_out.sign() * raw_out.abs().sqrt())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return torch.baddbmm(self.bias_mu, x, self.weight_mu)
        # outer(eps_out, eps_in) transposed, as the weights are: [K, in, out].
        weight = self.weight_mu + self.weight_sigma * (self.eps_in.unsqueeze(2) * self.eps_out.unsqueeze(1))
        bias = self.bias_mu + self.bias_sigma * self.eps_out.unsqueeze(1)
        return torch.baddbmm(bias, x, weight)

    def extra_repr(self) -> str:
        return f"n_members={self.n_members}, in_features={self.in_features}, out_features={self.out_features}, sigma0={self.sigma0}"


class EnsembleConv2d(StackedLayer):
    """K independent `nn.Conv2d`s (no padding, dilation or groups): [K, N, C, H, W] -> [K, N, C', H', W'].

    A Python loop of one convolution per member, over stacked weights: measured on one CPU thread
    (the Atari net, K=4, N=32 uint8 4x84x84 frames; a shared 2-core machine, min over rounds), a DQN
    update (forward+backward, then a target forward) took 438-502 ms with the loop against 522-572 ms
    with one grouped convolution over channel-stacked members (groups=K), inference 84-129 ms against
    139-183 ms, forward+backward alone was a draw (grouped 0.85-1.2x the loop's time), and
    `torch.func.vmap` over `functional_call` was slowest (forward+backward 1.6-1.8x). The loop also
    runs exactly the ordinary layer's kernel for each member.
    """

    def __init__(self, n_members: int, conv: nn.Conv2d):
        super().__init__(n_members)
        if conv.groups != 1 or conv.dilation != (1, 1) or conv.padding != (0, 0) or conv.padding_mode != "zeros":
            raise ValueError(f"EnsembleConv2d stacks plain convolutions (no padding, dilation or groups); got {conv}")
        self.stride = conv.stride
        self.weight = nn.Parameter(torch.zeros(self.n_members, *conv.weight.shape))
        self.bias = nn.Parameter(torch.zeros(self.n_members, *conv.bias.shape)) if conv.bias is not None else None
        self.single_shapes = {name: tuple(t.shape) for name, t in conv.state_dict().items()}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = [None] * self.n_members if self.bias is None else self.bias
        return torch.stack([F.conv2d(x[k], self.weight[k], bias[k], self.stride) for k in range(self.n_members)])

    def extra_repr(self) -> str:
        return f"n_members={self.n_members}, weight={tuple(self.weight.shape[1:])}, stride={self.stride}"


class Ensemble(nn.Module):
    """What every ensemble shares: member i in and out as the ordinary network's `state_dict`, and shrinking.

    Subclasses put their `StackedLayer`s at the module paths the ordinary network has its layers
    (`net.0`, `trunk.2`, `layers.1`, ...), so member i's keys are the ordinary network's keys.
    """

    n_members: int

    def stacked_layers(self) -> list[tuple[str, StackedLayer]]:
        return [(name, m) for name, m in self.named_modules() if isinstance(m, StackedLayer)]

    def member_state_dict(self, i: int) -> dict[str, torch.Tensor]:
        """Member i as the ordinary network's state_dict (e.g. `DuelingQNet(...).load_state_dict(...)` accepts it)."""
        return {f"{path}.{name}": value for path, layer in self.stacked_layers() for name, value in layer.member_state(i).items()}

    def load_member_state_dict(self, i: int, state: dict[str, torch.Tensor]) -> None:
        """Member i from the ordinary network's state_dict (strict: every key used, none missing)."""
        layers = self.stacked_layers()
        unknown = sorted(k for k in state if not any(k.startswith(path + ".") for path, _ in layers))
        if unknown:
            raise ValueError(f"{type(self).__name__} has no place for {unknown}: is this state_dict from another model?")
        for path, layer in layers:
            prefix = path + "."
            layer.load_member(i, {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})

    def keep_members_(self, members: torch.Tensor) -> list[tuple[nn.Parameter, nn.Parameter]]:
        """Shrink to `members` (indices, in that order), e.g. dropping members that stopped training.

        Returns the (old, new) parameter pairs; pass them to `keep_optimizer_members_` so the
        optimizer's state follows.
        """
        pairs = [pair for _, layer in self.stacked_layers() for pair in layer.keep_members_(members)]
        self.n_members = int(members.numel())
        return pairs


def stack_sequential(sequentials: Sequence[nn.Sequential], owner: str) -> nn.Sequential:
    """One Sequential running all members: Linear -> EnsembleLinear, activations and dropout as they are."""
    layers: list[nn.Module] = []
    for pos, layer in enumerate(sequentials[0]):
        if isinstance(layer, nn.Linear):
            # No initialisation of its own: it would draw from the global RNG only to be overwritten.
            stacked = EnsembleLinear(len(sequentials), layer.in_features, layer.out_features, bias=layer.bias is not None, init=False)
            for i, seq in enumerate(sequentials):
                stacked.load_member(i, seq[pos].state_dict())
            layers.append(stacked)
        elif isinstance(layer, _STATELESS):
            layers.append(layer)
        else:
            raise ValueError(
                f"{owner} stacks Linear layers and parameter-free activations; got {type(layer).__name__}. "
                "Use model=mlp for seed-batched runs."
            )
    return nn.Sequential(*layers)


def flat_features(x: torch.Tensor) -> torch.Tensor:
    """[K, N, *features] -> [K, N, F], as the ordinary networks flatten [N, *features]."""
    return x.flatten(2) if x.dim() > 3 else x


class EnsembleMLP(Ensemble):
    """K copies of an `nn.Sequential`-of-Linear network (our `MLP`), run as one batched network.

    `net` mirrors the source network's `net` Sequential position by position (Linear -> EnsembleLinear,
    activations and dropout as they are), so member i's `state_dict` has the source's keys
    (`net.0.weight`, ...) and loads into the ordinary network.
    Input [K, N, *features] -> output [K, N, out_features].
    """

    def __init__(self, members: Sequence[nn.Module]):
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one member")
        sequentials = [_sequential_of(m) for m in members]
        self.net = stack_sequential(sequentials, "EnsembleMLP")
        self.n_members = len(members)
        self.in_features = sequentials[0][0].in_features
        self.out_features = self._linears()[-1].out_features

    @classmethod
    def from_factory(
        cls, factory: Callable[..., nn.Module], seeds: Sequence[int], in_features: int | None, out_features: int
    ) -> EnsembleMLP:
        """One member per seed, member i initialised exactly as `factory` is under `torch.manual_seed(seeds[i])`.

        So member i starts from the weights of the single-seed run with that seed. The global RNG is
        left as it was.
        """
        return cls(seeded_members(factory, seeds, in_features, out_features))

    def _linears(self) -> list[EnsembleLinear]:
        return [m for m in self.net if isinstance(m, EnsembleLinear)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(flat_features(x))


class EnsembleDuelingQNet(Ensemble):
    """K `DuelingQNet`s: a stacked trunk, then stacked value and advantage streams. [K, N, *obs] -> [K, N, A]."""

    def __init__(self, members: Sequence[DuelingQNet]):
        super().__init__()
        self.trunk = stack_sequential([m.trunk for m in members], "EnsembleDuelingQNet")
        self.value = _stack_linear([m.value for m in members])
        self.advantage = _stack_linear([m.advantage for m in members])
        self.n_members = len(members)

    def value_and_advantage(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(flat_features(x))
        return self.value(h), self.advantage(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v, a = self.value_and_advantage(x)
        return v + a - a.mean(dim=-1, keepdim=True)


class EnsembleNoisyQNet(Ensemble):
    """K `NoisyQNet`s, each with its own weight noise. [K, N, *obs] -> [K, N, A]; eval() turns the noise off."""

    def __init__(self, members: Sequence[NoisyQNet]):
        super().__init__()
        self.n_members = len(members)
        self.layers = nn.ModuleList()
        for pos, layer in enumerate(members[0].layers):
            stacked = EnsembleNoisyLinear(self.n_members, layer.in_features, layer.out_features, sigma0=layer.sigma0)
            for i, member in enumerate(members):
                stacked.load_member(i, member.layers[pos].state_dict())
            self.layers.append(stacked)

    def reset_noise(self, generators: Sequence[torch.Generator] | None = None) -> None:
        """New noise for every member; member i's from generators[i], drawn as `NoisyQNet.reset_noise(generators[i])` does."""
        for layer in self.layers:
            layer.reset_noise(generators)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = flat_features(x)
        for layer in self.layers[:-1]:
            x = F.relu(layer(x))
        return self.layers[-1](x)


class EnsembleAtariCNN(Ensemble):
    """K `AtariCNN`s: uint8 frames [K, N, C, 84, 84] -> [K, N, A], scaled inside as the ordinary net does."""

    def __init__(self, members: Sequence[AtariCNN]):
        super().__init__()
        self.n_members = len(members)
        layers: list[nn.Module] = []
        for pos, layer in enumerate(members[0].features):
            if isinstance(layer, nn.Conv2d):
                stacked = EnsembleConv2d(self.n_members, layer)
                for i, member in enumerate(members):
                    stacked.load_member(i, member.features[pos].state_dict())
                layers.append(stacked)
            elif isinstance(layer, nn.Flatten):
                layers.append(nn.Flatten(start_dim=2))  # keep the member and batch axes
            else:
                layers.append(layer)
        self.features = nn.Sequential(*layers)
        self.head = stack_sequential([m.head for m in members], "EnsembleAtariCNN")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.float() / 255.0))


class EnsembleLogStd(StackedLayer):
    """K `LogStd`s: `value` [K, 1, D], which broadcasts against the members' means [K, N, D]."""

    def __init__(self, members: Sequence[LogStd]):
        super().__init__(len(members))
        dim = members[0].value.numel()
        self.value = nn.Parameter(torch.zeros(self.n_members, 1, dim))
        self.single_shapes = {"value": (dim,)}
        for i, member in enumerate(members):
            self.load_member(i, member.state_dict())

    def forward(self) -> torch.Tensor:
        return self.value


class EnsembleActorCritic(Ensemble):
    """K `ActorCritic`s: obs [K, N, *obs_shape] -> (policy parameters [K, N, out_features], values [K, N]);
    a continuous one's `log_std.value` is [K, 1, D]."""

    def __init__(self, members: Sequence[ActorCritic]):
        super().__init__()
        self.n_members = len(members)
        self.continuous = members[0].continuous
        self.torso = stack_sequential([m.torso for m in members], "EnsembleActorCritic")
        self.critic = stack_sequential([m.critic for m in members], "EnsembleActorCritic")
        self.actor = stack_sequential([m.actor for m in members], "EnsembleActorCritic")
        self.log_std = EnsembleLogStd([m.log_std for m in members]) if self.continuous else None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.torso(flat_features(x))
        return self.actor(h), self.critic(h).squeeze(-1)


def _stack_linear(linears: Sequence[nn.Linear]) -> EnsembleLinear:
    first = linears[0]
    stacked = EnsembleLinear(len(linears), first.in_features, first.out_features, bias=first.bias is not None, init=False)
    for i, linear in enumerate(linears):
        stacked.load_member(i, linear.state_dict())
    return stacked


def seeded_members(factory: Callable[..., nn.Module], seeds: Sequence[int], in_features: int | None, out_features: int) -> list[nn.Module]:
    """`make_net(factory, ...)` once per seed under `torch.manual_seed(seed)`: each single-seed run's initial network."""
    if len(seeds) == 0:
        raise ValueError("an ensemble needs at least one seed")
    members = []
    # Members are built on the CPU: seed only its generator, inside a fork that restores it. (torch.manual_seed
    # would also seed every CUDA generator, which the fork does not restore: on a GPU machine the caller's
    # CUDA stream was left seeded to seeds[-1].)
    with torch.random.fork_rng(devices=[]):
        for s in seeds:
            torch.default_generator.manual_seed(int(s))
            members.append(make_net(factory, in_features, out_features))
    return members


_ENSEMBLE_OF: dict[type, type[Ensemble]] = {
    MLP: EnsembleMLP, DuelingQNet: EnsembleDuelingQNet, NoisyQNet: EnsembleNoisyQNet, AtariCNN: EnsembleAtariCNN,
    ActorCritic: EnsembleActorCritic,
}


def make_ensemble(factory: Callable[..., nn.Module], seeds: Sequence[int], obs_shape: tuple[int, ...], n_actions: int,
                  stacked: type[StackedModule] = StackedModule) -> Ensemble | StackedModule:
    """The ensemble form of `factory`'s network, member i initialised as the single-seed run with seeds[i] starts.

    That run builds `make_net(factory, prod(obs_shape), n_actions)` right after `torch.manual_seed(seed)`;
    so does this, once per seed, then stacks the results: our networks by hand (`_ENSEMBLE_OF`), any other module
    as `stacked(members)` (a `StackedModule`). The global RNG is left as it was.
    """
    members = seeded_members(factory, seeds, math.prod(obs_shape), n_actions)
    kind = type(members[0])
    # Exact types: a subclass may change forward, which stacking the weights by hand would silently drop.
    build = _ENSEMBLE_OF.get(kind)
    if build is None:
        return stacked(members)
    if kind is AtariCNN and tuple(obs_shape) != (members[0].features[0].in_channels, 84, 84):
        raise ValueError(
            f"AtariCNN takes frames shaped (in_channels={members[0].features[0].in_channels}, 84, 84), the env gives "
            f"{tuple(obs_shape)}: use the Atari wrappers or set model.in_channels"
        )
    return build(members)


def keep_optimizer_members_(
    optimizer: torch.optim.Optimizer, pairs: Sequence[tuple[nn.Parameter, nn.Parameter]], members: torch.Tensor, n_before: int
) -> None:
    """Point `optimizer` at the new parameters and keep only `members` of its per-parameter state (Adam's moments, ...)."""
    new_of = {id(old): new for old, new in pairs}
    for group in optimizer.param_groups:
        group["params"] = [new_of.get(id(p), p) for p in group["params"]]
    for old, new in pairs:
        state = optimizer.state.pop(old, None)
        if state is None:
            continue
        optimizer.state[new] = {
            k: v.index_select(0, members.to(v.device)) if torch.is_tensor(v) and v.dim() > 0 and v.shape[0] == n_before else v
            for k, v in state.items()
        }


def _sequential_of(module: nn.Module) -> nn.Sequential:
    seq = getattr(module, "net", module)
    if not isinstance(seq, nn.Sequential) or not any(isinstance(m, nn.Linear) for m in seq):
        raise ValueError(f"cannot stack {type(module).__name__}: expected an MLP (a `net` Sequential of Linear layers)")
    return seq


@torch.no_grad()
def per_member_grad_norm(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of each member's whole gradient, [K], over parameters shaped [K, ...]."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        raise ValueError("no gradients to measure")
    # Per tensor, then across tensors: torch's clip_grad_norm_ order, one reduction per parameter. A stacked scalar
    # parameter ([K]) is its own norm: vector_norm over dim=() would reduce across the members.
    norms = [g.abs() if g.dim() == 1 else torch.linalg.vector_norm(g, dim=tuple(range(1, g.dim()))) for g in grads]
    return torch.linalg.vector_norm(torch.stack(norms), dim=0)


@torch.no_grad()
def clip_grad_norm_per_member_(params: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
    """`nn.utils.clip_grad_norm_` applied to each member on its own; returns the norms before clipping, [K].

    Same arithmetic as torch's (coefficient max_norm / (norm + 1e-6), capped at 1), so a member
    gets exactly the clipping it would get when trained alone.
    """
    params = [p for p in params if p.grad is not None]
    norms = per_member_grad_norm(params)
    coef = (float(max_norm) / (norms + 1e-6)).clamp(max=1.0)
    grads = [p.grad for p in params]
    # One fused kernel over every gradient instead of a multiply per tensor.
    torch._foreach_mul_(grads, [coef.view(-1, *([1] * (g.dim() - 1))) for g in grads])
    return norms


def compiled_graphs() -> int:
    """How many graphs torch.compile has made in this process so far (a call that raised it compiled)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _member_count(args: tuple, axes: dict[int, int]) -> int | None:
    """The size of a call's member axis: the first tensor argument's (at the axis `axes` names for it, else its
    first), else the first parameter's of the first module argument; None if the call has neither."""
    for i, arg in enumerate(args):
        if isinstance(arg, torch.Tensor) and arg.dim() > 0:
            return arg.shape[axes.get(i, 0)]
    for arg in args:
        if isinstance(arg, nn.Module):
            first = next(arg.parameters(), None)
            if first is not None:
                return first.shape[0]
    return None


def _marked_dynamic(args: tuple) -> bool:
    """Whether a tensor argument, or a parameter or buffer of a module argument, carries dynamo's marks of a symbolic
    axis (left by `maybe_mark_dynamic` or stamped on a symbolic graph's outputs): a graph traced from it would have
    that axis symbolic even under `dynamic=False`, as parameters are not forced static."""
    marks = ("_dynamo_weak_dynamic_indices", "_dynamo_dynamic_indices", "_dynamo_propagated_dynamic_indices")
    for arg in args:
        tensors = [*arg.parameters(), *arg.buffers()] if isinstance(arg, nn.Module) else [arg]
        if any(isinstance(t, torch.Tensor) and any(hasattr(t, m) for m in marks) for t in tensors):
            return True
    return False


def compile_over_members(fn: Callable, device: torch.device | str, member_axes: dict[int, int] | None = None,
                         cuda_graphs: bool = True) -> Callable:
    """`fn` (tensors and ensembles in, tensors out) through `torch.compile`: all shapes static while the member count K
    is the first call's, K symbolic from the first call with another K on.

    A call's K is its first tensor argument's first axis (or the axis `member_axes` names for positional argument i:
    e.g. an env state stored [state_size, B]), else its first module argument's first parameter's first axis.
    - Static: `torch.compile(fn, dynamic=False)`, nothing marked dynamic: every size is a constant of the graph.
    - Symbolic, for good, from the first call with another K (agents stopped) on; the static graph is never called
      again. A second compile of `fn` in which every tensor argument's member axis and every parameter's first axis
      are left dynamic: one graph serves each K >= 2, K = 1 gets one of its own (torch specialises sizes 0 and 1).
      A first call whose tensors carry dynamo's dynamic marks already (agents stopped under another wrapper of the
      same ensemble) starts here.
    So a wrapper makes at most three graphs (per piece, if `fn` graph-breaks): the first K's, K >= 2's and K = 1's;
    a run whose K never changes runs static graphs only. Another size of a non-member axis makes another graph of
    the phase (static in the static phase). The graphs read the ensemble's parameters on every call, so members
    dropped by `keep_members_` are gone from the next call on. Inductor on CPU; on CUDA also CUDA graphs in both
    phases (mode="reduce-overhead", each call a new step) unless `cuda_graphs=False`, which a caller keeping outputs
    across calls needs (a replay overwrites the last one's).
    """
    from torch._functorch import config as functorch_config
    from torch.fx.experimental import _config as fx_config

    # Parameters are static shapes to dynamo by default (a dropped member would recompile the symbolic graph), and
    # sizes that happen to be equal share one symbol (K = 4 agents on CartPole's 4 features would pin K to 4). Set for
    # the process rather than patched around each call: a patch costs ~75 us a call (dynamo re-hashes its config),
    # more than a PPO rollout step's fused element-wise kernels at K = 64. The static phase's `dynamic=False` still
    # makes unmarked parameters static (dynamo assumes static by default) and ignores the sizes a symbolic phase
    # recorded for `fn` (no automatic dynamic shapes).
    torch._dynamo.config.force_parameter_static_shapes = False
    # A generically stacked module (nets/stacked.py) reads its stacked tensors from torch's own modules (nn.Linear, ...),
    # whose tensors dynamo otherwise takes as static: vmap would then pin K at the first symbolic compile.
    torch._dynamo.config.force_nn_module_property_static_shapes = False
    # Views of saved activations may be recomputed in the backward: otherwise a vmapped ReLU's backward saves a bool mask
    # from the forward, whose inductor CPU kernel is ~25x slower than the ReLU itself (a K = 16 DQN update of a stacked
    # 120-84 MLP: 11-13 ms against 2.7-3.5 ms; the hand-written ensemble's 2.8-4.0 ms, not slower).
    functorch_config.recompute_views = True
    fx_config.use_duck_shape = False
    cuda = torch.device(device).type == "cuda"
    mode = "reduce-overhead" if cuda and cuda_graphs else None
    axes = member_axes or {}
    compiled = None
    static = True  # until a call comes with another member count than the first's
    static_k = None  # the first call's member count

    def mark_member_axes(args: tuple) -> None:
        for i, arg in enumerate(args):
            if isinstance(arg, nn.Module):
                first = next(arg.parameters(), None)
                if first is not None and hasattr(first, "_dynamo_weak_dynamic_indices"):
                    continue  # marked by an earlier call (`keep_members_` replaces every parameter at once)
                tensors = [*arg.parameters(), *arg.buffers()]
            else:
                tensors = [arg]
            for tensor in tensors:
                if isinstance(tensor, torch.Tensor) and tensor.dim() > 0:
                    torch._dynamo.maybe_mark_dynamic(tensor, axes.get(i, 0) if tensor is arg else 0)

    def call(*args):
        nonlocal compiled, static, static_k
        if compiled is None:  # the first call: static unless its inputs are marked dynamic already
            static = not _marked_dynamic(args)
            compiled = torch.compile(fn, mode=mode, dynamic=False if static else None)
            static_k = _member_count(args, axes)
        elif static and _member_count(args, axes) != static_k:
            static, compiled = False, torch.compile(fn, mode=mode)  # agents stopped: symbolic for good
        if not static:
            mark_member_axes(args)
        if cuda and cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        return compiled(*args)

    return call


def stacked_optimizer(factory: Callable[..., torch.optim.Optimizer], params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """The optimizer over an ensemble's stacked weights: `factory(params)`, except that Adam or AdamW left at torch's
    default implementation (`fused=None`: a Python loop over the parameters on a CPU) on CPU or CUDA weights is made
    fused (one kernel for every parameter; PPO's and DQN's K-agent iterations measured in docs/compiled_updates.md).
    An explicit `optimizer.fused=false` is kept."""
    params = list(params)
    if (isinstance(factory, functools.partial) and factory.func in (torch.optim.Adam, torch.optim.AdamW)
            and factory.keywords.get("fused", None) is None and not factory.keywords.get("foreach")
            and params and all(p.device.type in ("cpu", "cuda") for p in params)):
        return factory(params, fused=True)
    return factory(params)

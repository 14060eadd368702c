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
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from pipeline.nets.factory import make_net

# Modules that act elementwise (or per row) and hold no parameters: they apply to a [K, N, F] batch as is.
_STATELESS = (nn.ReLU, nn.Tanh, nn.LeakyReLU, nn.GELU, nn.ELU, nn.Sigmoid, nn.Identity, nn.Dropout)


class EnsembleLinear(nn.Module):
    """K independent affine maps: x [K, N, in] -> x @ weight[k] + bias[k], as one `baddbmm`."""

    def __init__(self, n_members: int, in_features: int, out_features: int, bias: bool = True, init: bool = True):
        super().__init__()
        self.n_members, self.in_features, self.out_features = int(n_members), int(in_features), int(out_features)
        # [K, in, out] rather than nn.Linear's [out, in]: the bmm reads it without a transpose.
        self.weight = nn.Parameter(torch.empty(self.n_members, self.in_features, self.out_features))
        self.bias = nn.Parameter(torch.empty(self.n_members, 1, self.out_features)) if bias else None
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
        if self.bias is None:
            return torch.bmm(x, self.weight)
        return torch.baddbmm(self.bias, x, self.weight)

    @torch.no_grad()
    def load_member(self, i: int, linear_state: dict[str, torch.Tensor]) -> None:
        """Member i from nn.Linear's state (weight [out, in], bias [out])."""
        self.weight[i].copy_(linear_state["weight"].t())
        if self.bias is not None:
            self.bias[i, 0].copy_(linear_state["bias"])

    def member_state(self, i: int) -> dict[str, torch.Tensor]:
        """Member i as nn.Linear's state: weight [out, in], bias [out]."""
        state = {"weight": self.weight[i].detach().t().contiguous()}
        if self.bias is not None:
            state["bias"] = self.bias[i, 0].detach().clone()
        return state

    def keep_members_(self, members: torch.Tensor) -> list[tuple[nn.Parameter, nn.Parameter]]:
        """Keep only `members` (indices), in that order; returns (old, new) parameter pairs for the optimizer."""
        pairs = []
        for name in ("weight", "bias"):
            old = getattr(self, name)
            if old is None:
                continue
            new = nn.Parameter(old.detach().index_select(0, members.to(old.device)), requires_grad=old.requires_grad)
            setattr(self, name, new)
            pairs.append((old, new))
        self.n_members = int(members.numel())
        return pairs

    def extra_repr(self) -> str:
        return f"n_members={self.n_members}, in_features={self.in_features}, out_features={self.out_features}"


class EnsembleMLP(nn.Module):
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
        template = sequentials[0]
        layers: list[nn.Module] = []
        for pos, layer in enumerate(template):
            if isinstance(layer, nn.Linear):
                # No initialisation of its own: it would draw from the global RNG only to be overwritten.
                stacked = EnsembleLinear(len(members), layer.in_features, layer.out_features, bias=layer.bias is not None, init=False)
                for i, seq in enumerate(sequentials):
                    stacked.load_member(i, seq[pos].state_dict())
                layers.append(stacked)
            elif isinstance(layer, _STATELESS):
                layers.append(layer)
            else:
                raise ValueError(
                    f"EnsembleMLP stacks Linear layers and parameter-free activations; got {type(layer).__name__}. "
                    "Use model=mlp for seed-batched runs."
                )
        self.net = nn.Sequential(*layers)
        self.n_members = len(members)
        self.in_features = template[0].in_features
        self.out_features = self._linears()[-1].out_features

    @classmethod
    def from_factory(
        cls, factory: Callable[..., nn.Module], seeds: Sequence[int], in_features: int | None, out_features: int
    ) -> EnsembleMLP:
        """One member per seed, member i initialised exactly as `factory` is under `torch.manual_seed(seeds[i])`.

        So member i starts from the weights of the single-seed run with that seed. The global RNG is
        left as it was.
        """
        members = []
        with torch.random.fork_rng(devices=[]):
            for s in seeds:
                torch.manual_seed(int(s))
                members.append(make_net(factory, in_features, out_features))
        return cls(members)

    def _linears(self) -> list[EnsembleLinear]:
        return [m for m in self.net if isinstance(m, EnsembleLinear)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(2) if x.dim() > 3 else x)

    def member_state_dict(self, i: int) -> dict[str, torch.Tensor]:
        """Member i as the ordinary network's state_dict (`MLP(...).load_state_dict(...)` accepts it)."""
        state = {}
        for pos, layer in enumerate(self.net):
            if isinstance(layer, EnsembleLinear):
                for name, value in layer.member_state(i).items():
                    state[f"net.{pos}.{name}"] = value
        return state

    def load_member_state_dict(self, i: int, state: dict[str, torch.Tensor]) -> None:
        for pos, layer in enumerate(self.net):
            if isinstance(layer, EnsembleLinear):
                layer.load_member(i, {name: state[f"net.{pos}.{name}"] for name in ("weight", "bias") if f"net.{pos}.{name}" in state})

    def keep_members_(self, members: torch.Tensor) -> list[tuple[nn.Parameter, nn.Parameter]]:
        """Shrink to `members` (indices, in that order), e.g. dropping members that stopped training.

        Returns the (old, new) parameter pairs; pass them to `keep_optimizer_members_` so the
        optimizer's state follows.
        """
        pairs = [pair for layer in self._linears() for pair in layer.keep_members_(members)]
        self.n_members = int(members.numel())
        return pairs


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
    # Per tensor, then across tensors: torch's clip_grad_norm_ order, one reduction per parameter.
    norms = [torch.linalg.vector_norm(g, dim=tuple(range(1, g.dim()))) for g in grads]
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

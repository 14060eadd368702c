"""Any `nn.Module` as K members with stacked weights: `torch.func.vmap` over `functional_call`.

`make_ensemble` (nets/ensemble.py) stacks our own networks by hand (`EnsembleMLP`, ...); every other module, a
user's own or a subclass of ours, becomes a `StackedModule`: one copy of the module (`module`) whose parameters and
buffers are replaced by the members' stacked ones ([K, *shape], member i at index i), run as K members at once by
`torch.func.vmap` over `torch.func.functional_call` (what `jax.vmap` gives PureJaxRL). So:

- inputs [K, N, ...] -> outputs [K, N, ...] (tuples and dicts of outputs too); member i sees exactly its own slice;
- member i's `state_dict` is the plain module's (`member_state_dict(i)`: the module's own keys and shapes), so
  `MyNet(...).load_state_dict` takes it; `load_member_state_dict`, `keep_members_` as every ensemble;
- the loss summed over members gives member i exactly its own gradient (vmap adds nothing across members);
- random ops (dropout) draw per member (`randomness="different"`): in distribution, not bitwise, as the K = 1 run;
- running statistics (BatchNorm) are per member: vmap updates each member's stacked buffers in place;
- K = 1 calls the module once on member 0's tensors (views: gradients and buffer updates reach the stack), without
  vmap: the plain module's kernels and random draws, so a single run is the plain module's run.

A forward that vmap cannot run (`.item()`, a Python branch on a tensor's value) is refused in one line naming the
method, at the first call (`make_ensemble` makes one on a zero input before training).
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap


class _Bound(nn.Module):
    """Calls `path` (a method or submodule of `module`, "" for `module` itself): what `functional_call` runs, so that
    a method other than forward sees the substituted tensors too."""

    def __init__(self, module: nn.Module, path: str):
        super().__init__()
        self.module = module
        self.path = path

    def forward(self, *args, **kwargs):
        target = operator.attrgetter(self.path)(self.module) if self.path else self.module
        return target(*args, **kwargs)


def _map_tensors(fn, out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return fn(out)
    if isinstance(out, tuple | list):
        return type(out)(_map_tensors(fn, o) for o in out)
    if isinstance(out, dict):
        return {k: _map_tensors(fn, v) for k, v in out.items()}
    return out


def _plain_tensor_attributes(module: nn.Module) -> dict[str, torch.Tensor]:
    """Tensors a module holds as plain attributes (neither parameters nor buffers): vmap cannot give them a member axis."""
    return {f"{path}.{name}" if path else name: value for path, sub in module.named_modules()
            for name, value in vars(sub).items() if isinstance(value, torch.Tensor)}


class StackedModule(nn.Module):
    """K modules of one class and architecture as one: [K, N, ...] -> [K, N, ...]; the interface of
    `pipeline.nets.ensemble.Ensemble` (`n_members`, `member_state_dict`, `load_member_state_dict`, `keep_members_`).

    `methods`: names of the module's methods or submodules the stacked form runs over members too (`distribution`,
    `unit`, `bounds` for an off-policy actor): `stacked.distribution(obs)` is member i's `distribution(obs[i])`.
    """

    def __init__(self, members: Sequence[nn.Module], methods: Sequence[str] = ()):
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one member")
        kind = type(members[0])
        if any(type(m) is not kind for m in members):
            raise ValueError(f"the members of a stacked module share one class; got {sorted({type(m).__name__ for m in members})}")
        shapes = {k: tuple(v.shape) for k, v in members[0].state_dict().items()}
        for m in members[1:]:
            if {k: tuple(v.shape) for k, v in m.state_dict().items()} != shapes:
                raise ValueError(f"the members of a stacked {kind.__name__} differ in their state_dict's keys or shapes: "
                                 "build every member with the same arguments")
        plain = _plain_tensor_attributes(members[0])
        for m in members[1:]:
            other = _plain_tensor_attributes(m)
            if differs := sorted(k for k, v in plain.items() if k not in other or not torch.equal(v, other[k])):
                raise ValueError(f"{kind.__name__} keeps {differs[0]} as a plain tensor attribute that differs between "
                                 "members: register it as a buffer (self.register_buffer) so each member keeps its own")
        missing = [name for name in methods if not hasattr(members[0], name)]
        if missing:
            raise ValueError(f"{kind.__name__} has no {', '.join(missing)}")
        params, buffers = stack_module_state(list(members))
        # The template: a copy of member 0 (the caller's modules stay as they were) holding the stacked tensors, each
        # at every path its plain tensor has (a tied parameter stays tied).
        template = copy.deepcopy(members[0])
        stacked = {id(p): nn.Parameter(params[n].detach(), requires_grad=p.requires_grad) for n, p in template.named_parameters()}
        stacked.update({id(b): buffers[n].detach() for n, b in template.named_buffers()})
        for name, value in [*template.named_parameters(remove_duplicate=False), *template.named_buffers(remove_duplicate=False)]:
            _set(template, name, stacked[id(value)])
        self.module = template
        self.n_members = len(members)
        self.methods = tuple(methods)
        # One caller per declared path, made here: under torch.compile a caller made on first use is a guard that fails
        # on the next call.
        self._callers = {path: _Bound(self.module, path) for path in ("", *self.methods)}
        self._paths = self._tensor_paths()
        self.train(members[0].training)

    # ---- running the members --------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        return self.call("", *args, **kwargs)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            # Declared methods only: a name the stacked form cannot run over members must not resolve to the template's.
            if name in self.__dict__.get("methods", ()):
                return lambda *args, **kwargs: self.call(name, *args, **kwargs)
            raise

    def call(self, path: str, *args, **kwargs):
        """`path` (a method or submodule of the module; "" for forward) of every member on its slice of each tensor
        argument [K, ...]; other arguments go to every member as they are."""
        caller = self._callers.get(path)
        if caller is None:
            caller = self._callers[path] = _Bound(self.module, path)
        # Every path of every tensor (a tied one under each of its names), so functional_call need not untie them
        # itself (tie_weights=False): that search was ~1/3 of a K = 16 MLP forward's overhead.
        names, owners = self._paths
        tensors = [getattr(owner, attr) for owner, attr in owners]
        # The member count from a tensor, not `n_members`: under torch.compile an int attribute is a constant of the
        # graph (every shrink would compile anew), a tensor's size a symbol.
        sized = tensors or [a for a in args if isinstance(a, torch.Tensor)]
        if (sized[0].shape[0] if sized else self.n_members) == 1:
            one = dict(zip(names, [t[0] for t in tensors]))
            sliced = [a[0] if isinstance(a, torch.Tensor) else a for a in args]
            return _map_tensors(lambda t: t.unsqueeze(0), functional_call(caller, one, tuple(sliced), kwargs, tie_weights=False))

        def member(ts, *a):
            return functional_call(caller, dict(zip(names, ts)), a, kwargs, tie_weights=False)

        in_dims = (0, *(0 if isinstance(a, torch.Tensor) else None for a in args))
        try:
            return vmap(member, in_dims=in_dims, randomness="different")(tensors, *args)
        except RuntimeError as exc:
            if "vmap" not in str(exc):
                raise
            line = str(exc).strip().splitlines()[0]
            name = f"{type(self.module).__name__}.{path or 'forward'}"
            raise RuntimeError(f"{name} cannot run as {len(tensors[0]) if tensors else 'several'} members under torch.func.vmap ({line}); write it "
                               "without .item() or Python branches on tensor values, or set seeds_per_process=1") from None

    def _tensor_paths(self) -> tuple[list[str], list[tuple[nn.Module, str]]]:
        """The name (from `_Bound`) and (owner module, attribute) of every parameter and buffer path, found once: the
        owners are kept, not the tensors, so a replaced tensor (`keep_members_`, a buffer moved by `.to`) is read anew."""
        entries = [*self.module.named_parameters(remove_duplicate=False), *self.module.named_buffers(remove_duplicate=False)]
        owners = []
        for name, _ in entries:
            path, _, attr = name.rpartition(".")
            owners.append((self.module.get_submodule(path) if path else self.module, attr))
        return ["module." + name for name, _ in entries], owners

    # ---- members in and out as the plain module's state_dict ----------------------------------------
    def stacked(self, name: str) -> torch.Tensor:
        """The members' stacked tensor [K, *shape] of the plain module's parameter or buffer `name`."""
        try:
            return self.module.get_parameter(name)
        except AttributeError:
            return self.module.get_buffer(name)

    def member_state_dict(self, i: int) -> dict[str, torch.Tensor]:
        """Member i as the plain module's state_dict (its keys, its shapes)."""
        return {k: v[i].detach().clone() for k, v in self.module.state_dict().items()}

    @torch.no_grad()
    def load_member_state_dict(self, i: int, state: dict[str, torch.Tensor]) -> None:
        """Member i from the plain module's state_dict (strict: every key used, none missing)."""
        own = self.module.state_dict(keep_vars=True)
        if set(state) != set(own):
            wrong = sorted(set(state) ^ set(own))
            raise ValueError(f"{type(self.module).__name__}: the state_dict's keys {wrong} do not fit this model: "
                             "is it from another model?")
        for k, v in own.items():
            if tuple(state[k].shape) != tuple(v.shape[1:]):
                raise ValueError(f"{type(self.module).__name__}: {k!r} has shape {tuple(state[k].shape)}, expected {tuple(v.shape[1:])}")
            v[i].copy_(state[k])

    def keep_members_(self, members: torch.Tensor) -> list[tuple[nn.Parameter, nn.Parameter]]:
        """Keep only `members` (indices), in that order; returns the (old, new) parameter pairs for
        `keep_optimizer_members_`."""
        pairs: dict[int, tuple[nn.Parameter, nn.Parameter]] = {}
        for name, old in list(self.module.named_parameters(remove_duplicate=False)):
            if id(old) not in pairs:  # a tied parameter is replaced once and stays tied
                new = nn.Parameter(old.detach().index_select(0, members.to(old.device)), requires_grad=old.requires_grad)
                pairs[id(old)] = (old, new)
            _set(self.module, name, pairs[id(old)][1])
        for name, old in list(self.module.named_buffers(remove_duplicate=False)):
            _set(self.module, name, old.index_select(0, members.to(old.device)))
        self.n_members = int(members.numel())
        return list(pairs.values())

    def extra_repr(self) -> str:
        return f"n_members={self.n_members}"


class _LogStdView:
    """What `net.log_std.value` reads for PPO: the members' log-stds [K, 1, D], broadcasting against means [K, N, D]."""

    def __init__(self, value: torch.Tensor):
        self.value = value


class StackedActorCritic(StackedModule):
    """A stacked actor-critic for PPO: forward [K, N, ...] -> (policy parameters [K, N, A], values [K, N]); a
    continuous one's state-independent log-std (the module's parameter `log_std.value`, [D]) reads as
    `log_std.value` [K, 1, D], as `EnsembleActorCritic`'s does."""

    @property
    def log_std(self) -> _LogStdView | None:
        try:
            value = self.stacked("log_std.value")
        except AttributeError:
            return None
        return _LogStdView(value.unsqueeze(1))


def _set(root: nn.Module, name: str, value: torch.Tensor) -> None:
    """Put `value` at the dotted path `name` (a parameter or buffer of a submodule): setattr keeps a buffer's
    persistence and a parameter's registration."""
    path, _, attr = name.rpartition(".")
    setattr(root.get_submodule(path) if path else root, attr, value)


Shapes = tuple | list | str


def output_shapes(net: nn.Module, in_shape: Sequence[int], method: str = "", n: int = 3) -> Shapes:
    """What one member of `net` (a stacked module or ensemble over K members) returns for a zero input [n, *in_shape]:
    its outputs' shapes with the member axis dropped and the batch axis written "N" (a list of them for a tuple of
    outputs; a type's name for anything else). Run in eval mode without gradients; the net's mode and the global RNG
    are left as they were."""
    first = next(iter([*net.parameters(), *net.buffers()]), None)
    K = int(net.n_members)
    x = torch.zeros(K, n, *in_shape, device=None if first is None else first.device)
    was = net.training
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        net.eval()
        try:
            out = (getattr(net, method) if method else net)(x)
        finally:
            net.train(was)
    return _shapes(out, K, n)


def _shapes(out: Any, K: int, n: int) -> Shapes:
    if isinstance(out, tuple | list):
        return [_shapes(o, K, n) for o in out]
    if not isinstance(out, torch.Tensor):
        return type(out).__name__
    shape = tuple(out.shape)
    if shape[:1] != (K,):
        return f"shape {list(shape)} without the member axis"
    return tuple("N" if i == 0 and d == n else d for i, d in enumerate(shape[1:]))


def shapes_text(shapes: Shapes) -> str:
    """`output_shapes` in words: "[N, 2]", "([N, 2], [N])"."""
    if isinstance(shapes, str):
        return shapes
    if isinstance(shapes, list):
        return "(" + ", ".join(shapes_text(s) for s in shapes) + ")"
    return "[" + ", ".join(str(d) for d in shapes) + "]"


def check_outputs(net: nn.Module, task: str, duty: str, in_shape: Sequence[int], want: Shapes, method: str = "") -> None:
    """Refuse, in one line, a stacked module whose `method` (forward when "") does not return `want` (`output_shapes`'s
    form) for inputs [N, *in_shape]; `duty` says what the task needs (a `ModelContract.describe()`). Our own
    ensembles are not probed: they meet their tasks' contracts by construction."""
    if not isinstance(net, StackedModule):
        return
    got = output_shapes(net, in_shape, method)
    if got != want:
        given = shapes_text(("N", *in_shape))
        raise ValueError(f"task={task} needs {duty}; {type(net.module).__name__}.{method or 'forward'}(x {given}) returned "
                         f"{shapes_text(got)}, expected {shapes_text(want)}")

"""Export a trained run's network: `python -m pipeline.export <run dir> [format=torchscript|onnx] [out=<file or dir>] [n=64]
[weights=model|best]`.

- An RL run (DQN, PPO, SAC, TD3, CEM, or an algorithm of your own): the deterministic act of the policy its task
  declares (`pipeline.rl.policies`), observations [N, *shape] -> actions ([N] for discrete actions, [N, D] within
  the bounds for continuous ones), its agent files included (a PPO run's observation statistics). What
  `pipeline.load(run).act(obs)`, `python -m pipeline.eval` and the run's own evaluations play.
- A supervised run: its network, inputs [N, in_features] -> outputs (logits).
- A GAN run: its generator, noise [N, latent_dim] -> images.

format=torchscript (the default) writes `<run dir>/policy.torchscript.pt` (RL) or `model.torchscript.pt`:
`torch.jit.load(path)` runs it without this package. format=onnx writes `policy.onnx` or `model.onnx` (one input,
batch size free), which onnxruntime runs without torch; it needs `pip install -e '.[onnx]'`. weights=best
exports the run's best-evaluated weights (best.pt, kept when the run was asked to keep them): `policy.best.onnx`, ...

Every file is self-contained (an ONNX file holds its weights: no `.data` file beside it); its sha256 is written
beside it (`<file>.sha256`, as for every file the pipeline writes), which a user may copy or leave. `out=<dir>` writes the
file under that name into the dir. Before it says done, the written file is copied alone into an empty temporary
folder, loaded from there (by torch, or by onnxruntime) and checked against the run's own network on `n` inputs: observations the policy meets in its env (start states it never trained on), the
data's test split, or noise. Outputs must agree within a bound on float32 rounding computed for these inputs
(`float32_error_bound`); discrete actions must be the same, except at a near-tie within that bound.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

from pipeline.eval import writable
from pipeline.runtime.replay import REPLAY_SEED_OFFSET, EvalError
from pipeline.store.atomic import StoreWriteError, write_error
from pipeline.store.integrity import save_verified

USAGE = "usage: python -m pipeline.export <run dir> [format=torchscript|onnx] [out=<file or dir>] [n=64] [weights=model|best]"
FORMATS = {"torchscript": ".torchscript.pt", "onnx": ".onnx"}
ONNX_PACKAGES = ("onnx", "onnxruntime", "onnxscript")  # torch.onnx's exporter needs onnx and onnxscript
# float32's unit roundoff: the largest relative error of one correctly rounded operation.
U = 2.0 ** -24


def env_observations(agent, n: int):
    """`n` observations the agent's own deterministic policy meets in its env, from start states it never trained
    on (seed + 30,000, ...): a batch [n, *shape] as the env gives them."""
    import numpy as np

    from pipeline.runtime.replay import run_env

    env = run_env(agent.config)
    seen = []
    try:
        episode = 0
        obs, _ = env.reset(seed=agent.seed + REPLAY_SEED_OFFSET)
        while len(seen) < n:
            seen.append(np.asarray(obs))
            obs, _, terminated, truncated, _ = env.step(agent.act(obs))
            if terminated or truncated:
                episode += 1
                obs, _ = env.reset(seed=agent.seed + REPLAY_SEED_OFFSET + episode)
    finally:
        env.close()
    return np.stack(seen)


def module_and_inputs(loaded, n: int):
    """What to export from a loaded run, `n` inputs to trace and check it on, and the module's real-valued output
    before any argmax or clip (the values the check bounds): (module, inputs, values of inputs, file stem)."""
    import torch
    from hydra.utils import instantiate

    from pipeline.api import Agent

    if isinstance(loaded, Agent):
        # The run's declared policy: its forward is the deterministic action, `outputs` what that is read from.
        return loaded.policy, torch.as_tensor(env_observations(loaded, n)), loaded.policy.outputs, "policy"
    model = loaded.model
    device = next(model.parameters()).device
    if loaded.task == "GANTask":  # its generator (nets/gan.py), from noise
        generator = torch.Generator().manual_seed(loaded.seed)
        noise = torch.randn(n, model.generator.latent_dim, generator=generator).to(device)
        return model.generator, noise, model.generator, "model"
    data = instantiate(loaded.config.data)
    data.setup("test")
    inputs = torch.cat([x for x, _ in data.test_dataloader()])[:n]
    return model, inputs.to(device), model, "model"


def float32_error_bound(module, values, inputs):
    """`values(inputs)` (a function of `module`'s layers) and, per element, a bound on how far two float32
    evaluations of it (torch's, and another runtime's with its own kernels and summation order) can be apart:
    twice a first-order bound on one evaluation's rounding error.

    One evaluation, with u = 2^-24 (float32's unit roundoff): a layer with weights (Linear, Conv, ...) summing d
    products per output computes, in any order, the exact sum of products each perturbed by at most (d + 2) u
    relative (d + 1 roundings of the products, the bias and the sum, 1 of its input): an error of at most
    (d + 2) u (|W| |h| + |b|) per output, which is the layer run with |weights| on |input|. BatchNorm at eval,
    (x - mean) w / sqrt(var + eps) + b, errs by at most 4 u ((|x| + |mean|) |w| / sqrt(var + eps) + |b|). An
    elementwise layer (activations, bounds) errs by at most 8 u (|out| + 1): onnxruntime's tanh is within 5.5 u
    absolute, its sigmoid 2.6 u, GELU 7.5 u (measured over [-12, 12] against float64). Each layer's error reaches
    an output times |d output / d layer output| (autograd); what runs outside layers (observation statistics, a
    final tanh or clip) adds 16 u (|out| + 1). A worst-case bound: real differences are far smaller.
    """
    import torch
    from torch import nn
    from torch.func import functional_call

    taken, inside = [], []

    def hook(module, args, out):
        if inside or not (args and torch.is_tensor(args[0]) and torch.is_tensor(out) and out.is_floating_point()):
            return
        h = args[0]
        params = dict(module.named_parameters(recurse=False))
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.running_var is not None and not module.training:
            shape = (1, -1) + (1,) * (h.dim() - 2)  # per channel (dim 1)
            scale = (module.weight.detach().abs() if module.weight is not None else 1.0) / torch.sqrt(module.running_var + module.eps)
            magnitude = (h.detach().abs() + module.running_mean.abs().view(shape)) * scale.view(shape)
            if module.bias is not None:
                magnitude = magnitude + module.bias.detach().abs().view(shape)
            magnitude = magnitude * (4 * U)
        elif params and h.is_floating_point():
            d = max((p.numel() // min(p.shape[:2]) for p in params.values() if p.dim() >= 2), default=1)  # >= fan-in
            state = {name: t.detach().abs() for name, t in [*params.items(), *module.named_buffers(recurse=False)]}
            with torch.no_grad():
                inside.append(module)  # the layer run on magnitudes is not one more layer of the network
                magnitude = functional_call(module, state, (h.detach().abs(),)) * ((d + 2) * U)
                inside.clear()
        else:
            magnitude = (out.detach().abs() + 1.0) * (8 * U)
        if out.requires_grad:
            taken.append((out, magnitude))

    leaves = [m for m in module.modules() if not list(m.children())]
    handles = [m.register_forward_hook(hook) for m in leaves]
    try:
        with torch.enable_grad():
            # Float inputs take part, so what runs on them before the first weights (a flatten) is a layer too.
            y = values(inputs.detach().requires_grad_() if inputs.is_floating_point() else inputs)
            flat = y.reshape(len(y), -1)
            bound = (flat.detach().abs() + 1.0) * (16 * U)  # [N, outputs per sample]
            outs = [out for out, _ in taken]
            for j in range(flat.shape[1]):  # samples are independent: d y[n, j] / d out[m] is 0 for m != n
                grads = torch.autograd.grad(flat[:, j].sum(), outs, retain_graph=True, allow_unused=True)
                for g, (_, magnitude) in zip(grads, taken):
                    if g is not None:
                        bound[:, j] += (g.abs() * magnitude).reshape(len(y), -1).sum(dim=1)
    finally:
        for h in handles:
            h.remove()
    return y.detach(), 2 * bound.reshape(y.shape)


def check_onnx_installed() -> None:
    """One line naming what format=onnx lacks (a package that is absent, or that does not import)."""
    missing = []
    for name in ONNX_PACKAGES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise EvalError(f"format=onnx needs {', '.join(missing)}, not installed: pip install -e '.[onnx]'")


def _write_torchscript(module, inputs, out: Path) -> None:
    import torch

    with torch.no_grad(), warnings.catch_warnings():
        # A size-dependent branch (nets' fast tanh above 8,192 values) is recorded as taken for these inputs: either
        # branch computes the same function, which the check confirms on these inputs.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(module, inputs, check_trace=False)
    traced.save(str(out))


def _run_torchscript(path: Path, inputs):
    import torch

    exported = torch.jit.load(str(path), map_location=inputs.device)
    with torch.inference_mode():
        return exported(inputs)


def write_onnx(module, inputs, out: Path, names: tuple[str, str]) -> None:
    import torch

    batch = torch.export.Dim("batch")
    quiet = logging.getLogger("torch.onnx")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # its exporter warns of each torchvision op it cannot register
    try:
        with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
            warnings.simplefilter("ignore")  # the exporter's deprecation notes of torch internals
            # external_data=False: the weights inside the file (its default writes them to `<file>.data` beside it).
            torch.onnx.export(module, (inputs,), str(out), dynamo=True, input_names=[names[0]], output_names=[names[1]],
                              dynamic_shapes=({0: batch},), verbose=False, external_data=False)
    finally:
        quiet.setLevel(level)


def _run_onnx(path: Path, inputs, input_name: str):
    import numpy as np
    import onnxruntime
    import torch

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    [got] = session.run(None, {input_name: inputs.cpu().numpy()})
    return torch.from_numpy(np.asarray(got))


def run_alone(path: Path, name: str, run):
    """`run(copy)` on a copy of the file `path` alone in an empty temporary folder, as a user who copies only that
    file gets it: a file that needs anything beside it fails here, not on their machine."""
    with tempfile.TemporaryDirectory(prefix="pipeline-export-check-") as folder:
        copy = Path(folder) / name
        shutil.copyfile(path, copy)
        try:
            return run(copy)
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise EvalError(f"{name}: the exported file does not load on its own (copied alone to another folder): {first}") from None


def check_writable(run_dir: Path, out: Path | None) -> None:
    """Refused before the run is loaded, in one line with the fix: a folder the file cannot be written into."""
    folder = Path(run_dir) if out is None else Path(out) if Path(out).is_dir() else Path(out).parent
    if Path(run_dir).is_dir() and not writable(folder):
        fix = "write it elsewhere with out=<file or dir>" if out is None else "choose a folder you can write"
        raise EvalError(f"cannot write into {folder}: the folder is not writable; {fix}")


def export(run_dir: Path, out: Path | None = None, n: int = 64, format: str = "torchscript", weights: str = "model") -> dict:
    """Write the run's network (see the module's docstring), load it back and compare it with the network on the
    same inputs. Returns what was written and checked; a mismatch raises EvalError."""
    if format not in FORMATS:
        raise EvalError(f"format={format}: choose {' or '.join(FORMATS)}")
    if format == "onnx":
        check_onnx_installed()
    check_writable(run_dir, out)
    import torch

    from pipeline.api import Agent, load

    loaded = load(run_dir, weights=weights)
    module, inputs, values, stem = module_and_inputs(loaded, n)
    module.eval()
    name = f"{stem}{'.best' if weights == 'best' else ''}{FORMATS[format]}"
    out = Path(run_dir) / name if out is None else Path(out) / name if Path(out).is_dir() else Path(out)
    with torch.inference_mode():
        expected = module(inputs)
    # Made and checked in a temporary folder; only a file that passed is stored, with its digest beside it.
    with tempfile.TemporaryDirectory(prefix="pipeline-export-") as folder:
        written = Path(folder) / out.name
        if format == "onnx":
            io_names = (("obs", "action") if isinstance(loaded, Agent) else ("noise", "images") if loaded.task == "GANTask"
                        else ("input", "output"))
            write_onnx(module, inputs, written, io_names)
            got = run_alone(written, out.name, lambda copy: _run_onnx(copy, inputs, io_names[0]))
        else:
            _write_torchscript(module, inputs, written)
            got = run_alone(written, out.name, lambda copy: _run_torchscript(copy, inputs))
        check = compare(out, got.to(expected.device), expected, module, values, inputs)
        try:
            save_verified(out, lambda f: f.write(written.read_bytes()))
        except OSError as exc:  # a disk that fills, a folder made read-only meanwhile: one line naming the file
            raise EvalError(str(exc if isinstance(exc, StoreWriteError) else write_error(out, exc))) from None
    kind = "policy" if isinstance(loaded, Agent) else "model"
    return {"run_dir": str(run_dir), "path": str(out), "format": format, "weights": weights, "exported": kind,
            "check": {"inputs": int(len(inputs)), "input_shape": list(inputs.shape[1:]),
                      "output_shape": list(expected.shape[1:]), **check}}


def compare(out: Path, got, expected, module, values, inputs) -> dict:
    """The exported file's outputs `got` against the network's `expected` on the same inputs, within the float32
    rounding bound of `values` (the real-valued outputs before an argmax or clip, which cannot widen a difference)."""

    if got.shape != expected.shape or got.dtype != expected.dtype:
        raise EvalError(f"{out}: the exported module gives {got.dtype} {tuple(got.shape)}, the network "
                        f"{expected.dtype} {tuple(expected.shape)}")
    reference, bound = float32_error_bound(module, values, inputs)
    if not expected.is_floating_point():  # discrete actions: the argmax of `reference`
        other = got != expected
        chosen = reference.gather(1, got.unsqueeze(1)).squeeze(1)
        top = reference.gather(1, expected.unsqueeze(1)).squeeze(1)
        tie = (top - chosen) <= (bound.gather(1, expected.unsqueeze(1)) + bound.gather(1, got.unsqueeze(1))).squeeze(1)
        if bool((other & ~tie).any()):
            raise EvalError(f"{out}: the exported policy chose other actions on {int((other & ~tie).sum())} of "
                            f"{len(got)} observations, not near-ties")
        return {"same_actions": int((~other).sum()), "near_ties": int(other.sum())}
    diff = (got.float() - expected.float()).abs()
    allowed = bound.reshape(diff.shape)  # a clipped action differs no more than the values it clips (1-Lipschitz)
    if bool((diff > allowed).any()):
        worst = int((diff - allowed).flatten().argmax())
        raise EvalError(f"{out}: the exported module differs from the network by {float(diff.flatten()[worst]):.3g} "
                        f"where float32 rounding allows {float(allowed.flatten()[worst]):.3g}")
    return {"max_abs_diff": float(diff.max()) if diff.numel() else 0.0, "max_bound": float(allowed.max()) if diff.numel() else 0.0}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(f"{USAGE}\n\n{__doc__.strip()}")
        return 0
    try:
        options = parse_args(argv)
        result = export(**options)
    except EvalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    check = result["check"]
    if "same_actions" in check:
        ties = f" (the other {check['near_ties']}: near-ties within float32 rounding)" if check["near_ties"] else ""
        agreed = f"the same actions on {check['same_actions']} of {check['inputs']} observations{ties}"
    else:
        agreed = (f"max |difference| {check['max_abs_diff']:.3g} on {check['inputs']} inputs "
                  f"(float32 rounding allows {check['max_bound']:.3g})")
    shape_in, shape_out = (", ".join(["N", *map(str, check[k])]) for k in ("input_shape", "output_shape"))
    runtime = "onnxruntime" if result["format"] == "onnx" else "torch"
    label = {"onnx": "ONNX", "torchscript": "TorchScript"}[result["format"]]
    print(f"wrote {result['path']} ({label} {result['exported']}: [{shape_in}] -> [{shape_out}]); "
          f"loaded back by {runtime}: {agreed}")
    return 0


def parse_args(argv: list[str]) -> dict:
    """The command line as export()'s arguments; anything else is one line naming it."""
    flag = next((i for i, a in enumerate(argv) if a.startswith("-")), None)
    if flag is not None:  # `--format onnx` or `--format=onnx`: say what it is written as here
        key, _, value = argv[flag].lstrip("-").partition("=")
        value = value or (argv[flag + 1] if flag + 1 < len(argv) and not argv[flag + 1].startswith("-") else "...")
        raise EvalError(f"{argv[flag]}: options are key=value, e.g. {key}={value}; {USAGE}")
    # A run dir may hold "=" (a sweep job's dir is named after its overrides): an existing dir is the run dir.
    paths = [a for a in argv if "=" not in a or Path(a).is_dir()]
    if len(paths) != 1:
        raise EvalError(f"expected one run dir, got {len(paths)}; {USAGE}")
    options: dict = {"run_dir": Path(paths[0])}
    for item in (a for a in argv if a not in paths):
        key, value = item.split("=", 1)
        if key == "out" and value:
            options["out"] = Path(value)  # a file, or an existing dir to write the file into under its usual name
        elif key == "n" and value.isdigit() and int(value) >= 1:
            options["n"] = int(value)
        elif key == "format" and value in FORMATS:
            options["format"] = value
        elif key == "weights" and value in ("model", "best"):
            options["weights"] = value
        else:
            choices = {"n": "a whole number >= 1", "format": "torchscript or onnx", "weights": "model or best", "out": "a file or a dir"}
            raise EvalError(f"{item}: {f'{key}= takes {choices[key]}' if key in choices else 'unknown option'}; {USAGE}")
    if options.get("format") == "onnx":
        check_onnx_installed()  # before the run is loaded
    return options


if __name__ == "__main__":
    sys.exit(main())

"""Export a trained run's network as TorchScript: `python -m pipeline.export <run dir> [out=<file>] [n=64]`.

- An RL run (DQN, PPO, CEM): its deterministic policy, observations [N, *shape] -> actions ([N] for discrete
  actions, [N, D] clipped to the bounds for continuous ones), observation statistics included (a PPO run with
  task.normalize_obs). What `pipeline.load(run).act(obs)` and `python -m pipeline.eval` play.
- A supervised run: its network, inputs [N, in_features] -> outputs (logits).
- A GAN run: its generator, noise [N, latent_dim] -> images.

Written to `<run dir>/policy.torchscript.pt` (RL) or `model.torchscript.pt`; `torch.jit.load(path)` runs it
without this package. Before it says done, the file is loaded back and checked against the run's own network on
`n` inputs: observations the policy meets in its env (start states it never trained on), the data's test split,
or noise.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

from pipeline.runtime.replay import REPLAY_SEED_OFFSET, EvalError

USAGE = "usage: python -m pipeline.export <run dir> [out=<file>] [n=64]"


def env_observations(agent, n: int):
    """`n` observations the agent's own deterministic policy meets in its env, from start states it never trained
    on (seed + 30,000, ...): a batch [n, *shape] as the env gives them."""
    import numpy as np

    from pipeline.rl.envs import make_env
    from pipeline.runtime.replay import env_of

    env_id, kwargs = env_of(agent.config)
    env = make_env(env_id, **kwargs)
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
    """What to export from a loaded run and `n` inputs to trace and check it on: (module, inputs, file name)."""
    import torch
    from hydra.utils import instantiate

    from pipeline.api import Agent

    if isinstance(loaded, Agent):
        return loaded.policy, torch.as_tensor(env_observations(loaded, n)), "policy.torchscript.pt"
    model = loaded.model
    device = next(model.parameters()).device
    if loaded.task == "GANTask":  # its generator (nets/gan.py), from noise
        generator = torch.Generator().manual_seed(loaded.seed)
        return model.generator, torch.randn(n, model.generator.latent_dim, generator=generator).to(device), "model.torchscript.pt"
    data = instantiate(loaded.config.data)
    data.setup("test")
    inputs = torch.cat([x for x, _ in data.test_dataloader()])[:n]
    return model, inputs.to(device), "model.torchscript.pt"


def export(run_dir: Path, out: Path | None = None, n: int = 64) -> dict:
    """Trace the run's network (see the module's docstring), save it, load it back and compare it with the network
    on the same inputs. Returns what was written and checked; a mismatch raises EvalError."""
    import torch

    from pipeline.api import Agent, load

    loaded = load(run_dir)
    module, inputs, name = module_and_inputs(loaded, n)
    module.eval()
    out = Path(out) if out is not None else Path(run_dir) / name
    with torch.inference_mode():
        expected = module(inputs)
    with torch.no_grad(), warnings.catch_warnings():
        # A size-dependent branch (nets' fast tanh above 8,192 values) is recorded as taken for these inputs: either
        # branch computes the same function, which the check below confirms on these inputs.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(module, inputs, check_trace=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    traced.save(str(out))
    exported = torch.jit.load(str(out), map_location=inputs.device)
    with torch.inference_mode():
        got = exported(inputs)
    if got.shape != expected.shape:
        raise EvalError(f"{out}: the exported module gives shape {tuple(got.shape)}, the network {tuple(expected.shape)}")
    check = {"inputs": int(len(inputs)), "input_shape": list(inputs.shape[1:]), "output_shape": list(expected.shape[1:])}
    if expected.dtype in (torch.int64, torch.int32):
        same = int((got == expected).sum())
        check["same_actions"] = same
        if same != expected.numel():
            raise EvalError(f"{out}: the exported policy chose other actions on {expected.numel() - same} of "
                            f"{expected.numel()} observations")
    else:
        diff = float((got.float() - expected.float()).abs().max()) if expected.numel() else 0.0
        scale = float(expected.float().abs().max()) if expected.numel() else 0.0
        check["max_abs_diff"] = diff
        # The same float32 operations in the same order: they may differ only by rounding (a few ulps of the outputs).
        if diff > 1e-5 * max(1.0, scale):
            raise EvalError(f"{out}: the exported module differs from the network by {diff:.3g} (outputs up to {scale:.3g})")
    kind = "policy" if isinstance(loaded, Agent) else "model"
    return {"run_dir": str(run_dir), "path": str(out), "format": "torchscript", "exported": kind, "check": check}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(f"{USAGE}\n\n{__doc__.strip()}")
        return 0
    paths = [a for a in argv if "=" not in a]
    try:
        if len(paths) != 1:
            raise EvalError(f"expected one run dir, got {len(paths)}; {USAGE}")
        out, n = None, 64
        for item in (a for a in argv if "=" in a):
            key, value = item.split("=", 1)
            if key == "out":
                out = Path(value)
            elif key == "n" and value.isdigit() and int(value) >= 1:
                n = int(value)
            else:
                raise EvalError(f"{item}: {'n= takes a whole number >= 1' if key == 'n' else 'unknown option'}; {USAGE}")
        result = export(Path(paths[0]), out, n)
    except EvalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    check = result["check"]
    agreed = (f"the same actions on {check['same_actions']} observations" if "same_actions" in check
              else f"max |difference| {check['max_abs_diff']:.3g} on {check['inputs']} inputs")
    shape_in, shape_out = (", ".join(["N", *map(str, check[k])]) for k in ("input_shape", "output_shape"))
    print(f"wrote {result['path']} (TorchScript {result['exported']}: [{shape_in}] -> [{shape_out}]); loaded back: {agreed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The Python API: train from a notebook and use what a run trained, without the command line.

    import pipeline
    records = pipeline.run(experiment="ppo_cartpole", overrides=["trainer=debug"])
    agent = pipeline.load(records[0]["run_dir"])
    action = agent.act(obs, deterministic=True)

`run` goes through the same front door as `python -m pipeline` (`pipeline.runtime.start`, which the CLI wraps):
Hydra's compose API on the packaged conf/, the one start-up check (`pipeline.config.startup.check_run`: a
`ConfigError` before any run dir exists), the run dir the CLI would make (`outputs/<name>/<date>_<time>_seed<seed>/`,
`.hydra/config.yaml` in it), locked before anything is written; it returns the records.

`load` rebuilds a run's network from the run's own config and model.pt, as `python -m pipeline.eval` does:
an RL run (DQN, PPO, SAC, TD3, CEM) becomes an `Agent` acting through the policy its task declares (its agent
files, e.g. observation statistics, included), a supervised or GAN run a `TrainedModel` whose `.model` is the
plain network. A seed of a `seeds_per_process` run is
`<run dir>/seed<n>`; `load(run_dir, weights="best")` takes an RL run's best-evaluated weights (best.pt).

Light to import: torch, Lightning and gymnasium are imported when a function is called.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("pipeline")

@dataclass
class TrainedModel:
    """A supervised or GAN run's network: `model` is the plain `nn.Module` (a GAN's holds `generator` and
    `discriminator`) with model.pt's weights, in eval mode."""

    run_dir: Path
    config: Any  # the run's composed config (an omegaconf DictConfig)
    seed: int
    task: str  # its task class: "SupervisedTask" or "GANTask"
    model: Any


@dataclass
class Agent:
    """A trained RL agent: `act(obs)` as the run's evaluations played it (`deterministic=True`) or as its policy
    samples (`deterministic=False`). `policy` is the policy its task declared (`pipeline.rl.policies`, what training
    evaluations, `python -m pipeline.eval` and `python -m pipeline.export` play: `policy(obs)` is the deterministic
    action), `model` its plain network with model.pt's weights."""

    run_dir: Path
    config: Any
    seed: int
    model: Any
    policy: Any
    observation_space: Any
    action_space: Any

    def act(self, obs, deterministic: bool = True, generator=None):
        """One observation (the env's shape) -> one action (an int, or an array for a Box); a batch [N, *shape]
        -> an array of N actions. `deterministic=False` samples the policy (SAC's squashed Gaussian, TD3's exploration
        noise, PPO's categorical or Gaussian, CEM's softmax, DQN epsilon-greedy with the run's final epsilon) from
        `generator` (a `torch.Generator`, e.g. `torch.Generator().manual_seed(0)`, on the agent's device; None:
        torch's global random stream)."""
        import numpy as np
        import torch

        x = torch.as_tensor(np.asarray(obs))
        shape = tuple(self.observation_space.shape)
        single = tuple(x.shape) == shape
        if not single and tuple(x.shape[1:]) != shape:
            raise ValueError(f"an observation of shape {tuple(x.shape)}: this agent takes {shape} or a batch [N, *{shape}]")
        x = x.unsqueeze(0) if single else x
        device = next(self.policy.parameters()).device
        with torch.inference_mode():
            actions = self.policy.act(x.to(device), deterministic, generator)
        out = actions.cpu().numpy()
        if single:
            return out[0] if out.ndim > 1 else int(out[0])
        return out


def load(run_dir: str | os.PathLike, device: str = "cpu", weights: str = "model") -> Agent | TrainedModel:
    """The trained run in `run_dir` (a `seed<n>` dir for one seed of a batched run): an `Agent` for an RL run, a
    `TrainedModel` for a supervised or GAN run. `weights="best"`: the best-evaluated weights an RL run kept
    (best.pt, task.keep_best=true) instead of model.pt's. Errors name the problem in one line
    (`pipeline.runtime.replay.EvalError`)."""
    from omegaconf import OmegaConf

    from pipeline.eval import best_weights
    from pipeline.runtime.replay import EvalError, find_config, has_env
    from pipeline.store.layout import BEST, MODEL

    if weights not in ("model", "best"):
        raise EvalError(f"weights={weights!r}: choose 'model' ({MODEL}, the weights at the end of training) or 'best' "
                        f"({BEST}, an RL run's best-evaluated weights)")
    _check_device(device)
    run_dir = Path(run_dir)
    cfg, seed = find_config(run_dir)
    state = best_weights(cfg, run_dir) if weights == "best" else None  # pipeline.eval's, shared with weights=best there
    if has_env(cfg):
        return _load_agent(cfg, run_dir, seed, device, state)
    task = str(OmegaConf.select(cfg, "task._target_", default="")).rsplit(".", 1)[-1]
    return TrainedModel(run_dir=run_dir, config=cfg, seed=seed, task=task, model=_load_model(cfg, task, run_dir, device, state))


def _check_device(device) -> None:
    """A device torch cannot name, or one this machine lacks: one line (EvalError), not torch's AssertionError."""
    import torch

    from pipeline.runtime.replay import EvalError

    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError) as exc:
        raise EvalError(f"device={device!r} is not a torch device ({str(exc).splitlines()[0][:80]}); e.g. device='cpu'") from None
    if (kind == "cuda" and not torch.cuda.is_available()) or (kind == "mps" and not torch.backends.mps.is_available()):
        raise EvalError(f"device={device!r}: torch sees no {kind.upper()} device on this machine; load with device='cpu'")


def _load_agent(cfg, run_dir: Path, seed: int, device: str, state: dict | None = None) -> Agent:
    from pipeline.runtime.replay import load_policy, run_env
    from pipeline.store.layout import best_path

    env = run_env(cfg)
    observation_space, action_space = env.observation_space, env.action_space
    env.close()
    policy = load_policy(cfg, run_dir, observation_space, action_space, device, state,
                         source=None if state is None else best_path(run_dir))
    return Agent(run_dir=run_dir, config=cfg, seed=seed, model=policy.net, policy=policy,
                 observation_space=observation_space, action_space=action_space)


def _load_model(cfg, task: str, run_dir: Path, device: str, state: dict | None = None):
    """The plain network of a run without an env, sized from its data module as its task sized it."""
    from hydra.utils import instantiate

    from pipeline.runtime.replay import EvalError
    from pipeline.store.checkpoint import CheckpointError, load_model
    from pipeline.store.layout import model_path

    data = instantiate(cfg.data)
    factory = instantiate(cfg.model)
    if task == "GANTask":
        model = factory(image_shape=tuple(data.image_shape))
    elif task == "SupervisedTask":
        from pipeline.nets.factory import make_net
        from pipeline.tasks.supervised import target_kind

        out_features = 1 if target_kind(instantiate(cfg.loss)) == "regression" else int(data.n_classes)
        model = make_net(factory, int(data.in_features), out_features)
    else:
        raise EvalError(f"this run ({task}) has no environment: pipeline.load loads RL agents and supervised and GAN models")
    try:
        model.load_state_dict(load_model(run_dir) if state is None else state)
    except CheckpointError as exc:
        raise EvalError(str(exc)) from None
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise EvalError(f"{model_path(run_dir)} does not fit the run's model config ({cfg.model._target_}): {first}") from None
    return model.to(device).eval()


def overrides_of(overrides: Mapping[str, Any]) -> list[str]:
    """`{"task.total_steps": 5000, "model.hidden": [64, 64], "env.id": "ALE/Pong-v5"}` as the command line's
    overrides (`task.total_steps=5000 model.hidden=[64,64] env.id=ALE/Pong-v5`); a string Hydra would not read
    as one value is quoted."""
    from pipeline.tune.space import format_value

    def text(value: Any) -> str:
        if isinstance(value, str):
            plain = re.fullmatch(r"[\w./~+:@%-]+", value) is not None
            # Hydra's quoted strings: a backslash escapes only before a quote or at the end.
            escaped = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, value).replace("'", "\\'")
            return value if plain else f"'{escaped}'"
        return format_value(value)

    return [f"{key}={text(value)}" for key, value in overrides.items()]


def run(experiment: str | None = None,
        overrides: list[str] | tuple[str, ...] | Mapping[str, Any] = ()) -> list[dict]:
    """Train one run (K agents with `seeds_per_process=K`) as `python -m pipeline experiment=<experiment> <overrides>`
    would, in this process, and return its records (one dict per seed, as result.json holds them). `overrides` is
    a list of the command line's strings (`["seed=3", "task.total_steps=5000"]`) or a dict of keys and values
    (`{"seed": 3, "task.total_steps": 5000}`).

    The command line's own start-up checks run first, before anything is written: a bad value raises
    `pipeline.config.errors.ConfigError` with the CLI's one-line message (its exit code 2), a run dir that is
    refused (a user's folder, busy, finished with another config: exit 1) raises
    `pipeline.runtime.preflight.RunRefused`. `hydra.run.dir=<dir>` chooses the dir. Sweeps (`-m`) stay on the
    command line. A run that fails while training is not an exception: its record says `failed` and why.
    """
    from pipeline.config.checks import check_group_overrides
    from pipeline.config.errors import ConfigError
    from pipeline.runtime.start import (
        ComposeFailed,
        adds_config_dirs,
        check_dirs_given,
        check_override_grammar,
        start_single_run,
        typed_lengths_win,
    )

    if isinstance(overrides, str):  # iterated, a string is its characters ("Error parsing override 't'")
        raise ConfigError(f"overrides={overrides!r}: a list of overrides, e.g. overrides={overrides.split()!r}")
    if isinstance(overrides, Mapping):
        overrides = overrides_of(overrides)
    argv = typed_lengths_win([str(o) for o in overrides])
    if any(o.startswith("-") for o in argv):
        raise ConfigError(f"{next(o for o in argv if o.startswith('-'))}: pipeline.run takes overrides only; sweeps "
                          "(-m) and Hydra's flags stay on the command line")
    if experiment is not None:
        argv = [f"experiment={experiment}", *argv]
    os.environ.setdefault("WANDB_MODE", "offline")
    check_dirs_given(argv)
    check_override_grammar(argv)
    if not adds_config_dirs(argv):
        check_group_overrides(argv)
    try:
        start = start_single_run(argv)  # also takes the run dir's lock, and pins hydra.run.dir in argv
    except ComposeFailed as exc:  # what the CLI leaves to Hydra, as one line
        raise ConfigError(str(exc)) from None
    refused = False
    try:
        return _run_in(start, argv)
    except ConfigError:
        refused = True
        raise
    finally:
        start.release(refused)


def _run_in(start, argv: list[str]) -> list[dict]:
    from omegaconf import OmegaConf

    from pipeline.runtime.context import JobContext
    from pipeline.runtime.run import run_job

    checked, run_dir = start.checked, start.run_dir
    hydra_dir = run_dir / ".hydra"
    hydra_dir.mkdir(parents=True, exist_ok=True)
    # What Hydra writes into a run dir, so `load`, `python -m pipeline.eval` and reports read this run as any other.
    OmegaConf.save(checked.cfg, hydra_dir / "config.yaml")
    OmegaConf.save(OmegaConf.create(argv), hydra_dir / "overrides.yaml")
    ctx = JobContext(run_dir=str(run_dir), overrides=argv, choices=dict(checked.choices),
                     num_threads=checked.device.num_threads)
    handler = logging.FileHandler(run_dir / "run.log")
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    log.addHandler(handler)
    # Lightning's start-up chatter ("GPU available: ...") stays out of a notebook, as the CLI's job logging keeps it out.
    chatty = [logging.getLogger(name) for name in ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda")]
    levels = [logger.level for logger in chatty]
    for logger in chatty:
        logger.setLevel(logging.WARNING)
    try:
        return run_job(checked, ctx, plan=start.plan)
    finally:
        log.removeHandler(handler)
        handler.close()
        for logger, level in zip(chatty, levels):
            logger.setLevel(level)

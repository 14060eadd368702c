"""`trainer=debug`: shrink a composed config to a run of seconds, whatever the preset asks for.

An experiment preset is merged after the trainer group, so its own `trainer.max_epochs: 60` or
`task.buffer_size: 100000` would win over conf/trainer/debug.yaml. So `apply_debug` shrinks the composed
config once, after Hydra, when the trainer option is `debug` (or a user's trainer says `debug: true`):
the trainer's values come back from the debug group, and each known task gets a few rounds, a small
replay buffer and short evaluations. Keys the user typed on the command line are left as typed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from omegaconf import DictConfig, OmegaConf, open_dict

# RL rounds (Lightning batches) of a debug run; conf/trainer/debug.yaml's limit_train_batches.
ROUNDS = 3
REPLAY_CAP = 1_000
EVAL_EPISODES = 2
# Atari games last thousands of agent steps: debug evaluations stop after this many emulator frames.
ATARI_MAX_FRAMES = 300


def _shrink(cfg: DictConfig, key: str, value, keep: set[str]) -> None:
    """Lower `key` to `value` (never raise it), unless the user set it on the command line."""
    if key in keep:
        return
    current = OmegaConf.select(cfg, key, default=None)
    if current is None or isinstance(current, bool) or not isinstance(current, int | float):
        return
    if value < current:
        OmegaConf.update(cfg, key, value, merge=False)


def _dqn(cfg: DictConfig, keep: set[str]) -> None:
    task = cfg.task
    freq = int(task.train_frequency) if "task.train_frequency" in keep else min(int(task.train_frequency), 256)
    _shrink(cfg, "task.train_frequency", freq, keep)
    steps = ROUNDS * freq
    _shrink(cfg, "task.total_steps", steps, keep)
    # Learning starts after the first round, so a debug run makes real updates.
    _shrink(cfg, "task.learning_starts", max(freq, int(task.get("batch_size", 1))), keep)
    _shrink(cfg, "task.buffer_size", max(REPLAY_CAP, steps), keep)
    _shrink(cfg, "task.gradient_steps", 4, keep)
    _shrink(cfg, "task.eps_duration", steps, keep)
    # One evaluation during training and the final one: both code paths run.
    _shrink(cfg, "task.eval_every", 2 * freq, keep)
    _shrink(cfg, "task.log_every", freq, keep)
    _shrink(cfg, "task.eval_episodes", EVAL_EPISODES, keep)
    _shrink(cfg, "task.final_eval_episodes", EVAL_EPISODES, keep)
    _shrink(cfg, "task.envs_per_agent", 2, keep)
    _short_atari_episodes(cfg, keep)


def _short_atari_episodes(cfg: DictConfig, keep: set[str]) -> None:
    env_id = str(OmegaConf.select(cfg, "env.id", default="") or "")
    key = "env.kwargs.max_episode_steps"
    if env_id.startswith("ALE/") and key not in keep and OmegaConf.select(cfg, key, default=None) is None:
        OmegaConf.update(cfg, key, ATARI_MAX_FRAMES, force_add=True)


def _cem(cfg: DictConfig, keep: set[str]) -> None:
    _shrink(cfg, "task.episodes_per_batch", 4, keep)
    _shrink(cfg, "task.max_iterations", ROUNDS, keep)
    _shrink(cfg, "task.final_eval_episodes", EVAL_EPISODES, keep)


def _gan(cfg: DictConfig, keep: set[str]) -> None:
    _shrink(cfg, "task.n_eval_samples", 64, keep)
    _shrink(cfg, "task.n_grid_samples", 16, keep)
    _shrink(cfg, "task.eval_every_n_epochs", 1, keep)
    _shrink(cfg, "task.sample_every_n_epochs", 1, keep)
    _shrink(cfg, "task.classifier.epochs", 2, keep)
    # data.n_frames stays: Atari frames are played once and cached under their count.


def _counterfactual(cfg: DictConfig, keep: set[str]) -> None:
    _shrink(cfg, "task.n_iters", 20, keep)
    _shrink(cfg, "task.point_iters", 50, keep)
    _shrink(cfg, "data.n_bids", 500, keep)


# Task class name (the last part of task._target_) -> what a debug run of it shrinks.
TASKS: dict[str, Callable[[DictConfig, set[str]], None]] = {
    "DQNTask": _dqn,
    "BatchedDQNTask": _dqn,
    "CEMTask": _cem,
    "GANTask": _gan,
    "CounterfactualTask": _counterfactual,
}


def debug_trainer() -> dict:
    """conf/trainer/debug.yaml's values, the marker left out."""
    from pipeline.config.checks import conf_root

    values = OmegaConf.to_container(OmegaConf.load(conf_root() / "trainer" / "debug.yaml"))
    values.pop("debug", None)
    return values


def _hydra_node(cfg: DictConfig, key: str):
    """`hydra.<key>` from the config itself (compose(return_hydra_config=True)) or from the running Hydra app."""
    if OmegaConf.select(cfg, "hydra") is not None:
        return OmegaConf.select(cfg, f"hydra.{key}", default=None)
    try:
        from hydra.core.hydra_config import HydraConfig

        return OmegaConf.select(HydraConfig.get(), key, default=None)
    except ValueError:  # composed outside a Hydra run (tests, notebooks)
        return None


def command_line_keys(cfg: DictConfig) -> set[str]:
    """Keys the user typed (`task.total_steps=5000`, `+env.kwargs.x=1`), from Hydra's record of this run."""
    overrides = _hydra_node(cfg, "overrides.task") or []
    return {str(item).split("=", 1)[0].lstrip("+~").strip() for item in overrides if "=" in str(item)}


def is_debug(cfg: DictConfig) -> bool:
    marker = OmegaConf.select(cfg, "trainer.debug", default=False)
    return bool(marker) or _hydra_node(cfg, "runtime.choices.trainer") == "debug"


def apply_debug(cfg: DictConfig, keep: Iterable[str] | None = None) -> DictConfig:
    """For `trainer=debug` (or `trainer.debug: true`), shrink `cfg` in place to a debug run; drop the marker.

    `keep`: keys left as they are (default: those typed on the command line of this Hydra run).
    Values are only ever lowered. Returns `cfg`.
    """
    if OmegaConf.select(cfg, "trainer") is None:
        return cfg
    debug = is_debug(cfg)
    with open_dict(cfg):
        cfg.trainer.pop("debug", None)
        if not debug:
            return cfg
        kept = set(command_line_keys(cfg) if keep is None else keep)
        for key, value in debug_trainer().items():
            if f"trainer.{key}" not in kept:
                cfg.trainer[key] = value
        target = str(OmegaConf.select(cfg, "task._target_", default="") or "")
        shrink = TASKS.get(target.rsplit(".", 1)[-1])
        if shrink is not None:
            shrink(cfg, kept)
    return cfg

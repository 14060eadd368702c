"""Replaying a trained agent (the engine of `python -m pipeline.eval` and of `task.capture_video`).


What it does and writes: see `pipeline/eval.py`, its command line.

No Lightning here: a replay starts in about the time torch and gymnasium take to import.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from pipeline.store.layout import MODEL, OBS_NORM, RESULT, agent_seed_dirs, config_path, has_model, model_path
from pipeline.store.record import read_record

# Training uses start states from seed + 0 (training), + 10,000 (evaluations), + 20,000 (final evaluation):
# a replay's episodes start from seed + 30,000 + i, states the agent was never trained or scored on.
REPLAY_SEED_OFFSET = 30_000
log = logging.getLogger("pipeline")
VIDEO_DIR = "videos"


class EvalError(ValueError):
    """A problem the user fixes on the command line (one line, exit 2)."""


@dataclass
class Options:
    run_dir: Path
    episodes: int = 10
    video: bool = False
    device: str = "cpu"
    seed: int | None = None
    # Runs without an env (supervised, GAN): the split to score (None: the task's default) and data.<key>= overrides.
    split: str | None = None
    data: dict[str, str] = field(default_factory=dict)
    # The option names given on the command line (an option that does not apply to the run is refused).
    given: set[str] = field(default_factory=set)


def find_config(run_dir: Path) -> tuple[DictConfig, int]:
    """The run's composed config and its seed (a `seed<n>` dir of a batch: the batch's config, seed n)."""
    if not run_dir.is_dir():
        raise EvalError(f"{run_dir}: no such run dir")
    if not has_model(run_dir):
        seeds = [p.name for p in agent_seed_dirs(run_dir)]
        hint = f"it holds seeds {', '.join(seeds)}: pass one, e.g. {run_dir / seeds[0]}" if seeds else "did the run finish?"
        raise EvalError(f"{run_dir}: no {MODEL}; {hint}")
    seed_dir = re.fullmatch(r"seed(\d+)", run_dir.name)
    for where in (run_dir, run_dir.parent if seed_dir else None):
        saved = None if where is None else config_path(where)
        if saved is not None:
            cfg = OmegaConf.load(saved)
            return cfg, _run_seed(run_dir, cfg, seed_dir)
    raise EvalError(f"{run_dir}: no .hydra/config.yaml here{' or in its batch dir' if seed_dir else ''}; was it made by python -m pipeline?")


def _run_seed(run_dir: Path, cfg: DictConfig, seed_dir: re.Match | None) -> int:
    record = read_record(run_dir)
    if record is not None and isinstance(record.seed, int):
        return record.seed
    return int(seed_dir.group(1)) if seed_dir else int(cfg.get("seed", 0))


def env_of(cfg: DictConfig) -> tuple[str, dict]:
    """The run's env id and kwargs (`env_config` has its whole env group)."""
    env = env_config(cfg)
    return env["id"], env["kwargs"]


def env_config(cfg: DictConfig) -> dict:
    """The run's env group as a plain dict (`id`, `kwargs`, `imports`, `wrappers`, ...), as its training got it."""
    if not has_env(cfg):
        task = OmegaConf.select(cfg, "task._target_", default="?")
        raise EvalError(f"this run ({task}) has no environment: pipeline.eval replays reinforcement-learning agents")
    env = OmegaConf.to_container(cfg.env, resolve=True)
    return {**env, "id": str(env["id"]), "kwargs": dict(env.get("kwargs") or {})}


def run_env(cfg: DictConfig, **kwargs):
    """A fresh env of the run (`make_env` of its env group: its modules imported, its kwargs, its wrappers; `kwargs`
    on top), what replays, videos, `pipeline.load` and export play. A module that does not import here, an id it
    does not register, a wrapper that fails: one line (EvalError) naming the run's config."""
    from pipeline.rl.envs import EnvError, make_env

    try:
        return make_env(env_config(cfg), **kwargs)
    except EnvError as exc:
        raise EvalError(f"the run's env (its .hydra/config.yaml): {exc}") from None


def task_settings(cfg: DictConfig) -> dict:
    """The run's `task:` node as plain values (without `_target_`): what its policy reads (DQN's eps_end, ...)."""
    node = OmegaConf.select(cfg, "task", default=None)
    settings = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else {}
    return {k: v for k, v in settings.items() if k != "_target_"}


def policy_class(cfg: DictConfig, run_dir: Path):
    """The policy the run played (`pipeline.rl.policies`): the one its record names (`policy`, written from its task's
    declaration; no Lightning), or for a record without one the declaration of its task class (imported: Lightning)."""
    record = read_record(run_dir)
    name = record.to_dict().get("policy") if record is not None else None
    if not isinstance(name, str):
        return declared_policy(cfg)
    return _a_policy(_located(name, f"{Path(run_dir) / RESULT}: its policy {name}"), name)


def declared_policy(cfg: DictConfig):
    """The `policy` the run's task class declares (`RLTask.policy`); importing the task imports Lightning."""
    target = OmegaConf.select(cfg, "task._target_", default=None)
    cls = _located(str(target), f"task._target_={target}")
    return _a_policy(getattr(cls, "policy", None), f"{target}.policy")


def _located(name: str, what: str):
    """The object a dotted name names (pydoc.locate: its module imported); one line when it does not import here."""
    import pydoc

    try:
        found = pydoc.locate(name)
    except pydoc.ErrorDuringImport as exc:
        found, why = None, _first_line(exc.value)
    else:
        why = "no such module or attribute"
    if found is None:
        raise EvalError(f"{what} does not import here ({why}); run from the folder that holds its module")
    return found


def _a_policy(policy, name: str):
    from pipeline.rl.policies import Policy

    if not (isinstance(policy, type) and issubclass(policy, Policy)):
        raise EvalError(f"{name} is not a pipeline.rl.policies.Policy class: an RL task declares how its network acts "
                        "as policy = <a Policy class>")
    return policy


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def load_policy(cfg: DictConfig, run_dir: Path, observation_space, action_space, device="cpu", state_dict: dict | None = None,
                files: dict | None = None, source: Path | None = None, policy=None):
    """The run's policy (`policy`, else `policy_class`'s) over its plain network with model.pt's weights (or
    `state_dict`'s, read from `source`) and the agent files it acts with (beside model.pt, or `files`'s), in eval
    mode on `device`: what a replay, a video, `pipeline.load` and an export play. `policy.net` is the network."""
    policy = policy_class(cfg, run_dir) if policy is None else policy
    settings = task_settings(cfg)
    net = load_network(cfg, run_dir, policy, observation_space, action_space, state_dict, source).to(device)
    agent_files = load_agent_files(run_dir, policy.files_needed(settings), files)
    return policy(net, action_space, agent_files, settings).eval()  # its files go to the network's device


def load_agent_files(run_dir: Path, needed: dict[str, str], files: dict | None = None) -> dict:
    """The agent files a policy acts with (`needed`: {file name: why}), from `files` or beside model.pt; a missing
    or unreadable one is one line."""
    from pipeline.store.checkpoint import CheckpointError, load_safely

    found = {}
    for name, why in needed.items():
        if files is not None and name in files:
            found[name] = files[name]
            continue
        path = Path(run_dir) / name
        if not path.is_file():
            raise EvalError(f"{path}: no such file; {why} beside {MODEL} (a run saved before 2026-12-05 has them only in "
                            "its checkpoint: resume it with ckpt_path=last to write them)")
        try:
            found[name] = load_safely(path, "observation statistics" if name == OBS_NORM else "agent file")
        except CheckpointError as exc:
            raise EvalError(str(exc)) from None
    return found


def load_network(cfg: DictConfig, run_dir: Path, policy, observation_space, action_space, state_dict: dict | None = None,
                 source: Path | None = None):
    """The plain network the run's `model:` config describes, built for the env's spaces as its `policy` declares,
    with model.pt's (or `state_dict`'s, read from `source`) weights."""
    from hydra.utils import instantiate

    from pipeline.store.checkpoint import CheckpointError, load_model

    net = policy.network(instantiate(cfg.model), observation_space, action_space)
    try:
        net.load_state_dict(load_model(run_dir) if state_dict is None else state_dict)
    except CheckpointError as exc:
        raise EvalError(str(exc)) from None
    except RuntimeError as exc:
        raise EvalError(f"{source or model_path(run_dir)} does not fit the run's model config ({cfg.model._target_}): "
                        f"{_first_line(exc)}") from None
    return net


class Mp4Writer:
    """Frames to an H.264 MP4 through imageio's ffmpeg (imageio-ffmpeg bundles the binary).

    gymnasium's RecordVideo needs moviepy, which is not a dependency: we write the env's rgb_array frames
    ourselves. Frames are padded to even sizes (yuv420p needs them) instead of imageio's resize with a warning.
    """

    def __init__(self, path: Path, fps: float):
        import imageio.v2 as imageio

        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.writer = imageio.get_writer(str(path), fps=fps, codec="libx264", macro_block_size=1, quality=7)

    def add(self, frame: np.ndarray) -> None:
        h, w = frame.shape[:2]
        if h % 2 or w % 2:
            frame = np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")
        self.writer.append_data(frame)

    def close(self) -> None:
        self.writer.close()


def play(options: Options, cfg: DictConfig, run_seed: int, state_dict: dict | None = None, video_name: str = "replay",
         files: dict | None = None) -> dict:
    """Play `options.episodes` deterministic episodes of the run's policy (`load_policy`: model.pt, or `state_dict` and
    `files`: a policy during training); with `options.video`, `<run dir>/videos/<video_name>-seed<episode seed>.mp4` each."""
    import torch

    from pipeline.rl.envs import is_atari, rendering_note

    env_id, env_kwargs = env_of(cfg)
    if is_atari(env_id):
        # Scored as players score the game (as evaluate_greedy does): unclipped rewards, whole games.
        env_kwargs.update(clip_rewards=False, terminal_on_life_loss=False)
    if options.video:
        env_kwargs["render_mode"] = "rgb_array"
        # Off-screen frames need no display: without this SDL (classic-control's pygame) prints an XDG error.
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    device = torch.device(options.device)
    first = run_seed + REPLAY_SEED_OFFSET if options.seed is None else options.seed
    seeds = [first + i for i in range(options.episodes)]
    env = run_env(cfg, **env_kwargs)
    try:
        acting = load_policy(cfg, options.run_dir, env.observation_space, env.action_space, device, state_dict, files)
    except BaseException:
        env.close()
        raise

    def action_of(x):
        action = acting(x)[0]
        return int(action.item()) if acting.discrete else action.cpu().numpy()

    fps = float(env.metadata.get("render_fps") or 30) / float(env_kwargs.get("frame_skip", 1) if is_atari(env_id) else 1)
    returns, lengths, videos = [], [], []
    try:
        for seed in seeds:
            obs, _ = env.reset(seed=seed)
            writer = Mp4Writer(options.run_dir / VIDEO_DIR / f"{video_name}-seed{seed}.mp4", fps) if options.video else None
            total, steps, done = 0.0, 0, False
            try:
                while not done:
                    if writer is not None:
                        writer.add(env.render())
                    with torch.inference_mode():
                        # uint8 frames stay uint8 (the network scales them); everything else becomes float32.
                        x = torch.as_tensor(np.asarray(obs)).unsqueeze(0).to(device)
                        action = action_of(x)
                    obs, reward, terminated, truncated, _ = env.step(action)
                    total, steps, done = total + float(reward), steps + 1, terminated or truncated
                if writer is not None:
                    writer.add(env.render())
            finally:
                if writer is not None:
                    writer.close()
                    videos.append(str(writer.path))
            returns.append(total)
            lengths.append(steps)
    finally:
        env.close()
    return {
        "run_dir": str(options.run_dir), "env_id": env_id, "run_seed": run_seed, "episodes": len(returns),
        "seeds": seeds, "returns": returns, "lengths": lengths,
        "mean": float(np.mean(returns)), "std": float(np.std(returns)), "device": str(device), "videos": videos,
        **({"rendering": note} if options.video and (note := rendering_note(env)) else {}),
    }


# TensorBoard shows a video as an animated GIF in its Images tab; at most this many frames, every k-th frame
# kept (a CartPole episode of 500 steps at 600x400 stays a few MB at half size).
GIF_MAX_FRAMES = 150


def video_as_gif(path: Path | str) -> tuple[bytes, int, int]:
    """An MP4 as an animated GIF at half size (bytes, height, width), for TensorBoard's image summary."""
    import io

    import imageio.v2 as imageio

    reader = imageio.get_reader(str(path))
    fps = float(reader.get_meta_data().get("fps") or 30)
    frames = [np.asarray(f)[::2, ::2] for f in reader]
    reader.close()
    stride = max(1, -(-len(frames) // GIF_MAX_FRAMES))
    frames = frames[::stride]
    buffer = io.BytesIO()
    imageio.mimwrite(buffer, frames, format="GIF", duration=1000.0 * stride / fps, loop=0)
    return buffer.getvalue(), frames[0].shape[0], frames[0].shape[1]


def add_video_to_tensorboard(writer, tag: str, path: Path | str, step: int) -> None:
    """The MP4 into a SummaryWriter as an animated image (torch's add_video needs moviepy, not a dependency)."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    gif, height, width = video_as_gif(path)
    image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=gif)
    writer.file_writer.add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)
    writer.flush()


def training_video_hook(cfg: DictConfig, dirs: list[Path], seeds: list[int], device: str, agent_loggers: list[list]):
    """What the lifecycle gives an RL task as `video_hook`: agent `i`'s policy (its task's declaration) at env step
    `step` plays one deterministic episode (the replay engine, on a start state training never used) into
    `<dirs[i]>/videos/train-step<step>-seed<agent's seed>-env-seed<episode's env seed>.mp4`,
    logged as `video/train` at that step to agent `i`'s own TensorBoard (animated image) and W&B (video) runs,
    `agent_loggers[i]`."""

    warned: list[str] = []

    def record(agent: int, step: int, state_dict: dict, files: dict | None = None) -> None:
        options = Options(run_dir=Path(dirs[agent]), episodes=1, video=True, device=device)
        try:
            # train-step<step>-seed<agent's seed>-env-seed<episode's env seed>.mp4: both seeds, each named.
            result = play(options, cfg, int(seeds[agent]), state_dict=state_dict,
                          video_name=f"train-step{step}-seed{int(seeds[agent])}-env", files=files)
        except Exception as exc:  # a video problem must not stop the training: say it once, go on without videos
            text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            if not warned:
                log.warning(f"no training video: {text}")
            warned.append(text)
            return
        for logger in agent_loggers[agent] if agent < len(agent_loggers) else []:
            if type(logger).__name__ == "TensorBoardLogger":
                for path in result["videos"]:
                    add_video_to_tensorboard(logger.experiment, "video/train", path, step)
            elif type(logger).__name__ == "WandbLogger":
                logger.log_video("video/train", videos=result["videos"], step=step, format=["mp4"] * len(result["videos"]),
                                 caption=[f"env step {step}: return {r:.1f}" for r in result["returns"]])

    return record


def log_to_run_loggers(cfg: DictConfig, result: dict, run_dir: Path) -> list[str]:
    """The replay's numbers and videos to the loggers the run itself used; returns their names."""
    spec = OmegaConf.select(cfg, "logger", default=None) or {}
    used = []
    metrics = {"replay/return_mean": result["mean"], "replay/return_std": result["std"]}
    if "tensorboard" in spec:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(run_dir / "tensorboard" / "replay"))
        for i, value in enumerate(result["returns"]):
            writer.add_scalar("replay/return", value, i)
        for key, value in metrics.items():
            writer.add_scalar(key, value, 0)
        if result["videos"]:
            writer.add_text("replay/videos", "\n\n".join(result["videos"]), 0)
            for path in result["videos"]:
                add_video_to_tensorboard(writer, "replay/video", path, 0)
        writer.close()
        used.append("tensorboard")
    if "wandb" in spec:
        import wandb

        opts = dict(spec.get("wandb") or {})
        record = read_record(run_dir)
        group = record.group if record is not None else None
        run = wandb.init(
            project=opts.get("project", "pipeline"), entity=opts.get("entity"), group=group, job_type="replay",
            name=f"{cfg.get('name', 'run')}-seed{result['run_seed']}-replay", dir=str(Path(run_dir).resolve()),
            mode=str(opts.get("mode") or os.environ.get("WANDB_MODE") or "offline"),
            config={"run_dir": str(run_dir), "episodes": result["episodes"], "seeds": result["seeds"]},
            settings=wandb.Settings(silent=True, console="off"),
        )
        run.log({**metrics, **{f"replay/video_{i}": wandb.Video(p, format="mp4") for i, p in enumerate(result["videos"])}})
        run.summary.update(metrics)
        run.finish()
        used.append("wandb")
    return used


def has_env(cfg: DictConfig) -> bool:
    env = OmegaConf.select(cfg, "env", default=None)
    return bool(env and env.get("id"))

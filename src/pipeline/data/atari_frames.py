"""Real Atari frames for generative models: play an ALE game, keep every k-th frame, 64x64 grayscale, cached.

`prepare_data` plays the game once and writes the frames to
`<cache>/atari_frames/<game>-n<N>-seed<seed>-<policy>-k<k>-<size>px.npz`; every later run with the same
settings loads that file instead of playing. Frames are stored as uint8 and served as (1, size, size)
float32 in [-1, 1] (the generator's Tanh range).

The frames are split at random into train and held-out test frames. Keeping only every k-th agent step
(`frame_interval`, each step already 4 emulator frames) makes neighbouring kept frames differ, so a
random split is close to an i.i.d. one; a split by time would put the late-game score digits only in
the test frames.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

log = logging.getLogger(__name__)

POLICIES = ("random",)


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The pipeline's on-disk cache: `cache_dir` if given, else $PIPELINE_CACHE, else ~/.cache/pipeline."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    return Path(os.environ.get("PIPELINE_CACHE") or Path.home() / ".cache" / "pipeline")


def make_ale_env(game: str, seed: int):
    import ale_py
    import gymnasium

    from pipeline.rl.envs import quiet_ale

    quiet_ale(ale_py)
    gymnasium.register_envs(ale_py)
    env = gymnasium.make(f"ALE/{game}-v5", obs_type="grayscale")
    env.reset(seed=int(seed))
    env.action_space.seed(int(seed))
    return env


def play_frames(game: str, n_frames: int, seed: int, policy: str = "random", frame_interval: int = 4, size: int = 64) -> np.ndarray:
    """(n_frames, size, size) uint8 grayscale frames from `game` played by `policy`, one kept every `frame_interval` steps."""
    import cv2

    if policy not in POLICIES:
        raise ValueError(f"data.policy={policy!r}; choose one of {', '.join(POLICIES)}")
    env = make_ale_env(game, seed)
    rng = np.random.default_rng(seed)
    frames = np.empty((int(n_frames), int(size), int(size)), dtype=np.uint8)
    kept = step = 0
    try:
        while kept < n_frames:
            obs, _, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
            step += 1
            if step % frame_interval == 0:
                frames[kept] = cv2.resize(obs, (int(size), int(size)), interpolation=cv2.INTER_AREA)
                kept += 1
            if terminated or truncated:
                env.reset()
    finally:
        env.close()
    return frames


def to_images(frames: np.ndarray) -> torch.Tensor:
    """uint8 (N, H, W) -> float32 (N, 1, H, W) in [-1, 1]."""
    return torch.from_numpy(frames).float().div_(127.5).sub_(1.0).unsqueeze(1)


class AtariFramesDataModule(L.LightningDataModule):
    n_classes = None

    def __init__(
        self,
        game: str = "Pong",
        n_frames: int = 1000,
        policy: str = "random",
        frame_interval: int = 4,
        size: int = 64,
        test_fraction: float = 0.2,
        seed: int = 0,
        batch_size: int = 32,
        cache_dir: str | None = None,
    ):
        super().__init__()
        if policy not in POLICIES:
            raise ValueError(f"data.policy={policy!r}; choose one of {', '.join(POLICIES)}")
        if int(n_frames) < 10 or not 0 < test_fraction < 1:
            raise ValueError(f"data.n_frames={n_frames} must be at least 10 and data.test_fraction={test_fraction} in (0, 1)")
        if int(frame_interval) < 1 or int(size) < 8:
            raise ValueError(f"data.frame_interval={frame_interval} must be >= 1 and data.size={size} >= 8")
        self.game, self.n_frames, self.policy = str(game), int(n_frames), str(policy)
        self.frame_interval, self.size, self.test_fraction = int(frame_interval), int(size), float(test_fraction)
        self.seed, self.batch_size, self.cache_dir = int(seed), int(batch_size), cache_dir
        self.image_shape = (1, self.size, self.size)
        self.loaded_from_cache = False
        self.splits: dict[str, TensorDataset] = {}

    @property
    def cache_path(self) -> Path:
        name = f"{self.game}-n{self.n_frames}-seed{self.seed}-{self.policy}-k{self.frame_interval}-{self.size}px.npz"
        return cache_root(self.cache_dir) / "atari_frames" / name

    def prepare_data(self) -> None:
        path = self.cache_path
        if self.splits:
            return  # Lightning calls prepare_data again inside fit; the frames are already here
        if path.is_file():
            self.loaded_from_cache = True
            log.info(f"atari frames: loading the cache {path}")
            return
        log.info(f"atari frames: playing {self.game} for {self.n_frames} frames (cached at {path})")
        frames = play_frames(self.game, self.n_frames, self.seed, self.policy, self.frame_interval, self.size)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written under a temporary name and renamed: runs of a parallel sweep never read half a file.
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npz")
        np.savez_compressed(tmp, frames=frames, game=self.game, seed=self.seed, policy=self.policy)
        os.replace(tmp, path)

    def frames(self) -> np.ndarray:
        if not self.cache_path.is_file():
            self.prepare_data()
        with np.load(self.cache_path) as data:
            return data["frames"]

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        images = to_images(self.frames())
        order = torch.from_numpy(np.random.default_rng(self.seed).permutation(len(images)))
        n_test = max(2, int(round(self.test_fraction * len(images))))
        self.splits["test"] = TensorDataset(images[order[:n_test]])
        self.splits["train"] = TensorDataset(images[order[n_test:]])

    def real_images(self, split: str) -> torch.Tensor:
        self.setup()
        return self.splits[split].tensors[0]

    def train_dataloader(self) -> DataLoader:
        # drop_last: a last batch of one frame would break the generator's BatchNorm.
        return DataLoader(self.splits["train"], batch_size=self.batch_size, shuffle=True, drop_last=True, num_workers=0)

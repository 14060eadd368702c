"""pipeline.data.atari_frames without playing: a stand-in env, caches written by hand, splits and refusals."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.utils.data import RandomSampler

from pipeline.data import atari_frames
from pipeline.data.atari_frames import AtariFramesDataModule, cache_root, play_frames, to_images


class _Env:
    """Observations 210x160 filled with the step number; an episode ends every `episode` steps."""

    def __init__(self, episode=5, truncate=False):
        self.action_space = SimpleNamespace(n=3)
        self.t = 0
        self.episode, self.truncate = episode, truncate
        self.resets = 0
        self.closed = False
        self.actions = []

    def step(self, action):
        self.actions.append(action)
        self.t += 1
        obs = np.full((210, 160), self.t, dtype=np.uint8)
        end = self.t % self.episode == 0
        return obs, 0.0, end and not self.truncate, end and self.truncate, {}

    def reset(self):
        self.resets += 1

    def close(self):
        self.closed = True


@pytest.fixture
def stand_in(monkeypatch):
    made = []

    def make(game, seed):
        env = _Env(**made.pop(0)) if made and isinstance(made[0], dict) else _Env()
        made.append(SimpleNamespace(game=game, seed=seed, env=env))
        return env

    monkeypatch.setattr(atari_frames, "make_ale_env", make)
    return made


def test_play_frames_keeps_every_kth_step_resized_and_resets_on_episode_end(stand_in):
    frames = play_frames("Breakout", 4, seed=3, frame_interval=3, size=8)
    assert frames.shape == (4, 8, 8) and frames.dtype == np.uint8
    assert [int(f[0, 0]) for f in frames] == [3, 6, 9, 12]
    assert all(np.all(f == f[0, 0]) for f in frames)
    (made,) = stand_in
    assert (made.game, made.seed) == ("Breakout", 3)
    env = made.env
    assert env.t == 12 and env.resets == 2 and env.closed  # episodes end at steps 5 and 10
    assert env.actions == [int(a) for a in np.random.default_rng(3).integers(3, size=12)]


def test_play_frames_defaults_random_policy_every_4th_step_64_pixels(stand_in):
    stand_in.append({"episode": 2, "truncate": True})
    frames = play_frames("Pong", 2, seed=0)
    assert frames.shape == (2, 64, 64)
    assert [int(f[0, 0]) for f in frames] == [4, 8]
    env = stand_in[-1].env
    assert env.resets == 4  # truncated episodes are reset too


def test_play_frames_area_interpolation(monkeypatch):
    class Stripes(_Env):
        def step(self, action):
            obs, *rest = super().step(action)
            obs = np.zeros((6, 6), dtype=np.uint8)
            obs[:, ::3] = 201
            return (obs, *rest)

    monkeypatch.setattr(atari_frames, "make_ale_env", lambda game, seed: Stripes(episode=100))
    frames = play_frames("Pong", 1, seed=0, frame_interval=1, size=2)
    assert frames.tolist() == [[[67, 67], [67, 67]]]  # area averaging of 201, 0, 0 columns


def test_play_frames_closes_the_env_when_playing_fails(monkeypatch):
    env = _Env()

    def broken(action):
        raise RuntimeError("emulator died")

    env.step = broken
    monkeypatch.setattr(atari_frames, "make_ale_env", lambda game, seed: env)
    with pytest.raises(RuntimeError, match="emulator died"):
        play_frames("Pong", 2, seed=0)
    assert env.closed


def test_play_frames_refuses_other_policies_before_starting_a_game(monkeypatch):
    monkeypatch.setattr(atari_frames, "make_ale_env", lambda *a: pytest.fail("started a game"))
    with pytest.raises(ValueError) as err:
        play_frames("Pong", 2, seed=0, policy="greedy")
    assert str(err.value) == "data.policy='greedy'; choose one of random"


def test_to_images_maps_0_255_to_minus_one_one_with_a_channel():
    x = to_images(np.array([[[0, 51], [255, 102]]], dtype=np.uint8))
    assert x.shape == (1, 1, 2, 2) and x.dtype == torch.float32
    assert torch.allclose(x[0, 0], torch.tensor([[-1.0, -0.6], [1.0, -0.2]]))


def test_cache_root_order(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "env"))
    assert cache_root("~/c") == tmp_path / "home" / "c"
    assert cache_root("") == tmp_path / "env"
    monkeypatch.setenv("PIPELINE_CACHE", "")
    assert cache_root() == tmp_path / "home" / ".cache" / "pipeline"
    monkeypatch.delenv("PIPELINE_CACHE")
    assert cache_root(None) == tmp_path / "home" / ".cache" / "pipeline"


def test_defaults_and_cache_path(monkeypatch, tmp_path):
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path))
    dm = AtariFramesDataModule()
    assert (dm.game, dm.n_frames, dm.policy, dm.frame_interval, dm.size) == ("Pong", 1000, "random", 4, 64)
    assert (dm.test_fraction, dm.seed, dm.batch_size, dm.cache_dir) == (0.2, 0, 32, None)
    assert dm.image_shape == (1, 64, 64) and dm.n_classes is None and dm.loaded_from_cache is False and dm.splits == {}
    assert dm.cache_path == tmp_path / "atari_frames" / "Pong-n1000-seed0-random-k4-64px.npz"
    other = AtariFramesDataModule("Breakout", "20", frame_interval="2", size="16", test_fraction=0.5, seed="7",
                                  batch_size="5", cache_dir=str(tmp_path / "c"))
    assert other.cache_path == tmp_path / "c" / "atari_frames" / "Breakout-n20-seed7-random-k2-16px.npz"
    assert (other.n_frames, other.frame_interval, other.size, other.seed, other.batch_size) == (20, 2, 16, 7, 5)
    assert other.test_fraction == 0.5 and other.image_shape == (1, 16, 16)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"policy": "greedy"}, "data.policy='greedy'; choose one of random"),
        ({"n_frames": 9}, "data.n_frames=9 must be at least 10 and data.test_fraction=0.2 in (0, 1)"),
        ({"test_fraction": 0.0}, "data.n_frames=1000 must be at least 10 and data.test_fraction=0.0 in (0, 1)"),
        ({"test_fraction": 1.0}, "data.n_frames=1000 must be at least 10 and data.test_fraction=1.0 in (0, 1)"),
        ({"frame_interval": 0}, "data.frame_interval=0 must be >= 1 and data.size=64 >= 8"),
        ({"size": 7}, "data.frame_interval=4 must be >= 1 and data.size=7 >= 8"),
    ],
)
def test_bad_settings_are_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError) as err:
        AtariFramesDataModule(**kwargs)
    assert str(err.value) == message


def test_settings_at_the_bounds_are_taken():
    AtariFramesDataModule(n_frames=10, frame_interval=1, size=8, test_fraction=0.99)


def _frames(n, size=8):
    return (np.arange(n, dtype=np.uint8)[:, None, None] * np.ones((1, size, size), dtype=np.uint8)) * 10


def test_prepare_data_plays_once_and_writes_the_cache(tmp_path, monkeypatch, caplog):
    calls = []

    def play(*args):
        calls.append(args)
        return _frames(10)

    monkeypatch.setattr(atari_frames, "play_frames", play)
    dm = AtariFramesDataModule("Pong", 10, frame_interval=2, size=8, seed=3, cache_dir=str(tmp_path / "deep" / "c"))
    with caplog.at_level(logging.INFO, logger="pipeline.data.atari_frames"):
        dm.prepare_data()
    assert calls == [("Pong", 10, 3, "random", 2, 8)]
    assert f"atari frames: playing Pong for 10 frames (cached at {dm.cache_path})" in caplog.text
    assert not dm.loaded_from_cache
    assert sorted(p.name for p in dm.cache_path.parent.iterdir()) == [dm.cache_path.name]  # no temporary left
    with np.load(dm.cache_path) as data:
        assert np.array_equal(data["frames"], _frames(10))
        assert (str(data["game"]), int(data["seed"]), str(data["policy"])) == ("Pong", 3, "random")
    again = AtariFramesDataModule("Pong", 10, frame_interval=2, size=8, seed=3, cache_dir=str(tmp_path / "deep" / "c"))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pipeline.data.atari_frames"):
        again.prepare_data()
    assert again.loaded_from_cache and len(calls) == 1
    assert f"atari frames: loading the cache {dm.cache_path}" in caplog.text
    # another game's cache already made the folder: playing still writes its own file there
    third = AtariFramesDataModule("Breakout", 10, size=8, cache_dir=str(tmp_path / "deep" / "c"))
    third.prepare_data()
    assert third.cache_path.is_file() and third.cache_path.parent == dm.cache_path.parent


def test_frames_plays_when_there_is_no_cache_and_setup_splits_at_random(tmp_path, monkeypatch):
    monkeypatch.setattr(atari_frames, "play_frames", lambda *a: _frames(20))
    dm = AtariFramesDataModule(n_frames=20, size=8, test_fraction=0.25, seed=5, batch_size=4, cache_dir=str(tmp_path))
    assert np.array_equal(dm.frames(), _frames(20))
    test = dm.real_images("test")  # sets up on its own
    order = np.random.default_rng(5).permutation(20)
    first = [int(round((v + 1) * 127.5)) // 10 for v in test[:, 0, 0, 0].tolist()]
    assert first == order[:5].tolist()
    train = dm.real_images("train")
    assert [int(round((v + 1) * 127.5)) // 10 for v in train[:, 0, 0, 0].tolist()] == order[5:].tolist()
    assert test.shape == (5, 1, 8, 8) and train.shape == (15, 1, 8, 8)
    split = dm.splits["test"]
    dm.setup()
    assert dm.splits["test"] is split
    loader = dm.train_dataloader()
    assert loader.dataset is dm.splits["train"] and loader.batch_size == 4 and loader.drop_last
    assert isinstance(loader.sampler, RandomSampler) and loader.num_workers == 0 and len(loader) == 3


def test_at_least_two_test_frames(tmp_path):
    dm = AtariFramesDataModule(n_frames=10, size=8, test_fraction=0.01, cache_dir=str(tmp_path))
    dm.cache_path.parent.mkdir(parents=True)
    np.savez(dm.cache_path, frames=_frames(10))
    dm.setup()
    assert len(dm.real_images("test")) == 2 and len(dm.real_images("train")) == 8
    dm.prepare_data()  # already set up: no cache check
    assert not dm.loaded_from_cache


def test_test_fraction_rounds_to_nearest(tmp_path):
    dm = AtariFramesDataModule(n_frames=10, size=8, test_fraction=0.37, cache_dir=str(tmp_path))
    dm.cache_path.parent.mkdir(parents=True)
    np.savez(dm.cache_path, frames=_frames(10))
    assert len(dm.real_images("test")) == 4  # 3.7 -> 4

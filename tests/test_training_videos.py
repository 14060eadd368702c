"""Videos during training (task.video_every=N, CleanRL's --capture-video): MP4s at evaluations, in TensorBoard and W&B."""

from __future__ import annotations

import io

import imageio.v2 as imageio
from PIL import Image


def test_dqn_records_a_video_every_nth_evaluation_into_tensorboard_and_wandb(make_cfg, tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from pipeline.runtime.run import run

    monkeypatch.setenv("WANDB_MODE", "offline")
    # trainer=debug evaluates once during training, at env step 128: video_every=1 records that evaluation.
    cfg = make_cfg("experiment=dqn_cartpole", "trainer=debug", "logger=many", "task.video_every=1", "seed=3")
    (record,) = run(cfg, tmp_path)
    assert record["status"] == "ok", record["error"]
    assert [e["env_step"] for e in record["evaluations"]] == [128]
    (video,) = (tmp_path / "videos").glob("train-step128-seed3-env-seed30003.mp4")  # the agent's seed, the episode's env seed
    frames = imageio.mimread(video, memtest=False)
    assert len(frames) >= 2 and frames[0].ndim == 3 and frames[0].std() > 0  # a real rendered episode
    events = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    (image,) = events.Images("video/train")
    assert image.step == 128
    gif = Image.open(io.BytesIO(image.encoded_image_string))
    assert gif.format == "GIF" and gif.n_frames >= 2  # animated, as TensorBoard plays it
    (offline,) = (tmp_path / "wandb").glob("offline-run-*")
    (logged,) = offline.glob("files/media/videos/**/*.mp4")
    assert logged.stat().st_size > 1000


def test_ppo_records_training_videos_and_its_bar_counts_env_steps(make_cfg, tmp_path, capsys):
    import re

    from pipeline.runtime.run import run

    cfg = make_cfg("experiment=ppo_cartpole", "trainer=debug", "task.video_every=1", "trainer.enable_progress_bar=true")
    (record,) = run(cfg, tmp_path)
    assert record["status"] == "ok", record["error"]
    steps = [e["env_step"] for e in record["evaluations"]]
    assert steps and sorted(p.name.split("-")[1] for p in (tmp_path / "videos").glob("train-step*.mp4")) == sorted(
        f"step{s}" for s in steps)
    last = [s for s in re.split(r"[\r\n]", capsys.readouterr().out) if s.startswith("env steps")][-1]
    assert f"{record['env_steps']}/{cfg.task.total_steps}" in last, last

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
    (video,) = (tmp_path / "videos").glob("train-step128-seed*.mp4")
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

"""`python -m pipeline.eval <run dir>`: greedy replays of a saved agent, eval.json, MP4 videos, the run's loggers."""

import json
from pathlib import Path

import imageio.v2 as imageio
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from pipeline.eval import main as eval_main
from pipeline.nets.mlp import MLP
from pipeline.rl.envs import evaluate_greedy
from pipeline.runtime.replay import REPLAY_SEED_OFFSET
from pipeline.store.checkpoint import save_atomic  # as the pipeline writes it: with its digest
from pipeline.store.integrity import save_verified
from pipeline_testing import read_result, run_cli, run_module


def run_eval(*args: str):
    return run_module("pipeline.eval", *args, timeout=300)


def make_run_dir(make_cfg, run_dir: Path, *overrides: str, seed: int = 0, config_dir: Path | None = None) -> MLP:
    """A run dir as the pipeline leaves it, without training: the composed config and an untrained MLP's model.pt."""
    cfg = make_cfg("experiment=dqn_cartpole", "model.hidden=[16]", f"seed={seed}", *overrides)
    (config_dir or run_dir).joinpath(".hydra").mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, (config_dir or run_dir) / ".hydra" / "config.yaml")
    torch.manual_seed(seed)
    net = MLP(4, 2, hidden=[16])
    run_dir.mkdir(parents=True, exist_ok=True)
    save_atomic(net.state_dict(), run_dir / "model.pt")
    return net.eval()


def test_replay_writes_returns_and_real_videos(make_cfg, tmp_path, capsys):
    net = make_run_dir(make_cfg, tmp_path)
    assert eval_main([str(tmp_path), "episodes=3", "video=true"]) == 0
    out = capsys.readouterr()
    assert out.err.strip() == "" and len(out.out.strip().splitlines()) == 1  # the summary line only
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["episodes"] == 3 and result["seeds"] == [REPLAY_SEED_OFFSET + i for i in range(3)]
    returns = result["returns"]
    assert all(r >= 8 for r in returns)  # a CartPole episode lasts at least ~8 steps, +1 each
    assert result["mean"] == pytest.approx(np.mean(returns)) and result["std"] == pytest.approx(np.std(returns))
    # The same greedy policy through the training code's evaluation, on the same start states.
    expected = evaluate_greedy(lambda o: net(o).argmax(1), "CartPole-v1", 3, REPLAY_SEED_OFFSET)
    assert returns == expected
    assert len(result["videos"]) == 3
    for path, length in zip(result["videos"], result["lengths"]):
        reader = imageio.get_reader(path, format="ffmpeg")
        frames = [frame for frame in reader]
        reader.close()
        assert len(frames) == length + 1  # the start state and one frame per step
        assert frames[0].shape == (400, 600, 3) and frames[0].std() > 0  # a drawn cart, not a blank
    assert read_result_or_none(tmp_path) is None  # a replay writes no run record


def read_result_or_none(run_dir: Path):
    return read_result(run_dir) if (run_dir / "result.json").exists() else None


def test_seed_of_a_batch_uses_the_batch_config_and_its_seed(make_cfg, tmp_path, capsys):
    batch = tmp_path / "batch"
    make_run_dir(make_cfg, batch / "seed3", "seeds_per_process=2", seed=3, config_dir=batch)
    assert eval_main([str(batch / "seed3"), "episodes=2"]) == 0
    result = json.loads((batch / "seed3" / "eval.json").read_text())
    assert result["run_seed"] == 3 and result["seeds"] == [REPLAY_SEED_OFFSET + 3, REPLAY_SEED_OFFSET + 4]
    assert result["videos"] == []
    # The batch dir itself holds no model.pt: the error names the seeds to choose from.
    capsys.readouterr()
    assert eval_main([str(batch)]) == 2
    err = capsys.readouterr().err
    assert "seed3" in err and len(err.strip().splitlines()) == 1
    assert not (batch / "eval.json").exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [(["/no/such/dir"], "no such run dir"), (["{run}", "episodes=0"], "episodes=0"), (["{run}", "colour=red"], "unknown option"),
     (["{run}", "video=maybe"], "true or false"), (["{run}", "device=tpu"], "device=tpu: choose cpu"),
     *([] if torch.cuda.is_available() else [(["{run}", "device=cuda"], "no CUDA GPU; use device=cpu")])],
)
def test_bad_arguments_are_one_line(make_cfg, tmp_path, capsys, args, says):
    make_run_dir(make_cfg, tmp_path)
    assert eval_main([a.format(run=tmp_path) for a in args]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1


def test_a_run_without_an_env_is_refused(make_cfg, tmp_path, capsys):
    cfg = make_cfg("experiment=rmac_auction")  # supervised and GAN runs are scored instead (test_eval_tasks.py)
    (tmp_path / ".hydra").mkdir()
    OmegaConf.save(cfg, tmp_path / ".hydra" / "config.yaml")
    save_atomic({}, tmp_path / "model.pt")
    assert eval_main([str(tmp_path)]) == 2
    assert "no environment" in capsys.readouterr().err


def test_a_model_file_that_is_not_one_is_one_line(make_cfg, tmp_path, capsys):
    make_run_dir(make_cfg, tmp_path)
    (tmp_path / "model.pt").write_bytes(b"not a torch file at all")  # over the weights: their digest no longer matches
    assert eval_main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "model.pt is damaged" in err and len(err.strip().splitlines()) == 1
    save_verified(tmp_path / "model.pt", lambda f: f.write(b"not a torch file at all"))  # written so, with its digest
    assert eval_main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "model.pt" in err and "cannot be loaded" in err and len(err.strip().splitlines()) == 1


def test_weights_that_do_not_fit_the_config_are_one_line(make_cfg, tmp_path, capsys):
    make_run_dir(make_cfg, tmp_path)
    save_atomic(MLP(4, 2, hidden=[32]).state_dict(), tmp_path / "model.pt")
    assert eval_main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "does not fit" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_replay_goes_to_the_runs_tensorboard_and_wandb(make_cfg, tmp_path):
    make_run_dir(make_cfg, tmp_path, "logger=many")
    proc = run_eval(str(tmp_path), "episodes=2", "video=true")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["logged_to"] == ["tensorboard", "wandb"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard" / "replay"))
    events.Reload()
    logged = [e.value for e in events.Scalars("replay/return")]
    assert logged == pytest.approx(result["returns"])
    (offline,) = (tmp_path / "wandb").glob("offline-run-*")
    videos = list(offline.glob("files/media/videos/**/*.mp4"))
    assert len(videos) == 2 and all(v.stat().st_size > 1000 for v in videos)


@pytest.mark.slow
def test_replay_of_a_real_debug_run(tmp_path):
    """The model.pt a real run writes loads into the network its config describes."""
    proc = run_cli("experiment=dqn_cartpole", "trainer=debug", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = run_eval(str(tmp_path), "episodes=2", "video=true")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["episodes"] == 2 and all(r >= 8 for r in result["returns"]) and len(result["videos"]) == 2


@pytest.mark.slow
def test_atari_replay_scores_whole_games_with_unclipped_rewards(make_cfg, tmp_path):
    from pipeline.nets.cnn import AtariCNN

    cfg = make_cfg("experiment=dqn_atari", "device=cpu", "+env.kwargs.max_episode_steps=400")
    (tmp_path / ".hydra").mkdir()
    OmegaConf.save(cfg, tmp_path / ".hydra" / "config.yaml")
    save_atomic(AtariCNN(6).state_dict(), tmp_path / "model.pt")
    proc = run_eval(str(tmp_path), "episodes=1", "video=true")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["lengths"][0] == 100  # 400 emulator frames at frame skip 4
    reader = imageio.get_reader(result["videos"][0], format="ffmpeg")
    frame = reader.get_data(0)
    reader.close()
    assert frame.shape == (210, 160, 3)

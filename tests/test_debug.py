"""`trainer=debug` shrinks every preset to a run of seconds under 1 GB, whatever the preset's own keys say."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from pipeline.config.debug import REPLAY_CAP, apply_debug, debug_trainer
from pipeline_testing import ROOT, read_result

PRESETS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))
RL_TASKS = ("DQNTask", "BatchedDQNTask")


def compose_cli(*overrides: str):
    """As the CLI composes, with the hydra node (the chosen options and the typed overrides)."""
    with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=True)


def _debug_cfg(make_cfg, preset: str, *extra: str, keep=None):
    return apply_debug(compose_cli(f"experiment={preset}", "trainer=debug", *extra), keep=keep)


@pytest.mark.parametrize("preset", PRESETS)
def test_debug_trainer_wins_over_the_preset(make_cfg, preset):
    cfg = _debug_cfg(make_cfg, preset)
    trainer = OmegaConf.to_container(cfg.trainer, resolve=True)
    assert "debug" not in trainer  # the marker is no Trainer argument
    assert trainer == debug_trainer()
    assert trainer["max_epochs"] == 1 and trainer["limit_train_batches"] == 3
    if cfg.scheduler.get("T_max") is not None:
        assert cfg.scheduler.T_max == 1  # the cosine schedule follows the debug epochs


@pytest.mark.parametrize("preset", [p for p in PRESETS if p.startswith("dqn")])
def test_dqn_presets_get_a_few_rounds_and_a_small_buffer(make_cfg, preset):
    cfg = _debug_cfg(make_cfg, preset)
    task = cfg.task
    assert task.total_steps == 3 * task.train_frequency
    assert task.learning_starts < task.total_steps  # updates do happen
    assert task.learning_starts >= task.batch_size
    assert task.buffer_size <= max(REPLAY_CAP, task.total_steps)
    assert task.eval_every < task.total_steps and task.eval_episodes <= 2 and task.final_eval_episodes <= 2


def test_atari_debug_buffer_is_small_and_episodes_short(make_cfg):
    cfg = _debug_cfg(make_cfg, "dqn_atari", "device=cpu")
    bytes_per_transition = 2 * 4 * 84 * 84 + 16
    assert cfg.task.buffer_size * bytes_per_transition < 100e6  # the preset's 100k transitions are 5.6 GB
    assert cfg.env.kwargs.max_episode_steps == 300


def test_command_line_keys_win_over_debug(make_cfg):
    cfg = _debug_cfg(make_cfg, "dqn_cartpole", "task.total_steps=5000", "trainer.max_epochs=2")
    assert cfg.task.total_steps == 5000 and cfg.trainer.max_epochs == 2
    assert cfg.task.buffer_size == REPLAY_CAP  # what the user did not type is still shrunk


def test_debug_only_lowers_values(make_cfg):
    cfg = _debug_cfg(make_cfg, "dqn_cartpole", "task.total_steps=300", "task.eval_episodes=1", keep=())
    assert cfg.task.total_steps == 300 and cfg.task.eval_episodes == 1


def test_other_trainers_are_left_alone(make_cfg):
    cfg = compose_cli("experiment=supervised_digits")
    before = OmegaConf.to_container(cfg, resolve=False)
    assert OmegaConf.to_container(apply_debug(cfg), resolve=False) == before
    assert cfg.trainer.max_epochs == 60


def test_a_users_trainer_opts_in_with_a_marker(make_cfg):
    cfg = make_cfg("experiment=supervised_digits", "+trainer.debug=true")
    apply_debug(cfg)
    assert cfg.trainer.max_epochs == 1 and "debug" not in cfg.trainer


def test_outside_hydra_without_the_marker_nothing_changes(make_cfg):
    cfg = make_cfg("experiment=supervised_digits", "trainer=debug")
    assert apply_debug(cfg).trainer.max_epochs == 60


def test_counterfactual_and_gan_are_shrunk(make_cfg):
    cfg = _debug_cfg(make_cfg, "rmac_auction")
    assert cfg.task.n_iters == 20 and cfg.data.n_bids == 500
    cfg = _debug_cfg(make_cfg, "gan_digits")
    assert cfg.task.classifier.epochs == 2 and cfg.task.eval_every_n_epochs == 1


# A fresh parent per run: its RUSAGE_CHILDREN peak is the pipeline run's own (and its helpers').
_MEASURE = (
    "import json, resource, subprocess, sys, time\n"
    "t = time.perf_counter()\n"
    "rc = subprocess.call([sys.executable, '-m', 'pipeline', *sys.argv[1:]], stdout=subprocess.DEVNULL)\n"
    "peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "print(json.dumps({'rc': rc, 'seconds': time.perf_counter() - t, 'peak_mb': peak_kb / 1024}))\n"
)


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_debugs_in_seconds_and_under_1gb(tmp_path, preset):
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURE, f"experiment={preset}", "trainer=debug", "device=cpu", f"hydra.run.dir={tmp_path}"],
        capture_output=True, text=True, cwd=ROOT, timeout=300, env={**__import__("os").environ, "WANDB_MODE": "offline"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{preset}: {measured['seconds']:.1f} s, peak {measured['peak_mb']:.0f} MB")
    records = [read_result(tmp_path)] if (tmp_path / "result.json").is_file() else [
        read_result(d) for d in sorted(Path(tmp_path).glob("seed*"))
    ]
    assert records and all(r["status"] == "ok" for r in records), [r.get("error") for r in records]
    assert measured["rc"] == 0
    assert measured["peak_mb"] < 1024
    # A quiet run: no Python warning ("file.py:12: ...") and no emulator banner on stderr.
    noise = [line for line in proc.stderr.splitlines() if re.search(r"\.py:\d+: |Warning|Powered by Stella", line)]
    assert noise == []
    # Loose: the machine is shared; a debug run that takes minutes is not a debug run.
    assert measured["seconds"] < 120

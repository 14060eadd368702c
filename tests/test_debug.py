"""`trainer=debug` shrinks every preset to a run of seconds under 1 GB, whatever the preset's own keys say.

trainer=debug is configuration composed after the experiment preset (conf/debug/): what `--cfg job` prints is
what runs. The numbers below are the documented debug sizes (docs/running.md), written out, not read from conf/.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

import pipeline
from pipeline.runtime.quiet import HARMLESS
from pipeline_testing import ROOT, read_result, run_cli, run_module

PRESETS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))
DEBUG_TRAINER = {"max_epochs": 1, "max_steps": -1, "log_every_n_steps": 1, "enable_progress_bar": False,
                 "limit_train_batches": 3, "limit_val_batches": 2, "limit_test_batches": 2, "check_val_every_n_epoch": 1}


def compose_cli(*overrides: str):
    """As the CLI composes."""
    with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def _debug_cfg(preset: str, *extra: str):
    return compose_cli(f"experiment={preset}", "trainer=debug", *extra)


@pytest.mark.parametrize("preset", PRESETS)
def test_debug_trainer_wins_over_the_preset(preset):
    cfg = _debug_cfg(preset)
    trainer = OmegaConf.to_container(cfg.trainer, resolve=True)
    assert {k: trainer[k] for k in DEBUG_TRAINER} == DEBUG_TRAINER
    if cfg.scheduler.get("T_max") is not None:
        assert cfg.scheduler.T_max == 1  # the cosine schedule follows the debug epochs


@pytest.mark.parametrize("preset", [p for p in PRESETS if p.startswith("dqn")])
def test_dqn_presets_get_a_few_rounds_and_a_small_buffer(preset):
    task = _debug_cfg(preset, "device=cpu").task
    assert task.total_steps == 3 * task.train_frequency <= 192
    assert task.batch_size <= task.learning_starts < task.total_steps  # updates do happen
    assert task.buffer_size <= 1000
    assert task.eval_every < task.total_steps and task.eval_episodes <= 2 and task.final_eval_episodes <= 2
    assert task.total_steps % task.envs_per_agent == 0 and task.train_frequency % task.envs_per_agent == 0


@pytest.mark.parametrize("preset", [p for p in PRESETS if p.startswith("ppo")])
def test_ppo_presets_get_three_small_iterations_whose_minibatches_split_the_rollout(preset):
    task = _debug_cfg(preset, "device=cpu").task
    batch = task.num_steps * task.envs_per_agent
    assert (task.num_steps, task.envs_per_agent, task.total_steps) == (32, 2, 3 * 64)
    assert batch % task.num_minibatches == 0 and task.update_epochs <= 2
    assert task.eval_every < task.total_steps and task.eval_episodes <= 2 and task.final_eval_episodes <= 2


def test_atari_debug_buffer_is_small_and_episodes_short():
    cfg = _debug_cfg("dqn_atari", "device=cpu")
    bytes_per_transition = 2 * 4 * 84 * 84 + 16
    assert cfg.task.buffer_size * bytes_per_transition < 100e6  # the preset's 100k transitions are 5.6 GB
    assert cfg.env.kwargs.max_episode_steps == 300


def test_command_line_keys_win_over_debug():
    cfg = _debug_cfg("dqn_cartpole", "task.total_steps=5000", "trainer.max_epochs=2")
    assert cfg.task.total_steps == 5000 and cfg.trainer.max_epochs == 2
    assert cfg.task.buffer_size == 1000  # what the user did not type is still shrunk


def test_other_trainers_are_left_alone():
    cfg = compose_cli("experiment=supervised_digits")
    assert cfg.trainer.max_epochs == 60 and cfg.trainer.enable_progress_bar is True
    assert compose_cli("experiment=dqn_cartpole").task.total_steps == 100_000


def test_counterfactual_and_gan_are_shrunk():
    cfg = _debug_cfg("rmac_auction")
    assert cfg.task.n_iters == 20 and cfg.data.n_bids == 500
    cfg = _debug_cfg("gan_digits")
    assert cfg.task.classifier.epochs == 2 and cfg.task.eval_every_n_epochs == 1


def test_cfg_job_prints_what_a_debug_run_runs(tmp_path):
    """`--cfg job` is the composed config the run gets: a debug run of the 60-epoch preset shows max_epochs 1."""
    out = run_cli("experiment=supervised_digits", "trainer=debug", "--cfg", "job", cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    trainer = OmegaConf.create(out.stdout).trainer
    assert trainer.max_epochs == 1 and trainer.limit_train_batches == 3


# How long a debug run takes is measured by `make bench ARGS="--only debug"`, as a multiple of `import torch`.
PACKAGE_DIR = Path(pipeline.__file__).resolve().parent


def project_noise(stderr: str) -> list[str]:
    """The lines of a run's stderr that the project is answerable for, whatever else the machine has installed.

    A warning raised from the project's own code (its location is a file of the package), one of the third-party
    warnings `pipeline.quiet` promises to silence, or the emulator banner `quiet_ale` turns off. Warnings that
    depend on the machine (CUDA library notices) are not the project's to silence here.
    """
    own = re.compile(rf"^{re.escape(str(PACKAGE_DIR))}/\S+\.py:\d+: ")
    silenced = [re.compile(message) for message in HARMLESS]
    return [
        line for line in stderr.splitlines()
        if own.search(line) or any(p.search(line) for p in silenced) or "Powered by Stella" in line
    ]


def test_project_noise_keeps_the_projects_warnings_and_drops_the_machines():
    cuda = "/x/.venv/lib/python3.11/site-packages/torch/cuda/__init__.py:129: UserWarning: CUDA initialization: no driver"
    # Lightning's srun warning is the project's to silence (runtime.quiet): it names LightningEnvironment itself.
    srun = (
        "/x/.venv/lib/python3.11/site-packages/lightning/fabric/plugins/environments/slurm.py:204: "
        "The `srun` command is available on your system but is not used."
    )
    ours = f"{PACKAGE_DIR}/tasks/dqn.py:12: UserWarning: something the project did"
    unsilenced = "/x/lightning/pytorch/loops/fit_loop.py:310: The number of training batches (3) is smaller than the logging interval"
    banner = "A.L.E: Arcade Learning Environment (version 0.11.2+ecc1138) [Powered by Stella]"
    assert project_noise("\n".join([cuda, srun, ours, unsilenced, banner, "done"])) == [srun, ours, unsilenced, banner]


# A fresh run's peak, measured from a small parent: its RUSAGE_CHILDREN peak is the pipeline run's own (and its
# helpers'). (A process started from the test process itself inherits that large process's high-water mark.)
_MEASURE = (
    "import json, resource, subprocess, sys\n"
    "rc = subprocess.call([sys.executable, '-m', 'pipeline', *sys.argv[1:]], stdout=subprocess.DEVNULL)\n"
    "peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "print(json.dumps({'rc': rc, 'peak_mb': peak_kb / 1024}))\n"
)


def fresh_run_peak_mb(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    proc = subprocess.run([sys.executable, "-c", _MEASURE, *args], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "WANDB_MODE": "offline"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    assert measured["rc"] == 0, proc.stderr[-2000:]
    return proc, measured["peak_mb"]


@pytest.fixture(scope="module")
def unshared_import_mb(tmp_path_factory) -> float:
    """What a forked run's peak memory leaves out: a run forked from the suite's warm interpreter (run_module) is
    not charged for the library pages its parent imported and it never touches, which a fresh interpreter loads.
    Measured here as one small debug run's peak, fresh minus forked (~75 MB on the machine we size the suite for)."""
    base = tmp_path_factory.mktemp("unshared")
    args = ("experiment=cem_cartpole", "trainer=debug", "device=cpu")
    forked = run_module("pipeline", *args, f"hydra.run.dir={base / 'forked'}")
    assert forked.returncode == 0, forked.stderr[-2000:]
    if forked.peak_mb is None:  # PIPELINE_TEST_FORKSERVER=0: every run below is measured fresh
        return 0.0
    _, fresh_mb = fresh_run_peak_mb(*args, f"hydra.run.dir={base / 'fresh'}")
    return max(0.0, fresh_mb - forked.peak_mb)


# One worker runs them all (xdist_group): `unshared_import_mb` (a forked and a fresh cem_cartpole run, ~9 s) is
# measured once in the suite, not once per worker (it was 11-15 s charged to each worker's first preset).
@pytest.mark.slow
@pytest.mark.xdist_group("every_preset_debugs")
@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_debugs_under_1gb_and_quietly(tmp_path, preset, unshared_import_mb):
    args = (f"experiment={preset}", "trainer=debug", "device=cpu", f"hydra.run.dir={tmp_path}")
    proc = run_module("pipeline", *args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    if proc.peak_mb is None:
        proc, peak_mb = fresh_run_peak_mb(*args[:-1], f"hydra.run.dir={tmp_path / 'fresh'}")
        tmp_path = tmp_path / "fresh"
        print(f"{preset}: peak {peak_mb:.0f} MB (a fresh interpreter)")
    else:
        peak_mb = proc.peak_mb + unshared_import_mb
        print(f"{preset}: peak {peak_mb:.0f} MB ({proc.peak_mb:.0f} forked + {unshared_import_mb:.0f} of imports a fresh run loads)")
    records = [read_result(tmp_path)] if (tmp_path / "result.json").is_file() else [
        read_result(d) for d in sorted(Path(tmp_path).glob("seed*"))
    ]
    assert records and all(r["status"] == "ok" for r in records), [r.get("error") for r in records]
    assert peak_mb < 1024
    # A quiet run: nothing the project is answerable for on stderr (see project_noise).
    assert project_noise(proc.stderr) == []

"""A resumed run keeps every curve row up to its checkpoint, for every kind of task: Lightning-loop tasks whose
curve counts something other than epochs (a GAN's batches, CEM's env steps) lost every row between step 0 and
the checkpoint, because the checkpoint's step (an epoch) was read as a curve step."""

import os
import signal
import time

import pandas as pd
import pytest
import torch

from pipeline.runtime.run import run
from pipeline.store.curves import read_run_curve
from pipeline_testing import read_result, run_cli, start_module


def compose(*overrides):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    with initialize_config_module("pipeline.conf", version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides))


@pytest.fixture(scope="module", autouse=True)
def cache_dir(tmp_path_factory):
    """The GAN's judge (a digits classifier) trained once into a throwaway cache, never the user's ~/.cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIPELINE_CACHE", str(tmp_path_factory.mktemp("pipeline_cache")))
        yield


# Task kinds whose curve step is not the checkpoint's epoch, each a short run and its continuation.
KINDS = {
    # 36 batches an epoch, a row every 3: the curve's steps are batches 3..36, the checkpoint's epoch 0.
    "gan": ("experiment=gan_digits", "task.log_every_n_steps=3", "task.eval_every_n_epochs=1", "task.n_eval_samples=200",
            "task.classifier.epochs=5", "trainer.enable_progress_bar=false"),
    # Batches of 16 episodes: the curve's steps are env steps (its budget: task.max_iterations, below).
    "cem": ("experiment=cem_cartpole", "task.stop_at_return=null", "task.final_eval_episodes=2",
            "trainer.enable_progress_bar=false"),
    # The curve's step is the epoch itself (the case that always worked).
    "supervised": ("experiment=supervised_digits", "scheduler=none", "trainer.limit_train_batches=2",
                   "trainer.limit_val_batches=1", "trainer.limit_test_batches=1", "trainer.enable_progress_bar=false"),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_resumed_lightning_task_keeps_every_row_its_checkpoint_covers(tmp_path, kind):
    budget = ("task.max_iterations=4", "task.max_iterations=8") if kind == "cem" else ("trainer.max_epochs=1", "trainer.max_epochs=2")
    (part,) = run(compose(*KINDS[kind], budget[0]), tmp_path)
    assert part["status"] == "ok", part["error"]
    # The final test scores come after training, past any checkpoint: a continued run redoes them.
    before = {s: {k: v for k, v in r.items() if not k.startswith("test/")} for s, r in read_run_curve(tmp_path).items()}
    before = {s: r for s, r in before.items() if r}
    if kind != "supervised":
        assert len(before) >= 2 and max(before) > 1, before  # steps past the checkpoint's epoch (0)
    (rest,) = run(compose(*KINDS[kind], budget[1], "ckpt_path=last"), tmp_path)
    assert rest["status"] == "ok", rest["error"]
    after = read_run_curve(tmp_path)
    for step, row in before.items():  # every row the first segment wrote (its checkpoint covers them all) is kept
        assert step in after, (kind, step, sorted(after)[:10])
        assert {k: after[step][k] for k in row} == row, (kind, step)
    assert max(after) > max(before)  # and the second segment added its own


@pytest.mark.slow
def test_a_gan_killed_with_sigkill_resumes_with_every_row_up_to_its_checkpoint(tmp_path):
    """As the issue ran it: a GAN checkpoints, is killed with kill -9, continues with ckpt_path=last; rows 50-250
    were gone. Every row up to the checkpoint's last batch stays as first written; the finals match a straight run."""
    args = (*KINDS["gan"], "trainer.max_epochs=6", "checkpoint.every_s=0", f"hydra.run.dir={tmp_path / 'run'}")
    proc = start_module("pipeline", *args)
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    end = time.monotonic() + 240
    while time.monotonic() < end and proc.poll() is None:
        try:
            if torch.load(ckpt, weights_only=True)["epoch"] >= 2:
                break
        except Exception:  # noqa: BLE001 - not written yet, or being replaced
            pass
        time.sleep(0.1)
    assert proc.poll() is None, proc.stdout.getvalue()[-2000:]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    held = torch.load(ckpt, weights_only=True)
    killed = read_run_curve(tmp_path / "run")
    covered = {s: r for s, r in killed.items() if s <= held["pipeline_curves"]["curve_step"]}
    assert len(covered) >= 2 * 36 // 3, sorted(killed)  # at least the two finished epochs' rows
    done = run_cli(*args, "ckpt_path=last")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    resumed = read_run_curve(tmp_path / "run")
    for step, row in covered.items():
        assert {k: resumed[step][k] for k in row} == row, step
    steps = pd.read_csv(tmp_path / "run" / "metrics.csv")["step"].tolist()
    assert steps == sorted(set(steps)) and max(steps) == 6 * 36  # monotone, none twice, to the end
    assert read_result(tmp_path / "run")["status"] == "ok"

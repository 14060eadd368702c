"""The tune summary as one offline W&B run (job_type=tune)."""

import json
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from pipeline.tune.summary import log_tune_to_wandb


def test_offline_tune_run(tmp_path, monkeypatch):
    import wandb

    for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline must be the default, not the environment's doing
    out = tmp_path / "tune"
    out.mkdir()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    fig.savefig(out / "confirmed.png")
    plt.close(fig)
    summary = {
        "study_name": "dqn_cartpole", "objective": "iqm", "best_params": {"optimizer.lr": "0.001"},
        "trials": {"total": 4, "completed": 3, "pruned": 1, "failed": 0}, "best_tuned_value": 497.5,
        "preset_wins": False, "plots": {"confirmed scores": "confirmed.png"},
        "candidates": [{"label": "trial2", "value": 481.25, "optimism_gap": 16.25}], "preset": {"value": 455.0},
    }
    (out / "tune.json").write_text(json.dumps(summary))

    info = log_tune_to_wandb(summary, out, group="dqn_cartpole", wandb_cfg={"project": "pipeline-tests"})

    assert info["mode"] == "offline"
    (run_dir,) = (out / "wandb").glob("offline-run-*")
    assert len(list((run_dir / "files" / "media" / "images" / "plots").glob("confirmed*.png"))) == 1
    wandb.teardown()  # the service may still be flushing the run log after finish()
    log = next(run_dir.glob("run-*.wandb")).read_bytes()
    assert re.search(rb"trial2/optimism_gap[^\n]{1,4}16\.25", log)
    assert re.search(rb"trials/pruned[^\n]{1,4}1", log)

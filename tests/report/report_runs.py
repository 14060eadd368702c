"""Synthetic run records written the way run.py writes them (result.json + sparse metrics.csv).

A plain module with a name no other test dir uses, so tests can import its constants.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Group A: an RL configuration with 3 ok seeds (below the 5-seed warning line) and 1 failed seed.
RL_GROUP = "dqn_cartpole"
RL_VALUES = {0: 480.0, 1: 500.0, 2: 450.0}
RL_TIMES = {0: 120.0, 1: 90.0, 2: None}
RL_FAILED_SEED = 3
RL_ERROR = "RuntimeError: replay buffer | exploded\nTraceback (most recent call last): ..."
THRESHOLD = 475.0

# Group B: same metric, 6 ok seeds, no RL fields; every value is below every value of group A.
OTHER_GROUP = "dqn_cartpole model=dueling"
OTHER_VALUES = {10: 100.0, 11: 300.0, 12: 310.0, 13: 320.0, 14: 330.0, 15: 440.0}


def write_run(
    run_dir: Path,
    *,
    seed: int,
    group: str,
    value: float | None,
    status: str = "ok",
    error: str | None = None,
    curve: list[tuple[int, float]] | None = None,
    rl: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "experiment": group.split()[0],
        "task": "dqn",
        "group": group,
        "seed": seed,
        "status": status,
        "error": error,
        "primary_metric": "eval/return_mean",
        "primary_curve": "eval/return_mean",
        "higher_is_better": True,
        "metrics": {} if value is None else {"eval/return_mean": value, "train/loss": 0.1},
        "wall_time_s": 10.0 + seed,
        "time_breakdown_s": {"env": 4.0, "learn": 5.0},
        "device": "cpu",
        "versions": {"python": "3.11"},
    }
    result.update(rl or {}, **(extra or {}))
    (run_dir / "result.json").write_text(json.dumps(result))
    if curve is not None:
        # Lightning's CSVLogger style: train and eval rows are sparse and can share a step.
        lines = ["step,train/loss,eval/return_mean"]
        for step, y in curve:
            lines.append(f"{step},0.5,")
            lines.append(f"{step},,{y}")
        (run_dir / "metrics.csv").write_text("\n".join(lines) + "\n")
    return run_dir


def write_two_group_sweep(root: Path) -> Path:
    """A Hydra-multirun-like sweep: <root>/<job>/result.json, plus things the collector must ignore."""
    job = 0
    for seed, value in RL_VALUES.items():
        write_run(
            root / str(job), seed=seed, group=RL_GROUP, value=value,
            curve=[(s, value * s / 1000) for s in (0, 250, 500, 750, 1000)],
            rl={"env_steps": 20000, "env_steps_per_s": 2000.0 + seed, "time_to_threshold_s": RL_TIMES[seed],
                "threshold": THRESHOLD},
        )
        job += 1
    failed = write_run(root / str(job), seed=RL_FAILED_SEED, group=RL_GROUP, value=None, status="failed",
                       error=RL_ERROR, rl={"threshold": THRESHOLD, "time_to_threshold_s": None})
    assert not (failed / "metrics.csv").exists()
    job += 1
    for seed, value in OTHER_VALUES.items():
        # Different seeds log at different steps, so the curve plot has to interpolate.
        steps = (0, 300, 600, 1000) if seed % 2 else (0, 500, 1000)
        write_run(root / "nested" / str(job), seed=seed, group=OTHER_GROUP, value=value,
                  curve=[(s, value * s / 1000) for s in steps])
        job += 1
    # Not run records: an old report, wandb internals, and a corrupt result.json.
    write_run(root / "report" / "stale", seed=99, group="stale", value=1.0)
    write_run(root / "0" / "wandb" / "run-x", seed=98, group="stale", value=1.0)
    (root / "corrupt").mkdir()
    (root / "corrupt" / "result.json").write_text("{not json")
    return root

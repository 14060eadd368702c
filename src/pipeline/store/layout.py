"""Where things are in a run dir, and nowhere else: the file names and the layout of runs, agents and sweeps.

    <run dir>/result.json          the run record (store/record.py)
    <run dir>/metrics.csv          the curves (store/curves.py)
    <run dir>/model.pt             the trained weights, a state_dict (store/checkpoint.py)
    <run dir>/best.pt              RL with task.keep_best: the best-evaluated weights, a state_dict like model.pt's
    <run dir>/checkpoints/last.ckpt  what a killed run continues from
    <run dir>/error.log            the traceback of a failed run
    <run dir>/.pipeline/ids.json   the ids a resumed run keeps: its W&B run id and its sweep's id
    <run dir>/seed<n>/...          agent n of a run that trains K seeds in one process (K > 1)
    <sweep dir>/<job>/...          one run dir per job; <sweep dir>/report/ and <sweep dir>/tune/ hold no runs
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

RESULT = "result.json"
# A result.json that could not be read when its run was resumed, kept aside whole (runtime/run.py).
UNREADABLE_RECORD = "result.unreadable.json"
METRICS = "metrics.csv"
MODEL = "model.pt"
# PPO with normalize_obs: the agent's observation statistics, beside model.pt (its policy needs both).
OBS_NORM = "obs_norm.pt"
# RL with task.keep_best: the agent's best-evaluated weights (its record's `best` says which evaluation), beside model.pt.
BEST = "best.pt"
CHECKPOINTS = "checkpoints"
LAST = "last.ckpt"
ERROR_LOG = "error.log"
# The run dir's owner: an flock held for the life of the run (runtime/rundir.py), naming {pid, host, since}.
LOCK = ".lock"
# What `python -m pipeline.eval` writes: the replay's returns and seeds.
EVAL_FILE = "eval.json"
# The composed config a run was made with: Hydra's copy, or (a sweep job's own process) the pipeline's.
CONFIG_FILES = (".hydra/config.yaml", ".pipeline/config.yaml")
# The ids a run keeps across its resumes ({"wandb_run_id", "sweep_id"}), written on its first start.
IDS = ".pipeline/ids.json"
# Folders of a sweep dir that hold outputs about runs, never runs.
NOT_RUNS = ("report", "tune", "wandb")


# What the pipeline, Hydra and the loggers write into a run dir: a dir holding only these (or a record of ours) is a
# run dir of ours, which a run may continue or refuse by its record; anything else is a user's folder, never written.
OWN_ENTRIES = frozenset({
    RESULT, "result.extending.json", UNREADABLE_RECORD, METRICS, MODEL, OBS_NORM, BEST, CHECKPOINTS, ERROR_LOG, LOCK, EVAL_FILE, "run.log",
    ".hydra", ".pipeline", "tensorboard", "wandb", "videos", "lightning_logs", "hparams.yaml", *NOT_RUNS,
})


def is_own_entry(name: str) -> bool:
    """Whether a run dir's entry `name` is one the pipeline (or Hydra, or a logger it runs) writes."""
    if name in OWN_ENTRIES or name.endswith(".tmp"):
        return True
    if name.endswith(".sha256"):  # a file's digest (store/integrity.py)
        return is_own_entry(name.removesuffix(".sha256"))
    if name.startswith(("policy.", "model.")) and name.endswith((".torchscript.pt", ".onnx")):  # python -m pipeline.export
        return True
    if name.startswith("metrics.prev") and name.endswith(".csv"):
        return True
    return name.startswith("seed") and name[4:].isdigit()


# store/record.py's STATUSES (layout imports nothing of the store).
RECORD_STATUSES = ("ok", "failed", "interrupted", "pruned", "running")


def is_own_record(data: object) -> bool:
    """Whether a parsed result.json is a pipeline run record (not a user's own file of that name)."""
    return isinstance(data, dict) and "seed" in data and data.get("status") in RECORD_STATUSES


def foreign_entries(run_dir: Path) -> list[str]:
    """What in `run_dir` the pipeline did not write: [] for a dir that does not exist, is empty or is a run dir of
    ours (its result.json is a pipeline record, or every entry is one the pipeline writes)."""
    run_dir = Path(run_dir)
    try:
        names = sorted(p.name for p in run_dir.iterdir())
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        return [run_dir.name]
    record = result_path(run_dir)
    others = [n for n in names if not is_own_entry(n)]
    if record.is_file():
        try:
            data = json.loads(record.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # half-written: ours when everything beside it is (a run resumed over it keeps it)
            return [RESULT, *others] if others or names == [RESULT] else []
        return [] if is_own_record(data) else [RESULT]
    return others


def agent_dirs(run_dir: Path, seeds: Sequence[int]) -> list[Path]:
    """The record dir of each agent: the run dir itself for one seed, `<run dir>/seed<n>` for K > 1."""
    return [Path(run_dir)] if len(seeds) == 1 else [Path(run_dir) / f"seed{s}" for s in seeds]


def result_path(run_dir: Path) -> Path:
    return Path(run_dir) / RESULT


def metrics_path(run_dir: Path) -> Path:
    return Path(run_dir) / METRICS


def model_path(run_dir: Path) -> Path:
    return Path(run_dir) / MODEL


def best_path(run_dir: Path) -> Path:
    return Path(run_dir) / BEST


def checkpoint_path(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS / LAST


def ids_path(run_dir: Path) -> Path:
    return Path(run_dir) / IDS


def read_ids(run_dir: Path) -> dict:
    """The ids a run kept (ids_path), or {} (none written yet, or unreadable)."""
    try:
        ids = json.loads(ids_path(run_dir).read_text(encoding="utf-8") or "null")
    except (OSError, ValueError):
        return {}
    return ids if isinstance(ids, dict) else {}


def lock_path(run_dir: Path) -> Path:
    return Path(run_dir) / LOCK


def read_owner(run_dir: Path) -> dict | None:
    """The run dir's owner as its lock file names it ({pid, host, since}), or None (no lock, or unreadable)."""
    try:
        owner = json.loads(lock_path(run_dir).read_text(encoding="utf-8") or "null")
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) and isinstance(owner.get("pid"), int) else None


def error_log_path(run_dir: Path) -> Path:
    return Path(run_dir) / ERROR_LOG


def config_path(run_dir: Path) -> Path | None:
    """The composed config saved in `run_dir`, or None."""
    return next((Path(run_dir) / name for name in CONFIG_FILES if (Path(run_dir) / name).is_file()), None)


def record_dirs_of_run(run_dir: Path) -> list[Path]:
    """Where a run dir's records may be: the dir itself (K = 1) and its `seed<n>/` agent dirs (K > 1), those that hold one."""
    run_dir = Path(run_dir)
    try:
        seeds = sorted((p for p in run_dir.glob("seed*") if p.name[4:].isdigit()), key=lambda p: int(p.name[4:]))
    except OSError:
        return []
    return [d for d in (run_dir, *seeds) if result_path(d).is_file()]


def agent_seed_dirs(batch_dir: Path) -> list[Path]:
    """The `seed<n>` agent dirs of a K-seed run that hold trained weights, in order of n."""
    found = [p for p in Path(batch_dir).glob("seed*") if p.name[4:].isdigit() and has_model(p)]
    return sorted(found, key=lambda p: int(p.name[4:]))


def has_record(run_dir: Path) -> bool:
    return result_path(run_dir).is_file()


def has_model(run_dir: Path) -> bool:
    return model_path(run_dir).is_file()


def record_dirs(root: Path) -> Iterator[Path]:
    """Every dir under `root` (itself included) that holds a run record, in sorted order; report/, tune/ and
    wandb/ folders are outputs about runs and are skipped."""
    root = Path(root)
    for path in sorted(root.rglob(RESULT)):
        if any(part in NOT_RUNS for part in path.relative_to(root).parts[:-1]):
            continue
        yield path.parent


def kept_sweep_id(sweep_dir: Path) -> str | None:
    """The sweep id its runs kept (runtime.loggers writes it to each run's IDS), for a sweep resumed in `sweep_dir`;
    None when none kept one."""
    for run_dir in record_dirs(sweep_dir):
        kept = read_ids(run_dir).get("sweep_id")
        if isinstance(kept, str) and kept:
            return kept
    return None

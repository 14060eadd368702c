"""Before a run starts: what it continues from, and what must be refused, decided before anything is written.

Light on purpose (no torch, no Lightning): the CLI asks `preflight` before Hydra creates the run dir, so a
refused command changes nothing and answers in about a second; the lifecycle asks `plan_start` again once it
owns the run dir (the answer cannot change in between: the lock is what makes it final).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from pipeline.config.grouping import flatten, is_ignored, semantic_config
from pipeline.runtime.rundir import RunDirBusy, probe_owner
from pipeline.store.integrity import DamagedCheckpoint, damaged_line, verify_checkpoint
from pipeline.store.layout import agent_dirs, checkpoint_path, foreign_entries
from pipeline.store.record import RunRecord, read_record

log = logging.getLogger("pipeline")


class RunRefused(RuntimeError):
    """The run cannot start without losing or mixing up work; the message is one line with the fix."""


@dataclass
class StartPlan:
    previous: list[RunRecord | None]
    ckpt: Path | None  # the checkpoint the run continues from, or None (a fresh start)
    extending: bool  # a finished (ok) run continued to a larger budget
    nothing_to_do: bool = False  # a finished run asked to resume: its records stand


def plan_start(cfg: DictConfig, run_dir: Path, dirs: list[Path]) -> StartPlan:
    """What the run in `run_dir` (agent records in `dirs`) starts from; RunRefused when it cannot start without
    losing or mixing up work."""
    previous = [read_record(d) for d in dirs]
    wants_resume = bool(cfg.get("ckpt_path")) or bool(cfg.get("resume"))
    extending = all(p is not None and p.status == "ok" for p in previous)
    if extending and not cfg.get("ckpt_path"):
        if wants_resume:
            log.info(f"{run_dir} already finished ok; nothing to continue")
            return StartPlan(previous, None, extending, nothing_to_do=True)
        raise RunRefused(
            f"{run_dir} already holds a finished run (status ok); choose a new dir (hydra.run.dir=<dir>) to run it "
            "again, or continue it to a larger budget with ckpt_path=last"
        )
    ckpt = resolve_ckpt(cfg, checkpoint_path(run_dir), any(p is not None for p in previous))
    if ckpt is not None:
        try:
            verify_checkpoint(ckpt)  # a damaged checkpoint is refused before anything is written
        except DamagedCheckpoint as exc:
            raise RunRefused(damaged_line(exc, ckpt)) from None
        refuse_changed_config(cfg, run_dir, previous)
    if extending and ckpt is None:
        raise RunRefused(f"{run_dir} finished ok and has no checkpoint to continue from; choose a new dir to run it again")
    return StartPlan(previous, ckpt, extending)


def check_run_dir_is_ours(run_dir: Path) -> None:
    """A run dir must be new (absent or empty) or a run dir of ours: a folder of the user's own files (an empty
    `hydra.run.dir=` from an unset shell variable names the current folder) is refused, never written into."""
    foreign = foreign_entries(run_dir)
    if foreign:
        shown = ", ".join(foreign[:4]) + (f" and {len(foreign) - 4} more" if len(foreign) > 4 else "")
        raise RunRefused(
            f"run dir {Path(run_dir).absolute()} holds files the pipeline did not write ({shown}); a run dir must be new "
            "or a run dir of the pipeline: choose another with hydra.run.dir=<dir>"
        )


def preflight(cfg: DictConfig, run_dir: Path) -> None:
    """The CLI's check of a single run into a dir that may hold one already: busy, finished, or resumed with
    another config is refused here, before Hydra writes the dir's .hydra/ (RunRefused)."""
    check_run_dir_is_ours(run_dir)
    try:
        probe_owner(run_dir)
    except RunDirBusy as exc:
        raise RunRefused(str(exc)) from None
    k = cfg.get("seeds_per_process") or 1
    seeds = [int(cfg.seed) + i for i in range(int(k) if isinstance(k, int) and k > 0 else 1)]
    plan_start(cfg, run_dir, agent_dirs(run_dir, seeds))


# What a resume may change: the budget (continue a finished run further), and what the record's config
# already leaves out (config.grouping.IGNORED: seeds, loggers, threads, checkpoint cadence, ...).
RESUME_FREE = ("task.total_steps", "task.max_iterations", "trainer.max_epochs", "trainer.max_steps")


def refuse_changed_config(cfg: DictConfig, run_dir: Path, previous: list[RunRecord | None]) -> None:
    """A resume continues the run its checkpoint holds: with another config it would silently mix two runs."""
    before = next((p.config for p in previous if p is not None and p.config), None)
    if before is None:
        return
    now = flatten(semantic_config(OmegaConf.to_container(cfg, resolve=True)))
    before = flatten(before)
    differing = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k) and not is_ignored(k, RESUME_FREE))
    if differing:
        shown = ", ".join(f"{k} ({before.get(k, '-')} -> {now.get(k, '-')})" for k in differing[:5])
        more = f" and {len(differing) - 5} more" if len(differing) > 5 else ""
        raise RunRefused(
            f"cannot resume {run_dir} with another config: {shown}{more}; resume with the run's own settings, or "
            "start a new run in a new dir (hydra.run.dir=<dir>)"
        )


def resolve_ckpt(cfg: DictConfig, last: Path, has_previous: bool) -> Path | None:
    requested = cfg.get("ckpt_path")
    requeued = os.environ.get("SLURM_RESTART_COUNT", "0") not in ("", "0")
    if not requested and (cfg.get("resume") or requeued) and has_previous:
        # A sweep resumed with resume=true, or a SLURM job requeued after preemption, continues its jobs.
        requested = "last"
    if not requested:
        return None
    if requested == "last":
        if not last.is_file():
            log.info(f"ckpt_path=last: no checkpoint at {last} yet, starting from scratch")
            return None
        return last
    path = Path(str(requested))
    if not path.is_file():
        raise RunRefused(f"ckpt_path={requested}: no such checkpoint file; pass a checkpoint path or `last`")
    return path

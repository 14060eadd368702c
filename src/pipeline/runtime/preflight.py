"""Before a run starts: what it continues from, and what must be refused, decided before anything is written.

Light on purpose (no torch, no Lightning): the front door (`pipeline.runtime.start`, for the CLI and `pipeline.run`)
asks `preflight` before Hydra creates the run dir, so a refused command changes nothing and answers in about a
second, and hands the plan to the lifecycle; a sweep job's lifecycle asks `plan_start` once it owns the run dir.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from pipeline.config.grouping import flatten, is_ignored, semantic_config
from pipeline.runtime.context import path_override
from pipeline.runtime.rundir import RunDirBusy, probe_owner
from pipeline.store.integrity import (
    DamagedCheckpoint,
    UnverifiedFile,
    damaged_line,
    read_digests,
    verify_checkpoint,
)
from pipeline.store.layout import agent_dirs, checkpoint_path, foreign_entries, record_dirs_of_run
from pipeline.store.record import RecordError, RunRecord, read_record

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
    losing or mixing up work: a dir holding another experiment's run (or other seeds), or a run that did not finish
    and is not resumed."""
    previous = [read_record(d) for d in dirs]
    wants_resume = bool(cfg.get("ckpt_path")) or bool(cfg.get("resume")) or _requeued()
    held = held_records(run_dir)
    refuse_another_run(cfg, run_dir, dirs, held, wants_resume)
    if not wants_resume:
        refuse_unfinished(run_dir, held)
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
        try:  # a damaged checkpoint, or one without its digest, is refused before anything is written
            verify_checkpoint(ckpt)
        except DamagedCheckpoint as exc:
            raise RunRefused(damaged_line(exc, ckpt)) from None
        except UnverifiedFile as exc:
            raise RunRefused(f"cannot resume {run_dir}: {exc}") from None
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


def preflight(cfg: DictConfig, run_dir: Path) -> StartPlan:
    """The front door's check of a single run into a dir that may hold one already (`pipeline.runtime.start`): busy,
    finished, or resumed with another config is refused here, before Hydra writes the dir's .hydra/ (RunRefused);
    else what the run starts from."""
    check_run_dir_is_ours(run_dir)
    try:
        probe_owner(run_dir)
    except RunDirBusy as exc:
        raise RunRefused(str(exc)) from None
    k = cfg.get("seeds_per_process") or 1
    seeds = [int(cfg.seed) + i for i in range(int(k) if isinstance(k, int) and k > 0 else 1)]
    return plan_start(cfg, run_dir, agent_dirs(run_dir, seeds))


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
    # A key one side lacks and the other holds empty ([], {}, null) is a setting added since, at its default.
    missing = object()
    differing = sorted(k for k in set(before) | set(now)
                       if before.get(k, missing) != now.get(k, missing) and not is_ignored(k, RESUME_FREE)
                       and not (missing in (before.get(k, missing), now.get(k, missing))
                                and before.get(k, now.get(k)) in ([], {}, None)))
    if differing:
        shown = ", ".join(f"{k} ({before.get(k, '-')} -> {now.get(k, '-')})" for k in differing[:5])
        more = f" and {len(differing) - 5} more" if len(differing) > 5 else ""
        raise RunRefused(
            f"cannot resume {run_dir} with another config: {shown}{more}; resume with the run's own settings, or "
            "start a new run in a new dir (hydra.run.dir=<dir>)"
        )


def _requeued() -> bool:
    """A SLURM job requeued after preemption: it continues its run."""
    return os.environ.get("SLURM_RESTART_COUNT", "0") not in ("", "0")


def held_records(run_dir: Path) -> dict[Path, RunRecord]:
    """Every run record the dir holds, by the dir it is in: its own and its `seed<n>/` agents' (whatever K the new
    run asks for); a record of an unknown schema is left to the reader of the new run's own agent dirs."""
    found = {}
    for d in record_dirs_of_run(run_dir):
        try:
            record = read_record(d)
        except RecordError:
            continue
        if record is not None:
            found[d] = record
    return found


def _seeds_shown(records: list[RunRecord]) -> str:
    seeds = sorted(int(r.seed) for r in records if isinstance(r.seed, int))
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    if seeds and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"seeds {seeds[0]}-{seeds[-1]} together (seed={seeds[0]} seeds_per_process={len(seeds)})"
    return "seeds " + ", ".join(map(str, seeds))


def _resume_of(records: list[RunRecord], run_dir: Path) -> str:
    """The command that continues the run these records belong to, as they say it (else its experiment's)."""
    for r in records:
        said = (r.interrupted or {}).get("resume") or r.extras.get("resume_command")
        if isinstance(said, str) and said:
            return said
    r = records[0]
    preset = (r.extras.get("choices") or {}).get("experiment") if isinstance(r.extras.get("choices"), dict) else None
    experiment = f"experiment={preset or r.experiment} " if (preset or r.experiment) else ""
    return f"python -m pipeline {experiment}{path_override('hydra.run.dir', str(run_dir))} ckpt_path=last"


def refuse_another_run(cfg: DictConfig, run_dir: Path, dirs: list[Path], held: dict[Path, RunRecord], wants_resume: bool) -> None:
    """A dir holding another experiment's run, or the same experiment's with other seeds, is never taken over nor
    resumed as this one: its records would sit beside ours and its checkpoint would be replaced or misread."""
    if not held:
        return
    name = cfg.get("name")
    theirs = next((str(r.experiment) for r in held.values() if r.experiment), None)
    ours = {Path(d).absolute() for d in dirs}
    other_seeds = any(Path(d).absolute() not in ours for d in held)
    other_name = name is not None and theirs is not None and str(name) != theirs
    held = list(held.values())
    if not (other_name or other_seeds):
        return
    what = f"a run of experiment {theirs}" if theirs else "another run"
    mine = f"{name}" if name is not None else "this run"
    seeds_now = [int(cfg.seed) + i for i in range(len(dirs))] if isinstance(cfg.get("seed"), int) else []
    if not other_name:
        what = f"{theirs or 'a run'} with {_seeds_shown(held)}"
        mine = f"seed {seeds_now[0]}" if len(seeds_now) == 1 else f"seeds {seeds_now[0]}-{seeds_now[-1]}" if seeds_now else "other seeds"
    ends = sorted({_ended(r) for r in held})
    status = "/".join(ends)
    if wants_resume:
        raise RunRefused(
            f"cannot resume {run_dir} as {mine}: it holds {what} ({status}); continue that run with its own command "
            f"({_resume_of(held, run_dir)}), or start {mine} in a new dir (hydra.run.dir=<dir>)"
        )
    raise RunRefused(
        f"run dir {run_dir} holds {what} ({status}); it is never taken over: choose a new dir for {mine} "
        f"(hydra.run.dir=<dir>)" + ("" if ends == ["ok"] else f", or continue that run with: {_resume_of(held, run_dir)}")
    )


def _ended(record: RunRecord) -> str:
    """How a record's run ended: its status, or `killed` for one whose last segment never closed (a record is
    `failed` from its first write until the run says otherwise)."""
    last = record.segments[-1] if record.segments else None
    if record.status in ("failed", "running") and isinstance(last, dict) and "end" not in last:
        return "killed"
    return record.status


def refuse_unfinished(run_dir: Path, held: dict[Path, RunRecord]) -> None:
    """A fresh start into a dir whose run did not finish (killed, interrupted, or failed after a checkpoint) would
    replace its checkpoint and its records: it is refused, naming the command that continues it."""
    last = checkpoint_path(run_dir)
    unfinished = [r for r in held.values() if r.status in ("running", "interrupted") or (r.status == "failed" and last.is_file())]
    if not unfinished and (held or not last.is_file()):
        return
    step = (read_digests(last) or {}).get("step") if last.is_file() else None
    saved = f"its checkpoint holds step {step}" if step is not None else "it has a checkpoint" if last.is_file() else "no checkpoint yet"
    if not unfinished:
        raise RunRefused(f"run dir {run_dir} holds a checkpoint ({last}) and no run record; continue from it with "
                         "ckpt_path=last, or start afresh in a new dir (hydra.run.dir=<dir>)")
    said = {"running": "was killed", "killed": "was killed", "interrupted": "was interrupted", "failed": "failed"}[_ended(unfinished[0])]
    raise RunRefused(
        f"run dir {run_dir} holds a run that {said} ({saved}); continue it with: {_resume_of(unfinished, run_dir)}; "
        "or start afresh in a new dir (hydra.run.dir=<dir>)"
    )


def resolve_ckpt(cfg: DictConfig, last: Path, has_previous: bool) -> Path | None:
    requested = cfg.get("ckpt_path")
    requeued = _requeued()
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

"""What a run needs from Hydra as plain values (`JobContext`: a sweep job's child process has no Hydra), and the
exit status the CLI ends with (`exit_status`: raised by the run and by the sweep-end callback)."""

from __future__ import annotations

import logging
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger("pipeline")


class ExitStatus:
    """The process's exit code: the worst outcome seen (a config error 2, a failed run 1, an interrupted 130/143)."""

    def __init__(self) -> None:
        self.code = 0

    def set(self, code: int) -> None:
        self.code = int(code)

    def at_least(self, code: int) -> None:
        self.code = max(self.code, int(code))


exit_status = ExitStatus()

# Set by a sweep's callback (pipeline.sweep) while it runs: what ends the sweep when its launcher fails under it.
# The CLI calls it (exception, stopped) -> whether it handled the failure; the CLI cannot import the sweep module.
launcher_failure_handler: list = []


@dataclass
class JobContext:
    """What a run needs from Hydra, as plain values (a child process has no Hydra)."""

    run_dir: str
    multirun: bool = False
    overrides: list[str] = field(default_factory=list)
    choices: dict[str, str] = field(default_factory=dict)
    num_threads: int | None = None
    sweep_dir: str | None = None
    job_num: int | None = None
    # True in a sweep job's own process: SIGUSR2 (SLURM's warning before preemption or the time
    # limit, as submitit asks for it) then also means "checkpoint and stop".
    isolated: bool = False
    # The sweep's own overrides (`seed=0,1,2`, not this job's `seed=1`): what its resume command repeats.
    sweep_overrides: list[str] = field(default_factory=list)
    # This process's rank in a run on several processes (trainer=ddp): rank 0 owns the run dir, the others write nothing.
    rank: int = 0

    @classmethod
    def from_hydra(cls, cfg: DictConfig) -> JobContext:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        multirun = hc.mode == RunMode.MULTIRUN
        return cls(
            run_dir=str(hc.runtime.output_dir),
            multirun=multirun,
            overrides=list(hc.overrides.task),
            choices={str(k): str(v) for k, v in hc.runtime.choices.items() if v is not None},
            num_threads=threads_for_this_job(cfg.device.num_threads, hc, multirun),
            sweep_dir=str(hc.sweep.dir) if multirun else None,
            job_num=int(hc.job.num) if multirun and hc.job.get("num") is not None else None,
            sweep_overrides=_sweep_overrides(str(hc.sweep.dir)) if multirun else [],
        )

    def resume_command(self) -> str:
        """The one command that continues this run (or, in a sweep, finishes the sweep)."""
        given = self.sweep_overrides if (self.multirun and self.sweep_overrides) else self.overrides
        skip = ("ckpt_path=", "resume=", "hydra.run.dir=", "hydra.sweep.dir=", "hydra.mode=")
        args = " ".join(shlex.quote(o) for o in given if not o.startswith(skip))
        if self.multirun and self.sweep_dir:
            return f"python -m pipeline -m {args} {path_override('hydra.sweep.dir', self.sweep_dir)} resume=true".replace("  ", " ")
        return f"python -m pipeline {args} {path_override('hydra.run.dir', self.run_dir)} ckpt_path=last".replace("  ", " ")


# Characters a Hydra override value may hold unquoted; a sweep job's dir (`3_seed=3,lr=0.1`) holds others.
_HYDRA_PLAIN = re.compile(r"^[\w./~+:@%-]+$")


def hydra_quoted(value: str) -> str:
    """`value` as Hydra's override grammar reads it back unchanged: as it is when plain, else single-quoted."""
    return value if _HYDRA_PLAIN.match(value) else "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def path_override(key: str, path: str) -> str:
    """`key=path` as a shell word Hydra reads back as that path: quoted for Hydra's grammar when the path holds
    `=`, `,`, spaces or brackets (a sweep job's dir does), then for the shell."""
    value = hydra_quoted(path)
    word = f"{key}={value}"
    return f'"{word}"' if value != path and not any(c in word for c in '"$`\\!') else shlex.quote(word)


def _sweep_overrides(sweep_dir: str) -> list[str]:
    saved = Path(sweep_dir) / "multirun.yaml"
    try:
        hydra = OmegaConf.load(saved).hydra
        return [str(o) for o in (*hydra.overrides.hydra, *hydra.overrides.task)]
    except (OSError, ValueError, AttributeError, yaml.YAMLError):  # missing, not Hydra's, or cut short (a full disk)
        return []


def threads_for_this_job(requested, hydra_cfg, multirun: bool) -> int | None:
    """Under a parallel launcher, jobs x threads must not exceed the cores (oversubscription is 3-10x slower)."""
    n_jobs = OmegaConf.select(hydra_cfg, "launcher.n_jobs", default=None)
    if not multirun or not isinstance(n_jobs, int) or requested is None:
        return requested
    cores = os.cpu_count() or 1
    # joblib: -1 means all cores, -2 all but one, ...
    parallel = cores + 1 + n_jobs if n_jobs < 0 else n_jobs
    cap = max(1, cores // max(1, parallel))
    if int(requested) > cap:
        log.info(f"device.num_threads={requested} lowered to {cap}: {parallel} parallel jobs on {cores} cores")
    return min(int(requested), cap)

"""The composition root: config -> objects -> fit -> evaluate -> K run records (K = 1 included).

One lifecycle for one seed or K seeds trained together (`seeds_per_process=K`): agent i is seed
`seed + i` and gets an ordinary run record of its own (the run dir itself for K = 1,
`<run dir>/seed<n>/` for K > 1), never a synthetic one. The lifecycle is durable:

- the run dir has one owner (`rundir.RunDirLock`);
- a finished (`ok`) record is never overwritten; a resume that cannot load its checkpoint leaves the
  earlier record and curve untouched and says why in one line;
- tasks checkpoint while they train (`checkpoint.CheckpointPolicy`: every 60 s by default), and on
  SIGINT/SIGTERM save, record `status: interrupted` with the step reached and the exact resume
  command, and exit 130/143;
- `ckpt_path=last` (or `resume=true` in a sweep) continues from the checkpoint: metrics.csv keeps its
  rows up to the checkpoint's step and `wall_time_s` adds up every segment.

It takes a run as the start-up check returned it (`pipeline.config.startup.CheckedRun`: the config checked once,
the task's typed Config, seeds, processes, device and checkpoint settings) and checks nothing itself. Only this
module (and the entry points) knows about config objects; everything it builds takes plain arguments and can be
made by hand in a notebook.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import traceback
import warnings
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.callbacks import Checkpoint
from omegaconf import DictConfig, OmegaConf, open_dict

from pipeline.config.checks import PROCESS_KEYS, one_line
from pipeline.config.errors import ConfigError
from pipeline.config.grouping import group_name, semantic_config
from pipeline.config.startup import CheckedRun, CheckpointSettings, check_run
from pipeline.runtime import quiet
from pipeline.runtime.callbacks import early_stop_of
from pipeline.runtime.checkpointing import (
    CheckpointPolicy,
    EpochCheckpointer,
    ValidationTimer,
    curve_step_of,
    history_of,
    state_checkpointer,
)
from pipeline.runtime.cluster import slurm_rank
from pipeline.runtime.context import JobContext
from pipeline.runtime.devices import RankProcesses, ddp_strategy, flushes_denormals, setup_device
from pipeline.runtime.loggers import CurveLogger, build_loggers, finish_loggers
from pipeline.runtime.preflight import RunRefused, StartPlan, check_run_dir_is_ours, plan_start, resolve_ckpt
from pipeline.runtime.rundir import (
    STOP_SIGNALS,
    Interrupted,
    RunDirBusy,
    RunDirLock,
    StopRequests,
    note_resume_command,
    say,
)
from pipeline.runtime.seeding import seed_everything
from pipeline.store.atomic import StoreWriteError, write_error
from pipeline.store.checkpoint import load_safely, save_model
from pipeline.store.curves import CurveLog
from pipeline.store.integrity import DamagedCheckpoint, damaged_line
from pipeline.store.layout import (
    RESULT,
    UNREADABLE_RECORD,
    agent_dirs,
    checkpoint_path,
    error_log_path,
    metrics_path,
)
from pipeline.store.owner import this_process
from pipeline.store.record import RunRecord, git_commit, versions
from pipeline.tasks.base import Task, TaskParts

log = logging.getLogger("pipeline")

warnings.filterwarnings("ignore", message=".*isinstance.treespec, LeafSpec.*")


def _is_empty(node) -> bool:
    return node is None or (isinstance(node, DictConfig) and len(node) == 0)


def build_task(run: CheckedRun | DictConfig, datamodule, n_agents: int | None = None, run_dir: Path | None = None,
               device: torch.device | None = None) -> Task:
    """`TaskClass(config, parts)`: the typed hyperparameters and the objects built from the groups it uses. A config
    not yet checked (tests, `python -m pipeline.eval`) goes through the start-up check first, at `n_agents` seeds."""
    if not isinstance(run, CheckedRun):
        cfg = run
        if n_agents is not None and n_agents != (cfg.get("seeds_per_process") or 1):
            cfg = cfg.copy()
            with open_dict(cfg):
                cfg.seeds_per_process = n_agents
        run = check_run(cfg)
    cfg, uses = run.cfg, run.uses

    def part(group: str):
        return None if group not in uses or _is_empty(cfg.get(group)) else instantiate(cfg[group])

    env = None if "env" not in uses or _is_empty(cfg.get("env")) else OmegaConf.to_container(cfg.env, resolve=True)
    parts = TaskParts(
        seed=run.seed, n_agents=run.k, net=part("model"), loss=part("loss"), optimizer=part("optimizer"),
        scheduler=part("scheduler"), env=env, datamodule=datamodule if "data" in uses else None,
        run_dir=run_dir, device=device,
    )
    return run.task_class()(run.task, parts)


def make_trainer(run: CheckedRun, accelerator: str, run_dir: Path, loggers, callbacks, ranks: RankProcesses | None = None,
                 task: Task | None = None) -> L.Trainer:
    """The run's Trainer; with several processes (trainer=ddp) one rank's, in step with the others (`ranks`: the
    local ranks rank 0 starts; None on the other ranks and under SLURM, whose tasks are the ranks; `task`: what
    it declares to DDP)."""
    from lightning.pytorch.callbacks import ProgressBar

    from pipeline.runtime.callbacks import aligned_epoch_metrics, build_callbacks, trainer_kwargs
    from pipeline.runtime.progress_bar import BudgetProgressBar

    cfg = run.cfg
    built = build_callbacks(cfg, run_dir, own=callbacks)
    kwargs = trainer_kwargs(cfg)
    if kwargs.get("enable_progress_bar", True) and not any(isinstance(c, ProgressBar) for c in built):
        built.append(BudgetProgressBar())  # RL tasks count env steps against their budget, not epochs
    if any(isinstance(c, Checkpoint) for c in built):  # Lightning refuses a Checkpoint callback with its switch off
        kwargs["enable_checkpointing"] = True
    # One process, one device: the cluster environment is named, not detected. Detection warns "`srun` is
    # available but not used" on every run of a SLURM login node, and inside a SLURM job it picks
    # SLURMEnvironment, whose auto-requeue would requeue the job a second time on top of ours (runtime.job:
    # SIGUSR2 -> checkpoint -> submitit requeues once).
    kwargs.setdefault("plugins", [LightningEnvironment()])
    devices = 1
    if run.processes > 1:
        devices, nodes = int(kwargs.pop("devices", 1)), int(kwargs.pop("num_nodes", 1))
        slurm = slurm_rank() is not None
        if slurm:  # SLURM started the ranks: its environment names them; requeueing stays ours (runtime.job)
            from lightning.fabric.plugins.environments import SLURMEnvironment

            kwargs["plugins"] = [SLURMEnvironment(auto_requeue=False)]
        timeout = float(OmegaConf.select(cfg, "trainer.ddp_timeout_s", default=None) or 120)
        unused = task is not None and task.ddp_unused_parameters
        kwargs.update(strategy=ddp_strategy(None if slurm else ranks, timeout, unused), num_nodes=nodes)
    else:
        for key in PROCESS_KEYS:
            kwargs.pop(key, None)
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=devices,
        precision=run.device.precision,
        logger=loggers or False,
        callbacks=built,
        default_root_dir=str(run_dir),
        deterministic=run.device.deterministic,
        **kwargs,
    )
    if trainer.world_size > 1:
        trainer.callbacks.insert(0, aligned_epoch_metrics())
        # Lightning's SIGTERM handler broadcasts from inside the handler, a collective the other ranks are not in;
        # the ranks agree on a stop request at their next batch end instead (checkpointing.EpochCheckpointer).
        trainer._signal_connector.register_signal_handlers = lambda: None
    return trainer


def exit_code_of(records: list[dict]) -> int:
    if any(r.get("status") == "interrupted" for r in records):
        return int((records[0].get("interrupted") or {}).get("exit_code") or 130)
    return 0 if records and all(r.get("status") == "ok" for r in records) else 1


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def run(cfg: DictConfig | CheckedRun, run_dir: Path | None = None) -> list[dict]:
    """Run from Python (tests, notebooks): the Hydra context when there is one, else `run_dir`. A config not yet
    checked goes through the start-up check first (`pipeline.config.startup.check_run`)."""
    checked = cfg if isinstance(cfg, CheckedRun) else check_run(cfg)
    try:
        ctx = JobContext.from_hydra(checked.cfg)
    except ValueError:
        ctx = JobContext(run_dir=str(run_dir))
    if run_dir is not None:
        ctx.run_dir = str(run_dir)
    return run_job(checked, ctx)


def run_job(run: CheckedRun, ctx: JobContext, trial_reporter: Callable[[Any], Any] | None = None,
            plan: StartPlan | None = None) -> list[dict]:
    """Run one job (K agents) and write its records. Refusals raise RunRefused; every other failure is recorded.

    `trial_reporter`: what makes the tuner's reporter from `cfg.trial` (handed in by the entry that runs sweep jobs,
    `runtime.job`; the lifecycle knows no tuner). None, or no `cfg.trial`: the task reports to no trial.
    `plan`: what the run continues from, when the front door already planned it under the run dir's lock
    (`pipeline.runtime.start`); None: planned here, once this process holds the lock."""
    run_dir = Path(ctx.run_dir)
    dirs = agent_dirs(run_dir, run.seeds)
    if plan is None:
        check_run_dir_is_ours(run_dir)  # a user's own folder is never written into (a run from Python, a sweep job)
    lock = RunDirLock(run_dir)
    try:
        lock.acquire()
    except RunDirBusy as exc:
        raise RunRefused(str(exc)) from None
    # The run flushes denormals (device.flush_denormal); whoever called it gets their own setting back
    # (hypothesis, for one, refuses to run in a process that flushes subnormal floats).
    flushing = flushes_denormals()
    # The harmless third-party warnings (runtime.quiet: exact messages only) are silenced for a run from Python
    # too, as the CLI and a sweep's job process do: Lightning's "srun is available" on every machine with
    # SLURM's tools.
    quiet.install()
    quiet.quiet_failing_log_handlers()  # run.log on a disk that fills up: one line, not a traceback per log line
    try:
        return _run_locked(run, ctx, run_dir, dirs, trial_reporter, plan)
    finally:
        torch.set_flush_denormal(flushing)
        lock.release()


def _run_locked(run: CheckedRun, ctx: JobContext, run_dir: Path, dirs: list[Path], trial_reporter,
                plan: StartPlan | None) -> list[dict]:
    plan = plan if plan is not None else plan_start(run.cfg, run_dir, dirs)
    if plan.nothing_to_do:
        return [p.to_dict() for p in plan.previous]
    if plan.extending:
        log.info(f"{run_dir} finished ok; continuing it from its checkpoint ({RESULT} keeps the finished record until this ends ok)")
    return _Lifecycle(run, ctx, run_dir, dirs, plan).run(trial_reporter)


class _Lifecycle:
    """One run's way: build -> attach -> fit -> save -> finish, and (in `run`) what each way of failing leaves."""

    def __init__(self, run: CheckedRun, ctx: JobContext, run_dir: Path, dirs: list[Path], plan: StartPlan) -> None:
        self.checked, self.cfg, self.ctx, self.run_dir, self.dirs, self.plan = run, run.cfg, ctx, run_dir, dirs, plan
        self.seeds = list(run.seeds)
        self.ckpt, self.ckpt_file = plan.ckpt, checkpoint_path(run_dir)
        self.processes = run.processes
        self.t_start = time.perf_counter()
        # SLURM's SIGUSR2 (a sweep job's own process), and SIGUSR2 to any rank of a run on several processes.
        signals = (*STOP_SIGNALS, signal.SIGUSR2) if ctx.isolated or self.processes > 1 else STOP_SIGNALS
        self.stop = StopRequests(signals).install()
        self.loggers: list = []
        self.records: list[RunRecord] = []
        self.curves: list[CurveLog] = []
        self.task: Task | None = None
        self.ranks: RankProcesses | None = None
        self.saves = {"count": 0, "seconds": 0.0}
        self._evaluations_noted = 0

    def run(self, trial_reporter) -> list[dict]:
        """The failure policy, in one place: a resume that cannot load its checkpoint is refused and leaves the earlier
        record and curve as they were; more processes than batches is refused before any record; a stop request
        records `interrupted` with the resume command; any other failure records `failed` (traceback in error.log,
        a rank that ended named)."""
        try:
            self.build()
        except RunRefused:
            self.stop.uninstall()
            raise
        except Exception as exc:
            return self.failed(exc)
        try:
            _check_batches(self.cfg, self.datamodule, self.processes)
        except ConfigError:
            self.stop.uninstall()
            raise
        try:
            self.start()
            self.attach(trial_reporter)
            self.save(self.fit())
        except Interrupted as exc:
            return self.interrupted(exc)
        except Exception as exc:  # every failure becomes a record; the traceback goes to error.log
            return self.failed(exc)
        finally:
            if self.ranks is not None:  # a failed run's other ranks hold nothing worth waiting for
                self.ranks.close(wait_s=0 if any(r.status == "failed" for r in self.records) else 60)
        return self.finish()

    def failed(self, exc: Exception) -> list[dict]:
        if not self.records:
            self.records = _start_records(self.cfg, self.ctx, self.dirs, self.seeds, self.plan.previous, None)
        cause = exc if self.ranks is None else self.ranks.failure(exc)
        trace = traceback.format_exc()
        for d in {Path(self.run_dir), *(Path(r.run_dir) for r in self.records)}:
            try:
                error_log_path(d).write_text(trace)
            except OSError as log_exc:  # the disk that failed the run may refuse the log too: the record says why
                error_log_path(d).unlink(missing_ok=True)
                log.error(f"traceback not saved: {write_error(error_log_path(d), log_exc)}")
        error = str(cause) if isinstance(cause, StoreWriteError) else one_line(cause)
        return self.end_unfinished("failed", error=error)

    def interrupted(self, exc: Interrupted) -> list[dict]:
        """A stop request honoured at a checkpoint: the records say `interrupted`, with the command that continues."""
        stop = self.stop
        command = self.ctx.resume_command()
        info = {"signal": stop.name or "unknown", "step": exc.step, "exit_code": stop.exit_code, "resume": command}
        out = self.end_unfinished("interrupted", error=f"stopped by {info['signal']} at step {exc.step}", interrupted=info)
        note_resume_command(command)
        say(f"interrupted by {info['signal']} at step {exc.step}; continue with: {command}")
        return out

    def end_unfinished(self, end: str, **fields) -> list[dict]:
        """Close a segment that did not finish ok: its records say why, the curves are flushed, the loggers closed."""
        records, task = self.records, self.task
        _close_segment(records, self.t_start, end)
        for i, r in enumerate(records):
            r.update(status=end, **fields)
            if task is not None:
                r.time_breakdown_s = {key: round(v, 4) for key, v in task.time_breakdown_s.items()}
                try:  # what the task knows so far (rows read, env steps, ...) stays in the record
                    r.update(**task.agent_record(i))
                except Exception:  # noqa: BLE001 - a half-built task may not know; the failure itself is what matters
                    pass
        for item in (*self.curves, *records):  # a full disk may refuse these too: say so once each, lose nothing else
            try:
                item.flush() if isinstance(item, CurveLog) else item.write()
            except StoreWriteError as exc:
                log.error(str(exc))
        finish_loggers(self.loggers, "failed")
        self.stop.uninstall()
        return [r.to_dict() for r in records]

    def finish(self) -> list[dict]:
        """A run that ended ok: the segment closed, the curves flushed, each record written where it belongs and
        published to its seed's loggers, the loggers closed, then the training videos (task.capture_video)."""
        records = self.records
        _close_segment(records, self.t_start, "ok")
        self.flush_curves()
        for r in records:
            side = getattr(r, "file", None)
            r.file = RESULT
            r.write()
            if side and side != RESULT:
                (Path(r.run_dir) / side).unlink(missing_ok=True)
        _publish(self.task.agent_loggers, records)
        finish_loggers(self.loggers, "ok")
        self.stop.uninstall()
        if self.task.capture_video:  # after the run's own loggers have closed: the replay is a run of its own in W&B
            try:
                _capture_videos(self.cfg, records, self.dirs, records[0].device or "cpu")
            except Exception as exc:  # a video problem must not turn a finished run into a failed one
                log.warning(f"no video: {one_line(exc)}")
            for r in records:
                r.write()
        return [r.to_dict() for r in records]

    def build(self) -> None:
        """Device, data, task and the checkpoint's state; a resume that cannot load it is RunRefused."""
        try:
            built = _build(self.checked, self.ctx, self.run_dir, self.ckpt)
        except Exception as exc:
            if self.ckpt is None:
                raise
            if isinstance(exc, DamagedCheckpoint):
                raise RunRefused(damaged_line(exc, self.ckpt)) from None
            raise RunRefused(f"cannot resume {self.run_dir} from {self.ckpt}: {one_line(exc)}; the earlier record is kept") from None
        self.device, self.datamodule, self.task, self.resume_step, self.curve_step, self.setup_s, self.history_kept = built

    def start(self) -> None:
        """The records say the run has started (a resumed one carries its segments); the other local ranks start."""
        task, side = self.task, EXTENDING if self.plan.extending else None
        self.records = _start_records(self.cfg, self.ctx, self.dirs, self.seeds, self.plan.previous, self.resume_step, side,
                                      self.history_kept)
        for r in self.records:
            r.update(task=type(task).__name__, primary_metric=task.primary_metric, primary_curve=task.primary_curve,
                     higher_is_better=task.higher_is_better, device=str(self.device),
                     **_process_fields(self.datamodule, self.processes))
            r.write()
        # Ranks 1..N-1 of a run on several processes on this machine start with the fit (SLURM starts its own tasks).
        if self.processes > 1 and slurm_rank() is None:
            self.ranks = RankProcesses(_rank_job_dir(self.cfg, self.ctx, self.ckpt))

    def attach(self, trial_reporter) -> None:
        """Curves, loggers, the tuner's reporter, the video hook and checkpointing to the task; the trainer."""
        cfg, task, k = self.cfg, self.task, len(self.seeds)
        self.curves = [CurveLog(metrics_path(d), resume_step=self.curve_step) for d in self.dirs]
        resolved = OmegaConf.to_container(cfg, resolve=True)
        agent_loggers = _build_agent_loggers(cfg, resolved, self.records, self.loggers)
        trainer_loggers = list(agent_loggers[0]) if k == 1 else []  # K > 1: each seed's loggers are the task's to feed
        task.agent_loggers = agent_loggers
        task.compile_updates = self.checked.device.compile
        if task.compile_updates and task.checkpointing == "lightning":
            # Lightning's own loop (supervised, GAN) runs eagerly: the switch is said to do nothing, not silently ignored.
            log.warning(f"device.compile=true: {type(task).__name__} trains in Lightning's loop, which is not compiled "
                        "(the RL tasks compile their updates); it runs eagerly")
        elif task.compile_updates:
            log.info("device.compile=true: results are not bitwise eager's for the same seeds (compiled kernels round "
                     "float32 in another order; docs/compiled_updates.md): compare seed distributions, not single runs")
        if task.writes_curves:
            task.curves = self.curves
        else:
            trainer_loggers.insert(0, CurveLogger(self.curves[0]))
            self.loggers.insert(0, trainer_loggers[0])
        if trial_reporter is not None and cfg.get("trial") is not None:
            task.trial_reporter = trial_reporter(cfg.trial)
        from pipeline.runtime.replay import training_video_hook

        task.video_hook = training_video_hook(cfg, self.dirs, self.seeds, self.device.type, agent_loggers)  # if it records
        policy = _policy(self.checked.checkpoint)
        self.timer, self.epochs = ValidationTimer(), None
        callbacks: list = [self.timer]
        if task.checkpointing == "state":
            task.checkpoint_hook = state_checkpointer(task, self.ckpt_file, policy, self.stop, self.note_save,
                                                      history=self.history, note_progress=self.note_progress,
                                                      before_save=self.flush_curves)
        else:
            self.epochs = EpochCheckpointer(self.ckpt_file, policy, self.stop, self.note_save, saved_epoch=self.resume_step,
                                            curve_step=lambda: max((c.last_step() for c in self.curves if c.rows), default=None),
                                            history=self.history, before_save=self.flush_curves)
            callbacks.append(self.epochs)
        policy.start(self.resume_step or 0)
        self.trainer = make_trainer(self.checked, self.device.type, self.run_dir, trainer_loggers, callbacks, self.ranks, task)

    def flush_curves(self) -> None:
        for c in self.curves:
            c.flush()

    def history(self, step: int | None) -> list[dict]:
        """The records' segments as they stand once a checkpoint of `step` is saved (what the checkpoint keeps)."""
        segments = [dict(seg) for seg in self.records[0].segments] if self.records else []
        if segments:
            segments[-1].update(wall_time_s=round(time.perf_counter() - self.t_start, 3), to_step=step)
        return segments

    def note_progress(self) -> None:
        """At a safe point without a save: a new evaluation (a value of the task's primary curve) goes into the
        records at once, with what the task says of it (its evaluations, the `best` its best.pt holds), so a run
        killed before its next checkpoint still says which evaluation best.pt holds."""
        key = self.task.primary_curve
        seen = sum(c.counts.get(key, 0) for c in self.curves) if key else 0
        if seen == self._evaluations_noted:
            return
        self._evaluations_noted = seen
        self._note_task()
        self.flush_curves()
        for r in self.records:
            r.write()

    def _note_task(self) -> None:
        for i, r in enumerate(self.records):
            try:  # what the task knows so far (env steps, evaluations, best): as _end_unfinished keeps it
                r.update(**self.task.agent_record(i))
            except Exception:  # noqa: BLE001 - a record without these fields is still a record
                pass

    def note_save(self, step: int, seconds: float, size: int, replay_saved: bool | None = None) -> None:
        """A checkpoint was saved: the records say where it is, what it holds and how to go on from it."""
        self.saves["count"] += 1
        self.saves["seconds"] += seconds
        info = {"path": str(self.ckpt_file), "step": step, "saved_at": _now(), "size_bytes": size,
                "saves": self.saves["count"], "save_seconds": round(self.saves["seconds"], 3)}
        if replay_saved is not None:
            info["replay_saved"] = replay_saved
        self._note_task()
        for r in self.records:
            r.checkpoint = info
            # A segment killed later still counts the time up to its last checkpoint.
            r.segments[-1].update(wall_time_s=round(time.perf_counter() - self.t_start, 3), to_step=step)
            # A reader that finds this process gone says how far the checkpoint got and how to go on (store.owner).
            r.wall_time_s = round(sum(float(seg.get("wall_time_s") or 0.0) for seg in r.segments), 3)
            r.write()

    def fit(self) -> list[dict[str, float]]:
        """The task's fit and final evaluation; a stop request ends it at a safe point with one checkpoint."""
        task, stop, epochs = self.task, self.stop, self.epochs
        lightning_ckpt = str(self.ckpt) if self.ckpt is not None and task.checkpointing == "lightning" else None
        per_agent = None
        try:
            per_agent = task.fit_and_evaluate(self.trainer, self.datamodule, lightning_ckpt)
        except SystemExit:
            # Lightning handles SIGTERM too (its handler chains to ours) and ends the fit with SIGTERMException,
            # a SystemExit with no code, at points of its own between our safe points (after a batch's last
            # callback, after an epoch). Uncaught, the process exited 0 and the record still said running.
            if not stop.requested:
                raise
            if epochs is None:
                task.checkpoint_hook()  # state tasks: between two steps, so the state is whole; saves, raises Interrupted
        if stop.requested:  # the fit ended on a stop request after its last safe point
            if epochs is not None:
                epochs.save_last_finished_epoch()
            raise Interrupted(task.resume_step if epochs is None else epochs.saved_epoch)
        return per_agent

    def save(self, per_agent: list[dict[str, float]]) -> None:
        """Each agent's model.pt and its record's final metrics and time breakdown."""
        task = self.task
        stopped = early_stop_of(self.trainer)  # a configured EarlyStopping ended the fit: when and why
        for i, (r, d) in enumerate(zip(self.records, self.dirs)):
            save_model(task.agent_state_dict(i), d, task.agent_files(i))
            extras = task.agent_record(i)
            if stopped is not None and extras.get("early_stop") is None:  # the tuner's pruning, when both, is what it reads
                extras["early_stop"] = stopped
            r.update(status="ok", error=None, metrics=per_agent[i], **extras)
            if r.primary_metric not in per_agent[i]:
                raise RuntimeError(f"task did not report its primary metric {r.primary_metric!r}")
        breakdown = {"setup": self.setup_s, **task.time_breakdown_s}
        val = self.timer.seconds
        if "fit" in breakdown and val:
            breakdown["fit"] -= val
            breakdown = {("train" if key == "fit" else key): v for key, v in breakdown.items()}
            breakdown["val"] = val
        if self.saves["count"]:
            breakdown["checkpoint"] = self.saves["seconds"]
        for r in self.records:
            r.time_breakdown_s = {key: round(v, 4) for key, v in breakdown.items()}


def _build(run: CheckedRun, ctx: JobContext, run_dir: Path, ckpt: Path | None):
    """What every rank builds alike: the device, the data, the task and the checkpoint's state it resumes from."""
    seed_everything(run.seed, deterministic=run.device.deterministic)
    device = setup_device(
        run.device.accelerator,
        ctx.num_threads if ctx.num_threads is not None else run.device.num_threads,
        flush_denormal=run.device.flush_denormal,
        cpu_heap_mb=run.device.cpu_heap_mb,
    )
    t0 = time.perf_counter()
    datamodule = None if _is_empty(run.cfg.get("data")) else instantiate(run.cfg.data)
    if datamodule is not None:
        datamodule.prepare_data()
        datamodule.setup("fit")
    task = build_task(run, datamodule, run_dir=run_dir, device=device)
    resume_step = curve_step = history = None
    if ckpt is not None:
        resume_state = load_safely(ckpt, "checkpoint")
        resume_step = task.load_checkpoint_state(resume_state)
        curve_step = curve_step_of(resume_state, resume_step)
        history = history_of(resume_state)
    return device, datamodule, task, resume_step, curve_step, time.perf_counter() - t0, history


def _check_batches(cfg: DictConfig, datamodule, processes: int) -> None:
    """Every process of a run on several needs a batch of its own each step: more processes than batches is refused."""
    if processes <= 1 or datamodule is None:
        return
    batches = len(datamodule.train_dataloader())
    if processes > batches:
        raise ConfigError(
            f"{processes} processes (trainer.devices x trainer.num_nodes) but {batches} training batch(es) of "
            f"data.batch_size={getattr(datamodule, 'batch_size', '?')}: each process needs a batch of its own every step; "
            f"use trainer.devices={max(1, batches)} or a smaller data.batch_size")


def _process_fields(datamodule, processes: int) -> dict:
    """What a record of a run on several processes adds: how many, and the batch one step of all of them sees."""
    if processes <= 1:
        return {}
    batch = getattr(datamodule, "batch_size", None)
    return {"processes": processes, "effective_batch_size": None if batch is None else int(batch) * processes}


def _rank_job_dir(cfg: DictConfig, ctx: JobContext, ckpt: Path | None) -> Path:
    """The config and context the other local ranks start from, in a temporary folder (never in the run dir)."""
    import json
    import tempfile
    from dataclasses import asdict

    job_dir = Path(tempfile.mkdtemp(prefix="pipeline-ranks-"))
    rank_cfg = cfg.copy()
    with open_dict(rank_cfg):
        rank_cfg.ckpt_path = None if ckpt is None else str(Path(ckpt).absolute())
    OmegaConf.save(rank_cfg, job_dir / "config.yaml", resolve=True)
    (job_dir / "context.json").write_text(json.dumps(asdict(ctx)))
    return job_dir


def run_rank(run: CheckedRun, ctx: JobContext) -> int:
    """Rank `ctx.rank` > 0 of a run on several processes: builds what rank 0 builds and trains in step with it, with
    no lock, no record, no curve, no logger and no checkpoint of its own. Returns its exit code (interrupted: the
    signal's, as rank 0's)."""
    run_dir = Path(ctx.run_dir)
    stop = StopRequests((*STOP_SIGNALS, signal.SIGUSR2)).install()
    try:
        ckpt = resolve_ckpt(run.cfg, checkpoint_path(run_dir), has_previous=True)
        device, datamodule, task, *_ = _build(run, ctx, run_dir, ckpt)
        epochs = EpochCheckpointer(checkpoint_path(run_dir), _policy(run.checkpoint), stop, on_save=None, writes=False)
        trainer = make_trainer(run, device.type, run_dir, [], [ValidationTimer(), epochs], task=task)
        task.fit_and_evaluate(trainer, datamodule, None if ckpt is None else str(ckpt))
    except Interrupted:
        return stop.exit_code
    finally:
        stop.uninstall()
    return 0


def _build_agent_loggers(cfg: DictConfig, resolved: dict, records: list[RunRecord], built: list) -> list[list]:
    """Each seed's TensorBoard (and W&B) run in its own run dir, named and tagged as a K = 1 run of that seed.

    Every logger made is appended to `built` as soon as it exists, so a failure on a later seed still closes it.
    """
    spec = dict(cfg.get("logger") or {})
    spec.pop("csv", None)  # metrics.csv is each seed's CurveLog
    per_agent = []
    for r in records:
        made = build_loggers(spec, Path(r.run_dir), run_name=f"{cfg.name}-seed{r.seed}", group=r.group, job_type=r.task,
                             seed=int(r.seed), config={**resolved, "seed": int(r.seed)})
        made = [lg for lg in made if type(lg).__name__ != "CSVLogger"]
        built.extend(made)
        per_agent.append(made)
    return per_agent


def _capture_videos(cfg: DictConfig, records: list[RunRecord], dirs: list[Path], device: str) -> None:
    """One greedy episode of each agent's final policy (model.pt) as an MP4, through pipeline.eval's replay code."""
    from pipeline.runtime.replay import Options, log_to_run_loggers, play

    for r, d in zip(records, dirs):
        result = play(Options(run_dir=d, episodes=1, video=True, device=str(device)), cfg, int(r.seed))
        r.update(videos=result["videos"], video_returns=result["returns"])
        try:
            log_to_run_loggers(cfg, result, d)
        except Exception as exc:  # a logger problem must not fail a finished run
            log.warning(f"video not logged: {one_line(exc)}")


def _policy(settings: CheckpointSettings) -> CheckpointPolicy:
    return CheckpointPolicy(enabled=settings.enabled, every_s=settings.every_s, every_steps=settings.every_steps, first=True)


EXTENDING = "result.extending.json"


def _start_records(cfg, ctx: JobContext, dirs, seeds, previous, resume_step, side_file: str | None = None,
                   kept: list[dict] | None = None) -> list[RunRecord]:
    """Fresh records that say the run has not finished; a resumed run carries its earlier segments (from its record,
    or, when that cannot be read, from its checkpoint's copy `kept`: the unreadable record is kept aside)."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    config, group = semantic_config(resolved), group_name(resolved, str(cfg.name))
    vers, commit = versions(), git_commit()
    records = []
    for i, (d, s, prev) in enumerate(zip(dirs, seeds, previous)):
        d.mkdir(parents=True, exist_ok=True)
        if prev is None and resume_step is not None:
            _keep_unreadable_record(d, kept)
        if resume_step is None:
            segments = []
        elif prev is not None:
            segments = [dict(seg) for seg in prev.segments]
        else:
            segments = [dict(seg) for seg in kept or []]
        for seg in segments:
            seg.setdefault("end", "killed")  # it never closed: the process was killed or crashed
        segments.append({"started": _now(), "from_step": resume_step, "pid": os.getpid()})
        r = RunRecord(
            experiment=str(cfg.name), group=group, task=str(cfg.task._target_).rsplit(".", 1)[-1], seed=s,
            run_dir=str(d), segments=segments, versions=vers, git_commit=commit, config=config,
            seeds_per_process=len(seeds), agent=i, pid=os.getpid(),
        )
        # What continues this run if it is killed: a later command refused in this dir repeats it (runtime.preflight).
        r.update(choices=dict(ctx.choices), resume_command=ctx.resume_command())
        r.update(status="running", error=None, owner=this_process())  # until it ends: ok, failed or interrupted
        if resume_step is None:
            error_log_path(d).unlink(missing_ok=True)
        if side_file is not None:
            r.file = side_file
        r.write()
        records.append(r)
    return records


def _keep_unreadable_record(run_dir: Path, kept: list[dict] | None) -> None:
    """A result.json that cannot be read (half-written by something, or damaged) is never silently replaced: it is
    moved aside whole, and the resumed run's record starts from the history its checkpoint kept."""
    path = Path(run_dir) / RESULT
    if not path.is_file():
        return
    aside = Path(run_dir) / UNREADABLE_RECORD
    path.replace(aside)
    rebuilt = f"its history is rebuilt from the checkpoint ({len(kept)} segment(s))" if kept else "the checkpoint kept no history"
    log.warning(f"{path} cannot be read (half-written?): kept as {aside.name}; {rebuilt}")


def _close_segment(records: list[RunRecord], t_start: float, end: str) -> None:
    for r in records:
        if r.segments:
            r.segments[-1].update(wall_time_s=round(time.perf_counter() - t_start, 3), end=end, ended=_now())
        r.wall_time_s = round(sum(float(s.get("wall_time_s") or 0.0) for s in r.segments), 3)


def _publish(agent_loggers: list[list], records) -> None:
    """Each seed's final record to its own loggers (TensorBoard HParams, W&B summary)."""
    from pipeline.runtime.loggers import publish_record, replay_unlogged_curve

    for loggers, r in zip(agent_loggers, records):
        try:
            if len(records) > 1:  # a task that logs each seed only to its metrics.csv: W&B gets the curve now
                replay_unlogged_curve(loggers, Path(r.run_dir))
            publish_record(loggers, r.to_dict(), Path(r.run_dir))
        except Exception as exc:  # a logger problem must not turn a finished run into a failed one
            log.warning(f"could not publish the record of seed {r.seed} to its loggers: {one_line(exc)}")



"""The tuner's loop: ask Optuna for a trial, train its seeds through Hydra's launcher, read their records,
tell Optuna the seed distribution's value; then confirm the best on fresh seeds beside the preset."""

from __future__ import annotations

import logging
import math
import os
import socket
from pathlib import Path
from typing import Any

from hydra.core.plugins import Plugins
from omegaconf import DictConfig, OmegaConf

from pipeline.config.checks import group_options
from pipeline.config.startup import check_run
from pipeline.sweep_progress import plan_jobs
from pipeline.tune.objective import OBJECTIVES, TIE_BREAKS, collect, maximize, rank_trials, trial_value
from pipeline.tune.progress import planned_jobs, quiet_launches, shown, trial_scored, trial_started
from pipeline.tune.space import Param, TuneError, format_value, parse_space
from pipeline.tune.study import tell

log = logging.getLogger("pipeline.tune")

# Objectives that read an RL run's evaluations.
RL_OBJECTIVES = ("time_to_threshold", "auc")
# A worker records a heartbeat for its running trials every hydra.sweeper.heartbeat_s; a trial whose
# heartbeat is older than STALE_BEATS of them belongs to a dead worker (kill -9, scancel, node failure): it
# is marked FAIL and its parameters are enqueued again, so no trial stays RUNNING forever and none is lost.
STALE_BEATS = 3



def _quote(text: str) -> str:
    return "'" + str(text).replace("\\", "\\\\").replace("'", "\\'") + "'"


class SeedDistributionSearch:
    def __init__(self, settings: dict, hydra_context, task_function, config: DictConfig) -> None:
        self.s = OmegaConf.create(dict(settings)) if not isinstance(settings, DictConfig) else settings
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )
        self.sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
        self.job_idx = 0

    # ---------------------------------------------------------------- set-up
    def _check_settings(self) -> None:
        s = self.s
        if int(s.seeds) < 1:
            raise TuneError(f"hydra.sweeper.seeds={s.seeds}: a trial needs at least one seed (five or more for a fair comparison)")
        if s.get("heartbeat_s") is not None and int(s.heartbeat_s) < 1:
            raise TuneError(f"hydra.sweeper.heartbeat_s={s.heartbeat_s}: give a number of seconds >= 1")
        if int(s.n_trials) < 1:
            raise TuneError(f"hydra.sweeper.n_trials={s.n_trials}: run at least one trial")
        if s.objective not in OBJECTIVES:
            raise TuneError(f"hydra.sweeper.objective={s.objective}: choose one of: {', '.join(OBJECTIVES)}")
        if s.objective in RL_OBJECTIVES and not self.config.get("env"):
            raise TuneError(f"hydra.sweeper.objective={s.objective} needs an RL task (it reads evaluations over env steps); "
                            f"{self.config.name} has no environment: use iqm, ci_low or mean")
        if str(s.get("tie_break") or "auto") not in TIE_BREAKS:
            raise TuneError(f"hydra.sweeper.tie_break={s.tie_break}: choose one of: {', '.join(TIE_BREAKS)}")
        if s.direction not in ("auto", "maximize", "minimize"):
            raise TuneError(f"hydra.sweeper.direction={s.direction}: choose auto, maximize or minimize")
        if int(s.confirm_top) > 0 and int(s.confirm_seeds) < 1:
            raise TuneError(f"hydra.sweeper.confirm_seeds={s.confirm_seeds}: confirm on at least one seed, or set confirm_top=0")

    def _task_class(self):
        from hydra.utils import get_class

        return get_class(str(self.config.task._target_))

    def _maximize(self) -> bool:
        if self.s.direction != "auto":
            return self.s.direction == "maximize"
        return maximize(str(self.s.objective), bool(getattr(self._task_class(), "higher_is_better", True)))

    def _warmup_steps(self) -> int:
        if self.s.get("pruner_warmup_steps") is not None:
            return int(self.s.pruner_warmup_steps)
        length = OmegaConf.select(self.config, "task.total_steps", default=None)
        if length is None:
            length = OmegaConf.select(self.config, "trainer.max_epochs", default=None)
        return int(0.25 * length) if isinstance(length, int) and length > 0 else 0

    def _storage_url(self) -> str:
        if self.s.storage:
            return str(self.s.storage)
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{self.sweep_dir / 'optuna.db'}"

    # ---------------------------------------------------------------- jobs
    def _jobs(self, overrides: list[str], seeds: list[int], subdir: str, trial: dict | None) -> list[list[str]]:
        if self.batched:
            extra = [] if trial is None else ["trial={" + ",".join(f"{k}:{_quote(v) if isinstance(v, str) else v}" for k, v in trial.items()) + "}"]
            return [[*self.fixed, *overrides, f"seed={seeds[0]}", f"seeds_per_process={len(seeds)}",
                     f"hydra.sweep.subdir={subdir}", *extra]]
        return [[*self.fixed, *overrides, f"seed={s}", "seeds_per_process=1", f"hydra.sweep.subdir={subdir}/seed{s}"]
                for s in seeds]

    def _launch(self, jobs: list[list[str]]) -> None:
        if not jobs:
            return
        with quiet_launches(self.launcher):  # the trial's own line says what runs
            self.launcher.launch(jobs, initial_job_idx=self.job_idx)
        self.job_idx += len(jobs)

    @staticmethod
    def _param_overrides(space: list[Param], params: dict[str, Any]) -> list[str]:
        return [f"{p.name}={format_value(params[p.name])}" for p in space if p.name in params]

    # ---------------------------------------------------------------- the search
    def _choose_tune_seeds(self) -> None:
        """Every trial's seeds: `hydra.sweeper.seeds` of them from the config's seed (the confirmation takes the next)."""
        self.base_seed = int(self.config.seed)
        self.tune_seeds = list(range(self.base_seed, self.base_seed + int(self.s.seeds)))

    def sweep(self, arguments: list[str]) -> Any:
        from pipeline.tune.study import make_pruner, make_sampler, open_storage, quiet_optuna, sampler_seed

        self._check_settings()
        # The search space first: a bad space is one line with nothing written (no sweep dir, no multirun.yaml).
        fixed, self.space = parse_space(arguments, self.s.get("params"), self.config, group_options())
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, self.sweep_dir / "multirun.yaml")  # as Hydra's own sweeper does; resume compares it
        self.fixed = [f for f in fixed if f.split("=", 1)[0] not in ("seed", "hydra.sweep.subdir")]
        # A task whose Config declares it trains seeds together runs a trial's K seeds in one process
        # (seeds_per_process=K); any other runs them as K launcher jobs.
        self.batched = check_run(self.config).trains_seeds_together
        self._choose_tune_seeds()
        k = len(self.tune_seeds)
        self.confirm_seeds: list[int] = []

        import optuna

        quiet_optuna()
        self.maximize = self._maximize()
        url = self._storage_url()
        self.heartbeat_s = int(self.s.get("heartbeat_s") or 20)
        storage = open_storage(url, heartbeat_interval=self.heartbeat_s, grace_period=STALE_BEATS * self.heartbeat_s,
                               heartbeat_stale_trial_callback=_run_again)
        name = str(self.s.study_name or self.config.name)
        self.warmup = self._warmup_steps()
        pruner = make_pruner(str(self.s.pruner), int(self.s.pruner_startup_trials), self.warmup)
        study = optuna.create_study(
            study_name=name, storage=storage, load_if_exists=True, pruner=pruner,
            direction="maximize" if self.maximize else "minimize",
        )
        # Workers on one shared study must not draw the same parameters from equally seeded samplers, and a
        # resumed study must not redraw the parameters it already tried: the seed moves on with its history.
        tried = len(study.get_trials(deepcopy=False))
        worker = (socket.gethostname(), os.getpid()) if self.s.storage else None
        study.sampler = make_sampler(str(self.s.sampler), sampler_seed(int(self.s.seed), tried, worker), self.space)
        if study.direction != (optuna.study.StudyDirection.MAXIMIZE if self.maximize else optuna.study.StudyDirection.MINIMIZE):
            raise TuneError(f"study {name!r} in {url} has direction {study.direction.name.lower()}; set hydra.sweeper.direction to match or pick another study_name")
        self.study, self.url, self.name = study, url, name
        self._resume_or_enqueue()
        n_trials = int(self.s.n_trials)
        if self.s.sampler == "grid":
            n_trials = min(n_trials, math.prod(len(p.grid_values()) for p in self.space))
        print(f"tuning {name}: {n_trials} trials x {k} seeds ({'one process per trial' if self.batched else f'{k} jobs per trial'}), "
              f"objective {self.s.objective} ({'max' if self.maximize else 'min'}imize), study in {url}", flush=True)
        self.n_trials = n_trials
        plan_jobs(self.sweep_dir, planned_jobs(n_trials - self._taken(), 1 if self.batched else k, int(self.s.confirm_top),
                                               n_trials, 1 if self.batched else int(self.s.confirm_seeds)))
        while True:
            while (left := n_trials - self._taken()) > 0:
                optuna.storages.fail_stale_trials(study)
                self._run_trials(min(int(self.s.n_jobs), left))
            if not self._others_running():
                break

        from pipeline.tune.summary import write_tune

        confirmed = {}
        if int(self.s.confirm_top) > 0:
            if not self._last_worker():
                return None
            confirmed = self._confirm()
        out = write_tune(self, confirmed)
        print(f"tune: {out / 'tune.md'}", flush=True)
        return None

    def _taken(self) -> int:
        from optuna.trial import TrialState

        # A FAIL trial was interrupted (its worker killed; a failed seed is a COMPLETE trial with the worst
        # value): its parameters were enqueued again, so it does not count.
        return sum(1 for t in self.study.get_trials(deepcopy=False) if t.state not in (TrialState.WAITING, TrialState.FAIL))

    def _resume_or_enqueue(self) -> None:
        from optuna.trial import TrialState

        trials = self.study.get_trials(deepcopy=False)
        if not trials:
            for params in self.s.get("enqueue") or []:
                self.study.enqueue_trial({str(k): v for k, v in dict(params).items()})
            return
        if not self.config.get("resume"):
            return
        # A killed search leaves RUNNING trials; they are marked and run again (as new trial numbers).
        for t in trials:
            if t.state == TrialState.RUNNING:
                self.study._storage.set_trial_user_attr(t._trial_id, "interrupted", True)
                tell(self.study, t.number, state=TrialState.FAIL)
                self.study.enqueue_trial(t.params, user_attrs={"rerun_of": t.number})
                print(f"[trial {t.number}] interrupted earlier: its parameters run again", flush=True)

    def _others_running(self) -> bool:
        """On a shared study, wait while other workers' trials run: one whose worker died goes stale, is
        failed and enqueued again (True: run it here). False once no trial runs."""
        import time

        import optuna
        from optuna.trial import TrialState

        if not self.s.storage:
            return False
        said = False
        while True:
            optuna.storages.fail_stale_trials(self.study)
            if self._taken() < int(self.s.n_trials):
                return True
            if not any(t.state == TrialState.RUNNING for t in self.study.get_trials(deepcopy=False)):
                return False
            if not said:
                print(f"waiting for the other workers' trials on study {self.name!r}", flush=True)
                said = True
            time.sleep(self.heartbeat_s)

    def _last_worker(self) -> bool:
        """With workers sharing a study, the confirmation runs once: the first worker to claim it runs it
        (the database's unique study names make the claim atomic); the others say so and end."""
        import time

        import optuna

        if not self.s.storage:
            return True
        try:
            optuna.create_study(study_name=f"{self.name}.confirmation", storage=self.url,
                                load_if_exists=False).set_user_attr("by", f"{os.uname().nodename}:{os.getpid()} {time.time()}")
        except optuna.exceptions.DuplicatedStudyError:
            print(f"worker done; the confirmation of study {self.name!r} is run by another worker", flush=True)
            return False
        return True

    def _trial_cfg(self, number: int) -> dict:
        return {"storage": self.url, "study_name": self.name, "number": number, "pruner": str(self.s.pruner),
                "n_startup_trials": int(self.s.pruner_startup_trials), "n_warmup_steps": self.warmup}

    def _run_trials(self, n: int) -> None:
        dists = {p.name: p.distribution() for p in self.space}
        trials = [self.study.ask(dists) for _ in range(n)]
        jobs = []
        # Pruning needs every seed's value at each step, so only trials trained in one process report.
        can_prune = self.batched or len(self.tune_seeds) == 1
        taken = self._taken()
        for i, trial in enumerate(trials):
            print(trial_started(trial.number, taken - len(trials) + i + 1, self.n_trials, trial.params, self.tune_seeds),
                  flush=True)
            subdir = f"trials/{trial.number}"
            trial.set_user_attr("dir", subdir)
            trial.set_user_attr("seeds", self.tune_seeds)
            jobs += self._jobs(self._param_overrides(self.space, trial.params), self.tune_seeds, subdir,
                               self._trial_cfg(trial.number) if can_prune else None)
        with _Heartbeat(self.study, trials, self.heartbeat_s):
            self._launch(jobs)
        for trial in trials:
            self._tell(trial)

    def _tell(self, trial) -> None:
        from optuna.trial import TrialState

        dist = collect(self.sweep_dir / "trials" / str(trial.number), self.tune_seeds, str(self.s.objective))
        if self.s.direction == "auto" and self.s.objective in ("iqm", "ci_low", "mean") and dist.higher_is_better is not None \
                and dist.higher_is_better != self.maximize:
            raise TuneError(f"the task's primary metric is {'higher' if dist.higher_is_better else 'lower'} is better, "
                            f"unlike the study; set hydra.sweeper.direction={'maximize' if dist.higher_is_better else 'minimize'}")
        trial.set_user_attr("scores", {str(s): (v if math.isfinite(v) else None) for s, v in dist.scores.items()})
        trial.set_user_attr("failed", {str(s): e for s, e in dist.errors.items()})
        if dist.pruned_at_step is not None:
            steps = sorted(self.study._storage.get_trial(trial._trial_id).intermediate_values)
            at = dist.pruned_at_step or (steps[-1] if steps else 0)
            trial.set_user_attr("pruned_at_step", at)
            tell(self.study, trial, state=TrialState.PRUNED)
            print(f"[trial {trial.number}] {shown(trial.params)} -> pruned at step {at}", flush=True)
            return
        value = trial_value(dist, str(self.s.objective), self.maximize)
        tell(self.study, trial, value)
        print(trial_scored(trial.number, trial.params, str(self.s.objective), value, len(dist.seeds), dist.failed), flush=True)

    # ---------------------------------------------------------------- confirmation
    def candidates(self) -> list:
        from optuna.trial import TrialState

        done = [t for t in self.study.get_trials(deepcopy=False)
                if t.state == TrialState.COMPLETE and t.value is not None and math.isfinite(t.value)]
        done = rank_trials(done, self.maximize, self.sweep_dir / "trials", self.tune_seeds, str(self.s.objective),
                           str(self.s.get("tie_break") or "auto"))  # ties in the objective: the secondary objective decides
        picked, seen = [], set()
        for t in done:
            key = tuple(sorted((k, format_value(v)) for k, v in t.params.items()))
            if key not in seen:
                seen.add(key)
                picked.append(t)
        return picked

    def _confirm(self) -> dict:
        """{label: SeedDistribution} for the top trials ("trial<n>") and the untouched preset ("preset")."""
        start = self.base_seed + len(self.tune_seeds)  # fresh seeds, disjoint from the tuning seeds
        self.confirm_seeds = list(range(start, start + int(self.s.confirm_seeds)))
        top = self.candidates()[: int(self.s.confirm_top)]
        labels = {"preset": {}, **{f"trial{t.number}": t.params for t in top}}
        jobs = []
        for label, params in labels.items():
            jobs += self._jobs(self._param_overrides(self.space, params), self.confirm_seeds, f"confirm/{label}", None)
        print(f"confirming {', '.join(labels)} on fresh seeds {self.confirm_seeds[0]}-{self.confirm_seeds[-1]}", flush=True)
        plan_jobs(self.sweep_dir, self.job_idx + len(jobs))  # fewer candidates than confirm_top finished: fewer jobs
        self._launch(jobs)
        return {label: self.sweep_dir / "confirm" / label for label in labels}


def _run_again(study, trial) -> None:
    """Optuna's stale-trial callback (the trial is FAIL already): its parameters run again as a new trial."""
    study.enqueue_trial(trial.params, user_attrs={"rerun_of": trial.number}, skip_if_exists=False)
    print(f"[trial {trial.number}] its worker stopped answering (no heartbeat): marked FAIL, its parameters "
          "run again", flush=True)


class _Heartbeat:
    """Records the heartbeat of this worker's running trials while their jobs train (Optuna does it only
    inside study.optimize; the tuner asks and tells itself)."""

    def __init__(self, study, trials, every_s: int) -> None:
        import threading

        self.every_s = every_s
        self.storage, self.ids = study._storage, [t._trial_id for t in trials]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self) -> None:
        while True:
            for trial_id in self.ids:
                try:
                    self.storage.record_heartbeat(trial_id)
                except Exception as exc:  # the database away for a moment: the next beat tries again
                    log.warning(f"tuner heartbeat not recorded: {str(exc).splitlines()[0] if str(exc) else exc}")
            if self.stop.wait(self.every_s):
                return

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(5)

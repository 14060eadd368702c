"""`python -m pipeline -m ... hydra/sweeper=optuna` end to end, as a user runs it."""

import json
import sqlite3

import optuna
import pytest
import yaml

from pipeline_testing import read_result, run_cli, start_module

pytestmark = pytest.mark.slow

SMALL = ["experiment=supervised_digits", "trainer.max_epochs=2", "trainer.enable_progress_bar=false", "hydra/sweeper=optuna"]


def _study(sweep_dir, name="supervised_digits"):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=name, storage=f"sqlite:///{sweep_dir}/optuna.db")


def test_tune_supervised_digits_bad_lr_loses_and_best_yaml_runs(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cli(
        # isolate_jobs=false: the trials run in the sweeper's process (a process per job is the default; slower here)
        "-m", *SMALL, "isolate_jobs=false", "optimizer.lr=tag(log, interval(1e-3, 10.0))", "hydra.sweeper.n_trials=3",
        "hydra.sweeper.seeds=3", "hydra.sweeper.confirm_top=2", "hydra.sweeper.confirm_seeds=3",
        "hydra.sweeper.pruner_startup_trials=1", "hydra.sweeper.enqueue=[{optimizer.lr: 0.003}, {optimizer.lr: 10.0}]",
        f"hydra.sweep.dir={sweep}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Progress: each trial "N of 3"; the sweep's line counts the 3 trials and the confirmation runs (the candidates
    # that finished, at most 2, and the preset; one process each) with an ETA; no launcher line repeating a trial's
    # overrides and Optuna settings.
    assert [line.split("]")[0] for line in proc.stdout.splitlines() if " of 3] " in line] == [
        "[trial 0, 1 of 3", "[trial 1, 2 of 3", "[trial 2, 3 of 3"], proc.stdout
    jobs = 3 + 1 + len(list((sweep / "confirm").glob("trial*")))
    assert "[1/6 done, " in proc.stdout and "ETA" in proc.stdout and f"[{jobs}/{jobs} done, " in proc.stdout, proc.stdout
    assert "trial={" not in proc.stdout + proc.stderr and "Launching" not in proc.stdout + proc.stderr
    tune = json.loads((sweep / "tune" / "tune.json").read_text())
    study = _study(sweep)
    trials = {t.number: t for t in study.trials}
    states = [t.state for t in trials.values()]

    # tune.json and optuna.db agree
    assert tune["trials"] == {"total": 3, "completed": states.count(optuna.trial.TrialState.COMPLETE),
                              "pruned": states.count(optuna.trial.TrialState.PRUNED), "failed": 0}
    best = trials[tune["best_trial"]]
    assert tune["best_params"] == {"optimizer.lr": best.params["optimizer.lr"]}  # typed, not a string
    assert tune["best_tuned_value"] == pytest.approx(best.value)
    assert tune["tuning_seeds"] == [0, 1, 2] and tune["confirm_seeds"] == [3, 4, 5]  # fresh, disjoint

    # lr 10.0 loses: the median pruner stops it at its first validation (its seeds' records say so)
    bad = trials[1]
    assert bad.params["optimizer.lr"] == 10.0
    assert bad.state == optuna.trial.TrialState.PRUNED and bad.user_attrs["pruned_at_step"] == 0
    assert bad.value < 0.5 < best.value
    for seed in (0, 1, 2):
        stop = read_result(sweep / "trials" / "1" / f"seed{seed}")["early_stop"]
        assert stop["reason"] == "pruned by the tuner"
    assert tune["best_params"]["optimizer.lr"] != 10.0
    assert all(c["params"]["optimizer.lr"] != 10.0 for c in tune["candidates"])
    assert tune["preset"]["primary"]["iqm"] > 0.5
    assert tune["best_confirmed"]["optimism_gap"] == pytest.approx(tune["best_tuned_value"] - tune["best_confirmed"]["value"])
    assert tune["verdict"] in (sweep / "tune" / "tune.md").read_text()
    assert tune["evidence"]["objective"] == "iqm" and 0 <= tune["evidence"]["ci"][0] <= tune["evidence"]["p"] <= tune["evidence"]["ci"][1] <= 1
    for name in ("tune.md", "best.yaml", "experiment/best.yaml", "confirmed.png", "optimization_history.png"):
        assert (sweep / "tune" / name).is_file(), name
    assert not (sweep / "tune" / "parameter_importances.png").exists()  # 3 trials: importances would be noise
    assert "no parameter importance plot: " in (sweep / "tune" / "tune.md").read_text()

    # best.yaml is a preset that runs as it is, with the tuned value
    preset = yaml.safe_load((sweep / "tune" / "best.yaml").read_text())
    assert preset["optimizer"]["lr"] == best.params["optimizer.lr"]
    run_dir = tmp_path / "best_run"
    proc = run_cli("--config-dir", str(sweep / "tune"), "experiment=best", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_result(run_dir)["status"] == "ok"
    ran = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    assert ran["optimizer"]["lr"] == best.params["optimizer.lr"] and ran["trainer"]["max_epochs"] == 2


def test_bad_input_is_one_line(tmp_path):
    for args, message in [
        (["optimizer.lrr=interval(1e-3, 1e-1)"], "search space: unknown parameter 'optimizer.lrr'"),
        (["optimizer.lr=interval(1e-3, 1e-1)", "hydra.sweeper.seeds=0"], "hydra.sweeper.seeds=0: a trial needs at least one seed"),
        (["optimizer.lr=interval(1e-1, 1e-3)"], "is empty; the first bound must be below the second"),
        (["optimizer.lr=interval(1e-3, 1e-1)", "hydra.sweeper.storage=postgresql://u:p@127.0.0.1:1/none"],
         "hydra.sweeper.storage=postgresql://u:p@127.0.0.1:1/none: cannot open it"),
        (["optimizer.lr=interval(1e-3, 1e-1)", "hydra.sweeper.storage=optuna.db"], "hydra.sweeper.storage=optuna.db: not a database URL"),
        (["optimizer.lr=interval(1e-3, 1e-1)", "hydra.sweeper.objective=auc"], "hydra.sweeper.objective=auc needs an RL task"),
    ]:
        proc = run_cli("-m", *SMALL, *args, f"hydra.sweep.dir={tmp_path / 'out' / 'sweep'}")
        assert proc.returncode == 2, proc.stderr[-2000:]
        # One line: the message, and no traceback around it.
        assert [line for line in proc.stderr.splitlines() if line.strip()] == [f"error: {proc.stderr.split('error: ', 1)[1].strip()}"]
        assert message in proc.stderr, proc.stderr[-2000:]
        assert not (tmp_path / "out").exists()  # no sweep dir (nor its progress folder, nor a dir above it)
    # A dir that was there keeps what it held, and gets nothing.
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    proc = run_cli("-m", *SMALL, "optimizer.lrr=interval(1e-3, 1e-1)", f"hydra.sweep.dir={tmp_path / 'mine'}")
    assert proc.returncode == 2 and sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]


# Trials of the shared study: each worker's share costs ~2 s of set-up a trial; 4 keep both workers busy.
SHARED_TRIALS = 4


def _worker(tmp_path, i, url):
    # isolate_jobs=false: trials in the worker's process (a fresh process per trial is the default; slower here)
    return start_module(
        "pipeline", "-m", *SMALL, "trainer=debug", "isolate_jobs=false", "optimizer.lr=tag(log, interval(1e-4, 1e-1))",
        f"hydra.sweeper.n_trials={SHARED_TRIALS}", "hydra.sweeper.seeds=1", "hydra.sweeper.confirm_top=0", "hydra.sweeper.pruner=none",
        f"hydra.sweeper.storage={url}", "hydra.sweeper.study_name=shared", f"hydra.sweep.dir={tmp_path / f'worker{i}'}",
        # A worker done first polls for the other's running trial every heartbeat_s (default 20 s: a 20 s wait).
        "hydra.sweeper.heartbeat_s=2", merge_stderr=False,
    )


def test_two_workers_share_one_sqlite_study(tmp_path):
    url = f"sqlite:///{tmp_path}/shared.db"
    workers = [_worker(tmp_path, i, url) for i in range(2)]
    outputs = [w.communicate(timeout=600) for w in workers]
    for w, (_, err) in zip(workers, outputs):
        assert w.returncode == 0, err[-3000:]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials = optuna.load_study(study_name="shared", storage=url).trials
    # Every trial finished, and each was run by exactly one worker (its folder exists in one sweep dir only).
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    owners = {t.number: [i for i in range(2) if (tmp_path / f"worker{i}" / "trials" / str(t.number) / "result.json").is_file()]
              for t in trials}
    assert all(len(o) == 1 for o in owners.values()), owners
    assert {len([n for n, o in owners.items() if o == [i]]) for i in range(2)} != {0}  # both workers worked
    # A worker checks the count before asking, so two may each start one last trial: never fewer than asked.
    assert SHARED_TRIALS <= len(trials) <= SHARED_TRIALS + 1
    assert len({t.params["optimizer.lr"] for t in trials}) == len(trials)  # no parameters drawn twice
    for t in trials:  # each trial's value is its own run's score
        record = read_result(tmp_path / f"worker{owners[t.number][0]}" / "trials" / str(t.number))
        assert record["metrics"]["test/acc"] == pytest.approx(t.value)
    with sqlite3.connect(tmp_path / "shared.db") as db:
        assert db.execute("select count(*) from trials").fetchone()[0] == len(trials)


def test_resume_reruns_a_trial_left_running_and_k_jobs_per_trial(tmp_path):
    # The counterfactual task trains one seed per process, so each trial is K=2 launcher jobs.
    sweep = tmp_path / "sweep"
    args = ["-m", "experiment=rmac_auction", "hydra/sweeper=optuna", "isolate_jobs=false", "data.n_bids=200",
            "task.n_iters=4", "task.point_iters=10", "task.epsilons=[0.02]", "data.grid=interval(0.01, 0.05)",
            "hydra.sweeper.seeds=2", "hydra.sweeper.confirm_top=0", f"hydra.sweep.dir={sweep}"]
    assert run_cli(*args, "hydra.sweeper.n_trials=1").returncode == 0
    study = _study(sweep, "rmac_auction")
    killed = study.ask({"data.grid": optuna.distributions.FloatDistribution(0.01, 0.05)})  # a worker died here

    proc = run_cli(*args, "hydra.sweeper.n_trials=2", "resume=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = _study(sweep, "rmac_auction").trials
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "COMPLETE"]
    assert trials[1].user_attrs["interrupted"] is True
    assert trials[2].params == killed.params  # its parameters ran again, as a new trial
    assert json.loads((sweep / "tune" / "tune.json").read_text())["trials"]["total"] == 3
    for t in (trials[0], trials[2]):
        records = [read_result(sweep / "trials" / str(t.number) / f"seed{s}") for s in (0, 1)]
        assert [r["seed"] for r in records] == [0, 1]
        assert records[0]["config"]["data.grid"] == pytest.approx(t.params["data.grid"])
        # two seeds: nothing is trimmed, the IQM is their mean
        assert t.value == pytest.approx(sum(r["metrics"][r["primary_metric"]] for r in records) / 2)


def test_resumed_study_draws_new_parameters(tmp_path):
    # The same sampler seed on resume would redraw the parameters already tried; the seed moves on with the history.
    sweep = tmp_path / "sweep"
    args = ["-m", *SMALL, "trainer=debug", "isolate_jobs=false", "optimizer.lr=tag(log, interval(1e-4, 1e-1))",
            "hydra.sweeper.sampler=random", "hydra.sweeper.seeds=1", "hydra.sweeper.confirm_top=0", f"hydra.sweep.dir={sweep}"]
    # One trial, then one more on resume: a sampler seed that did not move redraws the first trial's value.
    assert run_cli(*args, "hydra.sweeper.n_trials=1").returncode == 0
    proc = run_cli(*args, "hydra.sweeper.n_trials=2", "resume=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = _study(sweep).trials
    assert len(trials) == 2 and len({t.params["optimizer.lr"] for t in trials}) == 2, [t.params for t in trials]


def test_a_dead_workers_trial_is_failed_and_run_again_without_resume(tmp_path):
    # kill -9 of a worker mid-trial leaves its trial RUNNING; a worker on the same study (here: the same
    # command again, no resume=true) sees its heartbeat go stale, marks it FAIL and runs its parameters again.
    url = f"sqlite:///{tmp_path}/shared.db"
    args = ["-m", *SMALL, "trainer=debug", "isolate_jobs=false", "optimizer.lr=tag(log, interval(1e-4, 1e-1))",
            "hydra.sweeper.seeds=1", "hydra.sweeper.confirm_top=0", "hydra.sweeper.pruner=none", "hydra.sweeper.heartbeat_s=1",
            f"hydra.sweeper.storage={url}", "hydra.sweeper.study_name=shared", "hydra.sweeper.n_trials=2"]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(url, heartbeat_interval=1)
    study = optuna.create_study(study_name="shared", storage=storage, direction="maximize")
    killed = study.ask({"optimizer.lr": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)})
    storage.record_heartbeat(killed._trial_id)  # its worker beat once, then died (kill -9)
    proc = run_cli(*args, f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = optuna.load_study(study_name="shared", storage=url).trials
    assert trials[0].state == optuna.trial.TrialState.FAIL  # not RUNNING forever
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 2  # the failed trial does not count toward n_trials
    assert [t.params for t in done if t.user_attrs.get("rerun_of") == 0] == [killed.params]
    assert "[trial 0] its worker stopped answering" in proc.stdout


def test_a_ppo_trial_trains_its_seeds_in_one_process(tmp_path):
    """The sweeper reads the task's declared `trains_seeds_together` (no list of task names): PPO's K seeds are
    one job, and the trial's value is the IQM of their records."""
    sweep = tmp_path / "sweep"
    # One trial: each trial is its own job process (~6 s to start) and every trial takes the same path.
    proc = run_cli("-m", "experiment=ppo_cartpole", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=1", "hydra.sweeper.seeds=2",
                   "hydra.sweeper.confirm_top=0", "hydra.sweeper.pruner=none", "optimizer.lr=choice(0.001, 0.003)",
                   "model.hidden=[16]", "task.total_steps=128", "task.num_steps=32", "task.envs_per_agent=2",
                   "task.eval_every=128", "task.eval_episodes=2", "task.final_eval_episodes=2",
                   "trainer.enable_progress_bar=false", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1 trials x 2 seeds (one process per trial)" in proc.stdout
    trials = _study(sweep, "ppo_cartpole").trials
    assert [t.state.name for t in trials] == ["COMPLETE"]
    for t in trials:
        records = [read_result(sweep / "trials" / str(t.number) / f"seed{s}") for s in (0, 1)]
        assert [r["seed"] for r in records] == [0, 1] and records[0]["pid"] == records[1]["pid"]
        assert all(r["seeds_per_process"] == 2 for r in records)
        assert t.value == pytest.approx(sum(r["metrics"]["eval/return_mean"] for r in records) / 2)

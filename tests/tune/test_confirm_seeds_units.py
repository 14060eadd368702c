"""The tuner's confirmation runs on seeds no trial trained on: the real seed choices of the search (`sweep`'s
`_choose_tune_seeds`, the trials' jobs) and of the confirmation (`_confirm`), read from the jobs they launch."""

import optuna
import pytest
from omegaconf import OmegaConf

from hydra_plugins.pipeline_optuna_sweeper._impl import SeedDistributionSearch


class RecordingLauncher:
    """Takes the jobs a sweeper launches and runs none of them (what is tested is which seeds they name)."""

    def __init__(self):
        self.jobs: list[list[str]] = []

    def launch(self, jobs, initial_job_idx):
        self.jobs += [list(j) for j in jobs]


def seeds_of(job: list[str]) -> list[int]:
    """The seeds one launched job trains: `seed=s` and, batched, `seeds_per_process=K` (s .. s+K-1)."""
    values = dict(o.split("=", 1) for o in job if o.split("=", 1)[0] in ("seed", "seeds_per_process"))
    first, k = int(values["seed"]), int(values.get("seeds_per_process", 1))
    return list(range(first, first + k))


def search(tmp_path, seed: int, n_seeds: int, n_confirm: int, batched: bool) -> SeedDistributionSearch:
    s = SeedDistributionSearch.__new__(SeedDistributionSearch)  # no Hydra app: the launcher is the recorder
    s.s = OmegaConf.create({"seeds": n_seeds, "confirm_seeds": n_confirm, "confirm_top": 2})
    s.config = OmegaConf.create({"seed": seed})
    s.launcher, s.job_idx, s.sweep_dir = RecordingLauncher(), 0, tmp_path
    s.batched, s.fixed, s.space = batched, [], []
    return s


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("seed, n_seeds, n_confirm", [(0, 3, 3), (7, 5, 2), (100, 1, 4)])
def test_confirmation_seeds_are_fresh_and_as_many_as_asked(tmp_path, seed, n_seeds, n_confirm, batched):
    s = search(tmp_path, seed, n_seeds, n_confirm, batched)
    s._choose_tune_seeds()
    trial_jobs = s._jobs([], s.tune_seeds, "trials/0", None)  # what _run_trials launches for a trial
    searched = sorted(x for job in trial_jobs for x in seeds_of(job))
    assert searched == list(range(seed, seed + n_seeds))  # the config's seed and the next ones, once each

    trials = [optuna.trial.create_trial(params={}, distributions={}, value=v) for v in (1.0, 2.0)]
    for number, t in enumerate(trials):
        t.number = number
    s.candidates = lambda: trials
    s._confirm()
    confirm_jobs = s.launcher.jobs
    for job in confirm_jobs:
        confirmed = seeds_of(job)
        assert not set(confirmed) & set(searched), f"confirmation job {job} reuses tuning seeds {searched}"
    by_label: dict[str, list[int]] = {}
    for job in confirm_jobs:
        subdir = next(o.split("=", 1)[1] for o in job if o.startswith("hydra.sweep.subdir="))
        by_label.setdefault(subdir.split("/")[1], []).extend(seeds_of(job))
    # Every candidate and the preset on the same fresh seeds, as many as hydra.sweeper.confirm_seeds asks.
    assert sorted(by_label) == ["preset", "trial0", "trial1"]
    assert all(sorted(v) == sorted(s.confirm_seeds) for v in by_label.values()) and len(s.confirm_seeds) == n_confirm

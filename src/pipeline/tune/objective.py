"""A trial's value from its seeds' run records on disk: one number over a seed distribution.

Records are read from disk through the store (pipeline.store), never from a job's return value: one record per
seed, in the trial's dir (one seed per job) or in its `seed<n>/` dirs (`seeds_per_process=K`). A seed whose
record is missing or not ok counts as failed, and a trial with a failed seed gets the worst possible value (it
loses; it is not dropped).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.report.collect import PRUNED_REASON
from pipeline.store.layout import record_dirs
from pipeline.store.record import read_result
from pipeline.tune.space import TuneError

OBJECTIVES = ("iqm", "ci_low", "mean", "time_to_threshold", "steps_to_threshold", "auc")
# What breaks a tie in the objective (many configurations reach CartPole's 500): `auto` is time_to_threshold
# for runs with a threshold (auc when that is the objective itself), none elsewhere.
TIE_BREAKS = ("auto", "time_to_threshold", "steps_to_threshold", "auc", "none")
# Objective values equal to this many significant digits are a tie (an IQM of equal scores can differ in
# the last bit with the order of the additions).
TIE_DIGITS = 12


def read_records(run_dir: Path) -> dict[int, dict]:
    """{seed: record} for every run record under `run_dir` (both layouts), read through the store."""
    out: dict[int, dict] = {}
    for d in record_dirs(Path(run_dir)):
        record = read_result(d)
        if record is not None and isinstance(record.get("seed"), int):
            out[record["seed"]] = record
    return out


def maximize(objective: str, higher_is_better: bool) -> bool:
    if objective in ("time_to_threshold", "steps_to_threshold"):
        return False
    if objective == "auc":
        return True
    return higher_is_better


def curve_auc(evaluations: list[dict], horizon: int) -> float:
    """Mean evaluation return over env steps [0, horizon]: the area under the curve per step.

    Each evaluation's return holds until the next one, and the last one until `horizon` (an agent that
    stopped early keeps the level it stopped at). Sample efficiency: the earlier a curve rises, the larger.
    """
    points = sorted((int(e["env_step"]), float(e["return_mean"])) for e in evaluations or [])
    if not points or horizon <= 0:
        return -math.inf
    steps = [s for s, _ in points] + [max(horizon, points[-1][0])]
    area = sum(points[i][1] * (steps[i + 1] - steps[i]) for i in range(len(points)))
    return area / max(horizon, points[-1][0])


def seed_score(record: dict | None, objective: str, horizon: int = 0) -> float | None:
    """The seed's number for the objective; None when the seed failed or has no record."""
    if not record or record.get("status") != "ok":
        return None
    if objective == "time_to_threshold":
        if record.get("threshold") is None:
            return None  # not a run with a threshold to reach (records carry the key with null)
        t = record.get("time_to_threshold_s")
        return math.inf if t is None else float(t)  # never reached: infinitely slow
    if objective == "steps_to_threshold":
        if record.get("threshold") is None:
            return None
        reached = [int(e["env_step"]) for e in record.get("evaluations") or [] if float(e["return_mean"]) >= record["threshold"]]
        return float(min(reached)) if reached else math.inf  # never reached: infinitely slow
    if objective == "auc":
        return curve_auc(record["evaluations"], horizon) if record.get("evaluations") else None
    value = (record.get("metrics") or {}).get(record.get("primary_metric"))
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


@dataclass
class SeedDistribution:
    """A trial's (or a confirmation candidate's) seeds: their scores, and which failed and why."""

    seeds: list[int]
    scores: dict[int, float] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    higher_is_better: bool | None = None
    pruned_at_step: int | None = None

    @property
    def failed(self) -> list[int]:
        return sorted(self.errors)


def collect(run_dir: Path, seeds: list[int], objective: str) -> SeedDistribution:
    records = read_records(run_dir)
    horizon = max((int(e["env_step"]) for r in records.values() for e in r.get("evaluations") or []), default=0)
    dist = SeedDistribution(seeds=list(seeds))
    for seed in seeds:
        record = records.get(seed)
        if record is not None and dist.higher_is_better is None:
            dist.higher_is_better = bool(record.get("higher_is_better", True))
        stop = (record or {}).get("early_stop") or {}
        if stop.get("reason") == PRUNED_REASON:
            dist.pruned_at_step = int(stop.get("env_step", stop.get("epoch")) or 0)  # RL: env steps; supervised: epochs
        score = seed_score(record, objective, horizon)
        if score is None:
            why = "no run record" if record is None else (record.get("error") or f"no value for objective {objective}")
            dist.errors[seed] = str(why)
        else:
            dist.scores[seed] = score
    return dist


def aggregate(scores: list[float], objective: str, maximize_: bool) -> float:
    """IQM by default; `ci_low` is the pessimistic end of the IQM's 95% bootstrap interval; `mean`."""
    from pipeline.report.stats import fast_iqm, interval_estimates

    values = np.asarray(scores, dtype=float)
    if objective == "mean":
        return float(values.mean())
    if objective == "ci_low" and np.isfinite(values).all() and values.size > 1:
        low, high = interval_estimates(values, reps=1000)["iqm_ci"]
        return float(low if maximize_ else high)
    return fast_iqm(values)


def trial_value(dist: SeedDistribution, objective: str, maximize_: bool) -> float:
    if dist.failed or not dist.scores:
        return -math.inf if maximize_ else math.inf
    return aggregate(list(dist.scores.values()), objective, maximize_)


def tie_breaker(setting: str, objective: str, run_dirs: list[Path]) -> str | None:
    """The declared secondary objective (hydra.sweeper.tie_break), `auto` resolved from the runs' records."""
    if setting not in TIE_BREAKS:
        raise TuneError(f"hydra.sweeper.tie_break={setting}: choose one of: {', '.join(TIE_BREAKS)}")
    if setting == "none":
        return None
    if setting != "auto":
        return setting if setting != objective else None
    rl = any(r.get("threshold") is not None for d in run_dirs for r in read_records(d).values())
    if not rl:
        return None
    return "auc" if objective in ("time_to_threshold", "steps_to_threshold") else "time_to_threshold"


def secondary_value(run_dir: Path, seeds: list[int], secondary: str | None) -> float | None:
    """The seeds' IQM on the secondary objective (never reached counts as infinitely slow); None without one."""
    if secondary is None:
        return None
    dist = collect(run_dir, seeds, secondary)
    if dist.failed or not dist.scores:
        return None
    return aggregate(list(dist.scores.values()), "iqm", maximize(secondary, True))


def ties(a: float | None, b: float | None) -> bool:
    """Equal objective values (to TIE_DIGITS significant digits)."""
    return a is not None and b is not None and _rounded(a) == _rounded(b)


def _rounded(value: float) -> float:
    return float(f"{value:.{TIE_DIGITS}g}") if math.isfinite(value) else value


def rank(entries: list, value, second, maximize_: bool, secondary: str | None) -> list:
    """`entries` best first: by objective value (`value(entry)`), ties by the secondary objective (`second(entry)`,
    in its own direction; a missing one last), then as given. None values rank last."""

    def key(indexed):
        index, entry = indexed
        v, w = value(entry), second(entry) if secondary is not None else None
        primary = math.inf if v is None else (-_rounded(v) if maximize_ else _rounded(v))
        tiebreak = math.inf if w is None else (-w if maximize(secondary, True) else w)
        return (primary, tiebreak, index)

    return [entry for _, entry in sorted(enumerate(entries), key=key)]


def rank_trials(trials: list, maximize_: bool, trials_dir: Path, seeds: list[int], objective: str, tie_break: str) -> list:
    """Finished trials best first, ties in the objective broken by the secondary objective on the tuning seeds."""
    secondary = tie_breaker(tie_break, objective, [trials_dir / str(t.number) for t in trials[:1]])
    cache: dict[int, float | None] = {}

    def second(t):
        if t.number not in cache:
            cache[t.number] = secondary_value(trials_dir / str(t.number), seeds, secondary)
        return cache[t.number]

    return rank(trials, lambda t: t.value, second, maximize_, secondary)

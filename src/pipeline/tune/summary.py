"""What a search leaves in <sweep dir>/tune/: tune.json, tune.md, best.yaml (and experiment/best.yaml), plots."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from pipeline.config.checks import group_options
from pipeline.config.grouping import is_ignored
from pipeline.store.record import write_json
from pipeline.tune.objective import (
    collect,
    maximize,
    rank,
    read_records,
    secondary_value,
    tie_breaker,
    ties,
    trial_value,
)
from pipeline.tune.space import format_value

# Overrides that describe where or how a run ran, not what it is: best.yaml leaves them out.
_NOT_CONFIG = ("experiment", "seed", "resume", "logger", "hydra", "device.num_threads", "trial", "ckpt_path", "seeds_per_process",
               "isolate_jobs", "checkpoint", "trainer.enable_progress_bar")


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _stats(values: list[float]) -> dict[str, Any] | None:
    from pipeline.report.stats import interval_estimates

    values = [v for v in values if math.isfinite(v)]
    if not values:
        return None
    est = interval_estimates(values)
    return {"iqm": est["iqm"], "iqm_ci": est["iqm_ci"], "n": len(values)}


def _threshold(records: dict[int, dict], seeds: list[int]) -> dict[str, Any] | None:
    if not any(r.get("threshold") is not None for r in records.values()):
        return None
    times = [records[s].get("time_to_threshold_s") for s in seeds if s in records and records[s].get("status") == "ok"]
    reached = [float(t) for t in times if t is not None]
    return {"reached": len(reached), "of": len(seeds), "threshold": next((r.get("threshold") for r in records.values()), None),
            **(_stats(reached) or {"iqm": None, "iqm_ci": None, "n": 0})}


def confirmed_entry(run_dir: Path, seeds: list[int], objective: str, maximize: bool) -> dict[str, Any]:
    dist = collect(run_dir, seeds, objective)
    primary = collect(run_dir, seeds, "iqm")
    records = read_records(run_dir)
    metric = next((r.get("primary_metric") for r in records.values() if r.get("primary_metric")), None)
    return {
        "value": _finite(trial_value(dist, objective, maximize)),
        "seeds": seeds,
        "failed": {str(s): e for s, e in primary.errors.items()},
        "primary_metric": metric,
        "objective_scores": [dist.scores[s] for s in sorted(dist.scores)],
        "primary_scores": [primary.scores[s] for s in sorted(primary.scores)],
        "primary": _stats(list(primary.scores.values())),
        "time_to_threshold_s": _threshold(records, seeds),
    }


def _improvement(x: list[float], y: list[float], higher_is_better: bool) -> dict[str, Any] | None:
    from pipeline.report.stats import probability_of_improvement

    if not x or not y:
        return None
    sign = 1.0 if higher_is_better else -1.0
    poi = probability_of_improvement(sign * np.asarray(x), sign * np.asarray(y))
    return {"p": poi["p"], "ci": poi["ci"]}


# Every verdict reads one interval: the 95% interval of P(a candidate's seed does better than a preset's seed), as
# rliable reads probability of improvement. Above 0.5 (no difference): the candidate is better; below: the preset;
# across 0.5: the confirmation cannot tell them apart.
NO_DIFFERENCE = 0.5


def _with_failed(entry: dict, key: str, maximize_: bool) -> list[float]:
    """The entry's seed scores (`key`), a failed seed counted as the worst possible score (as a trial's value is)."""
    worst = -math.inf if maximize_ else math.inf
    return [*(entry.get(key) or []), *[worst] * len(entry.get("failed") or {})]


def evidence(winner: dict, preset: dict, objective: str, maximize_: bool, key: str = "objective_scores") -> dict[str, Any] | None:
    """How sure the confirmation is that `winner` does better than the preset in `objective`, seed against seed
    (a seed that never reached the threshold counts as never, a failed seed as the worst): P(better) with its 95%
    interval, which side of 0.5 the interval lies on (`better`: "candidate", "preset" or None when it holds 0.5),
    and, when it holds 0.5, about how many fresh seeds per side would move its edge off 0.5 at the spread seen.

    Seeds needed: the interval's half-width towards 0.5 shrinks as 1/sqrt(seeds), so n * (half-width / |P - 0.5|)^2
    seeds bring its edge to 0.5 (an estimate from this one confirmation; None when P is exactly 0.5)."""
    x, y = _with_failed(winner, key, maximize_), _with_failed(preset, key, maximize_)
    poi = _improvement(x, y, maximize_)
    if poi is None:
        return None
    p, (low, high) = poi["p"], poi["ci"]
    n = min(len(x), len(y))
    better = "candidate" if low > NO_DIFFERENCE else "preset" if high < NO_DIFFERENCE else None
    gap = abs(p - NO_DIFFERENCE)
    half = (p - low) if p >= NO_DIFFERENCE else (high - p)
    needed = None if better or gap == 0 else max(n + 1, math.ceil(n * (half / gap) ** 2))
    return {"objective": objective, "p": p, "ci": [low, high], "seeds": n, "distinguishable": better is not None,
            "better": better, "seeds_needed": needed}


def _shown_value(entry: dict) -> str:
    """An entry's confirmed value, or how many of its seeds failed (which makes it the worst)."""
    failed = len(entry.get("failed") or {})
    return f"worst ({failed} of {len(entry['seeds'])} seeds failed)" if failed else _show(entry["value"])


def _odds(label: str, proof: dict) -> str:
    low, high = proof["ci"]
    return f"P({label} does better on a seed) {proof['p']:.2f} [{low:.2f}, {high:.2f}]"


def _cannot_tell(proof: dict) -> str:
    """Why an interval across 0.5 settles nothing, and what would."""
    if proof["seeds_needed"]:
        return (f"includes {NO_DIFFERENCE}; about {proof['seeds_needed']} seeds each would be needed to tell them apart "
                "at the spread seen")
    return f"includes {NO_DIFFERENCE}; at P = {NO_DIFFERENCE} no number of seeds would tell them apart"


def metric_direction(search, confirm_dirs: dict[str, Path]) -> bool:
    """Whether the primary metric is higher-is-better, as its records say (the task class where no record is)."""
    for run_dir in confirm_dirs.values():
        for record in read_records(run_dir).values():
            if record.get("higher_is_better") is not None:
                return bool(record["higher_is_better"])
    return bool(getattr(search._task_class(), "higher_is_better", True))


def _show(value: float | None) -> str:
    return "-" if value is None else ("never" if math.isinf(value) else f"{value:.4g}")


def tie_of(ranked: list[dict], objective: str, secondary: str | None, where: str) -> dict | None:
    """The winner's tie in the objective, if any: with whom, and whether (and how) the secondary objective broke it."""
    winner = ranked[0]
    tied = [e for e in ranked[1:] if ties(e["value"], winner["value"])]
    if not tied:
        return None
    others = ", ".join(e["label"] for e in tied)
    head = f"{winner['label']} ties {others} on {objective} ({_show(winner['value'])}) {where}"
    seconds = [winner["secondary"], *(e["secondary"] for e in tied)]
    if secondary is None:
        note = f"{head}; no secondary objective breaks it (hydra.sweeper.tie_break=none, or no threshold), so the first is named"
        broken = False
    elif any(v is None for v in seconds) or all(v == seconds[0] for v in seconds):
        note = f"{head}, and {secondary} does not tell them apart ({', '.join(_show(v) for v in seconds)}): the first is named"
        broken = False
    else:
        note = (f"{head}; the tie is broken by {secondary}: {winner['label']} {_show(winner['secondary'])}, "
                + ", ".join(f"{e['label']} {_show(e['secondary'])}" for e in tied))
        broken = True
    return {"with": [e["label"] for e in tied], "value": winner["value"], "broken_by": secondary if broken else None,
            "secondary": {e["label"]: e["secondary"] for e in [winner, *tied]}, "note": note}


def confirm_outcome(confirm_dirs: dict[str, Path], trials: dict, seeds: list[int], objective: str, maximize_: bool,
                    metric_higher: bool, secondary: str | None) -> dict[str, Any]:
    """The confirmation's entries, the winner (ties in the objective broken by `secondary`) and the verdict against
    the preset. `trials` maps each candidate's label ("trial<n>") to its Optuna trial."""
    preset = confirmed_entry(confirm_dirs["preset"], seeds, objective, maximize_)
    preset["secondary"] = secondary_value(confirm_dirs["preset"], seeds, secondary)
    candidates = []
    for label, run_dir in confirm_dirs.items():
        if label == "preset":
            continue
        t = trials[label]
        entry = confirmed_entry(run_dir, seeds, objective, maximize_)
        entry.update(label=label, trial=t.number, params=dict(t.params), tuned_value=_finite(t.value),
                     secondary=secondary_value(run_dir, seeds, secondary))
        entry["optimism_gap"] = (None if entry["value"] is None or entry["tuned_value"] is None
                                 else entry["tuned_value"] - entry["value"])
        # "Better" is the primary metric's own direction (a study minimizing time to threshold still wants higher returns).
        entry["probability_of_improvement_over_preset"] = _improvement(entry["primary_scores"], preset["primary_scores"], metric_higher)
        candidates.append(entry)
    ranked = rank(candidates, lambda e: e["value"], lambda e: e["secondary"], maximize_, secondary)
    winner = ranked[0] if ranked else None
    tie = tie_of(ranked, objective, secondary, "on fresh seeds") if ranked else None
    preset_tie = beats = preset_wins = False
    if winner is None:
        preset_wins, verdict = True, "No candidate was confirmed: keep the preset."
        return {"preset": preset, "candidates": candidates, "winner": winner, "tie": tie, "verdict": verdict,
                "preset_wins": preset_wins, "preset_tie": preset_tie, "beats_preset": beats}
    label = winner["label"]
    winner["evidence"] = proof = evidence(winner, preset, objective, maximize_)
    seen = f"{objective} {_shown_value(winner)} vs {_shown_value(preset)}"
    if proof is None:  # no confirmation seeds at all
        preset_wins, verdict = True, f"{label} was not confirmed on any seed: keep the preset."
    elif proof["better"] == "candidate":
        beats = True
        verdict = f"{label} beats the preset's {objective} on fresh seeds: {seen}, {_odds(label, proof)}."
    elif proof["better"] == "preset":
        preset_wins = True
        verdict = f"The preset does better than {label} on fresh seeds: {seen}, {_odds(label, proof)}: keep it."
    elif ties(preset["value"], winner["value"]) and secondary is not None:
        # A tie in the objective (both reach CartPole's 500 on every seed): the declared secondary objective's own
        # interval decides, or says it cannot.
        second = evidence(*({"secondary_scores": list(collect(confirm_dirs[k], seeds, secondary).scores.values())}
                            for k in (label, "preset")), secondary, maximize(secondary, True), key="secondary_scores")
        winner["evidence"] = {**proof, "tie_break": second}
        head = f"{label} ties the preset's {objective} on fresh seeds ({_show(winner['value'])})"
        if second is None or second["better"] is None:
            preset_tie = True
            why = "is missing on one side" if second is None else f"cannot tell them apart: {_odds(label, second)} {_cannot_tell(second)}"
            verdict = f"{head}, and {secondary} {why}: compare the other columns before switching."
        else:
            preset_wins = second["better"] == "preset"
            w, p = _show(winner["secondary"]), _show(preset["secondary"])
            verdict = (f"{head}; the preset is better on {secondary} ({p} vs {w}, {_odds(label, second)}): keep it."
                       if preset_wins else
                       f"{head} and is better on {secondary} ({w} vs {p}, {_odds(label, second)}): the tie-break picks it.")
    else:
        verdict = (f"Cannot tell {label} from the preset on {proof['seeds']} fresh seeds: {seen}, {_odds(label, proof)} "
                   f"{_cannot_tell(proof)}.")
    return {"preset": preset, "candidates": candidates, "winner": winner, "tie": tie, "verdict": verdict,
            "preset_wins": preset_wins, "preset_tie": preset_tie, "beats_preset": beats}


def write_tune(search, confirm_dirs: dict[str, Path]) -> Path:
    from optuna.trial import TrialState

    out = search.sweep_dir / "tune"
    out.mkdir(parents=True, exist_ok=True)
    s, study, objective = search.s, search.study, str(search.s.objective)
    trials = study.get_trials(deepcopy=False)
    counts = {
        "total": len(trials),
        "completed": sum(t.state == TrialState.COMPLETE and not (t.user_attrs.get("failed") or {}) for t in trials),
        "pruned": sum(t.state == TrialState.PRUNED for t in trials),
        "failed": sum(t.state == TrialState.FAIL or bool(t.user_attrs.get("failed")) for t in trials),
    }
    ranked = search.candidates()
    warnings: list[str] = []
    metric_higher = metric_direction(search, confirm_dirs)
    tie_break = str(search.s.get("tie_break") or "auto")

    preset = None
    candidates: list[dict] = []
    tie = None
    if confirm_dirs:
        by_label = {f"trial{t.number}": t for t in ranked}
        secondary = tie_breaker(tie_break, objective, list(confirm_dirs.values()))
        outcome = confirm_outcome(confirm_dirs, by_label, search.confirm_seeds, objective, search.maximize, metric_higher, secondary)
        preset, candidates, winner = outcome["preset"], outcome["candidates"], outcome["winner"]
        verdict, preset_wins, tie = outcome["verdict"], outcome["preset_wins"], outcome["tie"]
        beats = outcome["beats_preset"]
        if not beats:  # the preset wins, ties, or the difference is within the confirmation's noise
            warnings.append(verdict)
        for entry in [*candidates, {**preset, "label": "preset"}]:
            if entry["failed"]:
                warnings.append(f"{entry['label']}: {len(entry['failed'])} of {len(entry['seeds'])} confirmation seeds failed")
    else:
        winner, verdict, preset_wins, beats = None, None, None, None
        trials_dir = search.sweep_dir / "trials"
        secondary = tie_breaker(tie_break, objective, [trials_dir / str(t.number) for t in ranked[:1]])
        entries = [{"label": f"trial{t.number}", "trial": t.number, "tuned_value": _finite(t.value), "value": _finite(t.value),
                    "params": dict(t.params), "secondary": secondary_value(trials_dir / str(t.number), search.tune_seeds, secondary)}
                   for t in ranked]
        if entries:
            winner = entries[0]  # ranked by the sweeper, ties by the secondary objective (objective.rank_trials)
            tie = tie_of(entries, objective, secondary, "on the tuning seeds")
        warnings.append("not confirmed (confirm_top=0): the tuned value is the winner's own score and is optimistic")
    if len(search.tune_seeds) < 5:
        warnings.append(f"{len(search.tune_seeds)} seeds per trial: one seed is not a comparison, and fewer than five is a weak one")
    if counts["failed"]:
        warnings.append(f"{counts['failed']} trials had failed seeds or failed outright (their value is the worst possible)")

    summary = {
        "experiment": str(search.config.name),
        "study_name": search.name,
        "storage": search.url,
        "objective": objective,
        "direction": "maximize" if search.maximize else "minimize",
        "sampler": str(s.sampler),
        "pruner": str(s.pruner),
        "tuning_seeds": search.tune_seeds,
        "confirm_seeds": search.confirm_seeds,
        "trials": counts,
        "best_trial": None if winner is None else winner["trial"],
        # Typed values (floats, ints, strings, booleans) as the sampler drew them; best.yaml writes them as overrides.
        "best_params": None if winner is None else winner["params"],
        "tie_break": secondary,
        "tie": tie,
        "best_tuned_value": None if winner is None else _finite(winner["tuned_value"]),
        "best_confirmed": None if winner is None or not confirm_dirs else {k: winner[k] for k in ("value", "secondary", "primary", "time_to_threshold_s", "optimism_gap", "probability_of_improvement_over_preset")},
        "preset_wins": preset_wins,
        # True only when the confirmation shows the winner better than the preset beyond its noise (evidence's interval).
        "beats_preset": beats,
        "evidence": None if winner is None else winner.get("evidence"),
        "candidates": candidates,
        "preset": preset,
        "verdict": verdict,
        "warnings": warnings,
    }
    write_json(out / "tune.json", summary)
    if winner is not None:
        label = verdict if verdict is not None else ("Not confirmed on fresh seeds (confirm_top=0): its value is its own "
                                                     "score on the tuning seeds, which is optimistic.")
        text = best_yaml(search, winner["params"], out, label)
        (out / "best.yaml").write_text(text)
        (out / "experiment").mkdir(exist_ok=True)
        (out / "experiment" / "best.yaml").write_text(text)
    from pipeline.tune.plots import write_plots

    summary["plots"] = write_plots(study, candidates, preset, out, warnings)
    (out / "tune.md").write_text(markdown(summary, out))
    wandb_cfg = (search.config.get("logger") or {}).get("wandb")
    if wandb_cfg is not None:
        log_tune_to_wandb(summary, out, str(search.config.name), dict(wandb_cfg))
    return out


def best_yaml(search, params: dict[str, Any], out: Path, label: str) -> str:
    """An experiment preset of the winner: the original preset, the fixed overrides, then the tuned values. Its header
    says what the confirmation found (`label`: the verdict, e.g. not distinguishable from the preset)."""
    groups = group_options()
    choices = OmegaConf.select(search.config, "hydra.runtime.choices", default={}) or {}
    experiment = choices.get("experiment")
    # A key and everything under it (`seed`, `hydra.job.chdir`, the group `hydra/launcher`), not every key that
    # starts alike (`seeding` stays).
    items = [o for o in search.fixed
             if not is_ignored(o.split("=", 1)[0].lstrip("+~").replace("/", "."), _NOT_CONFIG)]
    items += [f"{k}={format_value(v)}" for k, v in params.items()]
    defaults = [f"  - {experiment}"] if experiment else []
    values = []
    for item in items:
        key, value = item.split("=", 1)
        key = key.lstrip("+")
        if key in groups:
            defaults.append(f"  - override /{key}: {value}")
        else:
            values.append(f"{key}={value}")
    body = OmegaConf.to_yaml(OmegaConf.from_dotlist([f"name={search.config.name}_tuned", *values]))
    return "\n".join([
        "# @package _global_",
        f"# Tuned by pipeline's Optuna sweeper over {len(search.tune_seeds)} seeds per trial (study {search.name!r}).",
        *textwrap.wrap(f"Verdict: {label}", width=116, initial_indent="# ", subsequent_indent="#   "),
        f"# python -m pipeline --config-dir {out} experiment=best",
        "defaults:", *defaults, "  - _self_", "", body,
    ])


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def _ci(stats: dict | None) -> str:
    if not stats or stats.get("iqm") is None:
        return "-"
    low, high = stats["iqm_ci"]
    return f"{stats['iqm']:.4g} [{low:.4g}, {high:.4g}]"


def markdown(summary: dict, out: Path) -> str:
    lines = [f"# Tuning {summary['experiment']}", ""]
    for w in summary["warnings"]:
        lines.append(f"> **warning:** {w}")
    t = summary["trials"]
    lines += ["", f"Study `{summary['study_name']}` in `{summary['storage']}`: {t['total']} trials ({t['completed']} completed, "
              f"{t['pruned']} pruned, {t['failed']} failed); sampler {summary['sampler']}, pruner {summary['pruner']}; "
              f"objective {summary['objective']} ({summary['direction']}) over tuning seeds "
              f"{summary['tuning_seeds'][0]}-{summary['tuning_seeds'][-1]}.", ""]
    if summary["best_params"] is not None:
        lines += ["## Best configuration", "", *[f"- `{k}={format_value(v)}`" for k, v in summary["best_params"].items()], "",
                  f"Run it: `python -m pipeline --config-dir {out} experiment=best`", ""]
        if summary.get("tie"):
            lines += [f"**A tie:** {summary['tie']['note']}.", ""]
    if summary["candidates"]:
        seeds = summary["confirm_seeds"]
        metric = summary["preset"]["primary_metric"]
        rl = summary["preset"]["time_to_threshold_s"] is not None
        second = summary.get("tie_break")
        lines += [f"## Confirmed on fresh seeds {seeds[0]}-{seeds[-1]}", "",
                  f"| candidate | tuned value | confirmed value | optimism gap | IQM {metric} [95% CI] | P(better than preset) [95% CI] |"
                  + (f" tie-break: {second} (IQM) |" if second else "")
                  + (" time to threshold IQM [95% CI] (reached) |" if rl else ""),
                  "|---|---|---|---|---|---|" + ("---|" if second else "") + ("---|" if rl else "")]
        for c in [*summary["candidates"], {**summary["preset"], "label": "preset"}]:
            poi = c.get("probability_of_improvement_over_preset")
            poi_text = "-" if not poi else f"{poi['p']:.2f} [{poi['ci'][0]:.2f}, {poi['ci'][1]:.2f}]"
            row = (f"| {c['label']}{' (' + ', '.join(f'{k}={format_value(v)}' for k, v in c['params'].items()) + ')' if c.get('params') else ''} "
                   f"| {_fmt(c.get('tuned_value'))} | {_fmt(c['value'])} | {_fmt(c.get('optimism_gap'))} | {_ci(c['primary'])} | {poi_text} |")
            if second:
                row += f" {_show(c.get('secondary'))} |"
            if rl:
                th = c["time_to_threshold_s"] or {}
                row += f" {_ci(th)} ({th.get('reached')}/{th.get('of')}) |"
            lines.append(row)
        lines.append("")
        lines += [summary["verdict"], ""]
    for name, path in (summary.get("plots") or {}).items():
        lines.append(f"![{name}]({path})")
    return "\n".join(lines) + "\n"


def log_tune_to_wandb(summary: dict, out: Path, group: str, wandb_cfg: dict) -> dict:
    """The tune summary as one W&B run (job_type="tune") in the experiment's group, offline unless asked."""
    import os

    import wandb

    from pipeline.report.wandb_summary import quiet_settings

    mode = wandb_cfg.get("mode") or os.environ.get("WANDB_MODE") or "offline"
    flat: dict[str, Any] = {f"trials/{k}": v for k, v in summary["trials"].items()}
    flat.update(best_tuned_value=summary["best_tuned_value"], preset_wins=summary["preset_wins"])
    for c in summary["candidates"]:
        flat[f"{c['label']}/confirmed_value"] = c["value"]
        flat[f"{c['label']}/optimism_gap"] = c["optimism_gap"]
    if summary["preset"]:
        flat["preset/confirmed_value"] = summary["preset"]["value"]
    run = wandb.init(project=wandb_cfg.get("project", "pipeline"), entity=wandb_cfg.get("entity"), mode=mode,
                     group=group, job_type="tune", name=f"tune-{summary['study_name']}", dir=str(Path(out).resolve()),
                     config={"best_params": summary["best_params"], "objective": summary["objective"]},
                     reinit="create_new",  # a trial's run may still be open in this process
                     settings=quiet_settings())
    try:
        run.summary.update(flat)
        run.log({f"plots/{Path(p).stem}": wandb.Image(str(out / p)) for p in (summary.get("plots") or {}).values()})
        artifact = wandb.Artifact(f"tune-{summary['study_name']}".replace(" ", "_"), type="tune")
        artifact.add_file(str(out / "tune.json"))
        run.log_artifact(artifact)
        info = {"id": run.id, "mode": mode, "sync_dir": str(getattr(run.settings, "sync_dir", ""))}
    finally:
        run.finish()
    return info

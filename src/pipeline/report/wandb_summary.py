"""Log a built report as one W&B run (job_type="report"): per-seed table, aggregates, figures."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path
from typing import Any

from pipeline.report.collect import NOT_OK

SUMMARY_STATS = ("n_ok", "n_failed", "n_interrupted", "n_pruned", "n_running", "mean", "std", "median", "min", "max", "iqm")

THRESHOLD_STATS = ("n_reached", "n_seeds", "median_reached_s", "median_all_s")


def quiet_settings(**extra: Any):
    """wandb.Settings that keep W&B's own lines off the console (its ~25-line run summary and sync hints at every
    finish); what was logged is in the run, and the offline dir is named where the run is reported."""
    import wandb

    return wandb.Settings(silent=True, console="off", **extra)


def report_run_id(report_dir: str | os.PathLike[str], sweep: str | None) -> str:
    """The report's W&B run id: one per sweep (a resumed sweep keeps its id), else one per report dir, so a
    report rebuilt after a resume updates its run instead of leaving a stale partial one beside it."""
    return f"report-{sweep}" if sweep else "report-" + hashlib.sha256(str(Path(report_dir).resolve()).encode()).hexdigest()[:12]


def drop_offline_runs(report_dir: Path, run_id: str) -> None:
    """Offline runs of `run_id` an earlier build of this report left: a report is rebuilt whole, so they hold a
    stale partial one that `wandb sync` would upload too."""
    for old in (Path(report_dir) / "wandb").glob(f"offline-run-*-{run_id}"):
        shutil.rmtree(old, ignore_errors=True)


def report_run_name(report: dict[str, Any], report_dir: str | os.PathLike[str], group: str | None) -> str:
    if group:
        return f"report-{group}"
    inputs = report.get("inputs") or []
    sweep = Path(inputs[0]).name if len(inputs) == 1 else Path(report_dir).resolve().parent.name
    return f"report-{sweep}"


def per_seed_rows(report: dict[str, Any]) -> list[list[Any]]:
    """One row per run the report saw: ok seeds with their value, failed and excluded ones with why."""
    rows = []
    for name, g in report["groups"].items():
        metric = g["primary_metric"]
        for entry in g["per_seed"].values():
            rows.append([name, str(entry["seed"]), "ok", metric, entry["value"], None, entry["relative_dir"]])
        for status, entries in {**{s: g[s] for s in NOT_OK}, **g["other_status"]}.items():
            for entry in entries:
                rows.append([name, str(entry["seed"]), status, metric, None, entry["error"], entry["relative_dir"]])
        for entry in g["excluded"]:
            rows.append([name, str(entry["seed"]), "excluded", metric, None, entry["reason"], entry["relative_dir"]])
    return rows


def summary_values(report: dict[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {"n_runs": report["n_runs"], "n_groups": report["n_groups"], "partial": report["partial"]}
    values.update({f"runs/{status}": n for status, n in report["status_counts"].items()})
    for name, g in report["groups"].items():
        for stat in SUMMARY_STATS:
            values[f"{name}/{stat}"] = g[stat]
        for stat in ("iqm_ci", "mean_ci"):
            if g[stat]:
                values[f"{name}/{stat}_low"], values[f"{name}/{stat}_high"] = g[stat]
        if g["threshold"]:
            for stat in THRESHOLD_STATS:
                values[f"{name}/time_to_threshold/{stat}"] = g["threshold"][stat]
    for metric, comparison in report["comparisons"].items():
        for pair in comparison["probability_of_improvement"]:
            values[f"probability_of_improvement/{metric}/{pair['x']} > {pair['y']}"] = pair["p"]
    return values


def log_report_to_wandb(
    report: dict[str, Any],
    report_dir: str | os.PathLike[str],
    project: str,
    group: str | None = None,
    entity: str | None = None,
    mode: str | None = None,
) -> dict[str, Any]:
    """Create (or, for a rebuilt report of the same sweep, update) one W&B run holding the report; returns
    ``{"id", "name", "mode", "sync_dir"}``.

    ``mode`` defaults to ``$WANDB_MODE`` or "offline", so a report never waits on the network unless
    asked to; offline files land under ``report_dir/wandb`` (``wandb sync`` uploads them later).
    """
    import wandb

    from pipeline.config.grouping import sweep_id

    report_dir = Path(report_dir)
    sweep = sweep_id()  # set in a sweep: the report run carries the same sweep tag as the runs it reports
    mode = mode or os.environ.get("WANDB_MODE") or "offline"
    name = report_run_name(report, report_dir, group)
    run_id = report_run_id(report_dir, sweep)
    if mode == "offline":
        drop_offline_runs(report_dir, run_id)
    run = wandb.init(
        id=run_id,
        resume="allow",
        project=project,
        entity=entity,
        group=group,
        job_type="report",
        name=name,
        mode=mode,
        # Absolute: a W&B service another process started (WANDB_SERVICE inherited) resolves a relative dir against its
        # own working folder, and the offline run was lost (a sweep's report dir is relative, as Hydra's sweep dir is).
        dir=str(report_dir.resolve()),
        config={"inputs": report["inputs"], **report["settings"], **({"sweep_id": sweep} if sweep else {})},
        tags=[f"sweep={sweep}"] if sweep else None,
        # A training run may still be active in this process (a sweep's last job); leave it alone.
        reinit="create_new",
        settings=quiet_settings(),
    )
    try:
        columns = ["group", "seed", "status", "primary_metric", "primary_value", "error", "dir"]
        payload: dict[str, Any] = {"per_seed": wandb.Table(columns=columns, data=per_seed_rows(report))}
        for image in report["images"]:
            path = report_dir / image["file"]
            if path.is_file():
                payload[f"plots/{Path(image['file']).stem}"] = wandb.Image(str(path), caption=image["title"])
        run.log(payload)
        run.summary.update(summary_values(report))
        artifact = wandb.Artifact(re.sub(r"[^A-Za-z0-9._-]+", "_", name), type="report")
        for file in (report.get("files") or {}).values():
            if (report_dir / file).is_file():
                artifact.add_file(str(report_dir / file))
        run.log_artifact(artifact)
        info = {"id": run.id, "name": name, "mode": mode, "sync_dir": str(getattr(run.settings, "sync_dir", ""))}
    finally:
        run.finish()
    return info

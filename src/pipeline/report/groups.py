"""Put runs into groups: equal resolved configs (result.json ``config``) are one group, named by how it differs.

Records written before ``config`` existed fall back to their ``group`` string.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from pipeline.config.grouping import config_id, differences, semantic_config
from pipeline.report.collect import ReportedRun


def _experiment(run: ReportedRun, config: dict) -> str:
    return str(config.get("name") or run.result.get("experiment") or run.result.get("task") or "run")


def group_runs(runs: Sequence[ReportedRun]) -> dict[str, list[ReportedRun]]:
    """``{display name: runs}``, and each run's ``report_group`` set to its name. Within one experiment a group is named by the keys where its config differs
    from the experiment's other configs (``dqn_cartpole seeding=deterministic``); alone it is the experiment."""
    by_key: dict[tuple[str, str], list[ReportedRun]] = defaultdict(list)
    configs: dict[str, dict[tuple[str, str], dict]] = defaultdict(dict)
    choices: dict[tuple[str, str], dict] = {}
    legacy: dict[str, list[ReportedRun]] = defaultdict(list)
    for run in runs:
        raw = run.result.get("config")
        if not isinstance(raw, dict) or not raw:
            legacy[run.group].append(run)
            continue
        config = semantic_config(raw)
        experiment = _experiment(run, config)
        key = (experiment, config_id(config, already_semantic=True))
        by_key[key].append(run)
        configs[experiment][key] = config
        if isinstance(run.result.get("choices"), dict):
            choices[key] = run.result["choices"]

    named: dict[str, list[ReportedRun]] = {}
    for experiment, members in sorted(configs.items()):
        labels = differences(members, {k: choices[k] for k in members if k in choices})
        for key in sorted(members, key=lambda k: labels[k]):
            name = " ".join(part for part in (experiment, labels[key]) if part)
            if name in named:  # differences cut short ("+3 more") can coincide; the id keeps them apart
                name = f"{name} #{key[1]}"
            named[name] = by_key[key]
    for name, members in sorted(legacy.items()):
        named[name if name not in named else f"{name} (record without config)"] = members
    for name, members in named.items():
        for run in members:
            run.report_group = name
    return dict(sorted(named.items()))

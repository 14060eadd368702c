"""Tuning plots: Optuna's optimization history and parameter importances, and the confirmed score distributions."""

from __future__ import annotations

from pathlib import Path


def _save(ax_or_fig, path: Path) -> None:
    import warnings

    from pipeline.report.plots import fit_to_text

    fig = ax_or_fig.figure if hasattr(ax_or_fig, "figure") and not hasattr(ax_or_fig, "savefig") else ax_or_fig
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tight_layout on Optuna's figures warns about axes it cannot fit
        fit_to_text(fig)  # labels, titles and legends inside the picture, however long
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)


# Parameter importances (Optuna's fANOVA: a random forest fitted to the finished trials) from fewer trials
# than this are noise that looks like an answer: the plot is left out, and tune.md says why.
MIN_IMPORTANCE_TRIALS = 10


def write_plots(study, candidates: list[dict], preset: dict | None, out: Path, warnings: list[str]) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm

    with matplotlib.rc_context():  # Optuna's plots switch the process to the ggplot style: not beyond this call
        return _draw(study, candidates, preset, out, warnings, plt, ovm)


def _draw(study, candidates: list[dict], preset: dict | None, out: Path, warnings: list[str], plt, ovm) -> dict[str, str]:
    from optuna.trial import TrialState

    made: dict[str, str] = {}
    finished = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    draws = [("optimization history", ovm.plot_optimization_history)]
    if finished >= MIN_IMPORTANCE_TRIALS:
        draws.append(("parameter importances", ovm.plot_param_importances))
    else:
        warnings.append(f"no parameter importance plot: {finished} completed trial{'s' if finished != 1 else ''}; "
                        f"importances fitted to fewer than {MIN_IMPORTANCE_TRIALS} are noise")
    for name, draw in draws:
        try:
            ax = draw(study)
            path = f"{name.replace(' ', '_')}.png"
            _save(ax, out / path)
            made[name] = path
        except Exception as exc:  # too few finished trials for importances, say; the rest still gets written
            warnings.append(f"no {name} plot: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
    if preset is not None:
        # What tune.md's table shows: each seed's score, the IQM (line) and its 95% interval (bar).
        rows = [(c["label"], c["primary_scores"], c.get("primary")) for c in candidates]
        rows.append(("preset", preset["primary_scores"], preset.get("primary")))
        fig, ax = plt.subplots(figsize=(1.6 * len(rows) + 2, 3.5))
        for i, (_, scores, stats) in enumerate(rows):
            ax.scatter([i] * len(scores), scores, alpha=0.6)
            if stats and stats.get("iqm") is not None:
                ax.hlines(stats["iqm"], i - 0.25, i + 0.25, color="black")
                ax.vlines(i + 0.3, *stats["iqm_ci"], color="black", linewidth=3, alpha=0.4)
        ax.set_xticks(range(len(rows)), [label for label, _, _ in rows])
        ax.set_ylabel(preset.get("primary_metric") or "primary metric")
        ax.set_title("confirmed on fresh seeds (line: IQM, bar: its 95% CI)")
        _save(fig, out / "confirmed.png")
        made["confirmed scores"] = "confirmed.png"
    return made

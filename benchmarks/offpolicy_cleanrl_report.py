"""The verdicts of `make bench-offpolicy-cleanrl` from its results file: per algorithm and env, each side's IQM of the
final deterministic returns with its 95% stratified-bootstrap CI, the IQM difference with its CI (ours - CleanRL),
the verdict, the CPU per env step of each side, and the training curves side by side as a PNG.

    make bench-offpolicy-cleanrl ARGS="--report"

Verdict: "ours better" / "ours worse" only when the difference's CI excludes 0; otherwise "cannot tell on N seeds"
("not worse" is claimed only when the CI's lower end is above -10% of CleanRL's IQM).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np


def _curve(rows: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Steps and [seeds, points] of the training-return windows (NaN where a window saw no episode end)."""
    steps = np.array([p[0] for p in rows[0]["train_returns"]], float)
    values = np.array([[np.nan if p[1] is None else p[1] for p in r["train_returns"]] for r in rows], float)
    return steps, values


def _verdict(result: dict) -> str:
    lo, hi = result["iqm_difference_ci"]
    if lo > 0:
        return "ours better (the difference's CI is above 0)"
    if hi < 0:
        return "ours worse (the difference's CI is below 0)"
    base = abs(result["cleanrl"]["iqm"])
    if lo > -0.1 * base:
        return "not worse (the difference's CI stays above -10% of CleanRL's IQM)"
    return "cannot tell on these seeds (the difference's CI spans 0)"


def report(rows: list[dict], image_dir: Path) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from bench_cleanrl import compare

    cells: dict[tuple, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        cells[(row["algo"], row["env"], row["env_steps"])][row["side"]].append(row)
    if not cells:
        print("no results yet: run `make bench-offpolicy-cleanrl`")
        return 1
    image_dir.mkdir(parents=True, exist_ok=True)
    print("| algo | env | env steps | seeds ours / CleanRL | IQM ours [95% CI] | IQM CleanRL [95% CI] | difference [95% CI] | "
          "verdict | CPU ms per env step ours / CleanRL |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (algo, env, steps), sides in sorted(cells.items()):
        ours = sorted(sides.get("ours", []), key=lambda r: r["seed"])
        theirs = sorted(sides.get("cleanrl", []), key=lambda r: r["seed"])
        # A resumed run's CPU covers only the segments the bench ran (`cpu_env_steps` of them); without that count it
        # is not a rate.
        cpu = {side: np.mean([r["cpu_s"] / r.get("cpu_env_steps", r["env_steps"]) * 1e3 for r in rs])
               if rs and all(r["side"] == "cleanrl" or r.get("cpu_complete") or "cpu_env_steps" in r for r in rs) else float("nan")
               for side, rs in (("ours", ours), ("cleanrl", theirs))}
        partial = any(not r.get("cpu_complete") and "cpu_env_steps" in r for r in ours)
        cpu_text = f"{cpu['ours']:.1f}{'*' if partial else ''} / {cpu['cleanrl']:.1f}"
        if ours and theirs:
            result = compare([r["final_return"] for r in ours], [r["final_return"] for r in theirs])
            a, b = result["ours"], result["cleanrl"]
            lo, hi = result["iqm_difference_ci"]
            print(f"| {algo} | {env} | {steps:,} | {len(ours)} / {len(theirs)} | {a['iqm']:.0f} [{a['iqm_ci'][0]:.0f}, "
                  f"{a['iqm_ci'][1]:.0f}] | {b['iqm']:.0f} [{b['iqm_ci'][0]:.0f}, {b['iqm_ci'][1]:.0f}] | "
                  f"{result['iqm_difference']:.0f} [{lo:.0f}, {hi:.0f}] | {_verdict(result)} | {cpu_text} |")
        else:
            print(f"| {algo} | {env} | {steps:,} | {len(ours)} / {len(theirs)} | | | | waiting for both sides | {cpu_text} |")
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for side, rs, color in (("ours", ours, "C0"), ("CleanRL", theirs, "C1")):
            if not rs:
                continue
            x, y = _curve(rs)
            ax.plot(x, np.nanmedian(y, 0), color=color, label=f"{side} (median of {len(rs)} seeds)")
            ax.fill_between(x, np.nanmin(y, 0), np.nanmax(y, 0), color=color, alpha=0.2)
        ax.set_xlabel("env steps")
        ax.set_ylabel("training episode return (10k-step windows)")
        ax.set_title(f"{algo.upper()} {env}: ours vs CleanRL (band: min-max over seeds)")
        ax.legend(loc="upper left")
        fig.tight_layout()
        path = image_dir / f"offpolicy_cleanrl_{algo}_{env.split('-')[0].lower()}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        print(f"  curves: {path}")
        for rs in (ours, theirs):
            for diff in {tuple(r.get("differences") or ()) for r in rs}:
                if diff:
                    print(f"  settings differing from CleanRL's defaults: {'; '.join(diff)}")
    print("* ours' CPU over the segments after a resume (start-up and the final evaluation included): a killed "
          "segment's CPU is not recorded; nan: no count of the steps it covers")
    return 0

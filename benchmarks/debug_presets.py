"""How long `trainer=debug` takes for every preset, as a multiple of `python -c "import torch"` timed alongside.

    python benchmarks/debug_presets.py                 # every preset, median of 3 (~10 min on 2 shared cores)
    python benchmarks/debug_presets.py --repeats 1 --presets cem_cartpole dqn_atari

Each repeat runs `import torch` and then the preset's debug run (`device=cpu`, a fresh process each), so both
see the same load; the number that matters is the ratio of the medians. Most of a debug run is its start-up
(importing Lightning), which is why `import torch` is the reference. The test suite does not time these runs
(tests/test_debug.py checks that they succeed, quietly, under 1 GB).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))


def seconds(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, "WANDB_MODE": "offline"})
    return time.perf_counter() - t0


def measure(presets: list[str] | None = None, repeats: int = 3) -> dict:
    presets = presets or PRESETS
    torch_s: list[float] = []
    runs: dict[str, list[float]] = {p: [] for p in presets}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            for preset in presets:
                torch_s.append(seconds([sys.executable, "-c", "import torch"]))
                run_dir = Path(tmp) / f"{preset}-{r}"
                runs[preset].append(seconds([sys.executable, "-m", "pipeline", f"experiment={preset}", "trainer=debug",
                                             "device=cpu", f"hydra.run.dir={run_dir}"]))
    reference = statistics.median(torch_s)
    out = {"import_torch_s": round(reference, 2), "repeats": repeats, "presets": {}}
    print(f"debug: every preset with trainer=debug device=cpu, median of {repeats}, as multiples of "
          f"`python -c \"import torch\"` ({reference:.2f} s here)")
    for preset, times in runs.items():
        median = statistics.median(times)
        out["presets"][preset] = {"seconds": round(median, 2), "ratio_to_import_torch": round(median / reference, 2),
                                  "all_seconds": [round(t, 2) for t in times]}
        print(f"  {preset:24s} {median:6.1f} s   {median / reference:5.2f}x import torch")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", choices=PRESETS, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(json.dumps(measure(args.presets, args.repeats), indent=2))


if __name__ == "__main__":
    main()

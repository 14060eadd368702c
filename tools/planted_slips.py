"""Plant realistic one-line slips one at a time in a scratch clone and report which the tests catch.

    python tools/planted_slips.py SLIPS.txt                    # against `make test-fast` (-m "not slow")
    python tools/planted_slips.py SLIPS.txt --suite full       # against the whole suite
    python tools/planted_slips.py SLIPS.txt --only 3,7         # the 3rd and 7th slips of the list
    python tools/planted_slips.py SLIPS.txt --clone /tmp/slips # reuse a clone (default: a fresh one in /tmp)

The slip list is a text file of blocks separated by blank lines (`#` lines are comments):

    rl/gae.py                                       the module, under src/pipeline/
    gamma and lambda swapped at PPO's call site     what the slip is (one line)
    - advantages = gae(rewards, values, dones, self.gamma, self.gae_lambda)
    + advantages = gae(rewards, values, dones, self.gae_lambda, self.gamma)

The `-` text (leading and trailing whitespace ignored; `\\n` for a line break, to delete or join lines) must
occur exactly once in the module; the slip replaces it with the `+` text. Keep your list out of the repository:
a list the tests were written against measures nothing.

Slips are planted in a clone (`git clone` of this checkout's HEAD), never in this checkout, and the
tests run there with PYTHONPATH=<clone>/src (which shadows the editable install; src/pipeline/conf links
to the clone's conf/). Each slip first runs the test
files named after its module (tests/**/test_<module>*.py, in one process), then the rest of its package's
test folder (tests/<package>/), then the rest of the suite, stopping at the first failure: a slip caught
early costs seconds, a missed one the whole suite. A slip counts as caught when pytest exits with failures (1) or errors (2, a collection error
included); the first failing test is printed. The module is restored after each slip, whatever happens.
The last line is `caught: K/N (P%)`; --json writes the per-slip results.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]


class Slip(NamedTuple):
    module: str
    what: str
    old: str
    new: str


def parse_slips(text: str) -> list[Slip]:
    """The blocks of a slip list, in order (see the module docstring for the format)."""
    slips: list[Slip] = []
    blocks = re.split(r"\n\s*\n", "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#")))
    for block in blocks:
        lines = [ln for ln in block.splitlines() if ln.strip()]
        if not lines:
            continue
        olds = [ln.split("-", 1)[1].strip() for ln in lines if ln.lstrip().startswith("- ")]
        news = [ln.split("+", 1)[1].strip() for ln in lines if ln.lstrip().startswith("+ ")]
        if len(lines) != 4 or len(olds) != 1 or len(news) != 1:
            raise SystemExit(f"a slip is 4 lines (module, what, `- old`, `+ new`); got:\n{block}")
        unescape = lambda text: text.replace("\\n", "\n")  # noqa: E731
        slips.append(Slip(lines[0].strip(), lines[1].strip(), unescape(olds[0]), unescape(news[0])))
    return slips


def plant(source: str, slip: Slip) -> str:
    """`source` with the slip's old text replaced by its new text; exactly one occurrence is required."""
    count = source.count(slip.old)
    if count != 1:
        raise ValueError(f"`{slip.old}` occurs {count} times in {slip.module} (must be once)")
    if slip.old == slip.new:
        raise ValueError(f"the slip in {slip.module} changes nothing")
    return source.replace(slip.old, slip.new)


def run_pytest(clone: Path, selection: list[str], args: argparse.Namespace, jobs: int, ignore: Sequence[str] = ()) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
    cmd += ["-n", str(jobs), "--dist", "loadgroup"] if jobs > 1 else ["-p", "no:xdist"]
    if args.suite == "fast":
        cmd += ["-m", "not slow"]
    cmd += [f"--ignore={path}" for path in ignore] + [f"--deselect={node}" for node in args.deselect] + selection
    env = dict(os.environ, PYTHONPATH=str(clone / "src"), PYTHONDONTWRITEBYTECODE="1")
    # A session of its own: a stopped slip run takes its pytest workers with it.
    proc = subprocess.Popen(cmd, cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate()
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return proc.returncode, out


def stages(clone: Path, module: str, jobs: int) -> list[tuple[str, list[str], int, list[str]]]:
    """(name, selection, workers, ignored) in the order they run: the test files named after the module (one
    process), the rest of its package's test folder, then the rest of the suite. Together: the whole suite."""
    package, _, name = module.rpartition("/")
    named = sorted(str(p.relative_to(clone)) for p in (clone / "tests").rglob(f"test_{Path(name).stem}*.py"))
    out = [("named", named, 1, [])] if named else []
    folder = f"tests/{package}" if package and (clone / "tests" / package).is_dir() else None
    if folder:
        out.append(("package", [folder], jobs, named))
    out.append(("rest", ["tests"], jobs, named + ([folder] if folder else [])))
    return out


def first_failure(output: str) -> str:
    match = re.search(r"^(?:FAILED|ERROR) (\S+)", output, re.M)
    return match.group(1) if match else output.strip().splitlines()[-1] if output.strip() else "?"


def make_clone(target: Path | None) -> Path:
    if target is None:
        target = Path(tempfile.mkdtemp(prefix="slips-")) / "repo"
    if target.resolve() == ROOT or ROOT in target.resolve().parents:
        raise SystemExit(f"{target} is this checkout: slips are planted in a clone only")
    if not target.exists():
        subprocess.run(["git", "clone", "-q", str(ROOT), str(target)], check=True)
    if subprocess.run(["git", "status", "--porcelain", "src"], cwd=target, capture_output=True, text=True).stdout:
        raise SystemExit(f"{target}/src has changes: use a clean clone")
    for cache in (target / "src").rglob("__pycache__"):
        shutil.rmtree(cache)
    # pipeline.conf is the clone's conf/ (the editable install maps it to this checkout's, which may differ).
    link = target / "src" / "pipeline" / "conf"
    if not link.exists():
        link.symlink_to(Path("..", "..", "conf"))
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("slips", type=Path)
    parser.add_argument("--suite", choices=["fast", "full"], default="fast")
    parser.add_argument("--clone", type=Path, default=None)
    parser.add_argument("--only", default="", help="1-based indices, comma separated")
    parser.add_argument("--jobs", type=int, default=2, help="pytest-xdist workers (default 2)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--deselect", action="append", default=[], metavar="NODE",
                        help="a test that fails without any slip (check first: a slip it 'catches' is not caught)")
    parser.add_argument("--stages", default="named,package,rest",
                        help="which stages to run (named,package: a quick first pass; a slip they miss is only provisionally missed)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the module is restored on the way out

    slips = parse_slips(args.slips.read_text())
    indices = [int(i) for i in args.only.split(",") if i] or list(range(1, len(slips) + 1))
    clone = make_clone(args.clone)
    print(f"clone: {clone}; {len(indices)} slips against the {args.suite} suite", flush=True)
    results = []
    for i in indices:
        slip = slips[i - 1]
        path = clone / "src" / "pipeline" / slip.module
        original = path.read_text()
        start = time.monotonic()
        try:
            path.write_text(plant(original, slip))
            rc, out = 0, ""
            for stage, selection, jobs, ignore in stages(clone, slip.module, args.jobs):
                if stage not in args.stages.split(","):
                    continue
                print(f"    [{i}] {stage}: {' '.join(selection)}", flush=True)
                rc, out = run_pytest(clone, selection, args, jobs, ignore)
                if rc not in (0, 5):  # 5: nothing selected (every test there is slow)
                    break
        except ValueError as err:
            rc, out, stage = -1, str(err), "not planted"
        finally:
            path.write_text(original)
        caught = rc in (1, 2)
        if not caught and rc != -1:
            stage = "whole suite" if "rest" in args.stages.split(",") else f"provisional: only {args.stages} run"
        entry = {"index": i, "module": slip.module, "what": slip.what, "caught": caught, "stage": stage,
                 "returncode": rc, "by": first_failure(out) if caught else None,
                 "seconds": round(time.monotonic() - start, 1)}
        if rc == -1:
            entry["error"] = out
        results.append(entry)
        verdict = f"caught ({stage}) by {entry['by']}" if caught else ("NOT PLANTED: " + out if rc == -1 else f"MISSED ({stage})")
        print(f"[{i}] {slip.module}: {slip.what}: {verdict} ({entry['seconds']} s)", flush=True)
    planted = [r for r in results if r["returncode"] != -1]
    caught = sum(r["caught"] for r in planted)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(f"caught: {caught}/{len(planted)} ({100 * caught / max(len(planted), 1):.0f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

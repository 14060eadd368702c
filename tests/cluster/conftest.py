"""The tests in this folder run against the local SLURM cluster and PostgreSQL of tools/cluster/up.sh.

Without them (not root, no apt, `make cluster-up` not run) every test here is skipped with one reason,
which pytest's `-ra` summary prints: never a silent pass. Everything in tests/cluster/ is marked `cluster`
(and `slow`: `make test-fast` leaves them out).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

STATE = Path(os.environ.get("PIPELINE_CLUSTER_DIR", "/var/tmp/pipeline-cluster"))


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.cluster)
            item.add_marker(pytest.mark.slow)  # minutes of SLURM jobs: not in `make test-fast`
            # One SLURM node and one PostgreSQL: under pytest-xdist these run one at a time, on one worker.
            item.add_marker(pytest.mark.xdist_group("cluster"))


def _env_file() -> dict[str, str]:
    path = STATE / "env"
    if not path.exists():
        return {}
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {k.strip(): v.strip() for k, v in pairs}


def _why_not() -> tuple[str | None, dict[str, str]]:
    """None and the cluster's settings when it is up; else the reason, in one line."""
    settings = {**_env_file(), **{k: v for k, v in os.environ.items() if k.startswith("PIPELINE_CLUSTER_")}}
    if shutil.which("sinfo") is None:
        return "no SLURM here (sinfo not on PATH): run `make cluster-up` as root", settings
    partition = settings.get("PIPELINE_CLUSTER_PARTITION")
    if not partition or "PIPELINE_CLUSTER_PG_URL" not in settings:
        return f"the local cluster was not brought up ({STATE}/env missing): run `make cluster-up` as root", settings
    try:
        state = subprocess.run(["sinfo", "-h", "-p", partition, "-o", "%t"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer in 20 s: the SLURM controller is down; run `make cluster-up`", settings
    if state.returncode != 0 or not state.stdout.strip():
        return f"SLURM partition {partition!r} not answering ({(state.stderr or state.stdout).strip()[:120]}): run `make cluster-up`", settings
    if not any(s.rstrip("*~#") in ("idle", "mix", "alloc") for s in state.stdout.split()):
        return f"SLURM node of partition {partition!r} is {state.stdout.strip()}: run `make cluster-up`", settings
    sacct = subprocess.run(["sacct", "-n", "-X", "-S", "now-1minutes"], capture_output=True, text=True, timeout=20)
    if sacct.returncode != 0:
        return f"SLURM accounting not answering ({sacct.stderr.strip()[:120]}): run `make cluster-up`", settings
    try:
        import sqlalchemy

        engine = sqlalchemy.create_engine(settings["PIPELINE_CLUSTER_PG_URL"], connect_args={"connect_timeout": 5})
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("select 1"))
        engine.dispose()
    except Exception as e:  # the reason goes into the skip line
        return f"PostgreSQL of the local cluster not reachable ({type(e).__name__}): run `make cluster-up`", settings
    return None, settings


_STATUS: tuple[str | None, dict[str, str]] | None = None


def _status() -> tuple[str | None, dict[str, str]]:
    global _STATUS
    if _STATUS is None:
        _STATUS = _why_not()
    return _STATUS


def pytest_terminal_summary(terminalreporter):
    """One line at the end of the run (also under -q) when the cluster tests were skipped, and why."""
    if _STATUS is not None and _STATUS[0]:
        terminalreporter.write_line(f"cluster tests skipped: {_STATUS[0]}")


@pytest.fixture(scope="session")
def cluster() -> dict[str, str]:
    """The cluster's settings: partition and PostgreSQL URL; skips (with the reason) when it is not up."""
    reason, settings = _status()
    if reason:
        pytest.skip(f"cluster tests: {reason}")
    return {"partition": settings["PIPELINE_CLUSTER_PARTITION"], "pg_url": settings["PIPELINE_CLUSTER_PG_URL"]}


@pytest.fixture
def start_cli(cluster):
    """Start `python -m pipeline ...` in the background (slurm_testing.Cli); stopped, and its SLURM jobs
    cancelled, when the test ends."""
    from slurm_testing import Cli

    started = []

    def _start(args, cwd):
        started.append(Cli(args, cwd))
        return started[-1]

    yield _start
    for cli in started:
        cli.stop()

"""Fixtures for the report tests: a two-group sweep on disk and the report built from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from report_runs import write_two_group_sweep


@pytest.fixture(scope="session")
def two_group_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_two_group_sweep(tmp_path_factory.mktemp("sweep"))


@pytest.fixture(scope="session")
def two_group_report(two_group_sweep: Path) -> dict[str, Any]:
    from pipeline.report import build_report

    with pytest.warns(UserWarning, match="corrupt"):
        return build_report([two_group_sweep])

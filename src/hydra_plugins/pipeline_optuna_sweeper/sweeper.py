"""`hydra/sweeper=optuna`: the Hydra face of pipeline's tuner. Hydra imports every module under
`hydra_plugins` at start-up, so this one imports nothing heavy; the work is in `_impl.py`."""

from __future__ import annotations

import sys
from typing import Any

from hydra.plugins.sweeper import Sweeper


class OptunaSweeper(Sweeper):
    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        self._impl = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        from hydra_plugins.pipeline_optuna_sweeper._impl import SeedDistributionSearch

        self._impl = SeedDistributionSearch(self.settings, hydra_context, task_function, config)

    def sweep(self, arguments: list[str]) -> Any:
        from pipeline.config.checks import ConfigError
        from pipeline.tune.space import TuneError

        try:
            return self._impl.sweep(arguments)
        except (TuneError, ConfigError) as exc:  # a set-up error is one line, not Hydra's traceback
            from pipeline.sweep import end_refused_sweep

            end_refused_sweep()  # no sweep dir is left by a sweep refused before its first job
            print(f"error: {exc}", file=sys.stderr, flush=True)
            sys.exit(2)

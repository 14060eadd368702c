"""Counterfactual prediction for auctions from logged bids: point estimates and RMAC robust bounds.

Nothing is trained by gradient descent here, so Lightning has no loop to run; the task still fits the
run record, sweeps and reports like every other task. The numerics live in `pipeline.games.rmac`.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from pipeline.games.auction import default_rules, parse_rule
from pipeline.games.plots import plot_revenue_vs_reserve
from pipeline.games.rmac import counterfactual_table, realised_regret, truth_table
from pipeline.tasks.base import Task


class CounterfactualTask(Task):
    primary_metric = "cf/second_price_r0.5/point"
    primary_curve = None

    def __init__(
        self,
        datamodule,
        seed: int = 0,
        run_dir: Path | None = None,
        data_device: torch.device | None = None,
        rules: list[str] | None = None,
        epsilons: tuple[float, ...] = (0.001, 0.005, 0.02),
        statistics: tuple[str, ...] = ("revenue", "welfare"),
        n_iters: int = 200,
        point_iters: int = 1000,
        grid: float = 0.01,
    ):
        super().__init__()
        if not hasattr(datamodule, "load"):
            raise ValueError("task=counterfactual needs data=auction_bids (simulated bids or data.path=bids.csv)")
        self.data = datamodule
        self.seed = int(seed)
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.compute_device = data_device or torch.device("cpu")
        self.rules = [parse_rule(r).name for r in (rules or default_rules())]
        self.epsilons = [float(e) for e in epsilons]
        self.statistics = list(statistics)
        self.n_iters, self.point_iters, self.grid = int(n_iters), int(point_iters), float(grid)
        self.extras: dict = {}

    def fit_and_evaluate(self, trainer, datamodule, ckpt_path) -> dict[str, float]:
        generator = torch.Generator().manual_seed(self.seed)
        t0 = time.perf_counter()
        logged = self.data.load(generator)
        self.add_time("data", time.perf_counter() - t0)
        metrics: dict[str, float] = {}
        for statistic in self.statistics:
            t0 = time.perf_counter()
            table = counterfactual_table(
                logged.bids, logged.n_bidders, self.rules, self.epsilons, statistic=statistic, n_iters=self.n_iters,
                point_iters=self.point_iters, generator=generator, device=self.compute_device, grid=self.grid,
            )
            self.add_time(f"bounds_{statistic}", time.perf_counter() - t0)
            if logged.values is not None:
                table |= truth_table(logged.n_bidders, self.rules, statistic)
            metrics |= table
        if logged.values is not None:
            errors = [abs(metrics[f"cf/{r}/point"] - metrics[f"cf/{r}/truth"]) for r in self.rules]
            metrics["cf/max_abs_point_error"] = float(max(errors))
            metrics["data/worst_realised_regret"] = float(realised_regret(logged.values, logged.bids, logged.n_bidders).max())
        self.extras = {"n_bids": int(logged.bids.numel()), "n_bidders": logged.n_bidders, "simulated": logged.values is not None,
                       "k": logged.k, "rules": self.rules, "epsilons": self.epsilons}
        if self.run_dir is not None and any(parse_rule(r).kind == "second_price" for r in self.rules):
            t0 = time.perf_counter()
            figure = plot_revenue_vs_reserve([metrics], self.run_dir / "revenue_vs_reserve.png",
                                             title=f"Predicted revenue vs reserve (seed {self.seed}, N = {logged.bids.numel()})")
            self.add_time("plot", time.perf_counter() - t0)
            self.extras["figure"] = str(figure)
            for logger in trainer.loggers:
                if type(logger).__name__ == "WandbLogger":
                    logger.log_image(key="revenue_vs_reserve", images=[str(figure)])
        for logger in trainer.loggers:
            logger.log_metrics({k: v for k, v in metrics.items() if np.isfinite(v)}, step=0)
        return metrics

    def record_extras(self) -> dict:
        return dict(self.extras)

    def export_state_dict(self) -> dict[str, torch.Tensor]:
        return {}

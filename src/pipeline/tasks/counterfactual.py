"""Counterfactual prediction for auctions from logged bids: point estimates and RMAC robust bounds.

Nothing is trained by gradient descent here, so Lightning has no loop to run; the task still fits the
run record, sweeps and reports like every other task. The numerics live in `pipeline.games.rmac`.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch

from pipeline.games.asymmetric import ESTIMATED, NOT_ESTIMATED, asymmetric_bounds, asymmetric_point
from pipeline.games.auction import default_rules, parse_rule, reserve_top
from pipeline.games.bid_checks import (
    ZERO_WARN,
    bid_lattice,
    excess_zeros,
    logged_reserve,
    mass_points,
    zero_share,
)
from pipeline.games.plots import plot_revenue_vs_reserve
from pipeline.games.rmac import (
    choose_value_scale,
    default_bandwidth,
    effective_lattice,
    known_value_scale,
    predict_counterfactuals,
    realised_regret,
    truth_table,
)
from pipeline.games.rules import PREFIX
from pipeline.games.symmetry import symmetry_test
from pipeline.store.layout import RESULT
from pipeline.tasks.base import Task, TaskParts
from pipeline.tasks.configs import CounterfactualConfig

log = logging.getLogger(__name__)


class CounterfactualTask(Task):
    Config = CounterfactualConfig
    primary_metric = "cf/second_price_r0.5/point"
    primary_curve = None

    def __init__(self, config: CounterfactualConfig, parts: TaskParts):
        super().__init__(config, parts)
        datamodule = parts.require("datamodule", "counterfactual", "use data=auction_bids (simulated bids or data.path=bids.csv)")
        if not hasattr(datamodule, "load"):
            raise ValueError("task=counterfactual needs data=auction_bids (simulated bids or data.path=bids.csv)")
        rules, epsilons, statistics, value_top = config.rules, config.epsilons, config.statistics, config.value_top
        self.data = datamodule
        self.run_dir = Path(parts.run_dir) if parts.run_dir is not None else None
        self.compute_device = parts.device or torch.device("cpu")
        # Default reserves span the data's own units: the simulated value range, or the observed bids.
        self.rules = [parse_rule(r).name for r in (rules or default_rules(top=self._reserve_top(datamodule)))]
        second = [parse_rule(r) for r in self.rules if r.startswith("second_price")]
        if second:  # the reserve nearest the middle of the range: r = 0.5 on [0, 1] values
            middle = max(r.reserve for r in second) / 2
            self.primary_metric = f"cf/{min(second, key=lambda r: abs(r.reserve - middle)).name}/point"
        else:
            self.primary_metric = f"cf/{self.rules[0]}/point"
        self.epsilons = [float(e) for e in epsilons]
        self.statistics = list(statistics)
        self.n_iters, self.point_iters, self.grid = int(config.n_iters), int(config.point_iters), float(config.grid)
        self.value_top = None if value_top is None else float(value_top)
        self.extras: dict = {}

    @staticmethod
    def _reserve_top(datamodule) -> float:
        loaded = getattr(datamodule, "_file", None)
        if loaded is not None:
            return reserve_top(loaded.flat)
        return float(getattr(datamodule, "value_scale", 1.0))

    def _check_symmetry(self, logged) -> dict:
        """Whether to pool the bidders, with what the decision rests on (recorded in result.json)."""
        declared = getattr(self.data, "symmetric", None)
        if logged.by_bidder is None:
            if declared is False:
                raise ValueError("data.symmetric=false needs bidders named in the file (bid_i columns or a "
                                 "'bidder' column); this file has one pooled bid column")
            return {"decision": "symmetric (assumed: the data do not name bidders)"}
        if declared is True:
            return {"decision": "symmetric (declared by data.symmetric=true, not tested)"}
        if declared is False:
            return {"decision": "asymmetric (declared by data.symmetric=false, not tested)"}
        result = symmetry_test(logged.by_bidder, getattr(self.data, "symmetry_level", 0.01))
        result["decision"] = "asymmetric" if result["rejected"] else "symmetric (not rejected)"
        return result

    def _known_scale(self, largest_bid: float):
        """`task.value_top` as the value scale (None when the bids are to set it); refused below the largest bid."""
        if self.value_top is None:
            return None
        if self.value_top < largest_bid:
            raise ValueError(f"task.value_top={self.value_top} is below the largest bid {largest_bid:g}; "
                             "raise it, or set task.value_top=null to estimate the values' top from the bids")
        return known_value_scale(self.value_top, self.grid)

    def _record_clamps(self, metrics: dict, clamps: list[str]) -> None:
        # A clamp that fires means the bound optimiser fell short: count it, name it, never hide it.
        metrics["cf/bound_clamps"] = float(len(clamps))
        self.extras["bound_clamps"] = clamps
        if clamps:
            log.warning(f"{len(clamps)} robust bound(s) clamped to the point or a smaller epsilon's bound; "
                        f"first: {clamps[0]}")

    def _asymmetric(self, logged, metrics: dict) -> dict:
        """Each bidder inverted against its own highest competing bid; second price and first price with the
        logged number of bidders, points and RMAC bounds, each bidder with its own value distribution."""
        t0 = time.perf_counter()
        scale = self._known_scale(float(logged.by_bidder.max()))
        found = asymmetric_point(logged.by_bidder, self.rules, self.grid, self.compute_device, scale)
        table, skipped = found.table, found.skipped
        self.add_time("asymmetric", time.perf_counter() - t0)
        self.extras["value_top"] = {"estimated": found.value_top, "sd": found.value_top_sd,
                                    "from": "task.value_top" if self.value_top is not None else "estimated",
                                    "inversion": found.inversion}
        self._report_trust(found)
        log.info(f"point estimate: {found.inversion}")
        table = {k: v for k, v in table.items() if k.split("/")[0] in [PREFIX[s] for s in self.statistics]}
        t0 = time.perf_counter()
        bounds, clamps = asymmetric_bounds(logged.by_bidder, self.rules, table, self.epsilons, self.statistics,
                                           self.grid, self.compute_device, scale, self.n_iters, plug_ins=found.plug_in)
        self.add_time("asymmetric_bounds", time.perf_counter() - t0)
        metrics |= table | bounds
        self._record_clamps(metrics, clamps)
        self.extras["asymmetric"]["skipped_rules"] = skipped
        log.warning(f"asymmetric bidders: {NOT_ESTIMATED}; skipped rules {skipped}")
        return metrics

    def _symmetric(self, logged, metrics: dict) -> dict:
        """Pooled bidders: point estimates and RMAC bounds per statistic, on one value grid (a log with a hard
        reserve: points only, `pipeline.games.rmac.reserve_counterfactuals`)."""
        t0 = time.perf_counter()
        reserve = self.extras["bid_checks"].get("logged_reserve")
        scale = self._known_scale(float(logged.bids.max()))
        if scale is None and reserve is None:
            scale = choose_value_scale(logged.bids, logged.n_bidders, self.grid, self.compute_device)
        self.add_time("value_grid", time.perf_counter() - t0)
        clamps: list[str] = []
        found = None
        for statistic in self.statistics:
            t0 = time.perf_counter()
            found = predict_counterfactuals(
                logged.bids, logged.n_bidders, self.rules, self.epsilons, statistic=statistic, n_iters=self.n_iters,
                point_iters=self.point_iters, device=self.compute_device, grid=self.grid, scale=scale,
                reserve_in_logs=reserve,
            )
            self.add_time(f"bounds_{statistic}", time.perf_counter() - t0)
            table = found.table
            if logged.values is not None:
                table |= truth_table(logged.n_bidders, self.rules, statistic, logged.value_scale)
            metrics |= table
            clamps += found.clamps
        self._record_clamps(metrics, clamps)
        if found is not None:
            self._report_top(found)
            if found.skipped:
                self.extras["logged_reserve"] |= {"skipped_rules": found.skipped}
                log.warning(f"rules not estimated: {sorted(found.skipped)}: {next(iter(found.skipped.values()))}")
            if found.share_under_reserve is not None:
                share, sd = found.share_under_reserve
                self.extras["logged_reserve"] |= {"share_under_it": share, "share_under_it_sd": sd}
                source = ("the bids of 0" if self.extras["logged_reserve"]["zeros_as_non_bids"] else
                          "the bids' shape near it (no bids of 0: log the non-bids as 0 to read it directly)")
                log.warning(f"share of values under the logged reserve: {share:.3g} (SD {sd:.2g}), read off {source}")
        scale = found.scale if found is not None and scale is None else scale
        self.extras["value_grid"] = {"step": scale.unit * self.grid, "top": scale.unit * scale.top,
                                     "top_from": "task.value_top" if self.value_top is not None else "estimated",
                                     "rough_top_value": scale.estimated_top_value}
        return metrics

    def _report_top(self, found) -> None:
        """Which second-price reserves rest on the estimated top of the values alone (result.json and one line)."""
        reserves = [parse_rule(r).reserve for r in self.rules if r.startswith("second_price")]
        top_alone = found.top_reserves(reserves)
        self.extras["value_top"] = {"estimated": found.value_top, "sd": found.value_top_sd,
                                    "tail_value": found.tail_value, "reserves_on_the_top_alone": top_alone,
                                    "reserves_shrunk_to_the_top": found.shrunk_reserves(reserves),
                                    "from": "task.value_top" if self.value_top is not None else "estimated",
                                    "inversion": found.inversion}
        self._report_trust(found)
        log.info(f"point estimate: {found.inversion}")
        if top_alone and self.value_top is None:
            log.warning(f"second-price reserves {top_alone} are at or above {found.tail_value:.4g}, the value with 1% "
                        f"of the estimated values above it: their points rest on the estimated top of the values "
                        f"({found.value_top:.4g}{f', SD {found.value_top_sd:.2g}' if found.value_top_sd > 0 else ''}) "
                        "alone; pass task.value_top=<largest "
                        "value> if you know it")

    def _report_trust(self, found) -> None:
        """The second-price points' SDs and the reserves whose points are not to be trusted (result.json
        `point_sd`, `untrusted_reserves`; one line naming them and why)."""
        self.extras["point_sd"] = dict(found.point_sd)
        self.extras["values_sampling_sd"] = dict(found.floor_sd)
        self.extras["untrusted_reserves"] = {f"{r:g}": why for r, why in found.untrusted.items()}
        if found.untrusted:
            reasons = "; ".join(f"r={r:g}: {why}" for r, why in found.untrusted.items())
            log.warning(f"second-price points not to be trusted at reserves {[float(r) for r in found.untrusted]} "
                        f"({reasons}); read them with their SD (point_sd in {RESULT}), or pass "
                        "task.value_top=<largest value> if you know it")

    def _check_bids(self, logged) -> None:
        """A rounding lattice, exact-zero bids, mass points and a hard reserve in the logs: recorded in result.json
        (`bid_checks`), each named in one line."""
        bids = logged.bids
        checks: dict = {"zero_share": zero_share(bids), "excess_zero_share": excess_zeros(bids) / bids.numel()}
        reserve = logged_reserve(bids)
        asymmetric = self.extras["symmetry"]["decision"].startswith("asymmetric")
        if reserve is not None:
            zeros = int((bids == 0).sum())
            if asymmetric:
                raise ValueError(f"the positive bids start at {reserve:g} and pile up there: the logged auctions had a "
                                 "hard reserve (values under it did not bid), which is read for alike bidders only; "
                                 "pass data.symmetric=true to pool the bidders, or log auctions without a reserve")
            how = (f"{zeros} bids of 0 read as the values under it (non-bids)" if zeros else
                   "no bids of 0: read as only the auctions where everybody bid")
            checks["logged_reserve"] = reserve
            self.extras["logged_reserve"] = {"reserve": reserve, "zeros_as_non_bids": zeros}
            log.warning(f"the positive bids start at {reserve:g} and pile up there: the logged auctions had a hard "
                        f"reserve {reserve:g} (values under it did not bid; {how}); it is read as a known truncation "
                        "(value sieve), and rules that need the values under it are not estimated")
        for value, share, excess in mass_points(bids):
            checks.setdefault("mass_points", []).append({"bid": value, "share": share, "excess": excess})
            log.warning(f"{share:.1%} of the bids are exactly {value:g} ({excess} more than the bids around it): a mass "
                        "point no equilibrium of continuous values makes (a default bid, a bot, a cap?); its excess is "
                        "left out of the inversion")
        if checks["excess_zero_share"] > ZERO_WARN and reserve is None:
            what = ("dropped from the pooled inversion as bids not made (continuous values bid 0 with probability "
                    "0; if they are real bids of 0 the estimate is off)" if logged.by_bidder is None or
                    not asymmetric else
                    "kept (asymmetric bidders: each bidder's inversion reads them as bids)")
            log.warning(f"{checks['zero_share']:.1%} of the bids are exactly 0 ({checks['excess_zero_share']:.1%} more "
                        f"than rounding explains): {what}")
        found = bid_lattice(bids)
        step = effective_lattice(bids)
        if found is not None and step is not None:
            width = default_bandwidth(bids[bids > 0])
            checks |= {"lattice": step, "lattice_share": found[1], "bandwidth": width, "coarse": step > width / 2}
            if checks["coarse"]:
                log.warning(f"the bids lie on a lattice of step {step:g} ({found[1]:.0%} of them), over half the "
                            f"smoothing bandwidth {width:.3g}: each bid is read as censored to its rounding cell; "
                            f"measured at a step of 0.05 of the value range, the value sieve's worst second-price "
                            f"error is 1.4-3x the unrounded bids' (alike bidders), but the local inversion (asymmetric "
                            f"bidders, or a sieve that fails its check) reads the top off by up to 0.1 of the value "
                            f"range; log unrounded bids")
            else:
                log.warning(f"the bids lie on a lattice of step {step:g} ({found[1]:.0%} of them): each bid is read as "
                            f"censored to its rounding cell (measured at a step of 1/4-1/3 of the bandwidth {width:.3g}: "
                            "1.0-1.2x the worst error of unrounded bids on Beta(2, 2) and v^2 values, up to 1.8x with "
                            "the local inversion)")
        self.extras["bid_checks"] = checks

    def fit_and_evaluate(self, trainer, datamodule, ckpt_path) -> list[dict[str, float]]:
        generator = torch.Generator().manual_seed(self.seed)
        t0 = time.perf_counter()
        logged = self.data.load(generator)
        self.add_time("data", time.perf_counter() - t0)
        self.extras = {"n_bids": int(logged.bids.numel()), "n_bidders": logged.n_bidders,
                       "simulated": logged.values is not None, "k": logged.k, "rules": self.rules,
                       "epsilons": self.epsilons}
        metrics: dict[str, float] = {}
        if logged.rows is not None:
            metrics |= logged.rows.metrics()
            self.extras["data_rows"] = {"read": logged.rows.read, "used": logged.rows.used,
                                        "rejected": dict(logged.rows.rejected), "blank_lines": logged.rows.blank_lines}
        self.extras["symmetry"] = self._check_symmetry(logged)
        self._check_bids(logged)
        if self.extras["symmetry"]["decision"].startswith("asymmetric"):
            self.extras["asymmetric"] = {"estimated": ESTIMATED, "not_estimated": NOT_ESTIMATED}
            metrics = self._asymmetric(logged, metrics)
        else:
            metrics = self._symmetric(logged, metrics)
        if logged.values is not None:
            errors = [abs(metrics[f"cf/{r}/point"] - metrics[f"cf/{r}/truth"]) for r in self.rules]
            metrics["cf/max_abs_point_error"] = float(max(errors))
            metrics["data/worst_realised_regret"] = float(realised_regret(logged.values, logged.bids, logged.n_bidders).max())
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
        return [metrics]

    def agent_record(self, i: int) -> dict:
        return dict(self.extras)

    def agent_state_dict(self, i: int) -> dict[str, torch.Tensor]:
        return {}

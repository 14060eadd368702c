"""tasks/counterfactual.py without a run: the task built by hand on a few hundred simulated or hand-made bids, on a
coarse grid with few iterations (a fraction of a second), loggers stood in for. The numerics are tested in
tests/games/; here: which rules, which keys, which path (pooled or bidder by bidder), what the record says."""

import logging
import time
from types import SimpleNamespace

import pytest
import torch

from pipeline.data.auction import AuctionBidsData, LoggedBids
from pipeline.games.asymmetric import (
    asymmetric_bounds,
    asymmetric_point,
    asymmetric_table,
    asymmetric_uniform_equilibrium,
)
from pipeline.games.rmac import (
    choose_value_scale,
    known_value_scale,
    predict_counterfactuals,
    realised_regret,
)
from pipeline.tasks import counterfactual
from pipeline.tasks.base import TaskParts
from pipeline.tasks.configs import CounterfactualConfig
from pipeline.tasks.counterfactual import CounterfactualTask

FAST = {"epsilons": [0.01], "statistics": ["revenue"], "n_iters": 5, "point_iters": 20, "grid": 0.05}


def make_task(datamodule, run_dir=None, seed=1, **config):
    return CounterfactualTask(CounterfactualConfig(**{**FAST, **config}),
                              TaskParts(seed=seed, datamodule=datamodule, run_dir=run_dir))


class Recorder:
    def __init__(self):
        self.metrics, self.images = [], []

    def log_metrics(self, metrics, step):
        self.metrics.append((dict(metrics), step))


class WandbLogger(Recorder):  # matched by its class name, as the task does
    def log_image(self, key, images):
        self.images.append((key, images))


def stand_in(logged, **attrs):
    return SimpleNamespace(load=lambda generator: logged, **attrs)


def test_missing_or_wrong_data_is_one_line():
    with pytest.raises(ValueError, match=r"^task=counterfactual needs datamodule: use data=auction_bids"):
        CounterfactualTask(CounterfactualConfig(), TaskParts())
    with pytest.raises(ValueError, match=r"^task=counterfactual needs data=auction_bids \(simulated bids"):
        CounterfactualTask(CounterfactualConfig(), TaskParts(datamodule=SimpleNamespace()))


@pytest.mark.parametrize(("rules", "primary"), [
    (["second_price_r0.2", "second_price_r0.9", "second_price_r0.5", "first_price_n2"], "cf/second_price_r0.5/point"),
    (["first_price_n2", "first_price_n3"], "cf/first_price_n2/point"),
    (["first_price_n3", "second_price_r0.3"], "cf/second_price_r0.3/point"),
])
def test_the_primary_metric_is_the_second_price_reserve_nearest_the_middle(rules, primary):
    task = make_task(AuctionBidsData(n_bids=10), rules=rules)
    assert task.primary_metric == primary and task.rules == rules


def test_default_rules_span_the_simulated_values_or_the_files_bids():
    task = make_task(AuctionBidsData(n_bids=10, value_scale=2.0))
    assert task.rules[:3] == ["second_price_r0.0", "second_price_r0.2", "second_price_r0.4"]
    assert task.rules[10:] == ["second_price_r2.0", "first_price_n1", "first_price_n2", "first_price_n3", "first_price_n4",
                               "first_price_n5"]
    assert task.primary_metric == "cf/second_price_r1.0/point"
    # A loaded file: reserves up to the largest bid 0.5731 rounded up to 0.58, in steps of 0.058.
    loaded = SimpleNamespace(load=None, _file=SimpleNamespace(flat=torch.tensor([0.1, 0.5731, 0.4])))
    task = make_task(loaded)
    assert task.rules[:2] == ["second_price_r0.0", "second_price_r0.058"] and task.rules[10] == "second_price_r0.58"
    assert task.primary_metric == "cf/second_price_r0.29/point"
    assert make_task(SimpleNamespace(load=None)).rules[10] == "second_price_r1.0"  # neither: values on [0, 1]


def test_config_values_are_read_as_numbers():
    task = make_task(AuctionBidsData(n_bids=10), rules=["first_price_n2"], epsilons=[1, "0.5"], n_iters="7",
                     point_iters=9.0, grid="0.1", value_top=3)
    assert task.epsilons == [1.0, 0.5] and all(type(e) is float for e in task.epsilons)
    assert (task.n_iters, task.point_iters, task.grid, task.value_top) == (7, 9, 0.1, 3.0)
    assert type(task.n_iters) is int and type(task.point_iters) is int and type(task.grid) is float
    assert type(task.value_top) is float and make_task(AuctionBidsData(n_bids=10)).value_top is None
    assert task.compute_device == torch.device("cpu") and task.run_dir is None and task.extras == {}
    assert task.config.n_iters == "7" and task.config.rules == ["first_price_n2"]  # the config given, kept


def test_simulated_bids_give_points_near_the_truth_and_the_truth_by_hand(tmp_path, monkeypatch):
    # Two bidders, values U[0, 1]: second price with reserve 1/2 earns 1/3 + r^2 - 4r^3/3 = 5/12 and keeps welfare
    # E[max v; max v > r] = 2(1 - r^3)/3 = 7/12; first price among three earns (n-1)/(n+1) = 1/2, welfare E[max] = 3/4.
    data = AuctionBidsData(n_bids=400, grid=0.05)
    task = make_task(data, run_dir=tmp_path, rules=["second_price_r0.5", "first_price_n3"], statistics=["revenue", "welfare"])
    loggers = [Recorder(), WandbLogger()]
    titles = []
    real_plot = counterfactual.plot_revenue_vs_reserve

    def plot(tables, path, title=None):
        titles.append(title)
        return real_plot(tables, path, title=title)

    monkeypatch.setattr(counterfactual, "plot_revenue_vs_reserve", plot)
    started = time.perf_counter()
    (metrics,) = task.fit_and_evaluate(SimpleNamespace(loggers=loggers), None, None)
    took = time.perf_counter() - started
    assert all(0 <= t <= took for t in task.time_breakdown_s.values())  # durations, not clock readings
    assert metrics["cf/second_price_r0.5/truth"] == pytest.approx(5 / 12)
    assert metrics["cf/first_price_n3/truth"] == pytest.approx(1 / 2)
    assert metrics["cfw/second_price_r0.5/truth"] == pytest.approx(7 / 12)
    assert metrics["cfw/first_price_n3/truth"] == pytest.approx(3 / 4)
    errors = [abs(metrics[f"cf/{r}/point"] - metrics[f"cf/{r}/truth"]) for r in ("second_price_r0.5", "first_price_n3")]
    assert metrics["cf/max_abs_point_error"] == pytest.approx(max(errors)) and max(errors) < 0.05
    for prefix in ("cf", "cfw"):
        for rule in ("second_price_r0.5", "first_price_n3"):
            lower, upper = metrics[f"{prefix}/{rule}/lower_eps0.01"], metrics[f"{prefix}/{rule}/upper_eps0.01"]
            assert lower <= metrics[f"{prefix}/{rule}/point"] <= upper
    # The same bids the task drew (its seed): the estimators' numbers with the task's settings, the regret at the
    # true values, worst case.
    logged = data.load(torch.Generator().manual_seed(1))
    for statistic in ("revenue", "welfare"):
        found = predict_counterfactuals(logged.bids, 2, ["second_price_r0.5", "first_price_n3"], [0.01], statistic=statistic,
                                        n_iters=5, point_iters=20, grid=0.05, scale=choose_value_scale(logged.bids, 2, 0.05))
        assert found.table == pytest.approx({k: metrics[k] for k in found.table})
    regret = realised_regret(logged.values, logged.bids, logged.n_bidders)
    assert metrics["data/worst_realised_regret"] == pytest.approx(float(regret.max())) and regret.max() > regret.min()
    assert metrics["cf/bound_clamps"] == 0.0 and len(metrics) == 4 * 4 + 3
    assert task.extras["n_bids"] == 400 and task.extras["n_bidders"] == 2 and task.extras["simulated"] is True
    assert task.extras["k"] is None and task.extras["epsilons"] == [0.01] and task.extras["bound_clamps"] == []
    assert task.extras["rules"] == ["second_price_r0.5", "first_price_n3"]
    assert task.extras["symmetry"] == {"decision": "symmetric (assumed: the data do not name bidders)"}
    grid = task.extras["value_grid"]
    assert grid["top_from"] == "estimated" and 0.8 < grid["top"] <= 1.2 and grid["step"] == pytest.approx(0.05)
    assert 0.5 < grid["rough_top_value"] < 1.3
    assert set(task.time_breakdown_s) == {"data", "value_grid", "bounds_revenue", "bounds_welfare", "plot"}
    # Every logger gets the metrics at step 0; W&B also the figure, which is in the run dir.
    assert [step for _, step in loggers[0].metrics] == [0] and loggers[0].metrics[0][0] == metrics
    assert loggers[1].metrics == loggers[0].metrics
    figure = tmp_path / "revenue_vs_reserve.png"
    assert figure.stat().st_size > 0 and task.extras["figure"] == str(figure)
    assert loggers[1].images == [("revenue_vs_reserve", [str(figure)])] and loggers[0].images == []
    assert titles == ["Predicted revenue vs reserve (seed 1, N = 400)"]
    assert task.agent_record(0) == task.extras and task.agent_record(0) is not task.extras
    assert task.agent_state_dict(0) == {}


def test_the_seed_draws_the_simulated_bids():
    def point(seed):
        task = make_task(AuctionBidsData(n_bids=200, grid=0.05), seed=seed, rules=["first_price_n2"])
        return task.fit_and_evaluate(SimpleNamespace(loggers=[]), None, None)[0]["cf/first_price_n2/point"]

    assert point(1) == point(1) != point(2)


def test_no_figure_without_a_run_dir_or_a_second_price_rule(tmp_path):
    task = make_task(AuctionBidsData(n_bids=200, grid=0.05), run_dir=tmp_path, rules=["first_price_n2"])
    task.fit_and_evaluate(SimpleNamespace(loggers=[WandbLogger()]), None, None)
    assert "figure" not in task.extras and "plot" not in task.time_breakdown_s and list(tmp_path.iterdir()) == []
    task = make_task(AuctionBidsData(n_bids=200, grid=0.05), rules=["second_price_r0.5"])
    task.fit_and_evaluate(SimpleNamespace(loggers=[]), None, None)
    assert "figure" not in task.extras


class Rows:
    read, used, rejected, blank_lines = 5, 3, {"negative": 2}, 1

    def metrics(self):
        return {"data/rows_used": 3.0, "data/odd": float("nan")}


def test_logged_bids_from_a_file_record_their_rows_and_loggers_get_only_finite_values():
    bids = torch.arange(1, 201, dtype=torch.float64) / 200 * 0.5
    logged = LoggedBids(bids, 2, None, None, rows=Rows())
    task = make_task(stand_in(logged), rules=["first_price_n2"])
    logger = Recorder()
    (metrics,) = task.fit_and_evaluate(SimpleNamespace(loggers=[logger]), None, None)
    assert metrics["data/rows_used"] == 3.0 and metrics["data/odd"] != metrics["data/odd"]
    assert task.extras["data_rows"] == {"read": 5, "used": 3, "rejected": {"negative": 2}, "blank_lines": 1}
    assert task.extras["simulated"] is False
    assert "data/odd" not in logger.metrics[0][0] and logger.metrics[0][0]["data/rows_used"] == 3.0
    assert "cf/first_price_n2/truth" not in metrics and "cf/max_abs_point_error" not in metrics
    assert "data/worst_realised_regret" not in metrics


def test_a_known_value_top_sets_the_grid_and_one_below_the_largest_bid_is_refused():
    bids = torch.arange(1, 201, dtype=torch.float64) / 200 * 0.5
    task = make_task(stand_in(LoggedBids(bids, 2, None, None)), rules=["first_price_n2"], value_top=0.6)
    (metrics,) = task.fit_and_evaluate(SimpleNamespace(loggers=[]), None, None)
    # Values up to 0.6 on a 0.05 grid (of the top): steps of 0.03 round to 0.02 (a round step in data units).
    assert task.extras["value_grid"] == {"step": pytest.approx(0.02), "top": pytest.approx(0.6),
                                         "top_from": "task.value_top", "rough_top_value": 0.6}
    # The known scale, not an estimated one, reaches the estimators.
    found = predict_counterfactuals(bids, 2, ["first_price_n2"], [0.01], statistic="revenue", n_iters=5, point_iters=20,
                                    grid=0.05, scale=known_value_scale(0.6, 0.05))
    assert metrics["cf/first_price_n2/point"] == pytest.approx(found.table["cf/first_price_n2/point"])
    other = predict_counterfactuals(bids, 2, ["first_price_n2"], [0.01], statistic="revenue", n_iters=5, point_iters=20,
                                    grid=0.05)
    assert other.table["cf/first_price_n2/point"] != pytest.approx(found.table["cf/first_price_n2/point"])
    task = make_task(stand_in(LoggedBids(bids, 2, None, None)), rules=["first_price_n2"], value_top=0.4)
    with pytest.raises(ValueError, match=r"^task\.value_top=0\.4 is below the largest bid 0\.5; raise it, or set "
                                         r"task\.value_top=null"):
        task.fit_and_evaluate(SimpleNamespace(loggers=[]), None, None)
    assert task._known_scale(0.4) is not None  # equal to the largest bid is allowed
    assert make_task(stand_in(None), rules=["first_price_n2"])._known_scale(5.0) is None


def by_bidder(n=300):
    """Two unlike bidders' bids (n, 2) on a 0.01 lattice: values U[0, 1] and U[0, 2] in their first-price equilibrium
    (KS p-value 1e-13 at n = 300, 1e-9 at 200). Not uniform bids of unlike spreads: those are no equilibrium, and the
    value sieve's inverse family searched 10-45 s for a fit to them (~1 s here); the task's path is the same."""
    return (asymmetric_uniform_equilibrium(n, (1.0, 2.0), seed=2)[0] / 0.01).round() * 0.01


@pytest.mark.parametrize(("declared", "decision"), [
    (True, "symmetric (declared by data.symmetric=true, not tested)"),
    (False, "asymmetric (declared by data.symmetric=false, not tested)"),
])
def test_declared_symmetry_is_taken_untested(declared, decision):
    logged = LoggedBids(by_bidder().flatten(), 2, None, None, by_bidder=by_bidder())
    task = make_task(stand_in(logged, symmetric=declared), rules=["first_price_n2"])
    assert task._check_symmetry(logged) == {"decision": decision}


def test_pooled_bids_declared_asymmetric_are_refused_and_undeclared_ones_assumed_symmetric():
    logged = LoggedBids(by_bidder().flatten(), 2, None, None)
    task = make_task(stand_in(logged, symmetric=False), rules=["first_price_n2"])
    with pytest.raises(ValueError, match=r"^data\.symmetric=false needs bidders named in the file \(bid_i columns or a "
                                         r"'bidder' column\); this file has one pooled bid column$"):
        task._check_symmetry(logged)
    for declared in (None, True):
        task = make_task(stand_in(logged, symmetric=declared), rules=["first_price_n2"])
        assert task._check_symmetry(logged) == {"decision": "symmetric (assumed: the data do not name bidders)"}


def test_the_symmetry_test_decides_at_the_datas_level():
    alike = torch.stack([torch.arange(100, dtype=torch.float64)] * 2, 1) / 100
    logged = LoggedBids(alike.flatten(), 2, None, None, by_bidder=alike)
    found = make_task(stand_in(logged), rules=["first_price_n2"])._check_symmetry(logged)
    assert found["decision"] == "symmetric (not rejected)" and found["rejected"] is False and found["level"] == 0.01
    logged = LoggedBids(by_bidder().flatten(), 2, None, None, by_bidder=by_bidder())
    found = make_task(stand_in(logged, symmetry_level=0.2), rules=["first_price_n2"])._check_symmetry(logged)
    assert found["decision"] == "asymmetric" and found["rejected"] is True and found["level"] == 0.2


def test_asymmetric_bidders_are_inverted_one_by_one(caplog):
    bids = by_bidder()
    logged = LoggedBids(bids.flatten(), 2, None, None, by_bidder=bids, rows=Rows())
    rules = ["second_price_r0.2", "first_price_n2", "first_price_n3"]
    task = make_task(stand_in(logged), rules=rules)
    logger = Recorder()
    started = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="pipeline.tasks.counterfactual"):
        (metrics,) = task.fit_and_evaluate(SimpleNamespace(loggers=[logger]), None, None)
    took = time.perf_counter() - started
    assert all(0 <= t <= took for t in task.time_breakdown_s.values())  # durations, not clock readings
    assert task.extras["symmetry"]["decision"] == "asymmetric"
    assert task.extras["asymmetric"]["skipped_rules"] == ["first_price_n3"]
    assert set(task.extras["asymmetric"]) == {"estimated", "not_estimated", "skipped_rules"}
    assert any("asymmetric bidders:" in r.message and "first_price_n3" in r.message for r in caplog.records)
    # What the bidder-by-bidder estimators give on these bids, grid and rules, revenue only (welfare not asked).
    table, _ = asymmetric_table(bids, rules, 0.05, torch.device("cpu"), None)
    table = {k: v for k, v in table.items() if k.startswith("cf/")}
    bounds, clamps = asymmetric_bounds(bids, rules, table, [0.01], ["revenue"], 0.05, torch.device("cpu"), None, 5)
    assert metrics == pytest.approx({**Rows().metrics(), **table, **bounds, "cf/bound_clamps": float(len(clamps))},
                                    nan_ok=True)
    assert not any(k.startswith("cfw/") for k in metrics) and "cf/second_price_r0.2/point" in metrics
    assert set(task.time_breakdown_s) == {"data", "asymmetric", "asymmetric_bounds"}
    assert logger.metrics == [({k: v for k, v in metrics.items() if k != "data/odd"}, 0)]


def test_a_known_value_top_reaches_the_asymmetric_estimators():
    RULES = ["second_price_r0.2", "first_price_n2"]
    bids = by_bidder(200)
    logged = LoggedBids(bids.flatten(), 2, None, None, by_bidder=bids)
    # 1.5: above the largest bid (0.67), below the strong bidder's estimated top (~2), so that the cap binds.
    task = make_task(stand_in(logged), rules=RULES, value_top=1.5)
    (metrics,) = task.fit_and_evaluate(SimpleNamespace(loggers=[]), None, None)
    scale = known_value_scale(1.5, 0.05)
    found = asymmetric_point(bids, RULES, 0.05, torch.device("cpu"), scale)
    table = {k: v for k, v in found.table.items() if k.startswith("cf/")}
    bounds, _ = asymmetric_bounds(bids, RULES, table, [0.01], ["revenue"], 0.05, torch.device("cpu"), scale, 5,
                                  plug_ins=found.plug_in)
    assert metrics == pytest.approx({**table, **bounds, "cf/bound_clamps": 0.0})
    estimated, _ = asymmetric_table(bids, RULES, 0.05, torch.device("cpu"), None)
    # First price depends on the values (second price on the bids only): the estimated scale gives another number.
    assert estimated["cf/first_price_n2/point"] != pytest.approx(table["cf/first_price_n2/point"])
    with pytest.raises(ValueError, match="is below the largest bid"):
        make_task(stand_in(logged), rules=RULES, value_top=0.3).fit_and_evaluate(
            SimpleNamespace(loggers=[]), None, None)


def test_clamps_are_counted_named_and_warned(caplog):
    task = make_task(AuctionBidsData(n_bids=10), rules=["first_price_n2"])
    metrics = {}
    with caplog.at_level(logging.WARNING, logger="pipeline.tasks.counterfactual"):
        task._record_clamps(metrics, ["cf/a/upper_eps0.01", "cf/b/lower_eps0.01"])
    assert metrics == {"cf/bound_clamps": 2.0} and task.extras["bound_clamps"] == ["cf/a/upper_eps0.01", "cf/b/lower_eps0.01"]
    assert [r.message for r in caplog.records] == [
        "2 robust bound(s) clamped to the point or a smaller epsilon's bound; first: cf/a/upper_eps0.01"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pipeline.tasks.counterfactual"):
        task._record_clamps(metrics, [])
    assert metrics == {"cf/bound_clamps": 0.0} and caplog.records == []


def test_truth_in_the_datas_units_and_clamps_of_every_statistic(monkeypatch):
    # Values U[0, 2]: every revenue doubles, first price between two earns 2 (n-1)/(n+1) = 2/3.
    real = counterfactual.predict_counterfactuals

    def with_a_clamp(*args, statistic, **kwargs):
        found = real(*args, statistic=statistic, **kwargs)
        found.clamps.append(f"{statistic} clamp")
        return found

    monkeypatch.setattr(counterfactual, "predict_counterfactuals", with_a_clamp)
    task = make_task(AuctionBidsData(n_bids=200, grid=0.05, value_scale=2.0), rules=["first_price_n2"],
                     statistics=["revenue", "welfare"])
    (metrics,) = task.fit_and_evaluate(SimpleNamespace(loggers=[]), None, None)
    assert metrics["cf/first_price_n2/truth"] == pytest.approx(2 / 3)
    assert metrics["cfw/first_price_n2/truth"] == pytest.approx(2 * 2 / 3)  # E[max of two U[0, 2]] = 4/3
    assert metrics["cf/bound_clamps"] == 2.0 and task.extras["bound_clamps"] == ["revenue clamp", "welfare clamp"]


def test_rounded_and_zero_bids_are_named_in_one_line_each_and_recorded(caplog):
    """2,000 bids v / 2 of U[0, 1] values rounded to 0.05, 2% of them 0: one warning names the step (over half
    the bandwidth: too coarse), one the zero share; `bid_checks` records both; the top and its tail value are recorded."""
    generator = torch.Generator().manual_seed(0)
    bids = torch.round(torch.rand(2000, generator=generator, dtype=torch.float64) * 0.5 / 0.05) * 0.05
    bids[torch.randperm(2000, generator=generator)[:40]] = 0.0
    task = make_task(stand_in(LoggedBids(bids, 2, None, None)), rules=["second_price_r0.5", "second_price_r1.0"],
                     epsilons=[])
    with caplog.at_level(logging.WARNING, logger="pipeline.tasks.counterfactual"):
        task.fit_and_evaluate(SimpleNamespace(loggers=[]), None, None)
    lines = [r.getMessage() for r in caplog.records]
    assert sum("lattice of step 0.05 (100% of them), over half the smoothing bandwidth" in line for line in lines) == 1
    assert sum(" more than rounding explains): dropped from the pooled inversion" in line for line in lines) == 1
    checks = task.extras["bid_checks"]
    # 40 zeros set (2%) on top of the ~100 the cell at 0 holds; the two cell counts have SDs of ~10 and ~14 bids
    assert checks["excess_zero_share"] == pytest.approx(0.02, abs=0.015) and checks["zero_share"] > 0.06
    assert checks["lattice"] == 0.05 and checks["coarse"] is True
    top = task.extras["value_top"]
    assert 0.9 < top["tail_value"] < top["estimated"] and top["from"] == "estimated"
    assert 0.5 not in top["reserves_on_the_top_alone"]


def _reserve_log(n_auctions: int, reserve: float, seed: int = 0) -> torch.Tensor:
    """U[0, 1], 3 bidders, a hard reserve: values under it bid 0, the others (2 v^3 + R^3) / (3 v^2)."""
    values = torch.rand(n_auctions, 3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return torch.where(values < reserve, 0.0, (2 * values**3 + reserve**3) / (3 * values.clamp_min(reserve) ** 2))


def test_a_hard_reserve_in_the_logs_is_named_recorded_and_read_as_a_truncation(caplog):
    """1,500 auctions of 3 bidders with a reserve of 0.2 (values under it logged as 0): one line names the reserve
    and how the zeros are read, one the rules not estimated; the record holds both, and no zero-bid line says the
    zeros were dropped as bids not made."""
    bids = _reserve_log(1500, 0.2).flatten()
    rules = ["second_price_r0.1", "second_price_r0.5", "second_price_r0.9", "first_price_n3"]
    task = make_task(stand_in(LoggedBids(bids, 3, None, None)), rules=rules, epsilons=[0.01])
    with caplog.at_level(logging.WARNING, logger="pipeline.tasks.counterfactual"):
        (metrics,) = task.fit_and_evaluate(SimpleNamespace(loggers=[]), None, None)
    lines = [r.getMessage() for r in caplog.records]
    assert sum("the logged auctions had a hard reserve 0.2" in line and "bids of 0 read as the values under it" in line
               for line in lines) == 1
    assert sum(line.startswith("rules not estimated: ['first_price_n3', 'second_price_r0.1']") for line in lines) == 1
    assert not any("dropped from the pooled inversion" in line for line in lines)
    record = task.extras["logged_reserve"]
    assert record["reserve"] == pytest.approx(0.2, abs=1e-3) and record["zeros_as_non_bids"] == int((bids == 0).sum())
    assert sorted(record["skipped_rules"]) == ["first_price_n3", "second_price_r0.1"]
    # F(0.2) = 0.2 read off the zeros: within 3 SDs (its binomial SD on 4,500 bids is 0.006)
    assert abs(record["share_under_it"] - 0.2) <= 3 * record["share_under_it_sd"] and record["share_under_it_sd"] < 0.02
    assert sum(line.startswith("share of values under the logged reserve: ") for line in lines) == 1
    assert {k.split("/")[1] for k in metrics if k.startswith("cf/") and k.count("/") == 2} == {
        "second_price_r0.5", "second_price_r0.9"}


def test_a_mass_point_is_named_in_one_line_and_recorded(caplog):
    """3% of 3,000 bids of U[0, 1] values (2 bidders) moved to 0.2: one line names the value and its share."""
    generator = torch.Generator().manual_seed(0)
    bids = torch.rand(3000, generator=generator, dtype=torch.float64) * 0.5
    bids[torch.randperm(3000, generator=generator)[:90]] = 0.2
    task = make_task(stand_in(LoggedBids(bids, 2, None, None)), rules=["second_price_r0.5"], epsilons=[])
    with caplog.at_level(logging.WARNING, logger="pipeline.tasks.counterfactual"):
        task.fit_and_evaluate(SimpleNamespace(loggers=[]), None, None)
    lines = [r.getMessage() for r in caplog.records if "are exactly 0.2 (" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("3.0% of the bids are exactly 0.2 (89 more than the bids around it)")
    (point,) = task.extras["bid_checks"]["mass_points"]
    assert point == {"bid": 0.2, "share": pytest.approx(0.03), "excess": 89}


def test_the_points_sds_and_untrusted_reserves_are_recorded_and_named(caplog):
    """2,000 equilibrium bids v / 2 (2 bidders): every second-price point has its SD and the values' own sampling SD
    in the record; the top reserve (1.0, at the estimated top) is named as not to be trusted in one line."""
    bids = torch.rand(2000, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 0.5
    rules = ["second_price_r0.5", "second_price_r1.0"]
    task = make_task(stand_in(LoggedBids(bids, 2, None, None)), rules=rules, epsilons=[])
    with caplog.at_level(logging.WARNING, logger="pipeline.tasks.counterfactual"):
        task.fit_and_evaluate(SimpleNamespace(loggers=[]), None, None)
    assert set(task.extras["point_sd"]) == set(task.extras["values_sampling_sd"]) == {f"cf/{r}/point" for r in rules}
    assert all(v >= 0 for v in task.extras["point_sd"].values())
    assert "1" in task.extras["untrusted_reserves"] and "0.5" not in task.extras["untrusted_reserves"]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("second-price points not to be trusted")]
    assert len(lines) == 1 and "r=1: " in lines[0]


def test_a_bid_column_with_a_typo_in_its_header_is_refused_at_start_up(tmp_path):
    """bid_0, bid_1, bdi_2: read as 2 bidders it would drop the third silently; the data module refuses it naming
    the column before any work."""
    path = tmp_path / "typo.csv"
    path.write_text("bid_0,bid_1,bdi_2\n" + "".join(f"0.{i:02d},0.{i + 1:02d},0.{i + 2:02d}\n" for i in range(10, 80)))
    with pytest.raises(ValueError, match=r"column\(s\) \['bdi_2'\] look like bid columns but are not read"):
        AuctionBidsData(path=str(path)).prepare_data()

"""The revenue-vs-reserve figure and the coverage helper."""

from __future__ import annotations

import pytest
import torch

from pipeline.games.auction import simulate_first_price_bids
from pipeline.games.plots import coverage, plot_revenue_vs_reserve
from pipeline.games.rmac import counterfactual_table, truth_table

torch.set_num_threads(1)

RESERVES = ["second_price_r0.0", "second_price_r0.5", "second_price_r1.0"]


def _table(shift: float, width: float) -> dict[str, float]:
    table = truth_table(2, RESERVES + ["first_price_n3"])
    for key in list(table):
        base = key.removesuffix("/truth")
        table[f"{base}/point"] = table[key] + shift
        table[f"{base}/lower_eps0.001"] = table[key] + shift - width
        table[f"{base}/upper_eps0.001"] = table[key] + shift + width
        table[f"{base}/lower_eps0.02"] = table[key] + shift - 3 * width
        table[f"{base}/upper_eps0.02"] = table[key] + shift + 3 * width
    return table


def test_coverage_counts_the_seeds_whose_bounds_contain_the_truth():
    tables = [_table(0.0, 0.01), _table(0.02, 0.01), _table(-0.05, 0.01)]
    result = coverage(tables, RESERVES + ["first_price_n3"], [0.001, 0.02])
    assert set(result) == set(RESERVES) | {"first_price_n3"}
    for per_eps in result.values():
        assert per_eps[0.001] == pytest.approx(1 / 3)
        assert per_eps[0.02] == pytest.approx(2 / 3)


def test_coverage_needs_the_truth():
    table = _table(0.0, 0.01)
    del table["cf/second_price_r0.5/truth"]
    with pytest.raises(KeyError, match="truth_table"):
        coverage([table], ["second_price_r0.5"], [0.001])


def test_plot_from_several_seeds(tmp_path):
    path = plot_revenue_vs_reserve(
        [_table(0.0, 0.01), _table(0.01, 0.02)], tmp_path / "fig" / "revenue.png", "test"
    )
    assert path.exists() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_from_a_real_table_without_truth(tmp_path):
    generator = torch.Generator().manual_seed(0)
    bids, _ = simulate_first_price_bids(500, generator=generator)
    table = counterfactual_table(bids, 2, RESERVES, [0.005], n_iters=30, point_iters=100)
    path = plot_revenue_vs_reserve([table], tmp_path / "real.png", title=None)
    assert path.stat().st_size > 1000


def test_plot_needs_second_price_rules(tmp_path):
    with pytest.raises(ValueError, match="second_price"):
        plot_revenue_vs_reserve([{"cf/first_price_n2/point": 0.3}], tmp_path / "x.png")

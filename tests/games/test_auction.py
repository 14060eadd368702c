"""Closed-form truths, rule names and simulated bids (the CSV loader: test_bids_csv.py)."""

from __future__ import annotations

import pytest
import torch

from pipeline.games.auction import (
    Rule,
    default_rules,
    format_reserve,
    parse_rule,
    reserve_top,
    second_price_revenue,
    simulate_first_price_bids,
    truth,
    welfare,
)

torch.set_num_threads(1)


# ---------------------------------------------------------------------------------------------------
# Closed forms


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_revenue_equivalence(n):
    expected = (n - 1) / (n + 1)
    assert truth("second_price_r0.0", n) == pytest.approx(expected)
    assert truth(f"first_price_n{n}", n) == pytest.approx(expected)
    # The logged bidder count does not matter for a first-price rule that names its own.
    assert truth(f"first_price_n{n}", 2) == pytest.approx(expected)


def test_optimal_reserve_for_two_bidders_is_one_half():
    reserves = [i / 1000 for i in range(1001)]
    revenues = [second_price_revenue(2, r) for r in reserves]
    best = max(range(len(reserves)), key=revenues.__getitem__)
    assert reserves[best] == pytest.approx(0.5)
    assert revenues[best] == pytest.approx(5 / 12)
    assert second_price_revenue(2, 0.3) == pytest.approx(1 / 3 + 0.09 - 4 * 0.027 / 3)


def test_lone_bidder_pays_nothing_and_keeps_his_value():
    assert truth("first_price_n1", 2) == 0.0
    assert truth("first_price_n1", 2, "welfare") == pytest.approx(0.5)


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("reserve", [0.0, 0.3, 0.5, 0.8])
def test_second_price_revenue_and_welfare_match_monte_carlo(n, reserve):
    generator = torch.Generator().manual_seed(n * 10 + int(reserve * 10))
    values = torch.rand(400_000, n, generator=generator, dtype=torch.float64)
    top2 = values.topk(2, dim=1).values
    sold = top2[:, 0] >= reserve
    revenue = torch.where(sold, top2[:, 1].clamp_min(reserve), torch.zeros_like(sold, dtype=values.dtype))
    winner_value = torch.where(sold, top2[:, 0], torch.zeros_like(revenue))
    assert truth(f"second_price_r{reserve}", n) == pytest.approx(revenue.mean().item(), abs=3e-3)
    assert truth(f"second_price_r{reserve}", n, "welfare") == pytest.approx(
        winner_value.mean().item(), abs=3e-3
    )
    assert welfare(n, reserve) == pytest.approx(n / (n + 1) * (1 - reserve ** (n + 1)))


def test_truth_rejects_unknown_statistic():
    with pytest.raises(ValueError, match="statistic"):
        truth("first_price_n2", 2, "profit")


# ---------------------------------------------------------------------------------------------------
# Rule names


def test_default_rules_are_eleven_reserves_then_five_bidder_counts():
    rules = default_rules()
    assert rules[:11] == [f"second_price_r{i / 10:.1f}" for i in range(11)]
    assert rules[11:] == [f"first_price_n{n}" for n in range(1, 6)]


@pytest.mark.parametrize(
    "name, rule",
    [
        ("second_price_r0.5", Rule("second_price", reserve=0.5)),
        ("second_price_r0.0", Rule("second_price", reserve=0.0)),
        ("second_price_r1.0", Rule("second_price", reserve=1.0)),
        ("second_price_r0.25", Rule("second_price", reserve=0.25)),
        ("second_price_r150.0", Rule("second_price", reserve=150.0)),  # reserves in the data's units
        ("first_price_n3", Rule("first_price", n_bidders=3)),
    ],
)
def test_rule_names_round_trip(name, rule):
    assert parse_rule(name) == rule
    assert rule.name == name


def test_reserve_formatting_is_canonical():
    assert format_reserve(0) == "0.0"
    assert format_reserve(0.5) == "0.5"
    assert format_reserve(0.1 * 3) == "0.3"
    assert parse_rule("second_price_r0.50").name == "second_price_r0.5"


@pytest.mark.parametrize(
    "bad", ["second_price", "third_price_r0.5", "second_price_r-1", "first_price_n0", "fp3"]
)
def test_bad_rule_names_fail_with_the_accepted_forms(bad):
    with pytest.raises(ValueError, match="rule"):
        parse_rule(bad)


# ---------------------------------------------------------------------------------------------------
# Simulated bids


def test_simulated_bids_shade_values_on_the_grid():
    generator = torch.Generator().manual_seed(0)
    bids, values = simulate_first_price_bids(1000, n_bidders=2, generator=generator)
    assert bids.shape == values.shape == (1000,)
    assert torch.allclose(bids, torch.round(values / 2 / 0.01) * 0.01)
    assert torch.allclose(torch.round(bids / 0.01) * 0.01, bids)
    three, values3 = simulate_first_price_bids(1000, n_bidders=3, grid=None, generator=generator)
    assert torch.allclose(three, values3 * 2 / 3)
    misspecified, values6 = simulate_first_price_bids(1000, k=0.6, grid=None, generator=generator)
    assert torch.allclose(misspecified, 0.6 * values6)


def test_simulated_bids_follow_the_generator():
    a = simulate_first_price_bids(100, generator=torch.Generator().manual_seed(3)).bids
    b = simulate_first_price_bids(100, generator=torch.Generator().manual_seed(3)).bids
    assert torch.equal(a, b)


def test_truths_scale_with_the_value_range():
    """Values U[0, s] are s times values U[0, 1]: prices and values scale by s, a reserve r acts as r / s."""
    for n in (2, 3):
        assert truth("second_price_r1.0", n, value_scale=2.0) == pytest.approx(2 * second_price_revenue(n, 0.5))
        assert truth("second_price_r1.0", n, "welfare", value_scale=2.0) == pytest.approx(2 * welfare(n, 0.5))
        assert truth(f"first_price_n{n}", n, value_scale=100.0) == pytest.approx(100 * (n - 1) / (n + 1))
    # A reserve at or above every value sells nothing.
    assert truth("second_price_r2.5", 2, value_scale=2.0) == 0.0
    assert truth("second_price_r2.5", 2, "welfare", value_scale=2.0) == 0.0


def test_default_reserves_span_the_observed_bids():
    assert reserve_top(torch.tensor([0.1, 0.5])) == pytest.approx(0.5)
    assert reserve_top(torch.tensor([3.0, 73.2])) == pytest.approx(74.0)
    assert default_rules(top=74.0)[:3] == ["second_price_r0.0", "second_price_r7.4", "second_price_r14.8"]


# ---------------------------------------------------------------------------------------------------
# Defaults and refusals, by hand


def test_the_truths_default_to_no_reserve():
    assert second_price_revenue(2) == pytest.approx(1 / 3)
    assert welfare(2) == pytest.approx(2 / 3)
    assert second_price_revenue(3) == pytest.approx(1 / 2)
    assert welfare(3) == pytest.approx(3 / 4)


def test_simulated_bids_default_to_two_bidders_values_in_zero_one_in_float64():
    bids, values = simulate_first_price_bids(2000, generator=torch.Generator().manual_seed(1))
    assert values.dtype == bids.dtype == torch.float64
    assert 0.0 <= float(values.min()) and float(values.max()) < 1.0 and float(values.max()) > 0.99
    assert torch.allclose(bids, torch.round(values / 2 / 0.01) * 0.01)


def test_simulated_values_span_the_value_scale():
    _, values = simulate_first_price_bids(2000, value_scale=3.0, generator=torch.Generator().manual_seed(1))
    assert 0.0 <= float(values.min()) and 2.9 < float(values.max()) < 3.0


def test_one_bid_is_enough():
    bids, values = simulate_first_price_bids(1, grid=None, generator=torch.Generator().manual_seed(2))
    assert bids.shape == values.shape == (1,) and float(bids[0]) == pytest.approx(float(values[0]) / 2)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n_bids": 10, "n_bidders": 1}, "n_bidders=1: a logged first-price auction needs at least 2 bidders"),
        ({"n_bids": 0}, "n_bids=0: need at least one bid"),
    ],
)
def test_simulation_refusals(kwargs, message):
    with pytest.raises(ValueError) as err:
        simulate_first_price_bids(**kwargs)
    assert str(err.value) == message


def test_no_positive_bid_gives_the_unit_top():
    assert reserve_top(torch.zeros(5)) == 1.0
    assert reserve_top(torch.tensor([0.0, -1.0])) == 1.0

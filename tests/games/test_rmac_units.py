"""games/rmac.py pinned on tiny inputs, each test well under a second (mutation testing runs them).

Expectations come from outside the estimator: auction outcomes by enumerating every opponent profile,
regrets by hand on two or three bids, the local quadratic CDF fit against a plain weighted least
squares per point, and the point estimates against closed forms for uniform values (bids at exact
quantiles, so there is no sampling noise). The slow end-to-end checks live in test_rmac.py.
"""

from __future__ import annotations

import math
import re
import statistics

import numpy as np
import pytest
import torch
from games_testing import enumerate_outcomes

from pipeline.games import rmac
from pipeline.games.auction import Rule, first_price_revenue, parse_rule, second_price_revenue, truth, welfare
from pipeline.games.rmac import (
    MAX_GRID_POINTS,
    TOP_WINDOW,
    bid_grid,
    cap_types,
    cdf_points,
    choose_value_scale,
    clamp_bounds,
    counterfactual_table,
    default_bandwidth,
    eps_label,
    fit_logged_auction,
    interp,
    invert_types,
    inverted_value_cdf,
    inverted_value_curve,
    known_value_scale,
    local_cdf_fit,
    nice_step,
    point_types,
    predict_counterfactuals,
    realised_regret,
    result_key,
    second_price_point,
    smoothed_counts,
    smoothing_kernel,
    top_shrink,
    truth_table,
    type_distribution,
    type_grid,
    value_point_mask,
    value_type_weights,
)
from pipeline.games.solver import (
    equilibrium_guess,
    power_of_opponents,
    solve_bounds,
    solve_equilibrium,
    statistic_value,
    win_and_payment,
    win_probability,
)

torch.set_num_threads(1)
F64 = torch.float64


def _raises(message: str):
    """pytest.raises for a ValueError with exactly this message."""
    return pytest.raises(ValueError, match=f"^{re.escape(message)}$")


def _quantiles(n_points: int) -> torch.Tensor:
    """(i + 0.5) / n: a uniform sample with no sampling noise."""
    return (torch.arange(n_points, dtype=F64) + 0.5) / n_points


# ---------------------------------------------------------------------------------------------------
# Names


def test_eps_label_and_result_key():
    assert [eps_label(e) for e in (0.001, 0.02, 0.1, 1e-4, 0, 1.5, 10)] == [
        "0.001", "0.02", "0.1", "0.0001", "0", "1.5", "10"
    ]
    assert result_key("second_price_r0.50", "point") == "cf/second_price_r0.5/point"
    assert result_key(Rule("first_price", n_bidders=3), "lower_eps0.1", "welfare") == "cfw/first_price_n3/lower_eps0.1"


# ---------------------------------------------------------------------------------------------------
# Auction primitives against enumeration of every opponent profile


def _enumerate(pmf, actions, n_opponents, reserve, first_price):
    """(win, pay) per own bid index against ``n_opponents`` bidders with this pmf, by enumeration."""
    return enumerate_outcomes([pmf] * n_opponents, actions, reserve, first_price)


PMF = [0.1, 0.0, 0.35, 0.25, 0.3]  # a gap (tie-free bid) and ties both matter
ACTIONS = [0.0, 0.1, 0.2, 0.3, 0.4]


@pytest.mark.parametrize("n_opponents", [0, 1, 2, 3])
def test_win_probability_by_enumeration(n_opponents):
    expected, _ = _enumerate(PMF, ACTIONS, n_opponents, 0.0, True)
    got = win_probability(torch.tensor(PMF, dtype=F64), n_opponents)
    assert got.tolist() == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("n_bidders", [2, 3, 4])
@pytest.mark.parametrize("rule", ["first_price_n2", "second_price_r0.0", "second_price_r0.2", "second_price_r0.15"])
def test_win_and_payment_by_enumeration(n_bidders, rule):
    """Reserve 0.15 is off the 0.1 grid: the lowest allowed bid is 0.2, and a winner pays at least 0.15."""
    first = rule == "first_price_n2"  # the rule's kind matters here, not its own bidder count
    reserve = 0.0 if first else parse_rule(rule).reserve
    win, pay = win_and_payment(
        torch.tensor(PMF, dtype=F64), parse_rule(rule), n_bidders, torch.tensor(ACTIONS, dtype=F64)
    )
    expected_win, expected_pay = _enumerate(PMF, ACTIONS, n_bidders - 1, reserve, first)
    assert win.tolist() == pytest.approx(expected_win, abs=1e-12)
    assert pay.tolist() == pytest.approx(expected_pay, abs=1e-12)


def test_an_explicit_reserve_overrides_the_rules():
    pmf, actions = torch.tensor(PMF, dtype=F64), torch.tensor(ACTIONS, dtype=F64)
    win, pay = win_and_payment(pmf, Rule("second_price", reserve=0.0), 3, actions, reserve=0.25)
    expected_win, expected_pay = _enumerate(PMF, ACTIONS, 2, 0.25, False)
    assert win.tolist() == pytest.approx(expected_win, abs=1e-12)
    assert pay.tolist() == pytest.approx(expected_pay, abs=1e-12)


def test_statistic_value_is_n_times_the_expected_payment_or_won_value():
    pmf = torch.tensor([0.2, 0.3, 0.5], dtype=F64)
    value_mass = torch.tensor([0.01, 0.05, 0.2], dtype=F64)
    win = torch.tensor([0.1, 0.4, 0.9], dtype=F64)
    pay = torch.tensor([0.0, 0.02, 0.1], dtype=F64)
    assert float(statistic_value(pmf, value_mass, win, pay, 3, "revenue")) == pytest.approx(3 * (0.3 * 0.02 + 0.5 * 0.1))
    assert float(statistic_value(pmf, value_mass, win, pay, 3, "welfare")) == pytest.approx(
        3 * (0.01 * 0.1 + 0.05 * 0.4 + 0.2 * 0.9)
    )


def test_grid_points_and_the_size_limit():
    assert bid_grid(1.0, 0.01, None).tolist() == pytest.approx([i * 0.01 for i in range(101)])
    assert bid_grid(0.995, 0.01, None).numel() == 101  # rounded up to cover the top
    assert bid_grid(0.07, 0.01, None).numel() == 8  # 0.07 / 0.01 is 7.000000000000001 in floats: no extra point
    assert bid_grid(0.29, 0.01, None).numel() == 30  # 28.999999999999996: still reaches 0.29
    assert bid_grid(0.01 * (MAX_GRID_POINTS - 1), 0.01, None).numel() == MAX_GRID_POINTS
    with _raises(
        f"a 0.01 grid up to 20.01 has 2002 points (max {MAX_GRID_POINTS}); use a coarser grid, "
        "or let counterfactual_table choose the value scale"
    ):
        bid_grid(0.01 * MAX_GRID_POINTS, 0.01, None)
    assert type_grid(torch.tensor([0.0, 0.1, 0.2], dtype=F64)).tolist() == pytest.approx([0.05, 0.15])


# ---------------------------------------------------------------------------------------------------
# The local quadratic CDF fit


def _plain_fit(edge, values, cells):
    """Weighted least squares of a quadratic around each edge point: Gaussian weights of ``cells``, cut
    beyond 5 cells, the two end points weighted 1000x (the fit passes through the known ends)."""
    levels, slopes = [], []
    for target in edge:
        offset = edge - target
        weight = np.exp(-0.5 * (offset / cells) ** 2) * (np.abs(offset) <= 5 * cells)
        weight[[0, -1]] *= 1000.0
        design = np.stack([np.ones_like(offset), offset, offset**2], 1)
        sw = np.sqrt(weight)
        coef = np.linalg.lstsq(design * sw[:, None], values * sw, rcond=None)[0]
        levels.append(coef[0])
        slopes.append(coef[1])
    return np.array(levels), np.array(slopes)


def test_local_cdf_fit_is_a_weighted_quadratic_least_squares():
    edge = torch.tensor([2.3, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5, 9.5, 10.5, 11.5, 12.5, 13.1], dtype=F64)
    rng = np.random.default_rng(0)
    empirical = np.sort(rng.random(edge.numel()))
    for cells in (1.5, 2.0, 3.0):  # 2.0: points 10 apart sit exactly on the 5-cell cut, and count
        level_w, slope_w = local_cdf_fit(edge, cells)
        levels, slopes = _plain_fit(edge.numpy(), empirical, cells)
        assert (level_w @ torch.tensor(empirical)).tolist() == pytest.approx(levels.tolist(), abs=1e-9)
        assert (slope_w @ torch.tensor(empirical)).tolist() == pytest.approx(slopes.tolist(), abs=1e-9)


def test_cdf_points_sit_at_the_cell_edges_and_the_bid_range():
    assert cdf_points(3, 6).tolist() == [3.0, 3.5, 4.5, 5.5, 6.0]
    assert cdf_points(3, 6, (2.8, 6.3)).tolist() == [2.8, 3.5, 4.5, 5.5, 6.3]
    # Ends inside the end cells' halves: the first point stays at or below the first upper edge, the
    # last just above the last one (the CDF points keep increasing).
    assert cdf_points(3, 6, (3.7, 5.4)).tolist() == pytest.approx([3.5, 3.5, 4.5, 5.5, 5.5 + 1e-6], abs=1e-9)
    assert cdf_points(3, 6, (3.7, 5.4))[-1].item() > 5.5


def test_smoothing_kernel_reproduces_a_quadratic_cdf_and_leaves_other_cells_alone():
    """Counts whose CDF at the cell edges is a quadratic come back unchanged (a local quadratic fit is
    exact on it); cells outside lo..hi keep the identity."""
    n_actions, lo, hi = 20, 4, 14
    edge = cdf_points(lo, hi)
    cdf = 2.0 * (edge - edge[0]) + 0.3 * (edge - edge[0]) ** 2
    counts = torch.zeros(n_actions, dtype=F64)
    counts[lo:hi + 1] = cdf[1:] - cdf[:-1]
    kernel = smoothing_kernel(n_actions, lo, hi, 2.0)
    assert (counts @ kernel).tolist() == pytest.approx(counts.tolist(), abs=1e-9)
    assert torch.equal(kernel[:lo], torch.eye(n_actions, dtype=F64)[:lo])
    assert torch.equal(kernel[hi + 1:], torch.eye(n_actions, dtype=F64)[hi + 1:])
    # One count spread: not the identity inside, and its mass adds up to one count (the ends are held by
    # weight, not exactly: measured 1 - 3.8e-5; tolerance 1e-3).
    assert kernel[9, 8].item() > 0.01 and kernel[9].sum().item() == pytest.approx(1.0, abs=1e-3)
    assert torch.equal(smoothing_kernel(n_actions, lo, hi, 0.0), torch.eye(n_actions, dtype=F64))
    assert not torch.equal(smoothing_kernel(n_actions, lo, hi, 0.8), torch.eye(n_actions, dtype=F64))
    assert torch.equal(smoothing_kernel(n_actions, 4, 6, 2.0), torch.eye(n_actions, dtype=F64))
    assert not torch.equal(smoothing_kernel(n_actions, 4, 7, 2.0), torch.eye(n_actions, dtype=F64))


def test_smoothing_kernel_matches_the_plain_fit_on_a_step_cdf():
    n_actions, lo, hi, cells = 16, 3, 12, 1.5
    ends = (2.8, 12.2)
    counts = torch.zeros(n_actions, dtype=F64)
    counts[lo:hi + 1] = torch.tensor([1.0, 4, 0, 2, 7, 3, 3, 0, 5, 1])
    edge = cdf_points(lo, hi, ends)
    empirical = torch.cat([counts.new_zeros(1), counts[lo:hi + 1].cumsum(0)])
    levels, _ = _plain_fit(edge.numpy(), empirical.numpy(), cells)
    smoothed = counts @ smoothing_kernel(n_actions, lo, hi, cells, ends=ends)
    assert smoothed[lo:hi + 1].tolist() == pytest.approx(np.diff(levels).tolist(), abs=1e-9)


def test_smoothed_counts_with_no_bandwidth_are_the_raw_counts():
    bids = torch.tensor([0.0, 0.1, 0.1, 0.3, 0.42, 0.5, 0.61, 0.7], dtype=F64)
    counts, kernel = smoothed_counts(bids, 0.1, 8, 0.0)
    assert counts.tolist() == [1, 2, 0, 1, 1, 1, 1, 1]
    assert torch.equal(kernel, torch.eye(8, dtype=F64))
    smooth, _ = smoothed_counts(bids, 0.1, 8, 0.2)
    # Measured total 7.9986 (the ends held by weight); tolerance 0.005.
    assert smooth.sum().item() == pytest.approx(8.0, abs=5e-3) and smooth.tolist() != counts.tolist()
    # Off-grid bids: the CDF is held at the smallest and largest bid themselves, in cells.
    off = torch.tensor([0.13, 0.21, 0.28, 0.33, 0.35, 0.47, 0.52, 0.66], dtype=F64)
    smooth, kernel = smoothed_counts(off, 0.1, 8, 0.15)
    expected = smoothing_kernel(8, 1, 7, 1.5, ends=(1.3, 6.6))
    assert torch.allclose(kernel, expected, rtol=0, atol=1e-12)
    assert smooth.tolist() == pytest.approx((torch.tensor([0, 1, 1, 3, 0, 2, 0, 1], dtype=F64) @ expected).tolist())


def test_default_bandwidth_is_one_and_a_half_silverman():
    bids = torch.tensor([0.1, 0.25, 0.3, 0.42, 0.5, 0.61, 0.07], dtype=F64)
    expected = 1.5 * 1.06 * statistics.stdev(bids.tolist()) * 7 ** -0.2
    assert default_bandwidth(bids) == pytest.approx(expected, rel=1e-12)


# ---------------------------------------------------------------------------------------------------
# Inverting the bids to values


@pytest.mark.parametrize("n_bidders", [2, 3])
def test_inversion_of_equilibrium_bids_at_uniform_quantiles(n_bidders):
    """Values U[0, 1], bids (n - 1) v / n at 2,000 exact quantiles: v(b) = b n / (n - 1) and P(V <= v) = v.
    Measured worst gap 0.0023 (n = 2) / 0.0016 (n = 3), at the top; threshold 0.004. The empirical CDF
    returned is the plain fraction of bids at or below each point."""
    bids = (n_bidders - 1) / n_bidders * _quantiles(2000)
    values, cdf = inverted_value_cdf(bids, n_bidders, 0.01)
    assert (values - cdf)[1:].abs().max().item() < 4e-3
    assert float(values[-1]) == pytest.approx(1.0, abs=4e-3)
    edge = cdf_points(0, int(round(float(bids.max()) / 0.01)), (float(bids.min()) / 0.01, float(bids.max()) / 0.01))
    fraction = [(torch.round(bids / 0.01) <= e - 0.5).double().mean().item() for e in edge[1:-1]]
    assert cdf[0].item() == 0.0 and cdf[-1].item() == 1.0
    assert cdf[1:-1].tolist() == pytest.approx(fraction, abs=1e-12)
    assert torch.all(values[1:] >= values[:-1])


def test_inversion_bandwidth_argument_is_used_and_too_few_cells_fail():
    bids = 0.5 * _quantiles(400)
    narrow, _ = inverted_value_cdf(bids, 2, 0.01, bandwidth=0.01)
    wide, _ = inverted_value_cdf(bids, 2, 0.01, bandwidth=0.1)
    assert not torch.allclose(narrow, wide)
    with _raises("the bids fill 3 grid cells: too few to invert (use a finer grid)"):
        inverted_value_cdf(torch.tensor([0.1, 0.11, 0.12, 0.12], dtype=F64), 2, 0.01)
    with pytest.raises(ValueError, match="too few to invert"):
        inverted_value_cdf(bids, 2, 0.01, bandwidth=0.0)


def test_inversion_keeps_values_increasing_by_a_running_minimum_from_the_top():
    """Values F = v^2 (3 bidders, bids 4v/5): at the bottom F and f both vanish and the raw fit can
    dip; whatever it does, the values returned never decrease, and each is the value quantile sqrt(F) at
    its level (measured worst gap 0.0016 on 3,000 bids; threshold 0.003)."""
    values, cdf = inverted_value_cdf(0.8 * _quantiles(3000).sqrt(), 3, 0.01)
    assert torch.all(values[1:] >= values[:-1])
    assert float(values[-1]) == pytest.approx(1.0, abs=5e-3)
    assert (values - cdf.sqrt())[1:].abs().max().item() < 3e-3


def test_the_lowest_value_is_the_lowest_bid_and_four_cells_suffice():
    """Bids U[0.2, 0.5] (2 bidders): F(b) = 0 at the smallest bid, so v = b there (measured gap < 1e-6)."""
    bids = 0.2 + 0.3 * _quantiles(500)
    values, _ = inverted_value_cdf(bids, 2, 0.01)
    assert values[0].item() == pytest.approx(float(bids.min()), abs=1e-4)
    values, cdf = inverted_value_cdf(torch.tensor([0.1, 0.11, 0.12, 0.13, 0.13], dtype=F64), 2, 0.01)
    assert values.numel() == 5 and cdf.tolist() == pytest.approx([0.0, 0.2, 0.4, 0.6, 1.0])


# ---------------------------------------------------------------------------------------------------
# The logged game on a handful of bids


def _hand_regret(own, others, types, n_opponents, actions):
    """Regret of bid ``own`` for each type against ``n_opponents`` draws from the bids ``others``."""
    pmf = [sum(1 for o in others if abs(o - a) < 1e-9) / len(others) for a in actions]
    win, _ = _enumerate(pmf, actions, n_opponents, 0.0, True)
    out = []
    for t in types:
        utility = [(t - a) * w for a, w in zip(actions, win)]
        observed = utility[min(range(len(actions)), key=lambda i: abs(actions[i] - own))]
        out.append(max(0.0, max(utility) - observed))
    return out


@pytest.mark.parametrize("n_bidders", [2, 3])
def test_logged_regrets_by_hand_on_three_bids(n_bidders):
    bids = [0.2, 0.4, 0.4]
    logged = fit_logged_auction(bids, n_bidders, grid=0.1, bandwidth=0.0)
    actions = [i * 0.1 for i in range(11)]  # top max(1, largest bid)
    assert logged.actions.tolist() == pytest.approx(actions)
    assert logged.types.tolist() == pytest.approx([0.05 + 0.1 * i for i in range(10)])
    assert logged.class_bid.tolist() == [2, 4] and logged.class_count.tolist() == [1.0, 2.0]
    assert logged.data_class.tolist() == [0, 1, 1] and logged.n_bids == 3
    assert logged.class_weight.tolist() == pytest.approx([1 / 3, 2 / 3])
    types = logged.types.tolist()
    for c, own in enumerate([0.2, 0.4]):
        others = list(bids)
        others.remove(own)  # leave-one-out
        expected = _hand_regret(own, others, types, n_bidders - 1, actions)
        assert logged.regret[c].tolist() == pytest.approx(expected, abs=1e-12), own
    # Realised regret of each data point at a continuous value, the same logged game; values as a list
    # are read as float64.
    values = [0.81, 0.37, 0.8]
    regret = realised_regret(values, torch.tensor(bids, dtype=F64), n_bidders, 0.1, 0.0)
    assert regret[0].item() > 0.1
    for i, own in enumerate(bids):
        others = list(bids)
        others.pop(i)
        expected = _hand_regret(own, others, [values[i]], n_bidders - 1, actions)[0]
        assert regret[i].item() == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_logged_regrets_over_several_cells_use_the_raw_counts_without_bandwidth():
    """Eight bids over six 0.1 cells (enough for the smoother to act, were it asked to): bandwidth 0 keeps
    the raw leave-one-out counts; the default grid is 0.01."""
    bids = [0.1, 0.2, 0.2, 0.3, 0.4, 0.4, 0.5, 0.6]
    logged = fit_logged_auction(bids, 2, grid=0.1, bandwidth=0.0)
    actions = [i * 0.1 for i in range(11)]
    for c, own in enumerate([0.1, 0.2, 0.3, 0.4, 0.5, 0.6]):
        others = list(bids)
        others.remove(own)
        assert logged.regret[c].tolist() == pytest.approx(
            _hand_regret(own, others, logged.types.tolist(), 1, actions), abs=1e-12
        )
    smoothed = fit_logged_auction(bids, 2, grid=0.1, bandwidth=0.1)
    assert not torch.allclose(smoothed.regret, logged.regret)
    values = [0.35, 0.5, 0.45, 0.7, 0.9, 0.8, 1.0, 1.0]
    fine = [b / 10 for b in bids]
    for bandwidth in (None, 0.0):
        regret = realised_regret([v / 10 for v in values], fine, 2, bandwidth=bandwidth)
        logged = fit_logged_auction(fine, 2, bandwidth=bandwidth)
        for i, v in enumerate(values):
            win = logged.class_win[logged.data_class[i]]
            utility = (v / 10 - logged.actions) * win
            expected = (utility.max() - utility[logged.class_bid[logged.data_class[i]]]).item()
            assert regret[i].item() == pytest.approx(expected, abs=1e-15)


def test_logged_regrets_against_given_opponents():
    """One bidder of an asymmetric log: its bids answer the highest competing bids given, not each other."""
    logged = fit_logged_auction([0.3, 0.3], 2, grid=0.1, bandwidth=0.0, top=0.6, opponents=[0.1, 0.2, 0.2, 0.5])
    actions = [i * 0.1 for i in range(7)]
    assert logged.actions.numel() == 7
    assert logged.class_win.shape == (1, 7)
    expected = _hand_regret(0.3, [0.1, 0.2, 0.2, 0.5], logged.types.tolist(), 1, actions)
    assert logged.regret[0].tolist() == pytest.approx(expected, abs=1e-12)


def test_logged_auction_arguments_fail_early():
    with _raises("n_bidders=1: a logged first-price auction needs at least 2 bidders"):
        fit_logged_auction([0.1, 0.2], 1)
    with _raises("need at least two logged bids (each one's opponents are the others)"):
        fit_logged_auction([0.1], 2)
    with _raises("the largest bid 0.8 lies above the grid's top 0.5; raise top"):
        fit_logged_auction([0.1, 0.8], 2, grid=0.1, top=0.5)
    with _raises("the largest bid 0.56 lies above the grid's top 0.5; raise top"):
        fit_logged_auction([0.1, 0.56], 2, grid=0.1, top=0.5)
    # Within half a cell of the top: snapped onto the top point.
    assert fit_logged_auction([0.1, 0.54], 2, grid=0.1, top=0.5).class_bid.tolist() == [1, 5]
    with _raises("a competing bid 0.9 lies above the grid's top 0.5; raise top"):
        fit_logged_auction([0.1, 0.2], 2, grid=0.1, top=0.5, opponents=[0.2, 0.9])
    with _raises("a competing bid 0.56 lies above the grid's top 0.5; raise top"):
        fit_logged_auction([0.1, 0.2], 2, grid=0.1, top=0.5, opponents=[0.2, 0.56])
    edge = fit_logged_auction([0.1, 0.2], 2, grid=0.1, bandwidth=0.0, top=0.5, opponents=[0.2, 0.54])
    assert edge.class_win[0, -1].item() == 0.75  # a tie with the snapped 0.54 at the top: 1/2 + 1/2 * 1/2
    big = fit_logged_auction([0.5, 1.7], 2, grid=0.1, bandwidth=0.0)
    assert big.actions[-1].item() == pytest.approx(1.7)
    # Exactly half a cell above the top (0.25 grid, exact in binary) is still on the grid.
    assert fit_logged_auction([0.0, 0.625], 2, grid=0.25, bandwidth=0.0, top=0.5).class_bid.tolist() == [0, 2]
    assert fit_logged_auction([0.0, 0.25], 2, grid=0.25, bandwidth=0.0, top=0.5, opponents=[0.625]).class_win[0, -1] == 0.5
    default = fit_logged_auction([0.2, 0.4], 3, bandwidth=0.0)
    assert (default.step, default.n_bidders, default.actions.numel()) == (0.01, 3, 101)


def test_consistent_types_and_their_floor():
    """A bid no type rationalises within eps keeps its least-regret types; otherwise every type within eps."""
    logged = fit_logged_auction([0.2, 0.4, 0.4], 2, grid=0.1, bandwidth=0.0)
    regret = logged.regret
    for eps in (0.0, 0.01, 0.05, 0.2):
        floor = regret.min(1, keepdim=True).values.clamp_min(eps)
        assert torch.equal(logged.consistent(eps), regret <= floor + 1e-12)
        assert logged.consistent(eps).sum(1).min().item() >= 1
    assert logged.consistent(0.05).sum() > logged.consistent(0.0).sum()


def test_inverted_types_are_tied_best_responses_picked_uniformly():
    """Each data point picks type floor(u * n_tied) among its bid's tied best responses, u from the generator."""
    logged = fit_logged_auction([0.2] * 3 + [0.4] * 5, 2, grid=0.1, bandwidth=0.0)
    ok = logged.consistent(0.0)
    picked = invert_types(logged, torch.Generator().manual_seed(7))
    u = torch.rand(8, generator=torch.Generator().manual_seed(7), dtype=F64)
    for i, (c, t) in enumerate(zip(logged.data_class.tolist(), picked.tolist())):
        tied = ok[c].nonzero().flatten().tolist()
        assert t == tied[int(u[i].item() * len(tied))]
    assert [len(ok[c].nonzero()) for c in range(2)] == [int(n) for n in ok.sum(1).tolist()]
    assert ok.sum(1).min().item() >= 2  # ties exist, so the pick matters


def test_point_types_cap_and_type_distribution():
    logged = fit_logged_auction([0.2] * 3 + [0.4] * 5, 2, grid=0.1, bandwidth=0.0)
    ok = logged.consistent(0.0)
    assert torch.equal(point_types(logged), ok)
    capped = point_types(logged, 0.6)
    assert torch.equal(capped, ok & (logged.types <= 0.6))
    weights = type_distribution(logged)
    expected = (logged.class_weight[:, None] * ok.double() / ok.sum(1, keepdim=True)).sum(0)
    assert weights.tolist() == pytest.approx(expected.tolist()) and weights.sum().item() == pytest.approx(1.0)
    assert type_distribution(logged, 0.6)[logged.types > 0.6].sum().item() == 0.0
    # A row left with no type below the cap gets the highest type below it.
    types = torch.tensor([0.1, 0.3, 0.5, 0.7], dtype=F64)
    mask = torch.tensor([[False, True, True, False], [False, False, False, True]])
    assert cap_types(mask.clone(), types, 0.5).tolist() == [[False, True, True, False], [False, False, True, False]]
    assert cap_types(mask.clone(), types, 0.05).tolist() == [[True, False, False, False], [True, False, False, False]]
    assert torch.equal(cap_types(mask.clone(), types, None), mask)


# ---------------------------------------------------------------------------------------------------
# Value distribution helpers


def test_interp_matches_numpy():
    xp = torch.tensor([0.1, 0.3, 0.3, 0.7], dtype=F64)
    fp = torch.tensor([0.0, 0.5, 0.6, 1.0], dtype=F64)
    x = torch.tensor([-1.0, 0.1, 0.2, 0.3, 0.5, 0.7, 2.0], dtype=F64)
    assert interp(x, xp, fp).tolist() == pytest.approx([0.0, 0.0, 0.25, 0.6, 0.8, 1.0, 1.0])
    # A repeated knot is a jump: the CDF reads the value after it, at the first knot and the last too.
    jump_low = interp(torch.tensor([0.1], dtype=F64), torch.tensor([0.1, 0.1, 0.3], dtype=F64),
                       torch.tensor([0.0, 0.2, 1.0], dtype=F64))
    jump_high = interp(torch.tensor([0.5], dtype=F64), torch.tensor([0.0, 0.5, 0.5], dtype=F64),
                        torch.tensor([0.0, 0.4, 1.0], dtype=F64))
    assert jump_low.tolist() == [0.2] and jump_high.tolist() == [1.0]
    xp2 = torch.tensor([0.0, 0.25, 1.0], dtype=F64)
    fp2 = torch.tensor([0.0, 0.75, 1.0], dtype=F64)
    x2 = torch.linspace(-0.5, 1.5, 41, dtype=F64)
    assert interp(x2, xp2, fp2).tolist() == pytest.approx(np.interp(x2.numpy(), xp2.numpy(), fp2.numpy()).tolist())


def test_value_type_weights_bin_the_value_cdf_into_cells():
    actions = torch.arange(11, dtype=F64) * 0.1
    values, cdf = torch.tensor([0.0, 0.55], dtype=F64), torch.tensor([0.0, 1.0], dtype=F64)
    weights = value_type_weights(values, cdf, actions)
    expected = [0.1 / 0.55] * 5 + [0.05 / 0.55] + [0.0] * 4
    assert weights.tolist() == pytest.approx(expected)
    # Values beyond the grid's top count in its last cell; above max_type, in the last cell below it.
    beyond = value_type_weights(torch.tensor([0.0, 0.5, 2.0], dtype=F64), torch.tensor([0.0, 0.5, 1.0], dtype=F64), actions)
    assert beyond.tolist() == pytest.approx([0.1] * 5 + [0.5 / 15] * 4 + [1 - 0.5 - 4 * 0.5 / 15])
    capped = value_type_weights(torch.tensor([0.0, 1.0], dtype=F64), cdf, actions, max_type=0.3)
    assert capped.tolist() == pytest.approx([0.1, 0.1, 0.8] + [0.0] * 7)
    # A cap inside the first cell still keeps that one cell.
    lowest = value_type_weights(torch.tensor([0.0, 1.0], dtype=F64), cdf, actions, max_type=0.05)
    assert lowest.tolist() == pytest.approx([1.0] + [0.0] * 9)


def test_value_point_mask_meets_each_bids_value_cell():
    logged = fit_logged_auction([0.1, 0.2, 0.2], 2, grid=0.1, bandwidth=0.0)
    # values at cdf points lo-edge, between bids 0.1|0.2, top: bid 0.1 -> [0.12, 0.33], bid 0.2 -> [0.33, 0.52]
    values = torch.tensor([0.12, 0.33, 0.52], dtype=F64)
    mask = value_point_mask(values, logged)
    assert mask.tolist() == [
        [False, True, True, True] + [False] * 6,
        [False, False, False, True, True, True] + [False] * 4,
    ]
    capped = value_point_mask(values, logged, max_type=0.3)
    assert capped[1].tolist() == [False, False, True] + [False] * 7
    # Values exactly on cell edges (0.25 grid, exact in binary): a cell meets [v_low, v_high] when its upper
    # edge is above v_low and its lower edge at or below v_high.
    quarter = fit_logged_auction([0.25, 0.5, 0.5], 2, grid=0.25, bandwidth=0.0)
    edges = value_point_mask(torch.tensor([0.25, 0.75, 1.0], dtype=F64), quarter)
    assert edges.tolist() == [[False, True, True, True], [False, False, False, True]]


@pytest.mark.parametrize("n_bidders", [2, 3])
@pytest.mark.parametrize("reserve", [0.0, 0.3, 0.75])
def test_second_price_point_on_uniform_values_is_the_closed_form(n_bidders, reserve):
    """Values U[0, 1] as a two-point CDF: Simpson's rule is exact on these polynomials of degree <= 3."""
    values, cdf = torch.tensor([0.0, 1.0], dtype=F64), torch.tensor([0.0, 1.0], dtype=F64)
    revenue = second_price_point(values, cdf, n_bidders, reserve, "revenue")
    assert revenue == pytest.approx(second_price_revenue(n_bidders, reserve), abs=1e-12)
    assert second_price_point(values, cdf, n_bidders, reserve, "welfare") == pytest.approx(
        welfare(n_bidders, reserve), abs=1e-12
    )


def test_second_price_point_with_more_knots_a_top_and_a_cap():
    """Five bidders on a 21-knot uniform CDF (Simpson on degree 5 per piece: measured error < 1e-7);
    values on [0, 2] capped at 1 put the mass above 1 on 1; a reserve at or above the top sells nothing."""
    values = torch.linspace(0, 1, 21, dtype=F64)
    assert second_price_point(values, values.clone(), 5, 0.4, "revenue") == pytest.approx(
        second_price_revenue(5, 0.4), abs=1e-6
    )
    assert second_price_point(values, values.clone(), 5, 0.4, "welfare") == pytest.approx(welfare(5, 0.4), abs=1e-6)
    wide = torch.linspace(0, 2, 201, dtype=F64)
    cdf = wide / 2
    # Values U[0, 2] capped at 1, 2 bidders, reserve 0: the price is min(V1, V2, 1), P(min > x) = (1 - x/2)^2,
    # E = int_0^1 (1 - x/2)^2 dx = 7/12 (Simpson exact on these quadratics). Before the curve was cut at the
    # cap's jump this read 0.58292, 4.2e-4 low.
    assert second_price_point(wide, cdf, 2, 0.0, "revenue", max_value=1.0) == pytest.approx(7 / 12, abs=1e-12)
    # A cap between knots (1.005): P(min > x) = (1 - x/2)^2 up to the cap, E = int_0^1.005 (1 - x/2)^2 dx.
    expected = (8 - (2 - 1.005) ** 3) / 12
    assert second_price_point(wide, cdf, 2, 0.0, "revenue", max_value=1.005) == pytest.approx(expected, abs=1e-12)
    # Only the last knot above the cap (values 0, 0.5, 1, 2 with F = x/2): E = int_0^1.5 (1 - x/2)^2 dx = 0.65625.
    four = torch.tensor([0.0, 0.5, 1.0, 2.0], dtype=F64)
    assert second_price_point(four, four / 2, 2, 0.0, "revenue", max_value=1.5) == pytest.approx(0.65625, abs=1e-12)
    # Welfare capped at 1: E[min(max(V1, V2), 1)] = int_0^1 (1 - (x/2)^2) dx = 11/12.
    assert second_price_point(wide, cdf, 2, 0.0, "welfare", max_value=1.0) == pytest.approx(11 / 12, abs=1e-12)
    assert second_price_point(wide, cdf, 2, 0.0, "revenue") == pytest.approx(2 / 3, abs=1e-9)
    assert second_price_point(wide, cdf, 2, 1.0, "revenue", max_value=1.0) == 0.0
    assert second_price_point(values, values.clone(), 2, 1.0, "welfare") == 0.0
    assert second_price_point(values, values.clone(), 2, 1.5, "revenue") == 0.0


# ---------------------------------------------------------------------------------------------------
# The new game


def _uniform(step):
    actions = torch.arange(round(1 / step) + 1, dtype=F64) * step
    types = type_grid(actions)
    return actions, types, torch.full_like(types, 1 / types.numel())


def test_equilibrium_guess_is_truthful_or_the_uniform_shading():
    actions, types, weights = _uniform(0.05)
    assert torch.equal(equilibrium_guess(weights, types, parse_rule("second_price_r0.3"), 2), types)
    # Two bidders, uniform types: G is linear, the trapezoids are exact, the guess is t / 2.
    assert equilibrium_guess(weights, types, parse_rule("first_price_n2"), 2).tolist() == pytest.approx(
        (types / 2).tolist(), abs=1e-12
    )
    # Three bidders: 2t/3 less the trapezoids' error on G = t^2, (h^3 / 6 per half cell h, t / h of them) / t^2.
    three = equilibrium_guess(weights, types, parse_rule("first_price_n3"), 3)
    half = 0.025
    assert three.tolist() == pytest.approx((2 * types / 3 - half**2 / (6 * types)).tolist(), abs=1e-12)
    # No mass below a type: it bids 0 (nobody to beat); types with zero weight below still shade.
    lumpy = torch.zeros_like(weights)
    lumpy[10:] = 0.1
    guess = equilibrium_guess(lumpy, types, parse_rule("first_price_n2"), 2)
    assert guess[:10].tolist() == [0.0] * 10 and guess[10].item() == pytest.approx(types[10].item() - 0.0125)
    # A single type cell [0, 1] of mass 1: uniform values, two bidders, bid t / 2.
    single = equilibrium_guess(torch.ones(1, dtype=F64), torch.tensor([0.5], dtype=F64), parse_rule("first_price_n2"), 2)
    assert single.tolist() == pytest.approx([0.25])


@pytest.mark.parametrize("n_bidders", [2, 3])
def test_fictitious_play_finds_the_uniform_first_price_equilibrium(n_bidders):
    """Types U[0, 1] on a 0.05 grid, first price: bids near (n - 1) t / n and revenue near (n - 1) / (n + 1).
    Measured after 300 iterations (n = 2 / 3): revenue off by 0.0045 / 0.0012, welfare by 0.0029 / 0.0018,
    each type's mean bid off by 0.0135 / 0.0108 on average and 0.037 / 0.017 at worst (the grid is coarse);
    thresholds 0.01 (statistics), 0.02 (average bid error), 0.05 (worst)."""
    actions, types, weights = _uniform(0.05)
    found = solve_equilibrium(weights, types, parse_rule(f"first_price_n{n_bidders}"), n_bidders, actions, 300)
    assert found.revenue == pytest.approx(first_price_revenue(n_bidders), abs=0.01)
    assert found.welfare == pytest.approx(welfare(n_bidders), abs=0.01)
    mean_bid = found.strategy @ actions
    error = (mean_bid - (n_bidders - 1) / n_bidders * types).abs()
    assert error.mean().item() < 0.02 and error.max().item() < 0.05
    assert found.regret < 1e-3 and found.value("welfare") == found.welfare and found.value("revenue") == found.revenue
    assert found.pmf.tolist() == pytest.approx((weights @ found.strategy).tolist())
    assert found.value_mass.tolist() == pytest.approx(((weights * types) @ found.strategy).tolist())


def test_fictitious_play_averages_every_best_response_so_far():
    """After k iterations each type's strategy is the average of k best responses: one-hot after one, in
    halves after two, in thirds after three (first price moves its best responses at the start)."""
    actions, types, weights = _uniform(0.05)
    rule = parse_rule("first_price_n2")
    for k in (1, 2, 3):
        strategy = solve_equilibrium(weights, types, rule, 2, actions, k).strategy
        assert strategy.sum(1).tolist() == pytest.approx([1.0] * types.numel())
        assert torch.allclose(strategy * k, (strategy * k).round(), atol=1e-9), k
        assert (k == 1) == bool(((strategy == 0) | (strategy == 1)).all()), k


def test_second_price_play_is_truthful_and_stops_at_once():
    actions, types, weights = _uniform(0.05)
    found = solve_equilibrium(weights, types, parse_rule("second_price_r0.5"), 2, actions, 1000)
    assert found.regret < 1e-7
    # Ties with bids in the opponents' gaps resolve to the bid nearest the type: a grid point next to it.
    nearest = found.strategy.argmax(1)
    assert ((actions[nearest] - types).abs() <= 0.025 + 1e-12).all()
    win, pay = win_and_payment(found.pmf, parse_rule("second_price_r0.5"), 2, actions)
    assert found.revenue == pytest.approx(float(statistic_value(found.pmf, found.value_mass, win, pay, 2, "revenue")))
    assert found.revenue == pytest.approx(second_price_revenue(2, 0.5), abs=0.02)


def _small_logged(n_bids=200):
    bids = torch.round(0.5 * _quantiles(n_bids) / 0.05) * 0.05
    return fit_logged_auction(bids, 2, grid=0.05)


@pytest.mark.parametrize("rule", ["second_price_r0.3", "first_price_n2"])
@pytest.mark.parametrize("statistic", ["revenue", "welfare"])
def test_raw_bounds_contain_the_start_and_widen_with_epsilon(rule, statistic):
    """Frank-Wolfe's own numbers, no clamp: each epsilon's feasible set contains the smaller ones'."""
    logged = _small_logged()
    weights = type_distribution(logged)
    start = solve_equilibrium(weights, logged.types, parse_rule(rule), 2, logged.actions, 200)
    mask = point_types(logged)
    lower, upper = solve_bounds([logged], start, parse_rule(rule), 2, logged.actions, logged.types, [0.0, 0.01, 0.05], statistic, 30,
                                [mask])
    point = start.value(statistic)
    assert torch.all(lower <= point + 1e-9) and torch.all(upper >= point - 1e-9), (lower, point, upper)
    assert torch.all(lower[1:] <= lower[:-1]) and torch.all(upper[1:] >= upper[:-1]), (lower, upper)
    assert upper[-1] - lower[-1] > 2 * (upper[0] - lower[0]) > 0


def test_a_lone_bidder_bids_zero_and_its_welfare_is_its_mean_value():
    """first_price_n1: one bidder wins whatever it bids, so it bids 0 (revenue 0) and welfare is its mean type,
    E = 0.5 on uniform types; the welfare bounds run over consistent types (the statistic has no gradient in the
    bids: it must still run) and hold the point."""
    actions, types, weights = _uniform(0.05)
    found = solve_equilibrium(weights, types, parse_rule("first_price_n1"), 1, actions, 100)
    assert found.revenue == 0.0 and found.welfare == pytest.approx(0.5, abs=1e-12)
    logged = _small_logged()
    start = solve_equilibrium(type_distribution(logged), logged.types, parse_rule("first_price_n1"), 1, logged.actions)
    lower, upper = solve_bounds([logged], start, parse_rule("first_price_n1"), 1, logged.actions, logged.types, [0.01],
                                "welfare", 10, [point_types(logged)])
    assert lower.item() <= start.welfare + 1e-12 and upper.item() >= start.welfare - 1e-12


def test_with_any_type_and_bid_allowed_the_bounds_reach_the_extremes():
    """Regret 1 allows every type and every bid: first-price revenue runs from 0 (all bid 0) to the top bid
    (all bid 1), down and up by Frank-Wolfe steps 1/(k+1): after 40 iterations within 1/41 of each end."""
    logged = _small_logged()
    weights = type_distribution(logged)
    rule = parse_rule("first_price_n2")
    start = solve_equilibrium(weights, logged.types, rule, 2, logged.actions, 100)
    lower, upper = solve_bounds([logged], start, rule, 2, logged.actions, logged.types, [1.0], "revenue", 40)
    low_end, high_end = 1.0 / 41, 40.0 / 41  # one Frank-Wolfe step 1/(k+1) from each end, k = 40
    assert 0.0 <= lower.item() < low_end + 1e-9
    assert high_end - 1e-9 < upper.item() <= 1.0


def test_bounds_move_by_frank_wolfe_steps_of_one_over_k_plus_one():
    """With regret 1 every type and bid is allowed and the best vertex never changes (everyone bids 0 for
    the lower bound, the top bid for the upper), so after K steps of 1/(k+1) the profile is exactly
    start / (K + 1) + vertex * K / (K + 1)."""
    logged = _small_logged()
    weights = type_distribution(logged)
    rule = parse_rule("first_price_n2")
    start = solve_equilibrium(weights, logged.types, rule, 2, logged.actions, 100)
    for n_iters in (1, 7):
        lower, upper = solve_bounds([logged], start, rule, 2, logged.actions, logged.types, [1.0], n_iters=n_iters)  # revenue by default
        for bound, vertex in ((lower, 0), (upper, -1)):
            pmf = start.pmf / (n_iters + 1)
            pmf[vertex] += n_iters / (n_iters + 1)
            win, pay = win_and_payment(pmf, rule, 2, logged.actions)
            expected = float(statistic_value(pmf, None, win, pay, 2, "revenue"))
            assert bound.item() == pytest.approx(expected, rel=1e-12), (n_iters, vertex)


def test_clamp_bounds_forces_the_point_in_and_monotone_epsilon():
    lower = torch.tensor([0.31, 0.25, 0.27], dtype=F64)
    upper = torch.tensor([0.35, 0.29, 0.40], dtype=F64)
    reported_lower, reported_upper = clamp_bounds(0.30, lower, upper)
    assert reported_lower.tolist() == [0.30, 0.25, 0.25]
    assert reported_upper.tolist() == [0.35, 0.35, 0.40]


# ---------------------------------------------------------------------------------------------------
# Scale and the whole estimate on small data


def test_nice_steps():
    assert [nice_step(x) for x in (0.013, 0.018, 0.04, 0.08, 0.0031, 1.0, 6.5, 3.0, 7.5)] == pytest.approx(
        [0.01, 0.02, 0.05, 0.1, 0.002, 1.0, 5.0, 2.0, 10.0]
    )


def test_value_scale_from_the_bids_and_known():
    bids = 0.5 * _quantiles(2000)
    scale = choose_value_scale(bids, 2)
    assert scale.unit == 1.0 and scale.top == pytest.approx(1.0)
    assert scale.estimated_top_value == pytest.approx(1.0, abs=2e-3)  # measured 0.99935
    cents = choose_value_scale(bids * 100, 2)
    assert cents.unit == pytest.approx(100.0) and cents.top == pytest.approx(1.0)
    three = choose_value_scale(2 / 3 * _quantiles(2000), 3)
    assert three.estimated_top_value == pytest.approx(1.0, abs=3e-3) and three.top == pytest.approx(1.0)
    with _raises("every logged bid is 0: there is nothing to invert (check the bid column)"):
        choose_value_scale(torch.zeros(10, dtype=F64), 2)
    known = known_value_scale(250.0)
    assert (known.unit, known.top, known.estimated_top_value) == (200.0, 1.25, 250.0)
    assert known_value_scale(1.0, grid=0.05).unit == 1.0
    with _raises("value_top=0: the largest possible value must be > 0"):
        known_value_scale(0)


def test_the_rough_top_reads_the_density_within_a_silverman_bandwidth_of_the_top_bid():
    bids = torch.tensor([0.05, 0.1, 0.2, 0.3, 0.33, 0.4, 0.41, 0.45, 0.47, 0.5], dtype=F64)
    h = 1.06 * statistics.stdev(bids.tolist()) * 10 ** -0.2
    density = sum(1 for b in bids.tolist() if b >= 0.5 - h) / (10 * h)
    scale = choose_value_scale(bids, 3, grid=0.05)
    assert scale.estimated_top_value == pytest.approx(0.5 + 1 / (2 * density), rel=1e-12)


def test_the_value_scale_uses_the_bandwidth_given_in_data_units():
    """F = v^2, 3 bidders, 300 quantile bids, 0.05 grid, the local inversion (a bandwidth given): the default
    bandwidth puts the top at 1.0, a 0.02 one at 1.05 (measured); in cents the same bandwidth x 100 gives the same
    top."""
    bids = 0.8 * _quantiles(300).sqrt()
    assert choose_value_scale(bids, 3, 0.05, bandwidth=default_bandwidth(bids)).top == pytest.approx(1.0)
    assert choose_value_scale(bids, 3, 0.05, bandwidth=0.02).top == pytest.approx(1.05)
    cents = choose_value_scale(bids * 100, 3, 0.05, bandwidth=2.0)
    assert cents.unit == pytest.approx(100.0) and cents.top == pytest.approx(1.05)
    found = predict_counterfactuals(bids, 3, ["second_price_r0.5"], [], grid=0.05, bandwidth=0.02, point_iters=10)
    assert found.scale.top == pytest.approx(1.05)


@pytest.mark.slow  # the value sieve's three families fit to 2,200 piled bids: 6-12 s
def test_the_value_top_reaches_one_cell_above_the_highest_bid():
    """Bids piled at the top of 50 bidders (within 1e-4 of it: one value would be a mass point, left out) read a
    huge density there and a top barely above the highest bid: the grid's top is the next grid point, one cell
    above it."""
    bids = torch.cat([0.5 * _quantiles(200), 0.4999 + 1e-4 * _quantiles(2000)])
    scale = choose_value_scale(bids, 50)
    assert scale.unit == 0.5 and scale.top == pytest.approx(1.01)


SMALL = dict(n_iters=20, point_iters=100, grid=0.05)


def test_predict_on_uniform_quantile_bids():
    """Equilibrium bids v / 2 at 1,000 exact quantiles, 2 bidders, 0.05 grid. Point: second price is the
    closed form within 0.003 (measured 0.0004), first price within 0.01 (measured 0.004, grid-limited)."""
    found = predict_counterfactuals(0.5 * _quantiles(1000), 2, ["second_price_r0.5", "first_price_n3"], [0.02, 0.0], **SMALL)
    table = found.table
    assert table["cf/second_price_r0.5/point"] == pytest.approx(second_price_revenue(2, 0.5), abs=3e-3)
    assert table["cf/first_price_n3/point"] == pytest.approx(first_price_revenue(3), abs=0.01)
    assert set(table) == {
        f"cf/{r}/{w}" for r in ("second_price_r0.5", "first_price_n3")
        for w in ("point", "lower_eps0", "upper_eps0", "lower_eps0.02", "upper_eps0.02")
    }
    assert set(found.raw) == set(table) - {"cf/second_price_r0.5/point", "cf/first_price_n3/point"}
    for rule in ("second_price_r0.5", "first_price_n3"):
        lo0, hi0, lo, hi = (found.raw[f"cf/{rule}/{k}"] for k in ("lower_eps0", "upper_eps0", "lower_eps0.02", "upper_eps0.02"))
        assert lo <= lo0 < hi0 <= hi and hi - lo > 0.1, rule
    clamped = {line.split(":")[0] for line in found.clamps}
    for key, value in found.raw.items():
        assert (table[key] != value) == (key in clamped)
    assert found.scale.unit == 1.0


def test_predict_welfare_scales_and_skips_bounds_without_epsilons():
    bids = 0.5 * _quantiles(1000)
    rules = ["second_price_r0.2", "first_price_n2"]
    base = predict_counterfactuals(bids, 2, rules, [], statistic="welfare", **SMALL)
    assert set(base.table) == {"cfw/second_price_r0.2/point", "cfw/first_price_n2/point"} and base.raw == {}
    assert base.table["cfw/second_price_r0.2/point"] == pytest.approx(welfare(2, 0.2), abs=3e-3)
    assert base.table["cfw/first_price_n2/point"] == pytest.approx(welfare(2), abs=0.01)
    # Bids x 10 with reserve, epsilon and bandwidth x 10: every number x 10, welfare keys on both bounds.
    base = predict_counterfactuals(bids, 2, rules, [0.01], statistic="welfare", bandwidth=0.05, **SMALL)
    scaled = predict_counterfactuals(bids * 10, 2, ["second_price_r2.0", "first_price_n2"], [0.1], statistic="welfare",
                                     bandwidth=0.5, **SMALL)
    assert scaled.scale.unit == pytest.approx(10.0)
    assert [k.replace("r2.0", "r0.2").replace("eps0.1", "eps0.01") for k in scaled.table] == list(base.table)
    assert "cfw/first_price_n2/upper_eps0.01" in base.table
    # Points are closed-form integrals: x 10 to rounding. Bounds come out of unconverged Frank-Wolfe, where 155 of
    # these 1,000 bids not round-tripping through x 10 / 10 (1e-17) can flip a tie between exactly equal best
    # responses and move a bound by ~1e-4 (as a changed CPU kernel can); a unit error moves them by 10% or more.
    for key, scaled_key in zip(base.table, scaled.table):
        assert scaled.table[scaled_key] == pytest.approx(10 * base.table[key], rel=1e-9 if key.endswith("point") else 2e-3)
    for rule in rules:
        lower, point, upper = (base.table[f"cfw/{rule}/{w}"] for w in ("lower_eps0.01", "point", "upper_eps0.01"))
        assert lower <= point <= upper and upper - lower > 0.02


def test_predict_with_a_given_scale_headroom_and_bandwidth():
    bids = 0.5 * _quantiles(600)
    rules = ["second_price_r0.5"]
    known = predict_counterfactuals(bids, 2, rules, [0.01], scale=known_value_scale(1.0), **SMALL)
    assert known.scale.top == 1.0 and known.scale.estimated_top_value == 1.0
    # Headroom widens the bounds' types, not the point's: first-price upper bound at eps 0.05 measured
    # 0.705 at headroom 1, 0.756 at 2.
    tight, roomy = (
        predict_counterfactuals(bids, 2, ["first_price_n2"], [0.05], scale=known_value_scale(1.0), headroom=h, **SMALL)
        for h in (1.0, 2.0)
    )
    assert roomy.table["cf/first_price_n2/point"] == tight.table["cf/first_price_n2/point"]
    default, explicit = (
        predict_counterfactuals(bids, 2, ["first_price_n2"], [0.05], scale=known_value_scale(1.0), **SMALL, **extra)
        for extra in ({}, {"headroom": 1.5})
    )
    assert default.raw == explicit.raw and default.raw != roomy.raw
    assert roomy.raw["cf/first_price_n2/upper_eps0.05"] > tight.raw["cf/first_price_n2/upper_eps0.05"] + 0.02
    smooth = predict_counterfactuals(bids, 2, rules, [], bandwidth=0.2, **SMALL)
    assert smooth.table["cf/second_price_r0.5/point"] != pytest.approx(known.table["cf/second_price_r0.5/point"], abs=1e-6)


def test_predict_arguments_fail_early():
    bids = 0.5 * _quantiles(100)
    with _raises("statistic='profit'; choose one of ('revenue', 'welfare')"):
        predict_counterfactuals(bids, 2, ["first_price_n2"], statistic="profit")
    with _raises("epsilons=[0.1, -0.1]: every epsilon must be >= 0"):
        predict_counterfactuals(bids, 2, ["first_price_n2"], [0.1, -0.1])
    with _raises("headroom=0.5: the bounds' type space cannot be smaller than the point's (use >= 1)"):
        predict_counterfactuals(bids, 2, ["first_price_n2"], headroom=0.5)


def _unoptimised(scale: float, rules: list[str]):
    """Bounds with no Frank-Wolfe step (n_iters=0): every bound is the start, the grid equilibrium's revenue,
    which sits 1e-3-ish off the off-grid second-price point (the grid's discreteness), so one side's bounds
    lie on the wrong side of the point and are clamped to it, by a margin a million times float noise."""
    return predict_counterfactuals(scale * _quantiles(1000), 2, rules, [0.001, 0.0], n_iters=0, point_iters=100,
                                   grid=0.05)


def test_a_clamp_that_fires_is_listed_with_both_numbers():
    found = _unoptimised(0.5, ["second_price_r0.5"])
    point = found.table["cf/second_price_r0.5/point"]
    start = {found.raw[key] for key in found.raw}
    assert len(start) == 1  # no step taken: every raw bound is the start's value
    (start,) = start
    assert abs(start - point) > 1e-4  # the margin: far above any floating-point noise
    side = "upper" if start < point else "lower"
    clamped = [f"cf/second_price_r0.5/{side}_eps{e}" for e in ("0", "0.001")]  # by increasing epsilon
    for key in found.raw:
        assert found.table[key] == (point if key in clamped else start), key
    # Each clamp that fires is listed, with the raw and the reported number, the move and its share of the range.
    assert found.clamps == [f"{key}: raw {start:.8g} reported {point:.8g} (moved {point - start:+.2g}, "
                            f"{abs(point - start) / found.scale.top:.1g} of the value range; point {point:.6g})"
                            for key in clamped]
    # In other units (bids, reserve and epsilon x 10): the same clamps, the moves x 10, their shares the same.
    tenfold = predict_counterfactuals(5 * _quantiles(1000), 2, ["second_price_r5.0"], [0.01, 0.0], n_iters=0,
                                      point_iters=100, grid=0.05)
    assert tenfold.scale.unit == pytest.approx(10 * found.scale.unit)
    assert len(tenfold.clamps) == 2
    for line, tenfold_line in zip(found.clamps, tenfold.clamps):
        move = float(re.search(r"moved ([-+][0-9.e-]+)", line).group(1))
        assert float(re.search(r"moved ([-+][0-9.e-]+)", tenfold_line).group(1)) == pytest.approx(10 * move, rel=0.05)
        share = line.split("(moved")[1].split(";")[0].split(",")[1]
        assert share == tenfold_line.split("(moved")[1].split(";")[0].split(",")[1]
    # Two rules that each clamp: both listed, in the rules' order.
    both = _unoptimised(0.5, ["second_price_r0.5", "second_price_r0.2"])
    assert [line.split("/")[1] for line in both.clamps] == ["second_price_r0.5"] * 2 + ["second_price_r0.2"] * 2


@pytest.mark.parametrize("random_bids, value_top, headroom, bandwidth", [(False, 1.0, 1.0, 0.04), (True, 0.8, 1.25, 0.1)])
def test_predict_composes_the_documented_pieces(random_bids, value_top, headroom, bandwidth):
    """With the scale given: the logged game on the bids with types up to headroom x the top, the point's value
    CDF from `inverted_value_cdf`, second price read off it, first price by fictitious play on its cells,
    the bounds from that start with the point's types added; bids as a list are read as float64. Bids at
    U[0, 0.5] quantiles with top 1 (1 / 0.05 is a whole number of cells), then random bids, where the logged
    game's smoothing moves the second-price upper bound (by 0.02 against the default bandwidth) and the values
    (about U[0, 1]) above the top 0.8 count at 0.8 in the point."""
    generator = torch.Generator().manual_seed(0)
    tensor = 0.5 * (torch.rand(400, generator=generator, dtype=F64) if random_bids else _quantiles(400))
    rules = ["second_price_r0.45", "first_price_n3"]
    found = predict_counterfactuals(tensor.tolist(), 2, rules, [0.01], scale=known_value_scale(value_top),
                                    headroom=headroom, bandwidth=bandwidth, n_iters=6, point_iters=30, grid=0.05)
    logged = fit_logged_auction(tensor, 2, 0.05, bandwidth=bandwidth, top=math.ceil(value_top * headroom / 0.05 - 1e-9) * 0.05)
    assert logged.actions[-1].item() == pytest.approx(1.0)
    values, cdf = inverted_value_cdf(tensor, 2, 0.05, bandwidth)
    assert (values[-1].item() > value_top + 0.1) == random_bids  # where the cap binds
    weights = value_type_weights(values, cdf, logged.actions, value_top)
    mask = value_point_mask(values, logged, value_top)
    for name in rules:
        rule = parse_rule(name)
        n_new = rule.bidders(2)
        start = solve_equilibrium(weights, logged.types, rule, n_new, logged.actions, 30)
        point = second_price_point(values, cdf, 2, 0.45, "revenue", value_top) if name.startswith("second") else start.revenue
        assert found.table[f"cf/{name}/point"] == pytest.approx(point, rel=1e-12), name
        lower, upper = solve_bounds([logged], start, rule, n_new, logged.actions, logged.types, [0.01], "revenue", 6,
                                    [mask])
        assert found.raw[f"cf/{name}/lower_eps0.01"] == pytest.approx(lower.item(), rel=1e-12), name
        assert found.raw[f"cf/{name}/upper_eps0.01"] == pytest.approx(upper.item(), rel=1e-12), name


def test_counterfactual_table_and_truth_table():
    bids = 0.5 * _quantiles(300)
    table = counterfactual_table(bids, 2, ["second_price_r0.3"], [0.01], "revenue", 5, grid=0.05, point_iters=20)
    found = predict_counterfactuals(bids, 2, ["second_price_r0.3"], [0.01], "revenue", 5, grid=0.05, point_iters=20)
    assert table == found.table and len(table) == 3
    rules = ["second_price_r0.5", "first_price_n3"]
    assert truth_table(3, rules) == {
        "cf/second_price_r0.5/truth": truth("second_price_r0.5", 3), "cf/first_price_n3/truth": truth("first_price_n3", 3)
    }
    assert truth_table(2, rules, "welfare", 2.0) == {
        "cfw/second_price_r0.5/truth": truth("second_price_r0.5", 2, "welfare", 2.0),
        "cfw/first_price_n3/truth": truth("first_price_n3", 2, "welfare", 2.0),
    }
    assert truth_table(2, rules, "welfare", 2.0) != truth_table(2, rules, "welfare")


def test_a_density_vanishing_at_the_top_is_capped_at_twice_the_rough_top():
    """Bids whose density falls linearly to 0 at the highest bid: the fitted f(b_max) is near 0 and the
    inverted top runs away (measured 2.70 internal units), so the top is cut at twice the rough top (2.38). The local
    inversion (its default bandwidth given); the value sieve reads a top of 0.76 on these bids (measured)."""
    bids = 0.5 * (1 - (1 - _quantiles(2000)).sqrt())
    scale = choose_value_scale(bids, 2, bandwidth=default_bandwidth(bids))
    values, _ = inverted_value_cdf(bids / scale.unit, 2, 0.01)
    cap = 2 * scale.estimated_top_value / scale.unit
    assert values[-1].item() > cap + 0.1
    assert scale.top == pytest.approx(math.ceil(cap / 0.01) * 0.01)


def test_a_bandwidth_under_a_third_of_a_grid_step_is_a_clear_error():
    """Under 0.3 cells the local quadratic is singular (LinAlgError at 0.1) or wild (a top of 5e5 at 0.25,
    measured): refused by name. At 0.3 cells U[0, 0.5] bids of 2 bidders read values up to ~1 (measured 0.986)."""
    bids = torch.linspace(0.0, 0.5, 5001, dtype=F64)
    for bandwidth in (0.001, 0.0025):
        with pytest.raises(ValueError, match=r"bandwidth 0.00(1|25) is under 0.3 grid steps .*>= 0.003 or a finer"):
            inverted_value_cdf(bids, 2, 0.01, bandwidth=bandwidth)
    values, _ = inverted_value_cdf(bids, 2, 0.01, bandwidth=0.003)
    assert float(values[-1]) == pytest.approx(1.0, abs=0.02)


def _spiky_bids(where: str) -> torch.Tensor:
    """Half the bids on one point next to an end: the local quadratic's level leaves [0, 1] there
    (measured: up to 1.011 below a spike at the top, down to -0.008 above one at the bottom)."""
    g = torch.Generator().manual_seed(0)
    spread = torch.rand(500, generator=g, dtype=F64) * 0.5
    if where == "top":
        return torch.cat([spread, torch.full((500,), 0.5, dtype=F64), torch.tensor([0.9], dtype=F64)])
    return torch.cat([torch.tensor([0.0], dtype=F64), torch.full((500,), 0.1, dtype=F64), 0.1 + spread])


@pytest.mark.parametrize("where", ["top", "bottom"])
def test_the_inverted_values_read_the_fitted_cdf_level_kept_inside_0_1(where):
    """inverted_value_cdf's composition on bids where the fitted level overshoots: v = b + clamp(F, 0, 1) /
    ((n - 1) f), then the running minimum from the top; the CDF is the empirical one at the same points."""
    bids, grid, n = _spiky_bids(where), 0.01, 3
    cells = default_bandwidth(bids) / grid
    index = torch.round(bids / grid).long()
    lo, hi = int(index.min()), int(index.max())
    edge = cdf_points(lo, hi, (float(bids.min()) / grid, float(bids.max()) / grid))
    counts = torch.bincount(index - lo, minlength=hi - lo + 1).to(F64)
    empirical = torch.cat([torch.zeros(1, dtype=F64), counts.cumsum(0)]) / bids.numel()
    level_weights, slope_weights = local_cdf_fit(edge, cells)
    level = level_weights @ empirical
    assert float(level.max()) > 1.005 if where == "top" else float(level.min()) < -0.005
    density = (slope_weights @ empirical) / grid
    floor = 1e-6 / (float(bids.max()) - float(bids.min()))
    expected = edge * grid + level.clamp(0.0, 1.0) / ((n - 1) * density.clamp_min(floor))
    values, cdf = inverted_value_cdf(bids, n, grid)
    # Within TOP_WINDOW bandwidths of the highest bid the density is the top model's (`top_density`), not the fit's.
    far = edge[-1] - edge > TOP_WINDOW * cells
    assert far.sum() >= 5
    assert torch.allclose(values[far], expected[far].flip(0).cummin(0).values.flip(0), rtol=1e-12, atol=1e-12)
    assert torch.equal(cdf, empirical)


def test_second_price_from_cdfs_with_bidders_of_different_tops():
    """Values U[0, 1] and U[0, 2]: revenue E[min] = 5/12 and welfare E[max] = 13/12 at reserve 0; at 1.5
    only the strong bidder can sell, at the reserve: (1.5 * 1/4, E[V2 1{V2 >= 1.5}] = 7/16). Above the weak
    bidder's top its CDF is 1 (Simpson is exact on these quadratics)."""
    from pipeline.games.rmac import second_price_from_cdfs

    weak = (torch.tensor([0.0, 1.0], dtype=F64), torch.tensor([0.0, 1.0], dtype=F64))
    strong = (torch.tensor([0.0, 2.0], dtype=F64), torch.tensor([0.0, 1.0], dtype=F64))
    assert second_price_from_cdfs([weak, strong], 0.0) == pytest.approx((5 / 12, 13 / 12), abs=1e-12)
    assert second_price_from_cdfs([weak, strong], 1.5) == pytest.approx((0.375, 7 / 16), abs=1e-12)
    assert second_price_from_cdfs([weak, strong], 2.0) == (0.0, 0.0)


def test_product_of_the_others_over_a_batch():
    """(batch, bidders, K): for each bidder the product over the OTHER bidders, batch rows kept apart."""
    x = torch.arange(1, 25, dtype=F64).reshape(2, 3, 4)
    expected = torch.stack([torch.stack([x[b, [j for j in range(3) if j != i]].prod(0) for i in range(3)])
                            for b in range(2)])
    assert torch.equal(power_of_opponents(x, [1, 1, 1]), expected)


def test_product_of_the_others_with_alike_bidders():
    """Populations of 2 and 1 alike bidders: a bidder of the first faces one of its own and the other (x0 x1),
    a bidder of the second faces both of the first (x0^2). Integers: exact."""
    x = torch.tensor([[2.0, 3.0], [5.0, 7.0]], dtype=F64)
    assert power_of_opponents(x, [2, 1]).tolist() == [[10.0, 21.0], [4.0, 9.0]]
    assert power_of_opponents(x, [1, 1]).tolist() == [[5.0, 7.0], [2.0, 3.0]]


def test_beta22_values_have_no_bias_below_the_cusp_at_the_top():
    """Beta(2, 2) values, 3 bidders, bids at 15,000 exact quantiles: b(v) = v - (9v^5/5 - 2v^6 + 4v^7/7) / F(v)^2,
    F = 3v^2 - 2v^3. The value density vanishes at the top (a square-root cusp in the bids' CDF); the local fit
    alone read F 0.0054 low at v = 0.75 (measured), the top model (`top_density`) within 0.0018."""
    q = (torch.arange(15_000, dtype=F64) + 0.5) / 15_000
    v = 0.5 + torch.cos((torch.arccos(1 - 2 * q) + 4 * math.pi) / 3)  # the root in [0, 1] of 3v^2 - 2v^3 = q
    bids = v - (9 * v**5 / 5 - 2 * v**6 + 4 * v**7 / 7) / (3 * v**2 - 2 * v**3) ** 2
    values, cdf = inverted_value_cdf(bids, 3, 0.01)
    x = torch.linspace(0.6, 0.9, 7, dtype=F64)
    assert float((interp(x, values, cdf) - (3 * x**2 - 2 * x**3)).abs().max()) < 0.003


def test_the_reserves_on_the_top_alone_are_those_above_the_last_percent_of_values():
    """U[0, 1], 2 bidders, bids v / 2 at 4,000 exact quantiles: 1% of the values lie above 0.99, so of the
    reserves 0.5, 0.95, 0.995 and 1.0 the last two rest on the estimated top alone."""
    found = predict_counterfactuals(0.5 * _quantiles(4000), 2, ["second_price_r0.5"], [])
    assert found.tail_value == pytest.approx(0.99, abs=0.003) and found.value_top == pytest.approx(1.0, abs=0.01)
    assert found.top_reserves([0.5, 0.95, 0.995, 1.0]) == [0.995, 1.0]


def test_top_shrink_is_0_at_the_top_half_one_sd_below_and_1_from_two_sds_below():
    assert top_shrink(1.0, 1.0, 0.01) == 0.0 and top_shrink(1.05, 1.0, 0.01) == 0.0
    assert top_shrink(0.99, 1.0, 0.01) == pytest.approx(0.5) and top_shrink(0.995, 1.0, 0.01) == pytest.approx(0.25)
    assert top_shrink(0.98, 1.0, 0.01) == pytest.approx(1.0) and top_shrink(0.5, 1.0, 0.01) == 1.0
    assert top_shrink(1.0, 1.0, 0.0) == 1.0 and top_shrink(1.0, 1.0, math.nan) == 1.0  # no SD: nothing to shrink


def test_the_top_sd_is_the_seed_to_seed_sd_of_the_top_for_a_fixed_top_model(monkeypatch):
    """U[0, 1] values, 3 bidders, 2,000 auctions, 40 seeds, the smooth top model alone: the delta-method SD of the
    top (binomial covariance of the empirical CDF through the least squares) is the SD of the top over seeds
    (measured 0.0120 / 0.0117; the SD of an SD from 40 draws is ~11%), and the top is unbiased (mean 1.0001)."""
    monkeypatch.setattr(rmac, "CUSP_TEST", math.inf)
    monkeypatch.setattr(rmac, "CUSP_NEAR", math.inf)
    tops, sds = [], []
    for seed in range(40):
        bids = 2 * torch.rand(6000, generator=torch.Generator().manual_seed(seed), dtype=F64) / 3
        _, values, _, sd = inverted_value_curve(bids, 3, 0.01)
        tops.append(float(values[-1]))
        sds.append(sd)
    spread = statistics.stdev(tops)
    assert 0.75 < statistics.mean(sds) / spread < 1.33
    assert abs(statistics.mean(tops) - 1.0) < 3 * spread / math.sqrt(40)


def test_second_price_points_within_two_sds_of_the_estimated_top_are_shrunk_toward_0():
    """U[0, 1], 2 bidders, bids v / 2 at 4,000 exact quantiles (revenue 1/3 + r^2 - 4/3 r^3): the top reads
    0.998 with SD 0.022. Reserves more than 2 SDs below it keep the plug-in (within 0.002 of the truth); those
    within are shrunk by (top - r) / (2 SD), to 0 at the top, and listed. The local inversion (its default bandwidth
    given): the value sieve, whose top is read off the whole fit, shrinks nothing."""
    reserves = [0.9, 0.94, 0.97, 0.99, 1.0]
    rules = [parse_rule(f"second_price_r{r:g}").name for r in reserves]
    bids = 0.5 * _quantiles(4000)
    found = predict_counterfactuals(bids, 2, rules, [], bandwidth=default_bandwidth(bids))
    assert found.value_top == pytest.approx(1.0, abs=0.005) and 0.015 < found.value_top_sd < 0.03
    truths = [1 / 3 + r**2 - 4 / 3 * r**3 for r in reserves]
    points = [found.table[f"cf/{rule}/point"] for rule in rules]
    assert points[0] == pytest.approx(truths[0], abs=0.002) and points[1] == pytest.approx(truths[1], abs=0.002)
    assert 0.4 * truths[2] < points[2] < 0.8 * truths[2] and 0 < points[3] < 0.3 * truths[3] and points[4] == 0.0
    assert found.shrunk_reserves(reserves) == [0.97, 0.99, 1.0]


def test_the_bounds_hold_the_plug_in_and_reach_down_to_a_shrunk_point():
    """The same bids, r = 0.99 (shrunk to about 0.2 of its plug-in) with bounds: the upper bound holds the plug-in
    (`plug_in`, the bounds' own point), the lower bound reaches down to the shrunk point."""
    bids = 0.5 * _quantiles(4000)
    found = predict_counterfactuals(bids, 2, ["second_price_r0.99"], [0.005], n_iters=5,
                                    bandwidth=default_bandwidth(bids))
    point, plug_in = found.table["cf/second_price_r0.99/point"], found.plug_in["cf/second_price_r0.99/point"]
    assert 0 < point < 0.5 * plug_in and found.clamps == []
    assert found.table["cf/second_price_r0.99/lower_eps0.005"] <= point
    assert found.table["cf/second_price_r0.99/upper_eps0.005"] >= plug_in

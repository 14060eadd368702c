"""Asymmetric bidders: each one inverted against its own highest competing bid; second and first price predicted.

Truths: the closed-form first-price equilibrium of values U[0, w1] x U[0, w2] (Krishna 4.3) for the
logged bids and for first price without a reserve, Monte Carlo over 2,000,000 value pairs for second
price, the symmetric closed forms (revenue equivalence) for symmetric bidders, and an independent
backward-shooting ODE solution for asymmetric first price with a reserve.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from scipy.integrate import quad, solve_ivp

from pipeline.games.asymmetric import (
    asymmetric_bounds,
    asymmetric_sieve,
    asymmetric_table,
    asymmetric_uniform_equilibrium,
    first_price_from_cdfs,
    highest_competing_bids,
    inverted_value_cdfs,
    second_price_from_cdfs,
)
from pipeline.games.auction import second_price_revenue, simulate_first_price_bids, welfare
from pipeline.games.auction import truth as symmetric_truth
from pipeline.games.rmac import predict_counterfactuals
from pipeline.games.solver import win_probabilities

SEEDS = range(5)


def _uniform(top: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([0.0, top], dtype=torch.float64), torch.tensor([0.0, 1.0], dtype=torch.float64)


def _second_price_truth(reserve: float, tops=(1.0, 2.0), samples: int = 2_000_000) -> tuple[float, float]:
    return _second_price_monte_carlo(float(reserve), tuple(tops), samples)


@functools.cache  # a fixed seed: the same numbers for every test that asks (each draw of 2,000,000 pairs ~0.2 s)
def _second_price_monte_carlo(reserve: float, tops: tuple[float, float], samples: int) -> tuple[float, float]:
    """Monte Carlo over values U[0, w1] x U[0, w2] (standard error < 0.0005)."""
    generator = torch.Generator().manual_seed(99)
    values = torch.rand(samples, 2, generator=generator, dtype=torch.float64) * torch.tensor(tops)
    high, low = values.max(1).values, values.min(1).values
    sold = high >= reserve
    revenue = torch.where(sold, low.clamp_min(reserve), torch.zeros_like(low)).mean().item()
    return revenue, torch.where(sold, high, torch.zeros_like(high)).mean().item()


def _first_price_truth(tops=(1.0, 2.0)) -> tuple[float, float]:
    return _first_price_quadrature(tuple(tops))


@functools.cache
def _first_price_quadrature(tops: tuple[float, float]) -> tuple[float, float]:
    """Revenue E[max bid] and welfare of the closed-form equilibrium, by quadrature over the bids.

    Bidder i's bid CDF is G_i(b) = v_i(b) / w_i (v_i the inverse bid functions), the top bid
    w1 w2 / (w1 + w2): revenue = top - int_0^top G1 G2, welfare = int v1 G2 dG1 + int v2 G1 dG2.
    """
    w1, w2 = tops
    k, top = 1 / w1**2 - 1 / w2**2, w1 * w2 / (w1 + w2)
    v1, v2 = (lambda b: 2 * b / (1 + k * b * b)), (lambda b: 2 * b / (1 - k * b * b))
    dv1 = lambda b: (2 - 2 * k * b * b) / (1 + k * b * b) ** 2  # noqa: E731
    dv2 = lambda b: (2 + 2 * k * b * b) / (1 - k * b * b) ** 2  # noqa: E731
    revenue = top - quad(lambda b: v1(b) * v2(b) / (w1 * w2), 0, top, epsabs=1e-12)[0]
    integrand = lambda b: (v1(b) * dv1(b) * v2(b) + v2(b) * dv2(b) * v1(b)) / (w1 * w2)  # noqa: E731
    return revenue, quad(integrand, 0, top, epsabs=1e-12)[0]


def _shooting_first_price_revenue(tops: tuple[float, float], reserve: float) -> float:
    """First-price revenue with a reserve for values U[0, w1] x U[0, w2], independently of the grid solver.

    The inverse bid functions solve phi_j'(b) = F_j(phi_j) / (f_j(phi_j) (phi_i(b) - b)) = phi_j / (phi_i - b)
    (bidder i's first-order condition against j), with phi_i(top) = w_i at the common top bid and
    phi_i(r) = r: shoot backwards from a trial top, which is too high when the values meet the bids above
    the reserve (or the solver fails there), and bisect. Revenue = top - r G(r) - int_r^top G,
    G(b) = prod_i phi_i(b) / w_i the highest bid's CDF.
    """
    w = np.array(tops, dtype=float)

    def slope(b, phi):
        return [phi[0] / (phi[1] - b), phi[1] / (phi[0] - b)]

    def meets(b, phi):
        return min(phi) - b - 1e-9

    meets.terminal = True
    lo, hi = reserve, min(tops)
    for _ in range(45):
        top = (lo + hi) / 2
        solution = solve_ivp(slope, (top, reserve), w, events=meets, rtol=1e-10, atol=1e-12)
        lo, hi = (lo, top) if solution.status != 0 else (top, hi)
    solution = solve_ivp(slope, (lo, reserve), w, rtol=1e-10, atol=1e-12, dense_output=True)
    cdf = lambda b: float(np.prod(np.clip(solution.sol(b) / w, 0, 1)))  # noqa: E731
    return lo - reserve * cdf(reserve) - quad(cdf, reserve, lo, epsabs=1e-11, limit=200)[0]


# The tests on the logs of seeds 0-4 (5,000 auctions of U[0, 1] x U[0, 2] or U[0, 1.5]) share their value-sieve fits
# through `fit_sieve`'s cache of its last 8 fits: they run one after another on one worker (xdist_group), U[0, 2]
# last in the revenue test, just before the two tests that read the U[0, 2] logs again (15 fits, not 26).
SHARED_FITS = pytest.mark.xdist_group("asymmetric_logs")
TOPS = [(1.0, 2.0), (1.0, 1.5)]


def _quantile(values: torch.Tensor, cdf: torch.Tensor, q: float) -> float:
    j = int((cdf >= q).nonzero()[0])
    share = (q - cdf[j - 1]) / (cdf[j] - cdf[j - 1])
    return float(values[j - 1] + share * (values[j] - values[j - 1]))


def test_equilibrium_bids_are_best_responses():
    """The closed form: both bid up to w1 w2 / (w1 + w2) = 2/3, and E[min value] = 5/12 sets revenue at r = 0."""
    bids, values = asymmetric_uniform_equilibrium(200_000)
    assert bids.max(0).values.tolist() == pytest.approx([2 / 3, 2 / 3], abs=2e-3)
    assert (bids[:, 0] >= bids[:, 1]).double().mean() < 0.5  # the weak bidder bids higher for the same value
    assert _second_price_truth(0.0)[0] == pytest.approx(5 / 12, abs=1e-3)
    # The quadrature truth of first price against the bids themselves (standard error 0.0003).
    revenue, welfare_ = _first_price_truth()
    assert bids.max(1).values.mean().item() == pytest.approx(revenue, abs=1.5e-3)
    assert values.gather(1, bids.argmax(1, keepdim=True)).mean().item() == pytest.approx(welfare_, abs=3e-3)


def test_highest_competing_bid():
    table = torch.tensor([[0.1, 0.5, 0.3], [0.7, 0.2, 0.4]], dtype=torch.float64)
    assert highest_competing_bids(table).tolist() == [[0.5, 0.3, 0.5], [0.4, 0.7, 0.7]]


@SHARED_FITS
@pytest.mark.parametrize("tops", TOPS, ids=["tops0", "tops1"])
def test_inverted_quartiles_match_each_bidder(tops):
    """Mean error over seeds 0-4 (5,000 auctions each), measured: weak -0.002 / +0.004 / -0.005 (both pairs
    within 0.001 of that), strong -0.006 / -0.012 / +0.002 on U[0, 2] and -0.003 / -0.011 / -0.002 on U[0, 1.5]."""
    errors = torch.zeros(2, 3, dtype=torch.float64)
    for seed in SEEDS:
        cdfs = inverted_value_cdfs(asymmetric_uniform_equilibrium(5000, tops, seed)[0])
        for bidder, (values, cdf) in enumerate(cdfs):
            for k, q in enumerate((0.25, 0.5, 0.75)):
                errors[bidder, k] += (_quantile(values, cdf, q) - q * tops[bidder]) / len(SEEDS)
    assert errors[0].abs().max() <= 0.01
    assert errors[1].abs().max() <= 0.02


@SHARED_FITS
@pytest.mark.parametrize("tops", TOPS[::-1], ids=["tops1", "tops0"])
def test_second_price_revenue_and_welfare_match_the_truth_within_their_sd(tops):
    """Seeds 0-4, 5,000 auctions, the value sieve (`asymmetric_sieve`). Each revenue and welfare within 3.5 of its own
    SDs (delta method and the choice of degree) of the truth: measured at most 2.9 / 3.2 SDs (1, 2) and 2.6 / 2.7
    (1, 1.5). Measured mean errors (1, 2), revenue -0.0003 / +0.0003 / +0.0066 / -0.021 and welfare -0.008 / -0.008
    / -0.003 / -0.027 at r = 0 / 0.5 / 1.0 / 1.5: the strong bidder's top is read off the weak bidder's bids near
    the top bid, with an SD of 0.05-0.08 (the local inversion before: revenue -0.002 / -0.002 / 0.000 / -0.004)."""
    reserves = (0.0, 0.5, 1.0, 1.5) if tops[1] == 2.0 else (0.0, 0.5, 1.0)
    truths = torch.tensor([_second_price_truth(r, tops) for r in reserves], dtype=torch.float64)
    errors = []
    for seed in SEEDS:
        fit = asymmetric_sieve(asymmetric_uniform_equilibrium(5000, tops, seed)[0])
        for k, welfare_only in enumerate((False, True)):
            estimate, sd = fit.revenue_sd(list(reserves), welfare_only)
            assert ((estimate - truths[:, k]).abs() <= 3.5 * sd).all(), (seed, k, estimate - truths[:, k], sd)
        errors.append(torch.stack([fit.revenue_sd(list(reserves), w)[0] for w in (False, True)], 1) - truths)
    mean = torch.stack(errors).mean(0)
    for i, r in enumerate(reserves):
        assert abs(mean[i, 0]) <= (0.03 if r == 1.5 else 0.012 if r == 1.0 else 0.002), r
        assert abs(mean[i, 1]) <= (0.04 if r == 1.5 else 0.012), r


@SHARED_FITS
def test_table_from_logged_bids_matches_the_truth_and_the_logged_play():
    """Seeds 0-4, 5,000 auctions of U[0, 1] x U[0, 2]. first_price_n2 is the logged game: its revenue
    measured within 0.0011 of each log's mean highest bid (sampling error about 0.002) and within 0.005
    of the closed form (welfare within 0.043: it rests on the strong bidder's top, SD 0.05-0.08); other bidder
    counts are skipped, no bound is reported."""
    rules = ["second_price_r0.0", "second_price_r0.5", "first_price_n2", "first_price_n3"]
    revenue, welfare_ = _first_price_truth()
    for seed in SEEDS:
        bids, _ = asymmetric_uniform_equilibrium(5000, seed=seed)
        table, skipped = asymmetric_table(bids, rules)
        assert skipped == ["first_price_n3"]
        assert sorted(table) == sorted(f"{p}/{r}/point" for p in ("cf", "cfw") for r in rules[:3])
        assert table["cf/first_price_n2/point"] == pytest.approx(bids.max(1).values.mean().item(), abs=0.005)
        assert table["cf/first_price_n2/point"] == pytest.approx(revenue, abs=0.012)
        assert table["cfw/first_price_n2/point"] == pytest.approx(welfare_, abs=0.05)


@SHARED_FITS
def test_bounds_hold_the_point_and_the_truth_and_widen():
    """U[0, 1] x U[0, 2], 5,000 auctions, seeds 0-4 of both pairs measured: the truth inside every eps = 0.02
    bound (second price at reserves 0-1.5 and first price, revenue and welfare), no clamp."""
    bids, _ = asymmetric_uniform_equilibrium(5000, seed=1)
    rules = ["second_price_r0.0", "second_price_r1.0", "first_price_n2"]
    points, _ = asymmetric_table(bids, rules)
    bounds, clamps = asymmetric_bounds(bids, rules, points, (0.005, 0.02), ("revenue", "welfare"), n_iters=100)
    assert clamps == []
    truths = {"second_price_r0.0": _second_price_truth(0.0), "second_price_r1.0": _second_price_truth(1.0),
              "first_price_n2": _first_price_truth()}
    for rule, truth in truths.items():
        for prefix, value in zip(("cf", "cfw"), truth):
            low = [bounds[f"{prefix}/{rule}/lower_eps{e}"] for e in ("0.005", "0.02")]
            high = [bounds[f"{prefix}/{rule}/upper_eps{e}"] for e in ("0.005", "0.02")]
            assert low[1] <= low[0] <= points[f"{prefix}/{rule}/point"] <= high[0] <= high[1], (prefix, rule)
            assert low[1] <= value <= high[1], (prefix, rule)


def test_second_price_off_the_grid_on_hand_cases():
    """Piecewise-linear CDFs integrated exactly (hand computations in the comments)."""
    weak, strong = _uniform(1.0), _uniform(2.0)
    # U[0, 1] x U[0, 2]: E[min] = 5/12, E[max] = 2 - int_0^1 x^2 / 2 - int_1^2 x / 2 = 13/12.
    assert second_price_from_cdfs([weak, strong], 0.0) == pytest.approx((5 / 12, 13 / 12), abs=1e-12)
    # Reserve 1.5: only the strong bidder reaches it (probability 1/4) and pays it; welfare int_1.5^2 x / 2 = 7/16.
    assert second_price_from_cdfs([weak, strong], 1.5) == pytest.approx((0.375, 7 / 16), abs=1e-12)
    # The same U[0, 2] written with a kink point at 1 changes nothing.
    kinked = (torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64), torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64))
    assert second_price_from_cdfs([weak, kinked], 0.0) == pytest.approx((5 / 12, 13 / 12), abs=1e-12)
    # F1 = 1.6 x up to 0.5, then 0.8 + 0.4 (x - 0.5); F2 = x: E[min] = int_0^1 (1 - F1)(1 - F2)
    # = int_0^0.5 (1 - 2.6x + 1.6x^2) + int_0^0.5 (0.1 - 0.4y + 0.4y^2) = 0.2416667 + 0.0166667 = 31/120.
    bent = (torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64), torch.tensor([0.0, 0.8, 1.0], dtype=torch.float64))
    assert second_price_from_cdfs([bent, weak], 0.0)[0] == pytest.approx(31 / 120, abs=1e-12)
    # Three U[0, 1] bidders: the symmetric closed forms, any reserve; nothing sells at or above the top.
    for r in (0.0, 0.3, 0.8):
        assert second_price_from_cdfs([weak] * 3, r) == pytest.approx(
            (second_price_revenue(3, r), welfare(3, r)), abs=1e-12)
    assert second_price_from_cdfs([weak, strong], 2.0) == (0.0, 0.0)


def test_win_probabilities_split_ties():
    """Bidder 0 bids 1 surely; bidders 1 and 2 bid 0 or 1 with equal odds: at bid 1 it beats both (1/4),
    ties one (1/2, wins half) or both (1/4, wins a third); at bid 0 it could only win a three-way tie."""
    pmfs = torch.tensor([[0.0, 1.0], [0.5, 0.5], [0.5, 0.5]], dtype=torch.float64)
    win = win_probabilities(pmfs, [1, 1, 1])
    assert win[0].tolist() == pytest.approx([0.25 / 3, 0.25 + 0.5 / 2 + 0.25 / 3])
    # Bidder 1 at bid 0 ties bidder 2 half the time but bidder 0 never bids 0: it never wins there.
    assert win[1].tolist() == pytest.approx([0.0, 0.5 * (1 / 3) + 0.5 * (1 / 2)])


@pytest.mark.parametrize("tops", [(1.0, 2.0), (1.0, 1.5)])
def test_first_price_solver_reproduces_the_closed_form(tops):
    """True U[0, w1] x U[0, w2], no reserve: measured with the one solver (1/k averaging) revenue 0.0003-0.0004
    low, welfare 0.0019-0.0022 low (the two-solver code, which averaged the start in: within 0.0001 and
    0.0014-0.0016 low); fictitious play's average converges like 1/k."""
    revenue, welfare_ = _first_price_truth(tops)
    found = first_price_from_cdfs([_uniform(w) for w in tops])
    assert found.revenue == pytest.approx(revenue, abs=1e-3)
    assert found.welfare == pytest.approx(welfare_, abs=3e-3)


@pytest.mark.parametrize("n_bidders", [2, 3])
@pytest.mark.parametrize("reserve", [0.0, 0.25, 0.5, 0.75])
def test_first_price_solver_with_symmetric_bidders_is_revenue_equivalent(n_bidders, reserve):
    """Symmetric U[0, 1] bidders: first price earns the second-price revenue and welfare (measured within 0.00053)."""
    found = first_price_from_cdfs([_uniform(1.0)] * n_bidders, reserve)
    assert found.revenue == pytest.approx(second_price_revenue(n_bidders, reserve), abs=1e-3)
    assert found.welfare == pytest.approx(welfare(n_bidders, reserve), abs=1e-3)


@pytest.mark.parametrize("tops, reserve", [((1.0, 2.0), 0.25), ((1.0, 2.0), 0.75), ((1.0, 1.5), 0.5)])
def test_first_price_solver_with_a_reserve_matches_backward_shooting(tops, reserve):
    """Asymmetric bidders with a reserve: no revenue equivalence (second price earns 0.453 / 0.547 / 0.486
    here), so the grid solver is held to the ODE solution; measured within 0.00053 (200 cells, 1,000
    iterations; +0.00053, -0.00037, 0.0000 in the order below). Revenue only: the shooting solution gives the bids, welfare would need another quadrature."""
    shooting = _shooting_first_price_revenue(tops, reserve)
    assert abs(shooting - _second_price_truth(reserve, tops)[0]) > 0.01  # revenue equivalence does fail here
    assert first_price_from_cdfs([_uniform(w) for w in tops], reserve).revenue == pytest.approx(shooting, abs=1e-3)


@pytest.mark.slow  # ~5 CPU s; test_bounds_hold_the_point_and_the_truth_and_widen keeps the per-bidder bounds fast
def test_bounds_on_symmetric_data_match_the_pooled_bounds():
    """Both bidders U[0, 2] (5,000 auctions): the per-bidder bounds read like the symmetric path's pooled ones.
    Measured on seeds 0 and 1 with the one solver: within 0.012 at eps 0.001 and 0.069 at eps 0.02 (second
    price r = 0 upper, 1.267 against 1.198 on seed 0), the eps 0.02 bounds themselves 0.6-0.9 wide. Neither
    is converged: Frank-Wolfe on these sets is start-dependent (that bound is 1.263 after 400 iterations from
    the one solver's start, 1.235 from the two-solver code's, which averaged the start into the equilibrium);
    a higher upper bound is the better optimum, not an error. Tolerances: 0.02 at eps 0.001, 0.08 at 0.02."""
    simulated = simulate_first_price_bids(10_000, 2, grid=None, generator=torch.Generator().manual_seed(0),
                                          value_scale=2.0)
    rules, epsilons = ["second_price_r0.0", "second_price_r1.0", "first_price_n2"], (0.001, 0.02)
    pooled = predict_counterfactuals(simulated.bids, 2, rules, epsilons, n_iters=100).table
    points, _ = asymmetric_table(simulated.bids.view(-1, 2), rules)
    bounds, clamps = asymmetric_bounds(simulated.bids.view(-1, 2), rules, points, epsilons, n_iters=100)
    assert clamps == []
    assert sorted(bounds) == sorted(k for k in pooled if "_eps" in k)
    for key, value in bounds.items():
        assert value == pytest.approx(pooled[key], abs=0.02 if key.endswith("eps0.001") else 0.08), key


def test_three_symmetric_bidders_through_the_asymmetric_path():
    """Three U[0, 1] bidders bidding 2v/3 (5,000 auctions), each inverted against the higher of the other two:
    the symmetric closed forms. Measured on seeds 0-4: second price within 0.005 at r = 0 and 0.5, 0.011 at
    0.8; first price within 0.003."""
    rules = ["second_price_r0.0", "second_price_r0.5", "second_price_r0.8", "first_price_n3"]
    for seed in (0, 1):
        bids = simulate_first_price_bids(15_000, 3, grid=None, generator=torch.Generator().manual_seed(seed)).bids
        table, skipped = asymmetric_table(bids.view(-1, 3), rules)
        assert skipped == []
        for key, value in table.items():
            rule = key.split("/")[1]
            statistic = "revenue" if key.startswith("cf/") else "welfare"
            assert value == pytest.approx(symmetric_truth(rule, 3, statistic), abs=0.02 if rule.endswith("0.8") else 0.01), key


def test_a_bidder_with_one_bid_is_refused_by_name():
    """Bidder 1 always bids 0.3: bidder 0 has nothing to be inverted against, and bidder 1 no bid range."""
    bids, _ = asymmetric_uniform_equilibrium(500)
    bids[:, 1] = 0.3
    with pytest.raises(ValueError, match=r"bidder 0 .*competing bids span 0, .*too little to invert against"):
        inverted_value_cdfs(bids)
    with pytest.raises(ValueError, match=r"bidder 0 .*bids span 0, .*too little to invert its values"):
        inverted_value_cdfs(bids.flip(1))

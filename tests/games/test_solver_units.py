"""games/solver.py with SEVERAL populations of bidders, pinned on tiny inputs (mutation testing runs these).

test_rmac_units.py covers one population (the symmetric auction). Here: outcomes of unlike bidders by
enumerating every opponent profile, the nearest grid bid on even and uneven grids by hand, fictitious
play's start under a first-price reserve read off the grid, two populations of one bidder against one
population of two (the same auction), and Frank-Wolfe's first step worked by hand on a three-bid grid.
"""

from __future__ import annotations

import pytest
import torch
from games_testing import enumerate_outcomes

from pipeline.games.rules import Rule
from pipeline.games.solver import (
    Equilibrium,
    best_response_priority,
    break_ties,
    nearest_grid_index,
    power_of_opponents,
    solve_bounds,
    solve_equilibrium,
    tie_tolerance,
    win_and_payment,
    win_probabilities,
)

torch.set_num_threads(1)
F64 = torch.float64

ACTIONS = [0.0, 0.1, 0.2, 0.3, 0.4]
# Two unlike bid distributions: gaps and ties both matter.
PMF_A = [0.1, 0.0, 0.35, 0.25, 0.3]
PMF_B = [0.3, 0.2, 0.0, 0.4, 0.1]


def _opponents(pmfs, counts, p):
    """The pmf of every opponent a bidder of population p faces."""
    return [pmfs[q] for q, n in enumerate(counts) for _ in range(n - (q == p))]


@pytest.mark.parametrize("counts", [[2, 1], [1, 2], [1, 1, 1], [2, 2]])
@pytest.mark.parametrize("kind, reserve", [("first_price", 0.0), ("second_price", 0.0), ("second_price", 0.15)])
def test_win_and_payment_of_unlike_populations_by_enumeration(counts, kind, reserve):
    """Each population's own pmf (A, B, then A again for a third); a batch of two profiles (the second with the
    populations' pmfs swapped round) kept apart."""
    base = [PMF_A, PMF_B, PMF_A][: len(counts)]
    rows = [base, base[::-1]]
    pmfs = torch.tensor(rows, dtype=F64)  # (2, P, A)
    actions = torch.tensor(ACTIONS, dtype=F64)
    win, pay = win_and_payment(pmfs, Rule(kind, reserve=reserve), counts, actions)
    only_win = win_probabilities(pmfs, counts)
    assert win.shape == pay.shape == only_win.shape == (2, len(counts), len(ACTIONS))
    for b, row in enumerate(rows):
        for p in range(len(counts)):
            expected_win, expected_pay = enumerate_outcomes(_opponents(row, counts, p), ACTIONS, reserve, kind == "first_price")
            assert win[b, p].tolist() == pytest.approx(expected_win, abs=1e-12), (b, p)
            assert pay[b, p].tolist() == pytest.approx(expected_pay, abs=1e-12), (b, p)
            if reserve == 0:
                assert only_win[b, p].tolist() == pytest.approx(expected_win, abs=1e-12), (b, p)


def test_one_population_given_as_a_list_keeps_its_axis():
    """bidders=[3] is one population of three alike bidders: the (1, A) answer of bidders=3's (A,)."""
    pmf = torch.tensor([PMF_A], dtype=F64)
    expected, _ = enumerate_outcomes([PMF_A, PMF_A], ACTIONS, 0.0, True)
    got = win_probabilities(pmf, [3])
    assert got.shape == (1, 5) and got[0].tolist() == pytest.approx(expected, abs=1e-12)
    assert power_of_opponents(torch.tensor([[2.0, 3.0]], dtype=F64), [3]).tolist() == [[4.0, 9.0]]


def test_nearest_grid_index_on_even_and_uneven_grids():
    # Even grid (exact quarters): half steps round to the even index, as torch.round does; outside the grid
    # the nearest end.
    quarters = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0], dtype=F64)
    x = torch.tensor([0.125, 0.375, 0.625, 0.875, -0.3, 0.1, 0.2, 1.7], dtype=F64)
    assert nearest_grid_index(x, quarters).tolist() == [0, 2, 2, 4, 0, 0, 1, 4]
    # Uneven grid (a reserve inserted at 0.15): the nearest point by the midpoints 0.05, 0.125, 0.175, 0.3.
    uneven = torch.tensor([0.0, 0.1, 0.15, 0.2, 0.4], dtype=F64)
    x = torch.tensor([0.02, 0.06, 0.12, 0.14, 0.18, 0.29, 0.33, 0.9, -1.0], dtype=F64)
    assert nearest_grid_index(x, uneven).tolist() == [0, 1, 1, 2, 3, 3, 4, 4, 0]
    # Uneven by 5e-6 (relative) only: 1.500001 is nearer 1 than 2.000005, which rounding by the first step
    # (1.500001 -> 2) would miss.
    almost = torch.tensor([0.0, 1.0, 2.000005, 3.0], dtype=F64)
    assert nearest_grid_index(torch.tensor([1.500001, 2.6], dtype=F64), almost).tolist() == [1, 3]


def _uniform(step):
    actions = torch.arange(round(1 / step) + 1, dtype=F64) * step
    types = (actions[:-1] + actions[1:]) / 2
    return actions, types, torch.full_like(types, 1 / types.numel())


def test_first_price_start_with_a_reserve():
    """With no iteration the profile is the start: types below the reserve bid 0, the others their uniform
    first-price guess t / 2 raised to the reserve, each snapped to the nearest grid bid. Types U[0, 1] in cells
    of 0.05, reserve at the 7th type 0.325: 6 types below (mass 0.3 at bid 0); the 7 types 0.325 .. 0.625 bid the
    reserve (0.325: a half step, to 0.30 or 0.35); 0.675 .. 0.975 bid t / 2 = 0.3375 .. 0.4875 -> 0.35, 0.35,
    0.40, 0.40, 0.45, 0.45, 0.50."""
    actions, types, weights = _uniform(0.05)
    reserve = float(types[6])
    start = solve_equilibrium(weights, types, Rule("first_price", reserve=reserve), 2, actions, n_iters=0)
    pmf = start.pmf
    assert pmf.shape == (21,) and float(pmf.sum()) == pytest.approx(1.0)
    assert float(pmf[0]) == pytest.approx(0.30)
    assert pmf[1:6].tolist() == [0.0] * 5
    assert float(pmf[6] + pmf[7]) == pytest.approx(9 / 20)
    assert float(pmf[7]) >= 2 / 20 - 1e-12
    assert pmf[8:11].tolist() == pytest.approx([0.1, 0.1, 0.05])
    assert pmf[11:].tolist() == [0.0] * 10
    # Two populations of one bidder: the same start for each.
    both = solve_equilibrium(weights.expand(2, -1), types, Rule("first_price", reserve=reserve), [1, 1], actions, 0)
    assert both.pmf.shape == (2, 21) and torch.allclose(both.pmf, pmf.expand(2, -1), atol=1e-15)


def test_second_price_start_ignores_the_reserve():
    """Second price starts truthful whatever the reserve: each type at a grid bid within half a cell of it
    (types below the reserve too, never all at 0)."""
    actions, types, weights = _uniform(0.05)
    start = solve_equilibrium(weights, types, Rule("second_price", reserve=0.3), 2, actions, n_iters=0)
    assert float(start.pmf[0]) <= 0.05 + 1e-12
    centre = (start.pmf * actions).sum()
    assert float(centre) == pytest.approx(0.5, abs=0.025)  # the types' mean, up to the snapping


@pytest.mark.parametrize("kind", ["first_price", "second_price"])
@pytest.mark.parametrize("grid", ["uniform", "one_type"])
def test_two_populations_of_one_are_one_population_of_two(kind, grid):
    """Two unlike-in-name bidders with the same type distribution play the same auction as two alike bidders:
    after any number of iterations the same strategy, regret, revenue and welfare for each of them. One type
    only (a lone cell [0, 1]) too."""
    if grid == "uniform":
        actions, types, weights = _uniform(0.1)
    else:
        actions = torch.tensor([0.0, 0.5, 1.0], dtype=F64)
        types, weights = torch.tensor([0.6], dtype=F64), torch.ones(1, dtype=F64)
    rule = Rule(kind)
    for n_iters in (3, 30):
        alike = solve_equilibrium(weights, types, rule, 2, actions, n_iters)
        apart = solve_equilibrium(torch.stack([weights, weights]), types, rule, [1, 1], actions, n_iters)
        assert apart.strategy.shape == (2, types.numel(), actions.numel()) and apart.pmf.shape == (2, actions.numel())
        for p in range(2):
            assert torch.allclose(apart.strategy[p], alike.strategy, atol=1e-12), (n_iters, p)
            assert torch.allclose(apart.pmf[p], alike.pmf, atol=1e-12), (n_iters, p)
            assert torch.allclose(apart.value_mass[p], alike.value_mass, atol=1e-12), (n_iters, p)
        assert apart.regret == pytest.approx(alike.regret, abs=1e-12)
        assert apart.revenue == pytest.approx(alike.revenue, abs=1e-12)
        assert apart.welfare == pytest.approx(alike.welfare, abs=1e-12)
    if kind == "first_price" and grid == "uniform":
        assert alike.regret > 1e-4  # (the regrets compared above are not all zero)


def test_ties_within_rounding_go_to_the_nearest_bid_then_the_lowest():
    """Type 0.25 on the grid 0, 0.1, .., 0.4: 0.2 and 0.3 are equally near (0.05 each, though 0.25 - 0.2 and
    0.3 - 0.25 differ in their last bits), so the even index, 0.2, comes first (round half to even: half the
    half-step types go up, half down); then 0.4 and 0.1 (0.15 away: even first), then 0.0. Type 0.35: 0.4 (index 4)
    before 0.3."""
    actions = torch.tensor(ACTIONS, dtype=F64)
    priority = best_response_priority(torch.tensor([0.25, 0.35], dtype=F64), actions)
    assert priority.argsort(-1).tolist() == [[2, 3, 4, 1, 0], [4, 3, 2, 1, 0]]
    priority = priority[:1]
    flat = torch.zeros(1, 5, dtype=F64)
    ulp = torch.finfo(F64).eps
    for above, below in ((1, 2), (2, 1), (0, 3)):  # the two nearest bids a few ulps apart, either way round
        u = flat.clone()
        u[0, 2], u[0, 3] = 0.5 + above * ulp, 0.5 + below * ulp
        assert break_ties(u, priority, 1e-12).tolist() == [2]
    u = flat.clone()
    u[0, 3] = 1e-9  # a real difference wins over the order
    assert break_ties(u, priority, 1e-12).tolist() == [3]
    u = flat.clone()
    u[0, 2] = -1e-9
    assert break_ties(u, priority, 1e-12).tolist() == [3]


def test_the_tie_tolerance_grows_with_the_terms_and_the_scale():
    actions = torch.tensor(ACTIONS, dtype=F64)
    types = torch.tensor([0.05, 0.15, 0.25, 0.35], dtype=F64)
    one = tie_tolerance(actions, types, [2])
    assert 1e-15 < one < 1e-11  # far above one rounding, far below any real difference of utilities
    assert tie_tolerance(actions * 10, types * 10, [2]) == pytest.approx(10 * one)
    assert tie_tolerance(actions, types, [1, 1, 1]) == pytest.approx(one * 12 / 11)


@pytest.mark.parametrize("kind", ["first_price", "second_price"])
def test_play_is_the_same_whatever_the_last_bits_of_the_input(kind):
    """Type weights moved by one or two ulps (what another CPU's summation order does to the bid distribution
    each iteration) change no best response: the strategies are the same to the bit after 60 iterations."""
    actions, types, weights = _uniform(0.1)
    found = solve_equilibrium(weights, types, Rule(kind), 2, actions, 60)
    jitter = torch.tensor([(-1, 0, 1, 2)[i % 4] for i in range(types.numel())], dtype=F64)
    nudged = weights * (1 + jitter * torch.finfo(F64).eps)
    moved = solve_equilibrium(nudged, types, Rule(kind), 2, actions, 60)
    assert not torch.equal(nudged, weights)
    assert torch.equal(moved.strategy, found.strategy)


def test_unlike_populations_keep_their_own_mass():
    """Population 0 has every type in the top cell, population 1 in the bottom one; second price is truthful
    from the start, so each population's bids are its types snapped (0.85 -> 0.8 or 0.9, 0.05 -> 0.0 or 0.1)."""
    actions, types, _ = _uniform(0.1)
    weights = torch.zeros(2, types.numel(), dtype=F64)
    weights[0, -2], weights[1, 0] = 1.0, 1.0  # types 0.85 and 0.05
    found = solve_equilibrium(weights, types, Rule("second_price"), [1, 1], actions, 50)
    assert float(found.pmf[0, 8:10].sum()) == pytest.approx(1.0) and float(found.pmf[1, 0:2].sum()) == pytest.approx(1.0)
    # The high bidder always wins and pays the low bid (0 or 0.1): revenue in [0, 0.1], welfare 0.85.
    assert found.welfare == pytest.approx(0.85, abs=1e-12)
    assert 0.0 <= found.revenue <= 0.1 + 1e-12


# ---------------------------------------------------------------------------------------------------
# Frank-Wolfe's first step by hand


class _Game:
    """A logged game as solve_bounds reads it: one distinct bid of weight 1, consistent with ``allowed`` types."""

    def __init__(self, allowed):
        self.allowed = torch.tensor([allowed])

    @property
    def class_weight(self):
        return torch.ones(1, dtype=F64)

    def consistent(self, eps):
        return self.allowed


ACT3 = torch.tensor([0.0, 0.5, 1.0], dtype=F64)
TYPES2 = torch.tensor([0.25, 0.75], dtype=F64)


def _start(populations):
    """Everyone bids 0.5."""
    pmf = torch.tensor([[0.0, 1.0, 0.0]] * populations, dtype=F64)
    strategy = torch.zeros(populations, 2, 3, dtype=F64)
    return Equilibrium(strategy, pmf, pmf * 0.5, 0.0, 0.5, 0.5)


def test_one_frank_wolfe_step_by_hand():
    """Second price, two bidders, bids {0, 0.5, 1}, types {0.25, 0.75}, everyone at 0.5. Against that, type 0.25's
    only zero-regret bid is 0 (utility 0 > -0.125 > -0.25), type 0.75's is 1 (0.25 > 0.125 > 0). Revenue is
    E[min of the two bids]; its gradient in the mass at bid a is 2 E[min(a, X)]: 0 at bid 0, 1 at bid 1. So the
    lower bound moves half way to everyone at 0 (revenue 0.25 * 0.5 = 0.125), the upper half way to everyone at
    1 (0.75 * 0.5 + 0.25 * 1 = 0.625) when type 0.75 is allowed; when the logged bid is consistent with type
    0.25 only, the upper bound can only go to 0 too (0.125) unless the point mask adds type 0.75."""
    rule = Rule("second_price")
    only_low = [_Game([True, False])]
    lower, upper = solve_bounds([_Game([True, True])], _one(), rule, 2, ACT3, TYPES2, [0.0],
                                n_iters=1)
    assert lower.tolist() == pytest.approx([0.125]) and upper.tolist() == pytest.approx([0.625])
    lower, upper = solve_bounds(only_low, _one(), rule, 2, ACT3, TYPES2, [0.0], n_iters=1)
    assert lower.tolist() == pytest.approx([0.125]) and upper.tolist() == pytest.approx([0.125])
    mask = [torch.tensor([[False, True]])]
    lower, upper = solve_bounds(only_low, _one(), rule, 2, ACT3, TYPES2, [0.0], n_iters=1, point_masks=mask)
    assert lower.tolist() == pytest.approx([0.125]) and upper.tolist() == pytest.approx([0.625])


def _one():
    """_start for bidders=2 (an int: no population axis)."""
    start = _start(1)
    return Equilibrium(start.strategy[0], start.pmf[0], start.value_mass[0], 0.0, 0.5, 0.5)


def test_one_frank_wolfe_step_with_unlike_populations_by_hand():
    """As above with two populations of one bidder: bidder 0 may take either type, bidder 1 only type 0.25.
    Upper: bidder 0 half way to 1 ({0.5, 1} half each), bidder 1 half way to 0 ({0, 0.5}): E[min] = 0.5 * 0.5 =
    0.25. Lower: both half way to 0: 0.125. Two epsilons run as one batch, each with the same answer here."""
    rule = Rule("second_price")
    games = [_Game([True, True]), _Game([True, False])]
    lower, upper = solve_bounds(games, _start(2), rule, [1, 1], ACT3, TYPES2, [0.0, 0.01], n_iters=1)
    assert lower.tolist() == pytest.approx([0.125, 0.125]) and upper.tolist() == pytest.approx([0.25, 0.25])
    # The populations swapped: the same numbers.
    lower, upper = solve_bounds(games[::-1], _start(2), rule, [1, 1], ACT3, TYPES2, [0.0], n_iters=1)
    assert lower.tolist() == pytest.approx([0.125]) and upper.tolist() == pytest.approx([0.25])


def test_point_masks_must_match_the_logged_games():
    with pytest.raises(ValueError):
        solve_bounds([_Game([True, True])], _one(), Rule("second_price"), 2, ACT3, TYPES2, [0.0], n_iters=1,
                     point_masks=[None, None])

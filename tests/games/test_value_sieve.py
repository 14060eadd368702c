"""The value sieve (`pipeline.games.value_sieve`) on bids with no sampling noise: equilibrium bids at exact quantiles.

Tolerances: the likelihood bins the bids into `BINS` cells of [0, highest bid], so the fit cannot place the
value CDF finer than the mass of one cell (about 2.5 x range / 1000 of it at the bid density's peak on Beta(2, 2)).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.games.rmac import (
    default_bandwidth,
    inverted_value_curve,
    point_value_curve,
    predict_counterfactuals,
)
from pipeline.games.rules import parse_rule
from pipeline.games.value_sieve import BINS, KS_GATE, MIN_BIDS, fit_value_sieve

F64 = torch.float64


def _quantiles(n: int) -> torch.Tensor:
    return (torch.arange(n, dtype=F64) + 0.5) / n


def _beta22_cdf(v: torch.Tensor) -> torch.Tensor:
    return 3 * v**2 - 2 * v**3


def _beta22_bids(n: int) -> torch.Tensor:
    """Beta(2, 2) values at n exact quantiles and their 3-bidder equilibrium bids, closed form:
    b(v) = v - int_0^v F^2 / F(v)^2, int_0^v F^2 = 9 v^5 / 5 - 2 v^6 + 4 v^7 / 7."""
    u = _quantiles(n)
    v = 0.5 + torch.cos((torch.arccos(1 - 2 * u) + 4 * torch.pi) / 3)
    return v - (9 * v**5 / 5 - 2 * v**6 + 4 * v**7 / 7) / _beta22_cdf(v) ** 2


def test_uniform_values_are_recovered_with_degree_one():
    """U[0, 1], 2 bidders, bids v / 2 at 4,000 exact quantiles: uniform is the sieve's degree 1, and the top is the
    highest bid's value, 1 - 0.5 / 4000, within one likelihood bin (1 / BINS of the values)."""
    found = fit_value_sieve(0.5 * _quantiles(4000), 2)
    assert found.degree == 1 and found.misfit < KS_GATE
    assert float(found.values[-1]) == pytest.approx(1 - 0.5 / 4000, abs=1 / BINS)
    inside = found.values < 0.999
    assert torch.allclose(found.cdf[inside], found.values[inside], atol=1 / BINS)


@pytest.mark.parametrize("n_quantiles", [3000, 15000])
def test_a_value_density_vanishing_at_the_top_is_followed(n_quantiles):
    """Beta(2, 2), 3 bidders (the square-root cusp of the bids at the top that the local inversion needs a top
    model for): the value CDF at 0.3-0.95 within the mass of one likelihood bin (0.0016; measured 7e-4 at 3,000
    bids, 2.5e-4 at 15,000), and the fitted bids are the bids' own equilibrium (the CDF of the fitted bid curve
    at the data's bids within the same bin mass)."""
    bids = _beta22_bids(n_quantiles)
    found = fit_value_sieve(bids, 3)
    assert found.misfit < KS_GATE
    at = np.array([0.3, 0.5, 0.7, 0.8, 0.9, 0.95])
    estimate = np.interp(at, found.values.numpy(), found.cdf.numpy())
    assert np.abs(estimate - _beta22_cdf(torch.from_numpy(at)).numpy()).max() < 0.0016
    bid_cdf = np.interp(bids.numpy(), found.bids.numpy(), found.cdf.numpy())
    assert np.abs(bid_cdf - _quantiles(n_quantiles).numpy()).max() < 0.0016


@pytest.mark.parametrize("step", [0.01, 0.05])
def test_rounded_bids_are_read_as_censored_to_their_cells(step):
    """The same Beta(2, 2) bids (15,000 quantiles) rounded to 0.01 and 0.05 (a sixtieth and a twelfth of their
    range): the cells' probabilities are what rounding leaves exact, so the value CDF at 0.3-0.95 stays within the
    unrounded bound, one likelihood bin's mass (measured 1e-4 and 2e-5), the top within 0.005 (measured 1.0000 and
    0.998), and `predict_counterfactuals` takes this fit (the lattice found)."""
    bids = torch.round(_beta22_bids(15000) / step) * step
    found = fit_value_sieve(bids, 3, lattice=step)
    at = np.array([0.3, 0.5, 0.7, 0.8, 0.9, 0.95])
    estimate = np.interp(at, found.values.numpy(), found.cdf.numpy())
    assert np.abs(estimate - _beta22_cdf(torch.from_numpy(at)).numpy()).max() < 0.0016
    assert float(found.values[-1]) == pytest.approx(1.0, abs=0.005)
    point = predict_counterfactuals(bids, 3, ["second_price_r0.5"], [])
    assert point.lattice == pytest.approx(step) and point.inversion.startswith("value sieve (degree 3,")


@pytest.mark.slow
def test_a_distribution_no_polynomial_holds_fails_the_check_and_falls_back():
    """F = sqrt(v) (density infinite at 0), 3 bidders: equilibrium bids v / 2 at 15,000 exact quantiles. No
    Bernstein polynomial of the degrees tried follows it: the fitted bid CDF misses by more than the gate (measured
    4.7), and the point estimate uses the local inversion, bit for bit."""
    bids = 0.5 * _quantiles(15000) ** 2
    assert fit_value_sieve(bids, 3).misfit > KS_GATE
    chosen = point_value_curve(bids, 3, 0.01)
    local = inverted_value_curve(bids, 3, 0.01)
    assert all(torch.equal(a, b) for a, b in zip(chosen[:3], local[:3])) and chosen[3] == local[3]
    assert chosen[4].startswith("local inversion (the value sieve missed the bids by")


def test_second_price_from_the_sieve_matches_the_closed_form():
    """F = v^2, 3 bidders, bids 4v/5 at 5,000 exact quantiles: revenue 24/35 + 3/5 r^5 - 9/7 r^7 within 0.001 at
    r = 0-0.9 (measured 1e-4: the sieve holds v^2 at degree 2; one likelihood bin of the values is 0.001)."""
    reserves = [0.0, 0.3, 0.6, 0.9]
    rules = [parse_rule(f"second_price_r{r:g}").name for r in reserves]
    found = predict_counterfactuals(0.8 * _quantiles(5000).sqrt(), 3, rules, [])
    assert found.inversion.startswith("value sieve (degree 2,") and found.value_top_sd == 0.0
    for rule, r in zip(rules, reserves):
        assert found.table[f"cf/{rule}/point"] == pytest.approx(24 / 35 + 3 / 5 * r**5 - 9 / 7 * r**7, abs=1e-3)


def test_a_given_bandwidth_or_few_bids_keep_the_local_inversion():
    """A bandwidth given (the local fit's own parameter) and logs under MIN_BIDS bids go to the local inversion;
    the sieve refuses too few bids in one line."""
    bids = 0.5 * _quantiles(4000)
    width = default_bandwidth(bids)
    given = point_value_curve(bids, 2, 0.01, bandwidth=width)
    assert torch.equal(given[1], inverted_value_curve(bids, 2, 0.01, bandwidth=width)[1]) and given[3] > 0
    few = 0.5 * _quantiles(MIN_BIDS - 1)
    assert torch.equal(point_value_curve(few, 2, 0.01)[1], inverted_value_curve(few, 2, 0.01)[1])
    with pytest.raises(ValueError, match=f"at least {MIN_BIDS} nonnegative bids"):
        fit_value_sieve(few, 2)

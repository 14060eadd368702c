"""The value sieve (`pipeline.games.value_sieve`) on bids with no sampling noise: equilibrium bids at exact quantiles.

Tolerances: the likelihood bins the bids into `BINS` cells of [0, highest bid], so the fit cannot place the
value CDF finer than the mass of one cell (about 2.5 x range / 1000 of it at the bid density's peak on Beta(2, 2)).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import integrate, special

from pipeline.games.rmac import (
    default_bandwidth,
    inverted_value_curve,
    point_value_curve,
    predict_counterfactuals,
)
from pipeline.games.rules import parse_rule
from pipeline.games.value_sieve import (
    BINS,
    KS_GATE,
    MIN_BIDS,
    POINTS,
    InverseFamily,
    QuantileFamily,
    _elevate,
    fit_sieve,
    fit_value_sieve,
    plug_in_sd,
    second_price,
    untrusted_reserves,
)

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


def _cdf_at(fit, at: np.ndarray, row: int = 0) -> np.ndarray:
    _, values, cdf = fit.curves()
    return np.interp(at, values[row].numpy(), cdf[row].numpy())


def test_uniform_values_are_recovered_with_degree_one():
    """U[0, 1], 2 bidders, bids v / 2 at 4,000 exact quantiles: uniform is degree 1 of the value CDF and quantile
    families (the same model; the first is taken), and the top is the highest bid's value, 1 - 0.5 / 4000, within
    one likelihood bin (1 / BINS of the values)."""
    found = fit_value_sieve(0.5 * _quantiles(4000), 2)
    assert (found.family, found.degree) == ("cdf", 1) and found.misfit < KS_GATE
    assert float(found.values[-1]) == pytest.approx(1 - 0.5 / 4000, abs=1 / BINS)
    inside = found.values < 0.999
    assert torch.allclose(found.cdf[inside], found.values[inside], atol=1 / BINS)


@pytest.mark.parametrize("n_quantiles", [3000, 15000])
def test_a_value_density_vanishing_at_the_top_is_followed(n_quantiles):
    """Beta(2, 2), 3 bidders (the square-root cusp of the bids at the top): the value CDF at 0.3-0.9 within the mass
    of one likelihood bin (0.0016; measured 1.3e-3 at 3,000 bids), and the fitted bids are the bids' own
    equilibrium (the CDF of the fitted bid curve at the data's bids within the same bin mass). The top itself is
    weakly identified (the values 0.97-1 hold 0.3% of the mass: the log-likelihood moves 0.07 between a top of 0.97
    and 1.0 on 3,000 exact quantiles), so only to 5%."""
    bids = _beta22_bids(n_quantiles)
    found = fit_value_sieve(bids, 3)
    assert found.misfit < KS_GATE
    at = np.array([0.3, 0.5, 0.7, 0.8, 0.9])
    assert np.abs(_cdf_at(found, at) - _beta22_cdf(torch.from_numpy(at)).numpy()).max() < 0.0016
    bid_cdf = np.interp(bids.numpy(), found.bids.numpy(), found.cdf.numpy())
    assert np.abs(bid_cdf - _quantiles(n_quantiles).numpy()).max() < 0.0016
    assert float(found.values[-1]) == pytest.approx(1.0, abs=0.05)


def test_a_density_infinite_at_the_bottom_is_held():
    """F = sqrt(v) (density infinite at 0), 3 bidders: equilibrium bids v / 2 at 15,000 exact quantiles. No value-CDF
    polynomial holds it (that family's misfit stays over the gate); its quantile function u^2 is the quantile
    family's degree 2, and its linear bid function the inverse family's degree 0: the chosen fit passes the check
    and reads the CDF within a likelihood bin's mass."""
    bids = 0.5 * _quantiles(15000) ** 2
    found = fit_value_sieve(bids, 3)
    assert (found.family, found.degree) in {("quantile", 2), ("inverse", 0)} and found.misfit < KS_GATE
    at = np.array([0.01, 0.1, 0.3, 0.6, 0.9])
    assert np.abs(_cdf_at(found, at) - np.sqrt(at)).max() < 0.0016
    assert fit_value_sieve(bids, 3, families=("cdf",)).misfit > KS_GATE


@pytest.mark.parametrize("step", [0.01, 0.05])
def test_rounded_bids_are_read_as_censored_to_their_cells(step):
    """The same Beta(2, 2) bids (15,000 quantiles) rounded to 0.01 and 0.05 (a sixtieth and a twelfth of their
    range): the cells' probabilities are what rounding leaves exact, so the value CDF at 0.3-0.9 stays within the
    unrounded bound, and `predict_counterfactuals` takes this fit (the lattice found)."""
    bids = torch.round(_beta22_bids(15000) / step) * step
    found = fit_value_sieve(bids, 3, lattice=step)
    at = np.array([0.3, 0.5, 0.7, 0.8, 0.9])
    assert np.abs(_cdf_at(found, at) - _beta22_cdf(torch.from_numpy(at)).numpy()).max() < 0.0016
    point = predict_counterfactuals(bids, 3, ["second_price_r0.5"], [])
    assert point.lattice == pytest.approx(step) and point.inversion.startswith("value sieve: ")


def test_a_fit_read_in_other_units_is_the_same_fit_scaled():
    """A log is fitted once and read back in any units: the same bids in cents give the values in cents (a fit
    cached in dollars was once read back with the highest bid for the top of the lattice's cells)."""
    bids = torch.round(_beta22_bids(3000) / 0.01) * 0.01
    dollars = fit_value_sieve(bids, 3, lattice=0.01)
    cents = fit_value_sieve(bids * 100, 3, lattice=1.0)
    assert torch.allclose(cents.values, dollars.values * 100, rtol=1e-9)
    assert torch.allclose(cents.cdf, dollars.cdf)


def test_second_price_from_the_sieve_matches_the_closed_form():
    """F = v^2, 3 bidders, bids 4v/5 at 5,000 exact quantiles: revenue 24/35 + 3/5 r^5 - 9/7 r^7 within 0.001 at
    r = 0-0.9 (F = v^2 is the value CDF family's degree 2 and the inverse family's degree 0), with an SD."""
    reserves = [0.0, 0.3, 0.6, 0.9]
    rules = [parse_rule(f"second_price_r{r:g}").name for r in reserves]
    found = predict_counterfactuals(0.8 * _quantiles(5000).sqrt(), 3, rules, [])
    assert found.inversion.startswith("value sieve: ") and found.value_top_sd > 0
    for rule, r in zip(rules, reserves):
        assert found.table[f"cf/{rule}/point"] == pytest.approx(24 / 35 + 3 / 5 * r**5 - 9 / 7 * r**7, abs=1e-3)
        assert found.point_sd[f"cf/{rule}/point"] > 0


def test_unlike_bidders_are_read_by_their_inverse_bid_functions():
    """U[0, 1] vs U[0, 2], each bidder's equilibrium bids at 5,000 exact quantiles of its own values (closed form:
    b1(v) = (1 - sqrt(1 - k v^2)) / (k v), b2(v) = (sqrt(1 + k v^2) - 1) / (k v), k = 3/4): each bidder's value CDF
    within 0.004 at its 10-90% values (measured 1.3e-3) and the strong bidder's top within 2% of 2."""
    u = _quantiles(5000)
    k = 0.75
    weak, strong = u, 2 * u
    bids = torch.stack([(1 - torch.sqrt(1 - k * weak**2)) / (k * weak), (torch.sqrt(1 + k * strong**2) - 1) / (k * strong)], 1)
    found = fit_sieve([bids[:, 0], bids[:, 1]], 2)
    assert found.family == "inverse" and found.misfit < KS_GATE
    for row, top in ((0, 1.0), (1, 2.0)):
        at = top * np.linspace(0.1, 0.9, 9)
        assert np.abs(_cdf_at(found, at, row) - at / top).max() < 0.004
    assert float(found.curves()[1][1, -1]) == pytest.approx(2.0, rel=0.02)


def test_degree_elevation_keeps_the_polynomial():
    coefficients = torch.tensor([0.3, -1.0, 2.0, 0.5], dtype=F64)
    x = np.linspace(0, 1, 11)

    def value(c):
        m = c.numel() - 1
        j = np.arange(m + 1)[:, None]
        basis = special.comb(m, j) * x**j * (1 - x) ** (m - j)
        return c.numpy() @ basis

    assert np.allclose(value(_elevate(coefficients, 3)), value(coefficients), atol=1e-12)


@pytest.mark.parametrize("n_bidders", [2, 4])
def test_the_quantile_familys_bids_are_its_equilibrium(n_bidders):
    """The quantile family's closed-form bid components against B(u) = (n - 1) u^-(n-1) int_0^u Q(s) s^(n-2) ds by
    quadrature, for a degree-4 Q with uneven weights: within 1e-9."""
    family = QuantileFamily(4, 1, n_bidders)
    shape = torch.tensor([0.5, -1.0, 0.2, 1.0], dtype=F64)
    bids, values, cdf = family.curves(shape, torch.tensor(0.0, dtype=F64), torch.tensor(1.0, dtype=F64))
    weights = torch.softmax(shape, 0).numpy()
    u = cdf[0].numpy()

    def q(s):
        k = np.arange(1, 5)
        return float(weights @ special.betainc(k, 4 - k + 1, s))

    for i in (200, 1000, POINTS - 1):
        integral = integrate.quad(lambda s: q(s) * s ** (n_bidders - 2), 0, u[i], epsabs=1e-13)[0]
        shape_bid = (n_bidders - 1) * integral / u[i] ** (n_bidders - 1)
        scale = float(values[0, -1])  # values are Q scaled so that the top bid is 1
        assert float(bids[0, i]) == pytest.approx(shape_bid * scale, abs=1e-9)


def test_a_constant_inverse_bid_slope_is_a_power_law():
    """psi = c constant: phi(b) = b (1 + c), d log G / db = 1 / ((n - 1) c b), so G(b) = b^(1 / ((n - 1) c)) on
    [0, 1]: with c = 1 / (2 a), 3 bidders, the bid CDF is b^a."""
    family = InverseFamily(0, 1, 3)
    a = 0.5
    bids, values, cdf = family.curves(torch.tensor([np.log(1 / (2 * a))], dtype=F64), torch.tensor(0.0, dtype=F64),
                                      torch.tensor(1.0, dtype=F64))
    assert torch.allclose(cdf[0], bids[0] ** a, atol=1e-12)
    assert torch.allclose(values[0], bids[0] * (1 + 1 / (2 * a)))


def test_a_known_reserve_is_read_as_a_truncation():
    """U[0, 1], 3 bidders, a hard reserve 0.3: the values over it bid b = (2 v^3 + R^3) / (3 v^2) (equilibrium with a
    reserve), at exact quantiles of the values over R; the values under it are logged as 0 (30% of the bids). The
    sieve with the reserve known reads F(R) = 0.3 off the zeros and the value CDF above R within 0.002."""
    reserve, n = 0.3, 9000
    above = reserve + (1 - reserve) * _quantiles(int(n * (1 - reserve)))
    bids = (2 * above**3 + reserve**3) / (3 * above**2)
    found = fit_sieve([bids], 3, families=("cdf",), reserve=reserve, zeros=[int(n * reserve)])
    at = np.array([0.3, 0.4, 0.6, 0.8, 0.95])
    assert np.abs(_cdf_at(found, at) - at).max() < 0.002


def test_the_values_sampling_sd_is_the_empirical_revenues_spread():
    """plug_in_sd against Monte Carlo: the SD of the second-price revenue read off the empirical CDF of 2 x 2,000
    uniform values, over 400 samples, at r = 0.3 and 0.7 (within 12%: the Monte Carlo SD's own SE is 3.5%)."""
    reserves = torch.tensor([0.3, 0.7], dtype=F64)
    x = torch.linspace(0, 1, 2001, dtype=F64)
    sd = plug_in_sd((x[None], x[None], x[None]), [2], reserves, 2000)
    rng = np.random.default_rng(0)
    revenues = []
    for _ in range(400):
        v = np.sort(rng.random(4000))
        curve = torch.from_numpy(np.concatenate([[0.0], v]))[None]
        level = torch.from_numpy(np.arange(4001) / 4000)[None]
        revenues.append(second_price((curve, curve, level), [2], reserves).numpy())
    assert sd.numpy() == pytest.approx(np.std(revenues, 0, ddof=1), rel=0.12)


def test_untrusted_reserves_say_why():
    found = untrusted_reserves([0.5, 0.8, 0.9, 0.95, 1.0], sd=[0.001, 0.01, 0.001, 0.001, 0.0],
                               floor=[0.002, 0.002, 0.002, 0.002, 0.0], top=1.0, top_sd=0.03,
                               points=[0.4, 0.2, 0.05, 0.01, 0.0], rivals={"local inversion": [0.401, 0.2, 0.03, 0.01, 0.0]},
                               tail=0.97)
    assert sorted(found) == [0.8, 0.9, 0.95, 1.0]
    assert found[0.8].startswith("SD 0.01, 5.0x the values' own sampling SD")
    assert found[0.9].startswith("the local inversion reads 0.03 against 0.05, 10.0x")
    assert found[0.95].startswith("within 2 SDs of the estimated top 1")
    assert found[1.0].startswith("within 2 SDs")


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

"""The value sieve's model choice (`pipeline.games.value_sieve`: degree and family by BIC) where AIC and BIC disagree.

Values with F(v) = 0.89 v^2 + 0.11 v^3 (a Bernstein CDF of degree 3, mostly a degree-2 one), 3 bidders, their
equilibrium bids at 5,000 exact quantiles (closed form: b(v) = v - int_0^v F^2 / F(v)^2). Degree 3 adds 2.36 to the
log-likelihood of degree 2 (measured): more than AIC's price of a parameter (1), less than BIC's (log(5000) / 2 = 4.26),
so BIC keeps degree 2 (its value CDF 0.0098 off at 0.05-0.95, measured) where AIC would take degree 3 (6e-4 off).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from pipeline.games.value_sieve import PATIENCE, fit_value_sieve

N, SHARE = 5000, 0.11


def value_cdf(v: np.ndarray) -> np.ndarray:
    return (1 - SHARE) * v**2 + SHARE * v**3


def equilibrium_bids() -> torch.Tensor:
    u = (np.arange(N) + 0.5) / N
    grid = np.linspace(0.0, 1.0, 400_001)
    v = np.interp(u, value_cdf(grid), grid)  # F is increasing: its inverse on a fine grid (1e-6 off at most)
    # int_0^v F^2 for F = a v^2 + c v^3: a^2 v^5 / 5 + a c v^6 / 3 + c^2 v^7 / 7
    a, c = 1 - SHARE, SHARE
    integral = a * a * v**5 / 5 + a * c * v**6 / 3 + c * c * v**7 / 7
    return torch.from_numpy(v - integral / value_cdf(v) ** 2)


def test_the_degree_is_the_one_bic_chooses_where_aic_would_choose_another():
    fit = fit_value_sieve(equilibrium_bids(), 3, families=("cdf",))
    # Each candidate's free parameters: degree - 1 weights on the simplex and the two ends of the bids.
    params = {c.family.degree: c.family.degree + 1 for c in fit.candidates}
    loglik = {c.family.degree: c.log_likelihood for c in fit.candidates}
    aic = {d: -2 * loglik[d] + 2 * params[d] for d in loglik}
    bic = {d: -2 * loglik[d] + math.log(N) * params[d] for d in loglik}
    assert min(aic, key=aic.get) == 3 and min(bic, key=bic.get) == 2  # the set-up: the criteria disagree
    assert fit.degree == 2
    # The search goes PATIENCE degrees past the best BIC, then stops.
    assert [c.family.degree for c in fit.candidates] == [1, 2, *range(3, 3 + PATIENCE)]
    # The chosen curve is that degree's (the value CDF 0.0098 off where degree 3's is 6e-4: between them).
    at = np.linspace(0.05, 0.95, 91)
    error = np.abs(np.interp(at, fit.values.numpy(), fit.cdf.numpy()) - value_cdf(at)).max()
    assert 0.005 < error < 0.015

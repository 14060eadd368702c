"""games/asymmetric.py pieces pinned by hand on tiny inputs (fast; mutation testing runs these with
test_asymmetric.py): the rough top of a bidder's values, the closed-form equilibrium with a weak bidder other
than U[0, 1], and the bandwidth reaching each bidder's inversion."""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.games.asymmetric import (
    _rough_top,
    asymmetric_uniform_equilibrium,
    highest_competing_bids,
    inverted_value_cdf_of_bidder,
    inverted_value_cdfs,
)

F64 = torch.float64


def _silverman(x: list[float]) -> float:
    """Silverman's rule of thumb 1.06 * std * n^(-1/5) (sample std)."""
    mean = sum(x) / len(x)
    std = math.sqrt(sum((v - mean) ** 2 for v in x) / (len(x) - 1))
    return 1.06 * std * len(x) ** -0.2


def test_rough_top_is_b_plus_h_over_a_window_density():
    """b + H(b) / h(b) at the highest bid b = 2: H = P(M <= 2) = 3/5 of the competing bids, h the share of them
    within half a Silverman width of 2 (1.8, 2 and 2.2: the width is 1.09) over the width: b + width."""
    competing = [0.0, 1.8, 2.0, 2.2, 4.0]
    width = _silverman(competing)
    assert 0.5 < width < 3.5  # (1.8, 2.0 and 2.2 within width / 2 of 2; 0 and 4 not)
    expected = 2.0 + (3 / 5) / ((3 / 5) / width)
    got = _rough_top(torch.tensor([0.5, 2.0, 1.0], dtype=F64), torch.tensor(competing, dtype=F64))
    assert got == pytest.approx(expected, rel=1e-12)


def test_rough_top_with_nobody_near_the_top_counts_one_competing_bid_there():
    """No competing bid within the window around b = 5: the density is taken as one bid in the window,
    1 / (n width), so the top is b + H n width (H = 4/5 here)."""
    competing = [0.0, 0.1, 0.2, 0.3, 10.0]
    width = _silverman(competing)
    assert width / 2 < 4.7  # (nothing within the window around 5)
    got = _rough_top(torch.tensor([1.0, 5.0], dtype=F64), torch.tensor(competing, dtype=F64))
    assert got == pytest.approx(5.0 + (4 / 5) * 5 * width, rel=1e-12)


def test_closed_form_equilibrium_with_a_weak_bidder_of_top_one_half():
    """U[0, 0.5] against U[0, 1] (Krishna 4.3): k = 1/0.25 - 1 = 3, the inverse bid functions
    v1(b) = 2b / (1 + 3b^2), v2(b) = 2b / (1 - 3b^2), both bidding up to 0.5 * 1 / 1.5 = 1/3."""
    bids, values = asymmetric_uniform_equilibrium(2_000, tops=(0.5, 1.0), seed=3)
    assert float(values[:, 0].max()) <= 0.5 and float(values[:, 1].max()) > 0.5
    b1, b2 = bids[:, 0], bids[:, 1]
    assert (2 * b1 / (1 + 3 * b1**2)).tolist() == pytest.approx(values[:, 0].tolist(), abs=1e-9)
    assert (2 * b2 / (1 - 3 * b2**2)).tolist() == pytest.approx(values[:, 1].tolist(), abs=1e-9)
    assert float(bids.max()) <= 1 / 3 + 1e-12 and float(bids.max()) > 1 / 3 - 0.01


def test_a_given_bandwidth_reaches_every_bidders_inversion():
    """inverted_value_cdfs with a bandwidth is each column's inversion with that bandwidth (no cap: max_value
    far above), and another bandwidth gives other values."""
    bids, _ = asymmetric_uniform_equilibrium(400, seed=1)
    competing = highest_competing_bids(bids)
    for bandwidth in (0.03, 0.12):
        got = inverted_value_cdfs(bids, bandwidth=bandwidth, max_value=100.0)
        for i, (values, cdf) in enumerate(got):
            want_values, want_cdf, _, _ = inverted_value_cdf_of_bidder(bids[:, i], competing[:, i], bandwidth)
            assert torch.equal(values, want_values) and torch.equal(cdf, want_cdf), (bandwidth, i)
    narrow = inverted_value_cdfs(bids, bandwidth=0.03, max_value=100.0)
    wide = inverted_value_cdfs(bids, bandwidth=0.12, max_value=100.0)
    assert not torch.allclose(narrow[1][0], wide[1][0])

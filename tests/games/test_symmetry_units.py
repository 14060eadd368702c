"""games/symmetry.py on bids small enough that the Kolmogorov-Smirnov p-values are known by hand.

Two bidders of five auctions each whose bids do not overlap at all: the exact two-sided KS p-value is
2 / C(10, 5) = 2/252 (only the two fully separated orderings of the ten pooled bids are that extreme).
Bids shifted by 2 overlap in three of five: the exact p-value is 220/252 (scipy's exact method).
"""

from __future__ import annotations

import pytest
import torch

from pipeline.games.symmetry import symmetry_test

SEPARATE = 2 / 252  # the exact p-value of two fully separated samples of five


def bids(*columns: list[float]) -> torch.Tensor:
    """(auctions, bidders) with column i = bidder i, float32 as a run logs them."""
    return torch.tensor(list(zip(*columns)), dtype=torch.float32)


LOW = [0.0, 1.0, 2.0, 3.0, 4.0]
HIGH = [10.0, 11.0, 12.0, 13.0, 14.0]
HIGHER = [20.0, 21.0, 22.0, 23.0, 24.0]
SHIFTED = [2.0, 3.0, 4.0, 5.0, 6.0]


def test_two_separate_bidders_are_rejected_at_the_default_level():
    found = symmetry_test(bids(LOW, HIGH))
    assert found == {
        "test": "pairwise two-sample Kolmogorov-Smirnov, Bonferroni over pairs",
        "level": 0.01,
        "min_p_value": pytest.approx(SEPARATE, rel=1e-12),
        "least_alike_pair": "0-1",
        "p_values": {"0-1": pytest.approx(SEPARATE, rel=1e-12)},
        "rejected": True,
    }
    assert type(found["rejected"]) is bool and type(found["min_p_value"]) is float


def test_a_p_value_at_the_level_is_not_below_it():
    assert symmetry_test(bids(LOW, HIGH), level=SEPARATE)["rejected"] is False
    assert symmetry_test(bids(LOW, HIGH), level=0.008)["rejected"] is True
    assert symmetry_test(bids(LOW, HIGH), level=0.0079)["rejected"] is False


def test_the_level_is_split_over_the_pairs():
    """Three mutually separate bidders: three pairs at 2/252 each; rejected only when level / 3 exceeds 2/252."""
    three = bids(LOW, HIGH, HIGHER)
    found = symmetry_test(three)
    assert found["p_values"] == {
        "0-1": pytest.approx(SEPARATE, rel=1e-12),
        "0-2": pytest.approx(SEPARATE, rel=1e-12),
        "1-2": pytest.approx(SEPARATE, rel=1e-12),
    }
    assert found["rejected"] is False  # 2/252 = 0.0079 is not below 0.01 / 3
    assert symmetry_test(three, level=0.03)["rejected"] is True  # 0.03 / 3 = 0.01
    assert symmetry_test(three, level=0.02)["rejected"] is False  # 0.02 / 3 = 0.0067


def test_the_least_alike_pair_is_the_one_with_the_smallest_p_value():
    """Bidders 0 and 2 overlap (p = 220/252), bidder 1 is apart from both (2/252 each): the first of those."""
    found = symmetry_test(bids(LOW, HIGH, SHIFTED), level=0.5)
    assert found["p_values"] == {
        "0-1": pytest.approx(SEPARATE, rel=1e-12),
        "0-2": pytest.approx(220 / 252, rel=1e-12),
        "1-2": pytest.approx(SEPARATE, rel=1e-12),
    }
    assert found["least_alike_pair"] == "0-1"
    assert found["min_p_value"] == pytest.approx(SEPARATE, rel=1e-12)
    assert found["rejected"] is True and found["level"] == 0.5


def test_alike_bidders_are_not_rejected():
    found = symmetry_test(bids(LOW, SHIFTED), level=0.5)
    assert found["p_values"] == {"0-1": pytest.approx(220 / 252, rel=1e-12)}
    assert found["rejected"] is False


@pytest.mark.parametrize("level", [0.0, 1.0, -0.1, 1.5])
def test_a_level_outside_zero_one_is_refused(level):
    with pytest.raises(ValueError, match=rf"^symmetry level={level}; use a probability in \(0, 1\), e\.g\. 0\.01$"):
        symmetry_test(bids(LOW, HIGH), level=level)


def test_the_least_alike_pair_need_not_be_the_first_pair():
    """Bidders 0 and 1 overlap (220/252), bidder 2 is apart from both: the pair 0-2 is the least alike."""
    found = symmetry_test(bids(LOW, SHIFTED, HIGH))
    assert found["least_alike_pair"] == "0-2"
    assert found["min_p_value"] == pytest.approx(SEPARATE, rel=1e-12)
    assert found["rejected"] is False  # 2/252 is not below 0.01 / 3

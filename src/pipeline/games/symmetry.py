"""Are the logged bidders alike? A two-sample test between every pair of bidders' bid distributions.

Under symmetric independent private values every bidder bids from the same distribution, so the
pooled inversion is valid only when the bidders' bid distributions agree. Each pair is compared with
the two-sample Kolmogorov-Smirnov test (scipy), Bonferroni-corrected over the pairs; symmetry is
rejected when the smallest p-value is below ``level / n_pairs``.
"""

from __future__ import annotations

from itertools import combinations

import numpy as np
from scipy.stats import ks_2samp
from torch import Tensor

TEST = "pairwise two-sample Kolmogorov-Smirnov, Bonferroni over pairs"


def symmetry_test(bids: Tensor, level: float = 0.01) -> dict:
    """``bids`` (auctions, bidders), column i = bidder i. Returns the decision with what it rests on."""
    if not 0 < level < 1:
        raise ValueError(f"symmetry level={level}; use a probability in (0, 1), e.g. 0.01")
    columns = np.asarray(bids, dtype=np.float64).T
    pairs = list(combinations(range(columns.shape[0]), 2))
    p_values = {f"{i}-{j}": float(ks_2samp(columns[i], columns[j]).pvalue) for i, j in pairs}
    worst = min(p_values, key=p_values.get)
    rejected = p_values[worst] < level / len(pairs)
    return {"test": TEST, "level": level, "min_p_value": p_values[worst], "least_alike_pair": worst,
            "p_values": p_values, "rejected": bool(rejected)}

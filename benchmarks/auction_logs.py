"""Test logs for the auction estimator, built from closed forms the estimator never reads.

Each case is a first-price auction with independent private values and its exact equilibrium bids:

- ``beta22_n3``: values Beta(2, 2), F = 3v^2 - 2v^3, 3 bidders; b(v) = v - int_0^v F^2 / F(v)^2 in closed form
  (int_0^v F^2 = 9v^5/5 - 2v^6 + 4v^7/7).
- ``v2_n4``: F = v^2, 4 bidders; b(v) = 6v/7.
- ``uniform_n3``: U[0, 1], 3 bidders; b(v) = 2v/3.
- ``asym_1_2``: one bidder U[0, 1], one U[0, 2]; with k = 1 - 1/4 the inverse bids are v1(b) = 2b / (1 + k b^2),
  v2(b) = 2b / (1 - k b^2) (Krishna, Auction Theory, 4.3), so b1(v) = (1 - sqrt(1 - k v^2)) / (k v) and
  b2(v) = (sqrt(1 + k v^2) - 1) / (k v).

For each case: ``truth`` (second-price revenue at a reserve, by adaptive quadrature of the exact CDFs,
revenue = r (F2(r) - F1(r)) + T - r F2(r) - int_r^T F2 with F1, F2 the CDFs of the highest and second-highest
value) and ``oracle`` (the same formula with each bidder's EMPIRICAL value CDF from the true values of the same
auctions: what the statistic would read if the values were seen; pooled over bidders for symmetric cases).
``write_csv`` writes a log in either file layout, rounded to a currency step or with some bids set to 0.
`python benchmarks/auction_logs.py --case beta22_n3 --n 5000 --seed 0 --out bids.csv [--round 0.05]`
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import integrate


def _beta22_cdf(v):
    v = np.clip(v, 0.0, 1.0)
    return 3 * v**2 - 2 * v**3


def _beta22_ppf(u):
    # the root in [0, 1] of 3v^2 - 2v^3 = u (trigonometric form of the cubic)
    return np.clip(0.5 + np.cos((np.arccos(1 - 2 * np.asarray(u)) + 4 * np.pi) / 3), 0.0, 1.0)


def _beta22_bid(v):
    v = np.asarray(v, dtype=np.float64)
    integral = 9 * v**5 / 5 - 2 * v**6 + 4 * v**7 / 7
    big = _beta22_cdf(v) ** 2
    small = v < 1e-3  # series at 0: b = v - (9/5 v^5) / (9 v^4) + ... = 4v/5 - ...
    safe = np.where(small, 1.0, big)
    return np.where(small, 0.8 * v, v - integral / safe)


@dataclass(frozen=True)
class Case:
    name: str
    n_bidders: int
    tops: tuple[float, ...]  # per bidder (symmetric: one)
    reserves: tuple[float, ...]

    @property
    def symmetric(self) -> bool:
        return len(self.tops) == 1

    def cdfs(self):
        """Per bidder, the exact value CDF."""
        if self.name == "beta22_n3":
            return [_beta22_cdf] * 3
        if self.name == "v2_n4":
            return [lambda v: np.clip(v, 0, 1) ** 2] * 4
        if self.name == "uniform_n3":
            return [lambda v: np.clip(v, 0, 1)] * 3
        return [lambda v: np.clip(v, 0, 1), lambda v: np.clip(v / 2, 0, 1)]

    def draw(self, n_auctions: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """(values, bids), each (auctions, bidders), the bids the exact equilibrium of those values."""
        rng = np.random.default_rng(seed)
        u = rng.random((n_auctions, self.n_bidders))
        if self.name == "beta22_n3":
            values = _beta22_ppf(u)
            return values, _beta22_bid(values)
        if self.name == "v2_n4":
            values = np.sqrt(u)
            return values, 6 * values / 7
        if self.name == "uniform_n3":
            return u, 2 * u / 3
        values = u * np.array([1.0, 2.0])
        k = 1 - 1 / 4
        v1, v2 = np.maximum(values[:, 0], 1e-12), np.maximum(values[:, 1], 1e-12)
        b1 = (1 - np.sqrt(1 - k * v1**2)) / (k * v1)
        b2 = (np.sqrt(1 + k * v2**2) - 1) / (k * v2)
        return values, np.stack([b1, b2], 1)


CASES = {
    "beta22_n3": Case("beta22_n3", 3, (1.0,), tuple(np.round(np.arange(0, 1.01, 0.1), 2))),
    "v2_n4": Case("v2_n4", 4, (1.0,), tuple(np.round(np.arange(0, 1.01, 0.1), 2))),
    "uniform_n3": Case("uniform_n3", 3, (1.0,), tuple(np.round(np.arange(0, 1.01, 0.1), 2))),
    "asym_1_2": Case("asym_1_2", 2, (1.0, 2.0), tuple(np.round(np.arange(0, 2.01, 0.2), 2))),
}


def _order_cdfs(fs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    f = np.stack(fs)
    first = f.prod(0)
    second = first.copy()
    for i in range(f.shape[0]):
        second += (1 - f[i]) * np.prod(np.delete(f, i, 0), 0)
    return first, second


def truth(case: Case, reserve: float) -> float:
    """Exact second-price revenue with ``reserve`` (quadrature to ~1e-10)."""
    top = max(case.tops)
    if reserve >= top:
        return 0.0
    cdfs = case.cdfs()

    def f2(x):
        return float(_order_cdfs([np.atleast_1d(F(x)) for F in cdfs])[1][0])

    first, second = (float(a[0]) for a in _order_cdfs([np.atleast_1d(F(reserve)) for F in cdfs]))
    breaks = [t for t in case.tops if reserve < t < top]
    integral, _ = integrate.quad(f2, reserve, top, points=breaks or None, limit=200, epsabs=1e-12)
    return reserve * (second - first) + top - reserve * second - integral


def oracle(case: Case, values: np.ndarray, reserve: float) -> float:
    """The same revenue with each bidder's empirical value CDF (pooled over bidders when they are alike)."""
    samples = [values.ravel()] if case.symmetric else [values[:, i] for i in range(values.shape[1])]
    samples = [np.sort(s) for s in samples] * (case.n_bidders if case.symmetric else 1)
    top = max(float(s[-1]) for s in samples)
    if reserve >= top:
        return 0.0
    knots = np.unique(np.concatenate([[reserve], *[s[s > reserve] for s in samples]]))  # F2 is a step function

    def cdfs_at(x):
        return [np.searchsorted(s, x, side="right") / s.size for s in samples]

    first_r, second_r = (float(a[0]) for a in _order_cdfs(cdfs_at(np.array([reserve]))))
    _, second = _order_cdfs(cdfs_at(knots[:-1]))
    integral = float((second * np.diff(knots)).sum())
    return reserve * (second_r - first_r) + top - reserve * second_r - integral


def inverse_bids(case: Case, bids: np.ndarray) -> np.ndarray:
    """The exact equilibrium's value of each bid (same shape as ``bids``, (auctions, bidders))."""
    if case.name == "uniform_n3":
        return 1.5 * bids
    if case.name == "v2_n4":
        return 7 * bids / 6
    if case.name == "beta22_n3":
        grid = np.linspace(0.0, 1.0, 200_001)
        return np.interp(bids, _beta22_bid(grid), grid)  # b(v) increases
    k = 1 - 1 / 4
    b1, b2 = bids[:, 0], bids[:, 1]
    return np.stack([2 * b1 / (1 + k * b1**2), 2 * b2 / (1 - k * b2**2)], 1)


def bids_oracle_values(case: Case, bids: np.ndarray) -> np.ndarray:
    """GPV's pseudo-values with the TRUE bid density and the bids' EMPIRICAL CDF: v = b + G_hat(b) / ((n - 1) g(b)).

    g is the exact equilibrium's bid density, written through the first-order condition as g = G / ((n - 1) (v - b))
    with G the exact bid CDF (symmetric: F(v(b)); asymmetric: the other bidder's, F_j(v_j(b))), so
    v_hat = b + (G_hat(b) / G(b)) (v(b) - b). With G_hat = G this is the true value; the difference is the
    sampling of the bids' CDF alone, the floor for an estimator that reads the density perfectly from the bids.
    ``oracle(case, bids_oracle_values(case, bids), r)`` is then the bids-only oracle's revenue."""
    exact = inverse_bids(case, bids)
    cdfs = case.cdfs()
    if case.symmetric:
        pooled = np.sort(bids.ravel())
        level = np.searchsorted(pooled, bids, side="right") / pooled.size
        truth_level = cdfs[0](exact)
    else:  # two bidders: each one's competing bid is the other's
        other = [np.sort(bids[:, 1]), np.sort(bids[:, 0])]
        level = np.stack([np.searchsorted(other[i], bids[:, i], side="right") / other[i].size for i in (0, 1)], 1)
        swapped = inverse_bids(case, np.ascontiguousarray(bids[:, ::-1]))  # column j: bidder j's value of the other's bid
        truth_level = np.stack([cdfs[1 - i](swapped[:, 1 - i]) for i in (0, 1)], 1)
    ratio = np.where(truth_level > 0, level / np.maximum(truth_level, 1e-300), 1.0)
    return bids + ratio * (exact - bids)


def write_csv(path: str | Path, bids: np.ndarray, layout: str = "wide", step: float | None = None,
              zero_share: float = 0.0, seed: int = 0) -> Path:
    """Write ``bids`` (auctions, bidders) as ``bid_0,...`` (``wide``) or ``auction_id,bid`` (``long``) rows,
    rounded to ``step`` when given, with a ``zero_share`` of bids (chosen at random) set to 0."""
    bids = bids.copy()
    if step:
        bids = np.round(bids / step) * step
    if zero_share:
        rng = np.random.default_rng(seed + 7919)
        bids[rng.random(bids.shape) < zero_share] = 0.0
    path = Path(path)
    with path.open("w") as f:
        if layout == "wide":
            f.write(",".join(f"bid_{i}" for i in range(bids.shape[1])) + "\n")
            np.savetxt(f, bids, fmt="%.8g", delimiter=",")
        else:
            f.write("auction_id,bid\n")
            ids = np.repeat(np.arange(bids.shape[0]), bids.shape[1])
            np.savetxt(f, np.stack([ids, bids.ravel()], 1), fmt=["%d", "%.8g"], delimiter=",")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES), default="beta22_n3")
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layout", choices=["wide", "long"], default="wide")
    parser.add_argument("--round", type=float, default=None)
    parser.add_argument("--zeros", type=float, default=0.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    case = CASES[args.case]
    values, bids = case.draw(args.n, args.seed)
    write_csv(args.out, bids, args.layout, args.round, args.zeros, args.seed)
    for r in case.reserves:
        print(f"r={r:g}: truth {truth(case, r):.6f} oracle {oracle(case, values, r):.6f}")


if __name__ == "__main__":
    main()

"""Test logs for the auction estimator, built from value distributions and equilibria the estimator never reads.

A case is a first-price auction with independent private values and its exact equilibrium bids:

- alike bidders (``Family``): any value distribution on [lo, hi] (CDF, quantile function), n bidders, bids
  b(v) = v - int_lo^v F^(n-1) / F(v)^(n-1) (cumulative Simpson on 400,001 points, error < 1e-9), or with a hard
  reserve R: values under R do not bid, the others bid b_R(v) = v - int_R^v F^(n-1) / F(v)^(n-1).
- two unlike bidders (``Pair``): each with its own distribution on [0, top_i]; the inverse bid functions solve
  phi_i'(b) = F_i(phi_i) / (f_i(phi_i) (phi_j(b) - b)), phi_i(top bid) = top_i, shot backwards from a trial top
  bid (too high when a value meets its bid above 0) and bisected (scipy's DOP853, rtol 1e-11). On U[0, 1] vs
  U[0, 2] this matches the closed form (Krishna, Auction Theory, 4.3) within 1e-8.

For each case: ``truth`` (second-price revenue at a reserve, by adaptive quadrature of the exact CDFs,
revenue = r (F2(r) - F1(r)) + T - r F2(r) - int_r^T F2 with F1, F2 the CDFs of the highest and second-highest
value), ``oracle`` (the same formula with each bidder's EMPIRICAL value CDF from the true values of the same
auctions; pooled over alike bidders) and ``bids_oracle_values`` (GPV's pseudo-values with the TRUE bid density:
the floor for an estimator that reads the bid density perfectly). ``write_csv`` writes a log in either file
layout, rounded to a currency step, with some bids set to 0, or with a mass point.
`python benchmarks/auction_logs.py --case beta22_n3 --n 5000 --seed 0 --out bids.csv [--round 0.05]`
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
from scipy import integrate, stats

GRID = 400_001  # points of [lo, hi] on which an alike bidders' equilibrium is computed


@dataclass(frozen=True)
class Dist:
    """A value distribution on [lo, hi]: CDF and quantile function (vectorised), and a sampler."""

    name: str
    lo: float
    hi: float
    cdf_fn: object
    ppf_fn: object
    sample_fn: object = None  # (rng, shape) -> values; None: ppf of uniforms

    def cdf(self, v):
        return np.clip(self.cdf_fn(np.clip(np.asarray(v, dtype=np.float64), self.lo, self.hi)), 0.0, 1.0)

    def ppf(self, u):
        return np.clip(self.ppf_fn(np.asarray(u, dtype=np.float64)), self.lo, self.hi)

    def sample(self, rng: np.random.Generator, shape) -> np.ndarray:
        return self.sample_fn(rng, shape) if self.sample_fn is not None else self.ppf(rng.random(shape))


def _scipy(name: str, frozen) -> Dist:
    lo, hi = frozen.support()
    return Dist(name, float(lo), float(hi), frozen.cdf, frozen.ppf)


def _truncated(name: str, frozen, hi: float) -> Dist:
    """``frozen`` (support from 0) cut to [0, hi]."""
    mass = float(frozen.cdf(hi))
    return Dist(name, 0.0, hi, lambda v: frozen.cdf(v) / mass, lambda u: frozen.ppf(np.asarray(u) * mass))


def _mixture() -> Dist:
    """Beta(2, 8) and Beta(8, 2), half each (bimodal)."""
    a, b = stats.beta(2, 8), stats.beta(8, 2)

    def sample(rng, shape):
        u = rng.random(shape)
        return np.where(rng.random(shape) < 0.5, a.ppf(u), b.ppf(u))

    grid = np.linspace(0.0, 1.0, 200_001)
    mixed = 0.5 * (a.cdf(grid) + b.cdf(grid))
    return Dist("mix28", 0.0, 1.0, lambda v: 0.5 * (a.cdf(v) + b.cdf(v)), lambda u: np.interp(u, mixed, grid), sample)


def _kumaraswamy(a: float, b: float) -> Dist:
    return Dist(f"kuma{a:g}{b:g}", 0.0, 1.0, lambda v: 1 - (1 - v**a) ** b,
                lambda u: (1 - (1 - u) ** (1 / b)) ** (1 / a))


DISTS = {
    "beta22": _scipy("beta22", stats.beta(2, 2)),
    "v2": _scipy("v2", stats.beta(2, 1)),
    "uniform": _scipy("uniform", stats.uniform(0, 1)),
    "mix28": _mixture(),
    "kuma25": _kumaraswamy(2, 5),
    "beta0606": _scipy("beta0606", stats.beta(0.6, 0.6)),
    "exp3": _scipy("exp3", stats.truncexpon(b=3.0, scale=1 / 3)),  # Exp(rate 3) cut to [0, 1]
    "lognormal": _truncated("lognormal", stats.lognorm(s=0.5, scale=0.7), 2.0),
    "sqrt": _scipy("sqrt", stats.beta(0.5, 1)),  # F = sqrt(v): density infinite at 0
    "truncnorm": _scipy("truncnorm", stats.truncnorm(-0.5 / 0.15, 0.5 / 0.15, loc=0.5, scale=0.15)),
    "u1": _scipy("u1", stats.uniform(0, 1)),
    "u2": _scipy("u2", stats.uniform(0, 2)),
    "v2_15": _scipy("v2_15", stats.beta(2, 1, scale=1.5)),
}


def _reserves(top: float) -> tuple[float, ...]:
    return tuple(float(r) for r in np.round(np.arange(11) * top / 10, 6))


@dataclass(frozen=True)
class Family:
    """``n_bidders`` alike bidders with values from ``dist``; ``reserve``: a hard reserve in the logged auctions."""

    dist: Dist
    n_bidders: int
    reserve: float = 0.0
    name: str = ""
    reserves: tuple[float, ...] = field(default=())

    def __post_init__(self):
        object.__setattr__(self, "name", self.name or f"{self.dist.name}_n{self.n_bidders}")
        object.__setattr__(self, "reserves", self.reserves or _reserves(self.dist.hi))

    symmetric = True

    @property
    def tops(self) -> tuple[float, ...]:
        return (self.dist.hi,)

    def cdfs(self):
        return [self.dist.cdf] * self.n_bidders

    @cached_property
    def _curve(self) -> tuple[np.ndarray, np.ndarray]:
        """(values, equilibrium bids) on `GRID` points of [max(lo, reserve), hi]."""
        start = max(self.dist.lo, self.reserve)
        grid = np.linspace(start, self.dist.hi, GRID)
        power = self.dist.cdf(grid) ** (self.n_bidders - 1)
        integral = integrate.cumulative_simpson(power, x=grid, initial=0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            # the shading int F^(n-1) / F(v)^(n-1) lies in [0, v - start]; where F^(n-1) is tiny (a lognormal's
            # bottom) the quadrature's rounding would break that and, through the running maximum, every bid
            bids = grid - np.clip(integral / power, 0.0, grid - start)
        # where F^(n-1) underflows (the bottom; only with no reserve) a value bids about (n - 1) / n of its excess
        small = ~(power > 1e-250)
        bids[small] = start + (grid[small] - start) * (self.n_bidders - 1) / self.n_bidders
        return grid, np.maximum.accumulate(bids)

    def bid(self, values: np.ndarray) -> np.ndarray:
        grid, bids = self._curve
        out = np.interp(values, grid, bids)
        return np.where(values < self.reserve, 0.0, out)

    def draw(self, n_auctions: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """(values, bids), each (auctions, bidders); with a reserve, the values under it bid 0 (no bid)."""
        values = self.dist.sample(np.random.default_rng(seed), (n_auctions, self.n_bidders))
        return values, self.bid(values)


@dataclass(frozen=True)
class Pair:
    """Two unlike bidders (values from ``dists[0]`` and ``dists[1]``, each on [0, its top]) in their equilibrium."""

    dists: tuple[Dist, Dist]
    name: str = ""
    reserves: tuple[float, ...] = field(default=())

    def __post_init__(self):
        object.__setattr__(self, "name", self.name or f"{self.dists[0].name}_vs_{self.dists[1].name}")
        object.__setattr__(self, "reserves", self.reserves or _reserves(max(self.tops)))

    symmetric = False
    n_bidders = 2
    reserve = 0.0

    @property
    def tops(self) -> tuple[float, ...]:
        return tuple(d.hi for d in self.dists)

    def cdfs(self):
        return [d.cdf for d in self.dists]

    @cached_property
    def _solution(self) -> tuple[np.ndarray, np.ndarray]:
        """(bids (K,), inverse bids (2, K)) from the top bid down to 1e-7 of it, the top bid found by bisection."""
        tops = np.array(self.tops)
        pdfs = [_density(d) for d in self.dists]

        def slope(b, phi):
            ratio = [d.cdf(p) / max(pdf(p), 1e-300) for d, pdf, p in zip(self.dists, pdfs, phi)]
            return [ratio[0] / (phi[1] - b), ratio[1] / (phi[0] - b)]

        def meets(b, phi):
            return min(phi) - b - 1e-12 * tops.max()

        meets.terminal = True
        lo, hi = 0.0, float(tops.min())
        for _ in range(45):
            top = (lo + hi) / 2
            end = 1e-7 * top
            solution = integrate.solve_ivp(slope, (top, end), tops, method="DOP853", events=meets, rtol=1e-11,
                                           atol=1e-13)
            too_high = solution.status != 0 or bool(solution.t_events[0].size)
            lo, hi = (lo, top) if too_high else (top, hi)
        solution = integrate.solve_ivp(slope, (lo, 1e-7 * lo), tops, method="DOP853", rtol=1e-11, atol=1e-13,
                                       dense_output=True)
        bids = np.concatenate([np.linspace(lo, 1e-3 * lo, 200_001), np.geomspace(1e-3 * lo, 1e-7 * lo, 2001)[1:]])
        return bids[::-1], solution.sol(bids)[:, ::-1]

    @property
    def top_bid(self) -> float:
        return float(self._solution[0][-1])

    def inverse_bid(self, i: int, bids: np.ndarray) -> np.ndarray:
        grid, phi = self._solution
        return np.interp(bids, grid, phi[i])

    def draw(self, n_auctions: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(seed)
        values = np.stack([d.sample(rng, n_auctions) for d in self.dists], 1)
        grid, phi = self._solution
        bids = np.stack([np.interp(values[:, i], np.concatenate([[0.0], phi[i]]), np.concatenate([[0.0], grid]))
                         for i in range(2)], 1)
        return values, bids

    def competing_cdf(self, bids: np.ndarray, values: np.ndarray) -> np.ndarray:
        """Per bid, the exact CDF of the other bidder's bid at it: F_j(phi_j(b))."""
        return np.stack([self.dists[1 - i].cdf(self.inverse_bid(1 - i, bids[:, i])) for i in range(2)], 1)


def _density(dist: Dist):
    """The density of ``dist`` by a central difference of its CDF (step 1e-6 of its range)."""
    h = 1e-6 * (dist.hi - dist.lo)

    def pdf(v):
        a, b = max(dist.lo, v - h), min(dist.hi, v + h)
        return (dist.cdf(b) - dist.cdf(a)) / (b - a)

    return pdf


def _asym_uniform() -> Pair:
    return Pair((DISTS["u1"], DISTS["u2"]), name="asym_1_2")


CASES: dict[str, Family | Pair] = {
    "beta22_n3": Family(DISTS["beta22"], 3, name="beta22_n3"),
    "v2_n4": Family(DISTS["v2"], 4, name="v2_n4"),
    "uniform_n3": Family(DISTS["uniform"], 3, name="uniform_n3"),
    "asym_1_2": _asym_uniform(),
}
# The declared benchmark: families x 2, 4, 6 bidders, and the unlike pairs.
FAMILIES = ("beta22", "v2", "uniform", "mix28", "kuma25", "beta0606", "exp3", "lognormal", "sqrt", "truncnorm")
BIDDERS = (2, 4, 6)
for _family in FAMILIES:
    for _n in BIDDERS:
        CASES[f"{_family}_n{_n}"] = Family(DISTS[_family], _n)
CASES["asym_exp3_u1"] = Pair((DISTS["exp3"], DISTS["u1"]), name="asym_exp3_u1")
CASES["asym_u1_v2"] = Pair((DISTS["u1"], DISTS["v2_15"]), name="asym_u1_v2")
GRID_CASES = tuple(f"{f}_n{n}" for f in FAMILIES for n in BIDDERS) + ("asym_1_2", "asym_exp3_u1", "asym_u1_v2")
Case = Family | Pair


def with_reserve(case: Family, reserve: float) -> Family:
    """``case``'s bidders in auctions with a hard reserve (values under it do not bid)."""
    return Family(case.dist, case.n_bidders, reserve, name=f"{case.name}_R{reserve:g}", reserves=case.reserves)


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
    integral, _ = integrate.quad(f2, reserve, top, points=breaks or None, limit=400, epsabs=1e-12)
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


def bids_oracle_values(case: Case, bids: np.ndarray, values: np.ndarray, complete_only: bool = False) -> np.ndarray:
    """GPV's pseudo-values with the TRUE bid density and the bids' EMPIRICAL CDF: v = b + G_hat(b) / ((n - 1) g(b))
    (alike bidders; unlike ones: v = b + H_hat(b) / h(b), H the CDF of the other bidder's bid).

    g is the exact equilibrium's bid density, written through the first-order condition as g = G / ((n - 1) (v - b))
    with G the exact bid CDF (alike: F(v); unlike: the other's F_j(phi_j(b))), so v_hat = b + (G_hat(b) / G(b)) (v - b).
    With G_hat = G this is the true value; the difference is the sampling of the bids' CDF alone, the floor for an
    estimator that reads the density perfectly from the bids. ``oracle(case, bids_oracle_values(...), r)`` is then
    the bids-only oracle's revenue. Bids of 0 (values under a logged reserve) keep their values; with only the
    auctions where everybody bid (``complete_only``) the bids' CDF is conditional on bidding and is put back on the
    whole population with the exact share of values under the reserve."""
    if case.symmetric:
        pooled = np.sort(bids.ravel())
        level = np.searchsorted(pooled, bids, side="right") / pooled.size
        if complete_only:
            below = float(case.dist.cdf(case.reserve))
            level = below + (1 - below) * level
        exact = case.dist.cdf(values)
    else:  # two bidders: each one's competing bid is the other's
        other = [np.sort(bids[:, 1]), np.sort(bids[:, 0])]
        level = np.stack([np.searchsorted(other[i], bids[:, i], side="right") / other[i].size for i in (0, 1)], 1)
        exact = case.competing_cdf(bids, values)
    ratio = np.where(exact > 0, level / np.maximum(exact, 1e-300), 1.0)
    return np.where(bids > 0, bids + ratio * (values - bids), values)


def with_mass_point(bids: np.ndarray, share: float, seed: int) -> np.ndarray:
    """``bids`` with ``share`` of them (at random) moved to one value, the median bid (a default bid, a bot)."""
    bids = bids.copy()
    at = float(np.median(bids[bids > 0]))
    bids[np.random.default_rng(seed + 104729).random(bids.shape) < share] = at
    return bids


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
            np.savetxt(f, bids, fmt="%.10g", delimiter=",")
        else:
            f.write("auction_id,bid\n")
            ids = np.repeat(np.arange(bids.shape[0]), bids.shape[1])
            np.savetxt(f, np.stack([ids, bids.ravel()], 1), fmt=["%d", "%.10g"], delimiter=",")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES), default="beta22_n3")
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layout", choices=["wide", "long"], default="wide")
    parser.add_argument("--round", type=float, default=None)
    parser.add_argument("--zeros", type=float, default=0.0)
    parser.add_argument("--reserve", type=float, default=0.0, help="a hard reserve in the logged auctions")
    parser.add_argument("--complete-only", action="store_true", help="with --reserve: keep only auctions where all bid")
    parser.add_argument("--mass", type=float, default=0.0, help="move this share of the bids to the median bid")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    case = CASES[args.case]
    if args.reserve:
        case = with_reserve(case, args.reserve)
    values, bids = case.draw(args.n, args.seed)
    if args.complete_only:
        keep = (bids > 0).all(1)
        values, bids = values[keep], bids[keep]
    if args.mass:
        bids = with_mass_point(bids, args.mass, args.seed)
    write_csv(args.out, bids, args.layout, args.round, args.zeros, args.seed)
    for r in case.reserves:
        print(f"r={r:g}: truth {truth(case, r):.6f} oracle {oracle(case, values, r):.6f}")


if __name__ == "__main__":
    main()

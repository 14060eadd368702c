"""Global sieve estimators of the bid density against the shipped local inversion (prototype measurements).

bid-Bernstein: each bid sample's CDF on [lowest bid, highest bid] as a Bernstein polynomial (a mixture of
Beta(k, M - k + 1) CDFs, k = 1..M, weights on the simplex), the weights by maximum likelihood of the binned bids
(EM: the log-likelihood is concave in the weights), the degree M by AIC or BIC; then GPV's first-order condition
v(b) = b + H(b) / h(b) with the fitted H and its derivative (H = G^(n-1) for n alike bidders; for asymmetric
bidders H the CDF of each bidder's highest competing bid), and P(V <= v(b)) = the fitted CDF of the bidder's bids.
`python benchmarks/auction_sieve.py [--cases ...] [--sizes 5000] [--seeds 10] [--methods shipped aic bic]`
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from scipy import optimize, special, stats

sys.path.insert(0, str(Path(__file__).parent))
import auction_accuracy  # noqa: E402
import rmac_grid  # noqa: E402
from auction_logs import CASES, oracle  # noqa: E402

from pipeline.games.rmac import second_price_from_cdfs  # noqa: E402

BINS = 1000
DEGREE_SET = (2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 17, 20, 24, 28, 33, 40, 48, 57, 68, 80)


def simplex_mle(prob: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, float]:
    """argmax over w >= 0, sum w = 1 of sum_j counts_j log(w @ prob[:, j]): the concave problem
    max sum_j c_j log(w @ prob_j) - N sum w over w >= 0 has its optimum on the simplex (L-BFGS-B)."""
    n = counts.sum()
    m = prob.shape[0]

    def objective(w):
        p = np.maximum(w @ prob, 1e-300)
        return -(counts @ np.log(p)) / n + w.sum(), -(prob @ (counts / p)) / n + 1.0

    found = optimize.minimize(objective, np.full(m, 1.0 / m), jac=True, method="L-BFGS-B",
                              bounds=[(0.0, None)] * m, options={"maxiter": 5000, "ftol": 1e-15, "gtol": 1e-10})
    w = found.x / found.x.sum()
    return w, float(counts @ np.log(np.maximum(w @ prob, 1e-300)))


def bernstein_fit(sample: np.ndarray, lo: float, hi: float, criterion: str = "aic", degrees=None,
                  bins: int = BINS) -> tuple[np.ndarray, int]:
    """Weights of the Bernstein CDF of ``sample`` on [lo, hi] (degree chosen by ``criterion``) and the degree."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    x = np.clip((sample - lo) / (hi - lo), 0.0, 1.0)
    counts = np.bincount(np.minimum((x * bins).astype(int), bins - 1), minlength=bins).astype(float)
    keep = counts > 0
    n = counts.sum()
    best = None
    for m in degrees or DEGREE_SET:
        k = np.arange(1, m + 1)
        cdf = special.betainc(k[:, None], m - k[:, None] + 1, edges[None, :])  # (M, bins + 1)
        prob = np.diff(cdf, axis=1)[:, keep]  # (M, nonempty bins)
        w, ll = simplex_mle(prob, counts[keep])
        penalty = (m - 1) * (2.0 if criterion == "aic" else np.log(n))
        score = -2 * ll + penalty
        if best is None or score < best[0]:
            best = (score, w, m)
    return best[1], best[2]


def bernstein_cdf(w: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(CDF, density) of the Bernstein mixture at x in [0, 1] (density per unit x)."""
    m = w.size
    k = np.arange(1, m + 1)
    cdf = w @ special.betainc(k[:, None], m - k[:, None] + 1, x[None, :])
    # density of Beta(k, m - k + 1) = m * C(m-1, k-1) x^(k-1) (1-x)^(m-k)
    log_binom = special.gammaln(m) - special.gammaln(k) - special.gammaln(m - k + 1)
    with np.errstate(divide="ignore"):
        logpdf = (np.log(m) + log_binom[:, None] + special.xlogy(k[:, None] - 1, x[None, :])
                  + special.xlog1py(m - k[:, None], -x[None, :]))
    return cdf, w @ np.exp(logpdf)


def sieve_symmetric(bids: np.ndarray, n: int, criterion: str, points: int = 2000):
    bids = bids.ravel()
    lo, hi = float(bids.min()), float(bids.max())
    w, m = bernstein_fit(bids, lo, hi, criterion)
    x = np.linspace(0.0, 1.0, points + 1)
    cdf, dens = bernstein_cdf(w, x)
    b = lo + x * (hi - lo)
    g = dens / (hi - lo)
    v = b + cdf / ((n - 1) * np.maximum(g, 1e-12))
    v[0] = b[0]
    v = np.minimum.accumulate(v[::-1])[::-1].copy()
    return v, np.clip(cdf, 0, 1), m


def sieve_asymmetric(table: np.ndarray, criterion: str, points: int = 2000):
    lo, hi = float(table.min()), float(table.max())
    x = np.linspace(0.0, 1.0, points + 1)
    b = lo + x * (hi - lo)
    fits = [bernstein_fit(table[:, i], lo, hi, criterion) for i in range(table.shape[1])]
    own = [bernstein_cdf(w, x) for w, _ in fits]
    out = []
    for i in range(table.shape[1]):
        # H_i = prod_{j != i} G_j: h_i / H_i = sum_j g_j / G_j
        ratio = sum(own[j][1] / (hi - lo) / np.maximum(own[j][0], 1e-300) for j in range(table.shape[1]) if j != i)
        v = b + 1.0 / np.maximum(ratio, 1e-12)
        v[0] = b[0]
        v = np.minimum.accumulate(v[::-1])[::-1].copy()
        out.append((v, np.clip(own[i][0], 0, 1)))
    return out, [m for _, m in fits]


VALUE_DEGREES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 19, 24, 30)
VALUE_POINTS = 4001


def equilibrium_shape(w: torch.Tensor, components: torch.Tensor, x: torch.Tensor, opponents: int):
    """Value CDF F = w @ components on x (the grid of [0, 1]) and the symmetric equilibrium bid
    beta(x) = x - int_0^x F^(n-1) / F(x)^(n-1) there (trapezoid), both (X,)."""
    f = (w @ components).clamp(0.0, 1.0)
    power = f**opponents
    integral = torch.cat([power.new_zeros(1), torch.cumsum((power[1:] + power[:-1]) / 2 * (x[1:] - x[:-1]), 0)])
    small = power < 1e-200
    beta = x - integral / torch.where(small, torch.ones_like(power), power)
    beta = torch.where(small, x / (opponents + 1), beta)  # F ~ x near 0: beta ~ x (n - 1) / n, any F: below x
    return f, beta


def interp_torch(x: torch.Tensor, xp: torch.Tensor, fp: torch.Tensor) -> torch.Tensor:
    i = torch.searchsorted(xp.detach().contiguous(), x.contiguous()).clamp(1, xp.numel() - 1)
    x0, x1, y0, y1 = xp[i - 1], xp[i], fp[i - 1], fp[i]
    t = ((x - x0) / (x1 - x0).clamp_min(1e-300)).clamp(0.0, 1.0)
    return y0 + t * (y1 - y0)


FIT_KS: list = []
KS_GATE = 1.63  # sqrt(bids) x KS distance: the 1% critical value of a fully specified CDF


def value_cdf_of_bids(params, components, x, opponents, floor, edges):
    """The bid CDF at ``edges`` (units of the highest bid) implied by the value sieve's parameters."""
    w = torch.softmax(params[:-1], 0)
    start = floor * torch.sigmoid(params[-1])
    f, beta = equilibrium_shape(w, components, x, opponents)
    scaled = start + (1 - start) * beta / beta[-1]
    g = interp_torch(edges, scaled, f)
    return torch.where(edges < start, torch.zeros_like(g), g)


def value_loglik(params, components, x, opponents, floor, edges, counts):
    """Binned log-likelihood of the bids (units of the highest bid) under the value CDF softmax(params[:-1]) @
    components and the lower end floor * sigmoid(params[-1]), through the symmetric equilibrium."""
    g = value_cdf_of_bids(params, components, x, opponents, floor, edges)
    p = (g[1:] - g[:-1]).clamp_min(1e-300)
    return (counts * torch.log(p)).sum()


def fit_lbfgs(params, loss_of) -> None:
    opt = torch.optim.LBFGS([params], lr=1, max_iter=500, tolerance_grad=1e-9, tolerance_change=1e-12,
                            history_size=20, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = loss_of(params)
        loss.backward()
        return loss

    opt.step(closure)


def value_sieve_fit(bids: np.ndarray, n: int, criterion: str = "aic", degrees=VALUE_DEGREES, bins: int = BINS):
    """Value CDF as a Bernstein polynomial on [L, T] fitted by maximum likelihood of the binned bids through the
    symmetric equilibrium: L = lowest bid, T - L = (highest - lowest bid) / beta_1(1). Returns (values, cdf, degree)."""
    bids = bids.ravel()
    low, hi = float(bids.min()), float(bids.max())
    # Bins on [0, hi]: the values' (and bids') lower end L is a parameter in [0, lowest bid].
    u = bids / hi
    counts_np = np.bincount(np.minimum((u * bins).astype(int), bins - 1), minlength=bins).astype(float)
    counts = torch.from_numpy(counts_np)
    total = counts.sum()
    edges = torch.linspace(0.0, 1.0, bins + 1, dtype=torch.float64)
    x_np = np.linspace(0.0, 1.0, VALUE_POINTS)
    x = torch.from_numpy(x_np)
    floor = low / hi
    best = None
    for m in degrees:
        k = np.arange(1, m + 1)
        components = torch.from_numpy(special.betainc(k[:, None], m - k[:, None] + 1, x_np[None, :]))

        params = torch.zeros(m + 1, dtype=torch.float64, requires_grad=True)
        problem = (components, x, n - 1, floor, edges, counts)
        fit_lbfgs(params, lambda p, problem=problem: -value_loglik(p, *problem) / total)
        with torch.no_grad():
            ll = float(value_loglik(params, *problem))
        penalty = m * (2.0 if criterion == "aic" else math.log(float(total)))
        score = -2 * ll + penalty
        if best is None or score < best[0]:
            best = (score, params.detach().clone(), m, components, problem)
    _, params, m, components, problem = best
    with torch.no_grad():
        f, beta = equilibrium_shape(torch.softmax(params[:-1], 0), components, x, n - 1)
        start = hi * floor * float(torch.sigmoid(params[-1]))
        # Kolmogorov-Smirnov distance of the fitted bid CDF from the binned empirical one
        fitted = value_cdf_of_bids(params, *problem[:-1])
    empirical = np.concatenate([[0.0], np.cumsum(counts_np)]) / float(total)
    FIT_KS.append(float(np.abs(fitted.numpy() - empirical).max()) * math.sqrt(float(total)))
    width = (hi - start) / float(beta[-1])
    return (start + width * x_np), f.numpy(), m


DEGREES: list = []


SHIPPED = auction_accuracy.estimate


def make_estimate(method: str):
    shipped = SHIPPED

    def estimate(case, bids):
        if method == "shipped":
            return shipped(case, bids)
        if case.symmetric and method.startswith(("value-", "gated-")):
            v, cdf, m = value_sieve_fit(bids, case.n_bidders, method.split("-")[1])
            if method.startswith("gated-") and FIT_KS[-1] > KS_GATE:
                DEGREES.append(0)
                return shipped(case, bids)
            cdfs = [(torch.from_numpy(v), torch.from_numpy(cdf))] * case.n_bidders
            DEGREES.append(m)
        elif case.symmetric:
            v, cdf, m = sieve_symmetric(bids, case.n_bidders, method)
            cdfs = [(torch.from_numpy(v), torch.from_numpy(cdf))] * case.n_bidders
            DEGREES.append(m)
        else:
            if method.startswith("gated-"):
                return shipped(case, bids)
            curves, ms = sieve_asymmetric(bids, method.split("-")[-1])
            cdfs = [(torch.from_numpy(v), torch.from_numpy(c)) for v, c in curves]
            DEGREES.append(ms)
        return [second_price_from_cdfs(cdfs, r)[0] for r in case.reserves], {}

    return estimate


GENERIC = {
    "uniform": stats.uniform(0, 1),
    "v^2": stats.beta(2, 1),
    "sqrt(v)": stats.beta(0.5, 1),
    "beta(2,2)": stats.beta(2, 2),
    "truncnorm": stats.truncnorm(-0.5 / 0.15, 0.5 / 0.15, loc=0.5, scale=0.15),
    "beta(1.5,3)": stats.beta(1.5, 3),
    "beta(3,1.5)": stats.beta(3, 1.5),
    "U[0.2,1]": stats.uniform(0.2, 0.8),
}


def generic_errors(name: str, n: int, n_auctions: int, seeds: int, methods) -> dict:
    """Per method: median over seeds of the worst |error| over reserves 0, 0.1, ..., 1.0 and of its ratio to the
    true-values oracle's, on rmac_grid's equilibrium bids (4 decimals) of any value distribution on [0, 1]."""
    dist = GENERIC[name]
    reserves = tuple(np.round(np.arange(0, 1.01, 0.1), 2))
    case = SimpleNamespace(name=name, n_bidders=n, symmetric=True, reserves=reserves)
    truths = np.array([rmac_grid.second_price_truth(dist, n, r) for r in reserves])
    worst = {m: [] for m in methods}
    oracle_worst = []
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        values = dist.ppf(rng.random((n_auctions, n)))
        bids = np.round(rmac_grid.equilibrium_bid(dist, n, values), 4)
        oracle_worst.append(np.abs([oracle(case, values, r) - t for r, t in zip(reserves, truths)]).max())
        for m in methods:
            points, _ = make_estimate(m)(case, bids)
            worst[m].append(np.abs(np.array(points) - truths).max())
    out = {"oracle": float(np.median(oracle_worst))}
    for m in methods:
        out[m] = (float(np.median(worst[m])), float(np.median(np.array(worst[m]) / np.array(oracle_worst))))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--sizes", type=int, nargs="+", default=[5_000])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--methods", nargs="+", default=["shipped", "aic", "bic"])
    parser.add_argument("--generic", nargs="*", default=None, help="rmac_grid-style distributions instead")
    parser.add_argument("--bidders", type=int, nargs="+", default=[2, 3, 5])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.generic is not None:
        for name in args.generic or list(GENERIC):
            for n in args.bidders:
                for n_auctions in args.sizes:
                    row = generic_errors(name, n, n_auctions, args.seeds, args.methods)
                    print(f"{name:12s} n={n} N={n_auctions:>6} oracle {row['oracle']:.4f} " + " ".join(
                        f"{m} {row[m][0]:.4f} ({row[m][1]:.2f}x)" for m in args.methods), flush=True)
        return
    for name in args.cases:
        for n_auctions in args.sizes:
            for method in args.methods:
                auction_accuracy.estimate = make_estimate(method)
                DEGREES.clear()
                t0 = time.process_time()
                row = auction_accuracy.run_case(CASES[name], n_auctions, args.seeds)
                print(f"{method:8s} {auction_accuracy.line(row)} | cpu {time.process_time() - t0:.0f}s "
                      f"degrees {DEGREES[:10]}", flush=True)


if __name__ == "__main__":
    main()

"""The point estimate against its alternatives, on the accuracy benchmark's logs or on other value distributions.

Methods: ``shipped`` (the project's point estimate: the value sieve of `pipeline.games.value_sieve` when it passes
its check, else the local inversion), ``local`` (the local inversion alone, its default bandwidth given),
``value`` (the value sieve, ungated) and ``bid-aic`` / ``bid-bic`` (tried, not adopted: each bid sample's CDF as a
Bernstein polynomial on [lowest, highest bid], weights by maximum likelihood of the binned bids (concave in the
weights), degree by AIC or BIC, then GPV's first-order condition v(b) = b + H(b) / h(b) with the fitted H = CDF of
the highest competing bid; asymmetric pairs: per bidder). ``--generic`` runs `rmac_grid.py`'s equilibrium logs of
other value distributions (sqrt(v), a truncated normal, Beta(1.5, 3), Beta(3, 1.5), U[0.2, 1], ...) with 2, 3 and 5
bidders: median over seeds of the worst error over reserves 0-1 and of its ratio to the true-values oracle.
``--criteria CASE ...``: the model choice itself: every family searched with AIC's price per parameter (the
larger set), each candidate's worst error, then per cell the median worst error over the bids-only oracle's when
the model is chosen by AIC, by BIC, or by either within some families, and, within each log, the rank correlation
(Spearman) of each criterion with the candidates' realised worst errors.
``--parametric FAMILY ...``: the parametric oracle, the maximum-likelihood fit of a model that knows the family's
shape (the value CDF family at the degree that holds it exactly, started at the truth: the components of weight 0
stay at 0, their logits at log 1e-12 have no gradient, so what is fitted is the true components' weights and the
two ends of the bids), against the bids-only oracle: a floor for any estimator that does not know the bid density
(families: uniform 1, v2 2, beta22 3 (one component each: the ends alone), mix28 9 (2 components), kuma25 10).
`python benchmarks/auction_sieve.py [--cases ...] [--sizes 5000] [--seeds 10] [--methods shipped local ...]
[--generic [names ...]] [--bidders 2 3 5] [--parametric mix28 kuma25 --bidders 2 4 6 --sizes 5000 20000]
[--criteria kuma25_n2 mix28_n2 ... --sizes 5000 20000 --seeds 3]`
"""

from __future__ import annotations

import argparse
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
from auction_logs import CASES, bids_oracle_values, oracle, truth  # noqa: E402

from pipeline.games import value_sieve  # noqa: E402
from pipeline.games.rmac import default_bandwidth, predict_counterfactuals, second_price_from_cdfs  # noqa: E402
from pipeline.games.rules import parse_rule  # noqa: E402
from pipeline.games.value_sieve import fit_value_sieve  # noqa: E402

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


DEGREES: list = []


SHIPPED = auction_accuracy.estimate


def make_estimate(method: str):
    """shipped: the project's point estimate (the value sieve, KS-gated, else the local inversion); local: the local
    inversion alone (its default bandwidth given); value: the value sieve ungated; bid-aic / bid-bic: the bid
    sieve (asymmetric pairs: per bidder)."""

    def estimate(case, bids):
        if method == "shipped" or (method == "local" and not case.symmetric):
            return SHIPPED(case, bids)
        rules = [parse_rule(f"second_price_r{r:g}").name for r in case.reserves]
        if method == "local":
            flat = torch.from_numpy(np.ascontiguousarray(bids)).flatten()
            found = predict_counterfactuals(flat, case.n_bidders, rules, [], bandwidth=default_bandwidth(flat))
            return [found.table[f"cf/{r}/point"] for r in rules], {}
        if case.symmetric and method == "value":
            fit = fit_value_sieve(torch.from_numpy(np.ascontiguousarray(bids)), case.n_bidders)
            cdfs = [(fit.values, fit.cdf)] * case.n_bidders
            DEGREES.append((fit.degree, round(fit.misfit, 2)))
        elif case.symmetric:
            v, cdf, m = sieve_symmetric(bids, case.n_bidders, method.removeprefix("bid-"))
            cdfs = [(torch.from_numpy(v), torch.from_numpy(cdf))] * case.n_bidders
            DEGREES.append(m)
        else:
            curves, ms = sieve_asymmetric(bids, method.removeprefix("bid-"))
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


def _bernstein_weights(power: list[float]) -> np.ndarray:
    """The value CDF family's weights of F(x) = sum_i power[i] x^i (a polynomial CDF on [0, 1] of degree M)."""
    degree = len(power) - 1
    coefficients = [sum(special.comb(j, i) / special.comb(degree, i) * power[i] for i in range(j + 1))
                    for j in range(degree + 1)]
    return np.diff(coefficients)


def true_weights(family: str) -> np.ndarray:
    """The exact value-CDF-family weights of the families that are Bernstein polynomials."""
    if family == "mix28":  # I_x(2, 8) and I_x(8, 2), half each: components 2 and 8 of degree 9
        weights = np.zeros(9)
        weights[[1, 7]] = 0.5
        return weights
    if family == "kuma25":  # 1 - (1 - x^2)^5
        power = -np.polynomial.polynomial.polypow([1, 0, -1], 5)
        power[0] += 1
        return _bernstein_weights(list(power))
    return {"uniform": np.array([1.0]), "v2": _bernstein_weights([0, 0, 1]),
            "beta22": _bernstein_weights([0, 0, 3, -2])}[family]


def parametric_oracle(family: str, n_bidders: int, n_auctions: int, seeds: int) -> dict:
    """Median over seeds of the worst error of the maximum-likelihood fit that knows the family's shape (module
    docstring), and its ratio to the bids-only oracle's worst error (the same reserves, logs and oracle as
    `auction_accuracy.py`)."""
    case = CASES[f"{family}_n{n_bidders}"]
    weights = true_weights(family)
    truths = np.array([truth(case, r) for r in case.reserves])
    top_bid = float(case.bid(np.array([case.dist.hi]))[0])
    ratios, worst = [], []
    for seed in range(seeds):
        values, bids = case.draw(n_auctions, seed)
        data = value_sieve.bin_bids([torch.from_numpy(bids.ravel())])
        model = value_sieve.CdfFamily(weights.size, 1, n_bidders)
        share = (top_bid / data.high / data.top_low - 1) / value_sieve.TOP_SPAN
        ends = [-30.0, float(np.log(share / (1 - share))) if share > 0 else -30.0]
        params = torch.tensor([*np.log(np.maximum(weights, 1e-12)), *ends], dtype=torch.float64).requires_grad_(True)
        with torch.enable_grad():
            value_sieve.maximise_likelihood(model, params, data)
        candidate = value_sieve.Candidate(model, params.detach(), 0.0, 0.0)
        with torch.no_grad():
            points = value_sieve.second_price(candidate.curves(data), [n_bidders],
                                              torch.tensor(case.reserves, dtype=torch.float64)).numpy()
        pseudo = bids_oracle_values(case, bids, values)
        floor = np.abs([oracle(case, pseudo, r) - t for r, t in zip(case.reserves, truths)]).max()
        worst.append(np.abs(points - truths).max())
        ratios.append(worst[-1] / floor)
    return {"case": case.name, "n": n_auctions, "worst": float(np.median(worst)), "ratio": float(np.median(ratios)),
            "ratios": np.round(ratios, 2).tolist()}


def criteria(name: str, n_auctions: int, seeds: int) -> list[dict]:
    """Per seed: every candidate's family, degree, free parameters, log-likelihood and signed errors at the case's
    reserves (searched with AIC's price, so BIC's choice is among them), and the bids-only oracle's errors."""
    case = CASES[name]
    truths = np.array([truth(case, r) for r in case.reserves])
    at = torch.tensor(case.reserves, dtype=torch.float64)
    out = []
    for seed in range(seeds):
        values, bids = case.draw(n_auctions, seed)
        rows = [torch.from_numpy(bids.ravel())] if case.symmetric else [torch.from_numpy(bids[:, i].copy()) for i in range(2)]
        data = value_sieve.bin_bids(rows)
        families = value_sieve.FAMILIES if case.symmetric else ("inverse",)
        counts = [case.n_bidders] if case.symmetric else [1, 1]
        candidates = []
        for family in families:
            for c in value_sieve.fit_family(family, data, case.n_bidders, penalty=2.0):
                with torch.no_grad():
                    errors = value_sieve.second_price(c.curves(data), counts, at).numpy() - truths
                candidates.append({"family": family, "degree": c.family.degree, "k": c.family.n_params() + 2,
                                   "ll": c.log_likelihood, "err": errors})
        pseudo = bids_oracle_values(case, bids, values)
        floor = np.abs([oracle(case, pseudo, r) - t for r, t in zip(case.reserves, truths)]).max()
        out.append({"candidates": candidates, "floor": floor, "n_bids": bids.size})
    return out


def choose(log: dict, rule: str, families=None) -> dict:
    price = 2.0 if rule == "aic" else np.log(log["n_bids"])
    pool = [c for c in log["candidates"] if families is None or c["family"] in families]
    return min(pool, key=lambda c: -2 * c["ll"] + price * c["k"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--sizes", type=int, nargs="+", default=[5_000])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--methods", nargs="+", default=["shipped", "local"],
                        choices=["shipped", "local", "value", "bid-aic", "bid-bic"])
    parser.add_argument("--generic", nargs="*", default=None, help="rmac_grid-style distributions instead")
    parser.add_argument("--bidders", type=int, nargs="+", default=[2, 3, 5])
    parser.add_argument("--parametric", nargs="+", default=None, choices=["uniform", "v2", "beta22", "mix28", "kuma25"])
    parser.add_argument("--criteria", nargs="+", default=None, choices=list(CASES))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.criteria:
        rules = {"aic": ("aic", None), "bic": ("bic", None), "bic cdf+quantile": ("bic", ("cdf", "quantile")),
                 "aic cdf+quantile": ("aic", ("cdf", "quantile")), "bic inverse": ("bic", ("inverse",))}
        cells, rho = {name: [] for name in rules}, {"aic": [], "bic": []}
        for name in args.criteria:
            for n_auctions in args.sizes:
                logs = criteria(name, n_auctions, args.seeds)
                ratios = {}
                for label, (rule, families) in rules.items():
                    if CASES[name].symmetric or families in (None, ("inverse",)):
                        ratios[label] = float(np.median([np.abs(choose(log, rule, families)["err"]).max() / log["floor"]
                                                         for log in logs]))
                        cells[label].append(ratios[label])
                for log in logs:
                    worst = [np.abs(c["err"]).max() for c in log["candidates"]]
                    for rule in rho:
                        price = 2.0 if rule == "aic" else np.log(log["n_bids"])
                        score = [-2 * c["ll"] + price * c["k"] for c in log["candidates"]]
                        rho[rule].append(stats.spearmanr(score, worst).statistic)
                print(f"{name:14s} N={n_auctions:>6} median worst / bids-only oracle: "
                      + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()), flush=True)
        for label, values in cells.items():
            print(f"{label}: {sum(v <= 1.5 for v in values)} of {len(values)} cells within 1.5x, median {np.median(values):.2f}")
        for rule, values in rho.items():
            values = np.array(values)
            print(f"within-log Spearman({rule}, realised worst error) over {values.size} logs: median "
                  f"{np.nanmedian(values):.2f}, positive on {np.mean(values > 0):.0%}")
        return
    if args.parametric:
        for family in args.parametric:
            for n in args.bidders:
                for n_auctions in args.sizes:
                    row = parametric_oracle(family, n, n_auctions, args.seeds)
                    print(f"parametric oracle {row['case']:12s} N={n_auctions:>6} worst {row['worst']:.4f} ratio to the "
                          f"bids-only oracle {row['ratio']:.2f} (per seed {row['ratios']})", flush=True)
        return
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
                auction_accuracy.estimate = make_estimate(method)  # run_case reads it
                DEGREES.clear()
                t0 = time.process_time()
                row = auction_accuracy.run_case(CASES[name], n_auctions, args.seeds)
                print(f"{method:8s} {auction_accuracy.line(row)} | cpu {time.process_time() - t0:.0f}s "
                      f"degrees {DEGREES[:10]}", flush=True)


if __name__ == "__main__":
    main()

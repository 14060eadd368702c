"""Auctions: what would revenue and welfare be under other rules, from logged first-price bids (numpy/torch; no training).

Which file does what, in the order the data flows:

- `bids_csv`    reads a CSV of logged bids into an (auctions, bidders) table; bad rows counted and named.
- `rules`       the rule names (`parse_rule`: ``second_price_r0.5``, ``first_price_n3``) and result keys
                (`result_key`: ``cf/second_price_r0.5/point``), torch-free for reports and plots.
- `auction`     the closed forms for uniform values (the truths the tests hold everything to) and
                simulated equilibrium bids.
- `symmetry`    may the bidders be pooled? A two-sample test between every pair of bidders' bids.
- `rmac`        pooled (symmetric) bidders: the bids inverted to a value distribution, the logged game
                (`fit_logged_auction`: which types each logged bid is consistent with), the value grid,
                and the whole estimate `predict_counterfactuals` (points + RMAC bounds + clamps). Also the
                helpers the asymmetric path shares (`interp`, `cap_types`, `nice_step`, `value_type_weights`,
                `second_price_from_cdfs`, `reported_bounds`, ...).
- `asymmetric`  unlike bidders: each inverted against its own highest competing bid; the same points and
                bounds with one population per bidder (`asymmetric_table`, `asymmetric_bounds`).
- `solver`      THE solver of the new game on a bid grid, for both: win/payment with ties, revenue and
                welfare, the equilibrium by fictitious play (`solve_equilibrium`) and the robust bounds by
                Frank-Wolfe (`solve_bounds`). Bidders come in populations of alike bidders: a symmetric
                auction is one population of n, an asymmetric one n populations of one.
- `plots`       revenue against the reserve, with bounds and truths.

The task that runs all this from a config is `pipeline.tasks.counterfactual`.
"""

"""Rule and result-key names, torch-free (report code and plots read them without importing torch).

- `parse_rule` / `Rule`: ``second_price_r<reserve>`` (reserve written with at least one decimal, no
  trailing zeros) and ``first_price_n<bidders>``; `default_rules` the reserves 0..top and 1..5 bidders.
- `result_key`: ``<prefix>/<rule>/<what>``, prefix ``cf`` (revenue) or ``cfw`` (welfare), ``what`` one of
  ``point``, ``lower_eps<e>``, ``upper_eps<e>``, ``truth``, ``e`` written by `eps_label`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

STATISTICS = ("revenue", "welfare")
PREFIX = {"revenue": "cf", "welfare": "cfw"}


def format_reserve(reserve: float) -> str:
    """At least one decimal, no trailing zeros: 0 -> '0.0', 0.5 -> '0.5', 0.25 -> '0.25'."""
    text = f"{reserve:.10f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


@dataclass(frozen=True)
class Rule:
    """A counterfactual auction format. ``n_bidders`` None means "as many as in the logged game"."""

    kind: str  # "first_price" | "second_price"
    reserve: float = 0.0
    n_bidders: int | None = None

    @property
    def name(self) -> str:
        if self.kind == "second_price":
            return f"second_price_r{format_reserve(self.reserve)}"
        return f"first_price_n{self.n_bidders}"

    def bidders(self, logged_n_bidders: int) -> int:
        return logged_n_bidders if self.n_bidders is None else self.n_bidders


_RULE_PATTERNS = (
    (re.compile(r"second_price_r(\d+(?:\.\d+)?)"), "second_price"),
    (re.compile(r"first_price_n(\d+)"), "first_price"),
)


def parse_rule(name: str | Rule) -> Rule:
    """``second_price_r0.5`` -> Rule("second_price", 0.5); ``first_price_n3`` -> Rule("first_price", 0, 3)."""
    if isinstance(name, Rule):
        return name
    for pattern, kind in _RULE_PATTERNS:
        m = pattern.fullmatch(name)
        if m is None:
            continue
        if kind == "second_price":
            return Rule(kind, reserve=float(m.group(1)))
        n = int(m.group(1))
        if n < 1:
            raise ValueError(f"rule {name!r}: a first-price auction needs at least 1 bidder")
        return Rule(kind, n_bidders=n)
    raise ValueError(
        f"unknown rule {name!r}; use 'second_price_r<reserve>' (e.g. second_price_r0.5) "
        "or 'first_price_n<bidders>' (e.g. first_price_n3)"
    )


def default_rules(reserves: int = 11, max_bidders: int = 5, top: float = 1.0) -> list[str]:
    """Second price with reserves 0, top/10, ..., top (0, 0.1, ..., 1.0) then first price with 1..5 bidders.

    For logged data in other units pass ``top`` from `reserve_top` (the observed bid range).
    """
    second = [Rule("second_price", reserve=round(i * top / (reserves - 1), 10)).name for i in range(reserves)]
    first = [Rule("first_price", n_bidders=n).name for n in range(1, max_bidders + 1)]
    return second + first


def eps_label(eps: float) -> str:
    """Canonical text for an epsilon in result keys: plain decimal, no trailing zeros ('0.001')."""
    text = f"{float(eps):.10f}".rstrip("0").rstrip(".")
    return text or "0"


def result_key(rule: str | Rule, what: str, statistic: str = "revenue") -> str:
    """``result_key("second_price_r0.5", "lower_eps0.001")`` -> ``cf/second_price_r0.5/lower_eps0.001``."""
    return f"{PREFIX[statistic]}/{parse_rule(rule).name}/{what}"

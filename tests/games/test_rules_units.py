"""games/rules.py: rule names, result keys and the default rule list, every string written out by hand."""

from __future__ import annotations

import pytest

from pipeline.games.rules import (
    PREFIX,
    STATISTICS,
    Rule,
    default_rules,
    eps_label,
    format_reserve,
    parse_rule,
    result_key,
)


def test_the_statistics_and_their_key_prefixes():
    assert STATISTICS == ("revenue", "welfare")
    assert PREFIX == {"revenue": "cf", "welfare": "cfw"}


@pytest.mark.parametrize(
    "reserve, text",
    [(0, "0.0"), (0.0, "0.0"), (0.5, "0.5"), (0.25, "0.25"), (3, "3.0"), (150.0, "150.0"), (0.1 * 3, "0.3"),
     (0.0000000001, "0.0000000001"), (12.125, "12.125")],
)
def test_format_reserve(reserve, text):
    assert format_reserve(reserve) == text


def test_a_rule_defaults_to_no_reserve_and_the_logged_bidders():
    rule = Rule("second_price")
    assert rule.reserve == 0.0 and rule.n_bidders is None
    assert rule.name == "second_price_r0.0"
    assert rule.bidders(4) == 4
    assert Rule("first_price", n_bidders=3).bidders(4) == 3
    assert Rule("first_price", n_bidders=1).bidders(7) == 1


def test_names():
    assert Rule("second_price", reserve=0.75).name == "second_price_r0.75"
    assert Rule("first_price", n_bidders=2).name == "first_price_n2"
    assert Rule("first_price", reserve=0.5, n_bidders=2).name == "first_price_n2"


@pytest.mark.parametrize(
    "name, rule",
    [
        ("second_price_r0.5", Rule("second_price", reserve=0.5)),
        ("second_price_r2", Rule("second_price", reserve=2.0)),
        ("second_price_r0.50", Rule("second_price", reserve=0.5)),
        ("first_price_n1", Rule("first_price", n_bidders=1)),
        ("first_price_n12", Rule("first_price", n_bidders=12)),
    ],
)
def test_parse_rule(name, rule):
    found = parse_rule(name)
    assert found == rule
    assert (found.kind, found.reserve, found.n_bidders) == (rule.kind, rule.reserve, rule.n_bidders)
    assert type(found.reserve) is float


def test_a_rule_is_taken_as_it_is():
    rule = Rule("second_price", reserve=0.3)
    assert parse_rule(rule) is rule


@pytest.mark.parametrize("bad", ["first_price_n0", "first_price_n00"])
def test_a_first_price_auction_without_bidders_is_refused(bad):
    with pytest.raises(ValueError) as err:
        parse_rule(bad)
    assert str(err.value) == f"rule {bad!r}: a first-price auction needs at least 1 bidder"


@pytest.mark.parametrize(
    "bad",
    ["second_price", "x_second_price_r0.5", "second_price_r0.5x", "first_price_n3 ", "FIRST_PRICE_N3", "second_price_r.5",
     "second_price_r0.", "first_price_n1.5", "first_price_n-1", "XXsecond_price_r0.5XX"],
)
def test_unknown_rules_name_the_accepted_forms(bad):
    with pytest.raises(ValueError) as err:
        parse_rule(bad)
    assert str(err.value) == (
        f"unknown rule {bad!r}; use 'second_price_r<reserve>' (e.g. second_price_r0.5) "
        "or 'first_price_n<bidders>' (e.g. first_price_n3)"
    )


def test_default_rules():
    assert default_rules() == [
        "second_price_r0.0", "second_price_r0.1", "second_price_r0.2", "second_price_r0.3", "second_price_r0.4",
        "second_price_r0.5", "second_price_r0.6", "second_price_r0.7", "second_price_r0.8", "second_price_r0.9",
        "second_price_r1.0",
        "first_price_n1", "first_price_n2", "first_price_n3", "first_price_n4", "first_price_n5",
    ]
    assert default_rules(reserves=3, max_bidders=2, top=2.0) == [
        "second_price_r0.0", "second_price_r1.0", "second_price_r2.0", "first_price_n1", "first_price_n2",
    ]
    # top / 3 rounded to ten decimals, then written without trailing zeros
    assert default_rules(reserves=4, max_bidders=1, top=1.0) == [
        "second_price_r0.0", "second_price_r0.3333333333", "second_price_r0.6666666667", "second_price_r1.0",
        "first_price_n1",
    ]


@pytest.mark.parametrize(
    "eps, text",
    [(0.001, "0.001"), (0.02, "0.02"), (0.1, "0.1"), (1e-4, "0.0001"), (0, "0"), (0.0, "0"), (1.5, "1.5"), (10, "10"),
     (100, "100"), ("0.5", "0.5")],
)
def test_eps_label(eps, text):
    assert eps_label(eps) == text


def test_result_key():
    assert result_key("second_price_r0.50", "point") == "cf/second_price_r0.5/point"
    assert result_key("second_price_r0.5", "truth", "revenue") == "cf/second_price_r0.5/truth"
    assert result_key(Rule("first_price", n_bidders=3), "lower_eps0.1", "welfare") == "cfw/first_price_n3/lower_eps0.1"
    with pytest.raises(KeyError):
        result_key("first_price_n2", "point", "profit")


def test_default_reserves_are_rounded_once_to_ten_decimals():
    """i/11 to ten decimals by hand: 5/11 = 0.45454545454... -> 0.4545454545 (rounding to eleven first would
    give 0.45454545455 and then 0.4545454546)."""
    assert default_rules(reserves=12, max_bidders=0, top=1.0) == [
        "second_price_r0.0", "second_price_r0.0909090909", "second_price_r0.1818181818", "second_price_r0.2727272727",
        "second_price_r0.3636363636", "second_price_r0.4545454545", "second_price_r0.5454545455",
        "second_price_r0.6363636364", "second_price_r0.7272727273", "second_price_r0.8181818182",
        "second_price_r0.9090909091", "second_price_r1.0",
    ]

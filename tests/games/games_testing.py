"""Helpers shared by the games test files (a module of its own, as tests/pipeline_testing.py is for the rest)."""

import itertools
import math


def enumerate_outcomes(opponents, actions, reserve, first_price):
    """(win, pay) per own bid index by summing over every profile of the opponents' bid indices, one pmf per
    opponent (ties split at random; second price pays max(reserve, highest other bid), its bid on a tie)."""
    n_actions = len(actions)
    win, pay = [0.0] * n_actions, [0.0] * n_actions
    for own in range(n_actions):
        if actions[own] < reserve - 1e-12:
            continue
        for profile in itertools.product(range(n_actions), repeat=len(opponents)):
            prob = math.prod(pmf[i] for pmf, i in zip(opponents, profile))
            highest = max(profile) if profile else -1
            if own > highest:
                share = 1.0
                price = actions[own] if first_price else max(reserve, actions[highest] if profile else 0.0)
            elif own == highest:
                share = 1.0 / (1 + sum(1 for i in profile if i == own))
                price = actions[own]
            else:
                continue
            win[own] += prob * share
            pay[own] += prob * share * price
    return win, pay

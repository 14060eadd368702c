import pytest

from pipeline.rl.schedules import epsilon_at, linear_schedule


def test_epsilon_endpoints_midpoint_and_clamp():
    assert epsilon_at(0, 1.0, 0.04, 8000) == 1.0
    assert epsilon_at(4000, 1.0, 0.04, 8000) == pytest.approx(0.52)
    assert epsilon_at(8000, 1.0, 0.04, 8000) == pytest.approx(0.04)
    assert epsilon_at(10**6, 1.0, 0.04, 8000) == pytest.approx(0.04)
    assert epsilon_at(-5, 1.0, 0.04, 8000) == 1.0


def test_zero_duration_is_the_end_value():
    assert epsilon_at(0, 1.0, 0.1, 0) == 0.1


def test_linear_schedule_matches_epsilon_at():
    schedule = linear_schedule(1.0, 0.05, 100)
    assert [schedule(s) for s in (0, 50, 100, 200)] == [
        epsilon_at(s, 1.0, 0.05, 100) for s in (0, 50, 100, 200)
    ]

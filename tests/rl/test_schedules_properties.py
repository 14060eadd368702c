"""epsilon_at over generated schedules: exact endpoints, bounds, monotone from start to end, constant after."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.rl.schedules import epsilon_at, linear_schedule

eps = st.floats(0.0, 1.0)
durations = st.integers(1, 10**6)
steps = st.integers(-(10**7), 10**7)


@given(start=eps, end=eps, duration=durations)
def test_exact_endpoints(start, end, duration):
    assert epsilon_at(0, start, end, duration) == start
    assert epsilon_at(-1, start, end, duration) == start
    # Exact at the end too (the form `start + frac * (end - start)` missed 0.1 by an ulp); past it the
    # value is held, not extrapolated.
    at_end = epsilon_at(duration, start, end, duration)
    assert at_end == end  # exact: the schedule lands on its end value
    assert epsilon_at(duration + 1, start, end, duration) == at_end
    assert epsilon_at(10 * duration + 7, start, end, duration) == at_end


@given(start=eps, end=eps, duration=durations, step=steps)
def test_stays_between_start_and_end(start, end, duration, step):
    value = epsilon_at(step, start, end, duration)
    assert isinstance(value, float)
    assert min(start, end) - 1e-15 <= value <= max(start, end) + 1e-15


@given(start=eps, end=eps, duration=durations, a=steps, b=steps)
def test_moves_monotonically_from_start_towards_end(start, end, duration, a, b):
    a, b = sorted((a, b))
    ea, eb = epsilon_at(a, start, end, duration), epsilon_at(b, start, end, duration)
    # A later step is never further from `end` than an earlier one: decay (start > end) never rises,
    # and the schedule DQN uses (1.0 -> 0.04) cannot run backwards from 0.04 up to 1.0.
    assert abs(eb - end) <= abs(ea - end) + 1e-12
    if start >= end:
        assert eb <= ea + 1e-12
    else:
        assert eb >= ea - 1e-12


@given(start=eps, end=eps, duration=st.integers(2, 10**6), data=st.data())
def test_linear_in_between(start, end, duration, data):
    step = data.draw(st.integers(0, duration))
    expected = start + (step / duration) * (end - start)
    assert epsilon_at(step, start, end, duration) == pytest.approx(expected, abs=1e-12)


@given(start=eps, end=eps, duration=st.integers(-5, 0), step=steps)
def test_non_positive_duration_is_the_end_value(start, end, duration, step):
    assert epsilon_at(step, start, end, duration) == end


@given(start=eps, end=eps, duration=durations, step=steps)
def test_linear_schedule_is_epsilon_at(start, end, duration, step):
    assert linear_schedule(start, end, duration)(step) == epsilon_at(step, start, end, duration)


def test_dqn_preset_decays_from_one_to_its_floor():
    # The shape DQN's preset uses: 1.0 at the first step, 0.04 once exploration ends, halfway between.
    assert [epsilon_at(s, 1.0, 0.04, 8000) for s in (0, 4000, 8000, 9000)] == pytest.approx([1.0, 0.52, 0.04, 0.04])

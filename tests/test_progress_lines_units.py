"""runtime/progress_lines.py: where a bar may redraw, and the lines written where it may not."""

from __future__ import annotations

import io

import pytest

from pipeline.runtime.progress_lines import LIVE_STATUS_ENV, ThrottledLines, bar_on_terminal


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_redraws_only_on_a_terminal_no_sweep_status_holds(monkeypatch):
    monkeypatch.delenv(LIVE_STATUS_ENV, raising=False)
    assert bar_on_terminal(Terminal()) is True
    assert bar_on_terminal(io.StringIO()) is False
    closed = io.StringIO()
    closed.close()
    assert bar_on_terminal(closed) is False
    monkeypatch.setenv(LIVE_STATUS_ENV, "1")
    assert bar_on_terminal(Terminal()) is False


def test_redraws_become_one_line_per_interval_and_the_last_state_at_the_end():
    out, clock = io.StringIO(), Clock()
    lines = ThrottledLines(out, every_s=10.0, clock=clock)
    lines.write("\rTraining: |          | 0/? [00:00<?, ?it/s]")  # no count yet: never written
    assert out.getvalue() == ""
    for step in range(1, 101):  # 100 redraws over 25 s
        clock.now = step * 0.25
        lines.write(f"\renv steps: {step}/100")
    # The first state with a count at once (0.25 s), then one every 10 s: at 10.25 and 20.25 s.
    assert out.getvalue().splitlines() == ["env steps: 1/100", "env steps: 41/100", "env steps: 81/100"]
    lines.write("\r" + " " * 40 + "\r")  # a bar clearing itself: nothing to write
    lines.finish()
    assert out.getvalue().splitlines()[-1] == "env steps: 100/100"
    lines.finish()  # written once
    assert out.getvalue().count("100/100") == 1 and "\r" not in out.getvalue()


@pytest.mark.parametrize("every_s", [0.0, 5.0])
def test_a_state_already_written_is_not_written_again(every_s):
    out, clock = io.StringIO(), Clock()
    lines = ThrottledLines(out, every_s=every_s, clock=clock)
    for t in (0.0, 6.0, 12.0):
        clock.now = t
        lines.write("\rEpoch 3: 19/19")
    lines.finish()
    assert out.getvalue() == "Epoch 3: 19/19\n"

"""Where a run's progress bar may draw, and what it writes where it may not (light: no torch, no Lightning).

A terminal that the run has to itself gets tqdm's bar, redrawn in place. Anywhere else (a file, a pipe, a job of
a sweep, whose status line and parallel jobs share the terminal) a redrawn bar is
a flood: every frame lands in the log (149 frames for one DQN run, 635 with the nested validation bars of a
13-epoch supervised run). There the bar's state is written as one plain line at most every `every_s` seconds,
and its last state when training ends.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

# Set by a sweep while it shows its progress (pipeline.sweep_progress), inherited by the processes it starts: its
# jobs write lines (which a live status prints above itself) instead of bars that would draw over it and each other.
LIVE_STATUS_ENV = "PIPELINE_SWEEP_LIVE_STATUS"
# Off a terminal: one progress line at most this often.
EVERY_S = 30.0


def bar_on_terminal(stream=None) -> bool:
    """Whether a bar may redraw in place on `stream` (sys.stdout): a terminal no sweep status line is using."""
    stream = sys.stdout if stream is None else stream
    try:
        tty = bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or odd stream
        tty = False
    return tty and os.environ.get(LIVE_STATUS_ENV) != "1"


class ThrottledLines:
    """A stream for tqdm off a terminal: tqdm's redraws ("\\r" + state) become whole lines, one at most every
    `every_s` seconds (the first state with a count is written at once, so a log shows the run has started);
    `finish()` writes the last state when it has not been written yet. States without a count ("0/?") and blank
    redraws (a bar clearing itself) are never written."""

    def __init__(self, stream=None, every_s: float = EVERY_S, clock: Callable[[], float] = time.monotonic):
        self.stream, self.every_s, self.clock = stream, float(every_s), clock
        self.pending: str | None = None
        self.last_written_at: float | None = None
        self.last_written: str | None = None

    def _out(self):
        return sys.stdout if self.stream is None else self.stream

    def write(self, text: str) -> int:
        for part in text.replace("\n", "\r").split("\r"):
            state = part.strip()
            if state and "/?" not in state:
                self.pending = state
        now = self.clock()
        if self.pending is not None and (self.last_written_at is None or now - self.last_written_at >= self.every_s):
            self._emit(now)
        return len(text)

    def _emit(self, now: float) -> None:
        if self.pending != self.last_written:
            out = self._out()
            out.write(self.pending + "\n")
            out.flush()
            self.last_written = self.pending
        self.last_written_at, self.pending = now, None

    def finish(self) -> None:
        if self.pending is not None:
            self._emit(self.clock())

    def flush(self) -> None:
        self._out().flush()

    def isatty(self) -> bool:
        return False

"""runtime/progress_bar.py: the bar's hooks called by hand on a task that declares its budget, drawn into a string.

tests/test_progress_bar.py checks a whole DQN run's bar; these pin each hook: what the bar counts, when it is redrawn,
when Lightning's own bar is kept instead.
"""

from __future__ import annotations

import io

import pytest
from lightning.pytorch.callbacks import TQDMProgressBar
from tqdm import tqdm

from pipeline.runtime.progress_bar import BudgetProgressBar
from pipeline.tasks.base import Progress, Task


@pytest.fixture(autouse=True)
def no_monitor_thread(monkeypatch):
    """tqdm's monitor thread would outlive the test (and hang a forking test runner such as mutmut's)."""
    monkeypatch.setattr(tqdm, "monitor_interval", 0)


class BudgetTask(Task):
    """A task whose progress() is whatever the test sets."""

    now: Progress | None = None

    def progress(self) -> Progress | None:
        return self.now


class Drawn:
    """A BudgetProgressBar whose training bar draws into a string (every frame, separated by \\r)."""

    def __init__(self, refresh_rate: int = 1, leave: bool = False) -> None:
        self.callback = BudgetProgressBar(refresh_rate=refresh_rate, leave=leave)
        self.out = io.StringIO()
        self.made = 0
        self.callback.train_progress_bar = self.new_bar()
        self.callback.init_train_tqdm = self.new_bar  # what a leave=True bar makes at each epoch

    def new_bar(self) -> tqdm:
        self.made += 1
        made = tqdm(file=self.out, bar_format=TQDMProgressBar.BAR_FORMAT, ncols=120, mininterval=0, position=0)
        self.start = len(self.out.getvalue())  # what the hooks draw comes after the new bar's empty frame
        return made

    @property
    def bar(self) -> tqdm:
        return self.callback.train_progress_bar

    def frames(self) -> list[str]:
        return [f for f in self.out.getvalue()[self.start:].split("\r") if f.strip()]


def task_at(done: int, total: int, unit: str = "env steps", shown: dict | None = None) -> BudgetTask:
    task = BudgetTask()
    task.now = Progress(done, total, unit, shown if shown is not None else {})
    return task


def test_an_epoch_starts_counting_the_budget_from_where_the_run_is():
    drawn = Drawn()
    drawn.callback.on_train_epoch_start(None, task_at(20_000, 50_000, shown={"return": 1.0}))
    bar = drawn.bar
    assert (bar.desc, bar.unit, bar.unit_scale, bar.total, bar.initial, bar.n) == (
        "env steps: ", "step", True, 50_000, 20_000, 20_000)
    assert bar.postfix is None  # the values beside it come with the first batch
    last = drawn.frames()[-1]
    assert last.startswith("env steps:  40%|") and "| 20.0k/50.0k [" in last and "step/s]" in last, last
    assert drawn.made == 1  # leave=False keeps the bar Lightning made at on_train_start


def test_a_leave_bar_is_made_anew_each_epoch():
    drawn = Drawn(leave=True)
    first = drawn.bar
    drawn.callback.on_train_epoch_start(None, task_at(0, 10, unit="episodes"))
    assert drawn.made == 2 and drawn.bar is not first
    assert (drawn.bar.desc, drawn.bar.total, drawn.bar.n) == ("episodes: ", 10, 0)


def test_a_batch_shows_the_count_and_the_values_to_one_decimal():
    drawn = Drawn()
    task = task_at(0, 50_000)
    drawn.callback.on_train_epoch_start(None, task)
    task.now = Progress(20_000, 50_000, "env steps", {"return": 120.54, "eval": 300.25})
    drawn.callback.on_train_batch_end(None, task, None, None, 0)
    assert drawn.bar.n == 20_000
    assert drawn.bar.postfix == "return=120.5, eval=300.2"
    last = drawn.frames()[-1]
    assert last.startswith("env steps:  40%|") and "20.0k/50.0k" in last, last
    assert last.endswith("step/s, return=120.5, eval=300.2]"), last
    assert sum("return=" in f for f in drawn.frames()) == 1  # one redraw per update, not one per setter


def test_the_bar_is_redrawn_every_refresh_rate_batches_and_at_the_end_of_the_budget():
    drawn = Drawn(refresh_rate=3)
    task = task_at(0, 100)
    drawn.callback.on_train_epoch_start(None, task)
    seen = []
    for batch_idx, done in enumerate([10, 20, 30, 40, 50, 60, 70]):
        task.now = Progress(done, 100, "env steps", {})
        drawn.callback.on_train_batch_end(None, task, None, None, batch_idx)
        seen.append(drawn.bar.n)
    assert seen == [0, 0, 30, 30, 30, 60, 60]
    task.now = Progress(100, 100, "env steps", {})  # the budget reached between refreshes: shown at once
    drawn.callback.on_train_batch_end(None, task, None, None, 7)
    assert drawn.bar.n == 100
    assert drawn.frames()[-1].startswith("env steps: 100%|"), drawn.frames()[-1]


def test_a_count_past_the_budget_shows_the_budget():
    drawn = Drawn()
    task = task_at(0, 192)
    drawn.callback.on_train_epoch_start(None, task)
    task.now = Progress(256, 192, "env steps", {})
    drawn.callback.on_train_batch_end(None, task, None, None, 4)
    assert drawn.bar.n == 192
    task.now = Progress(300, 192, "env steps", {"return": 2.0})
    drawn.callback.on_train_epoch_end(None, task)
    assert drawn.bar.n == 192 and drawn.bar.postfix == "return=2.0"


def test_a_disabled_bar_is_not_updated_by_batches():
    drawn = Drawn()
    task = task_at(0, 10)
    drawn.callback.on_train_epoch_start(None, task)
    drawn.callback.disable()
    task.now = Progress(10, 10, "env steps", {"return": 1.0})
    drawn.callback.on_train_batch_end(None, task, None, None, 0)
    assert drawn.bar.n == 0 and not drawn.bar.postfix


def test_the_epoch_end_shows_the_last_count_and_closes_a_leave_bar():
    for leave in (False, True):
        drawn = Drawn(leave=leave)
        task = task_at(0, 10)
        drawn.callback.on_train_epoch_start(None, task)
        task.now = Progress(7, 10, "env steps", {"eval": 3.14159})
        drawn.callback.on_train_epoch_end(None, task)
        assert (drawn.bar.n, drawn.bar.postfix) == (7, "eval=3.1")
        assert drawn.frames()[-1].startswith("env steps:  70%|"), drawn.frames()[-1]
        assert drawn.bar.disable is leave  # tqdm marks a closed bar disabled


@pytest.fixture
def lightning_hooks(monkeypatch):
    """Lightning's own hooks, recorded instead of run."""
    calls = []
    for hook in ("on_train_epoch_start", "on_train_batch_end", "on_train_epoch_end"):
        monkeypatch.setattr(TQDMProgressBar, hook, lambda self, *args, _h=hook: calls.append((_h, args)))
    return calls


@pytest.mark.parametrize("module", ["a task without a budget", "not a task"])
def test_other_modules_keep_lightnings_bar(lightning_hooks, module):
    pl_module = BudgetTask() if module == "a task without a budget" else object()
    drawn = Drawn()
    drawn.callback.on_train_epoch_start("trainer", pl_module)
    drawn.callback.on_train_batch_end("trainer", pl_module, "outputs", "batch", 5)
    drawn.callback.on_train_epoch_end("trainer", pl_module)
    assert lightning_hooks == [("on_train_epoch_start", ("trainer", pl_module)),
                               ("on_train_batch_end", ("trainer", pl_module, "outputs", "batch", 5)),
                               ("on_train_epoch_end", ("trainer", pl_module))]
    assert drawn.frames() == [] and drawn.bar.n == 0


def test_a_disabled_bar_ends_its_epoch_as_lightning_does(lightning_hooks):
    drawn = Drawn()
    task = task_at(3, 10)
    drawn.callback.disable()
    drawn.callback.on_train_epoch_end("trainer", task)
    assert lightning_hooks == [("on_train_epoch_end", ("trainer", task))]
    assert drawn.bar.n == 0


def test_a_budget_task_does_not_call_lightnings_hooks(lightning_hooks):
    drawn = Drawn()
    task = task_at(3, 10)
    drawn.callback.on_train_epoch_start("trainer", task)
    drawn.callback.on_train_batch_end("trainer", task, None, None, 0)
    drawn.callback.on_train_epoch_end("trainer", task)
    assert lightning_hooks == []


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def compiled_bar(clock: Clock) -> Drawn:
    """A Drawn whose bar is the run's own kind (BudgetTqdm), on a clock the test moves."""
    from pipeline.runtime.progress_bar import BudgetTqdm

    drawn = Drawn()

    def new_bar():
        drawn.made += 1
        made = BudgetTqdm(file=drawn.out, bar_format=TQDMProgressBar.BAR_FORMAT, ncols=120, mininterval=0, position=0)
        made._time = clock
        drawn.start = len(drawn.out.getvalue())
        return made

    drawn.new_bar = new_bar
    drawn.callback.train_progress_bar = new_bar()
    return drawn


def test_the_time_left_leaves_out_compile_time():
    """A compiled run: 30 s of compiling in its first iteration, then 1,000 env steps a second. The bar's rate and
    time left are the working rate's (the 30 s made a 38 s run read hours left), its elapsed the wall clock's."""
    clock = Clock()
    drawn = compiled_bar(clock)
    task = task_at(0, 40_000)
    task.time_breakdown_s = {"compile": 4.0}  # booked by an earlier segment of a resumed run: not this bar's
    drawn.callback.on_train_epoch_start(None, task)
    task.time_breakdown_s = {"compile": 34.0}
    clock.now += 32.0  # 30 s compiling + 2 s for 2,000 env steps
    task.now = Progress(2_000, 40_000, "env steps", {})
    drawn.callback.on_train_batch_end(None, task, None, None, 0)
    last = drawn.frames()[-1]
    assert "[00:32<00:38, 1.00kstep/s" in last, last  # 38,000 steps left at 1,000 a second
    eager = Drawn()  # the same numbers without compile time booked: tqdm's own average over the wall clock
    eager.bar._time = clock
    eager.callback.train_progress_bar = eager.bar
    clock.now -= 32.0
    eager.callback.on_train_epoch_start(None, task_at(0, 40_000))
    clock.now += 32.0
    eager.callback.on_train_batch_end(None, task_at(2_000, 40_000), None, None, 0)
    assert "[00:32<10:08, 62.5step/s" in eager.frames()[-1], eager.frames()[-1]


@pytest.mark.parametrize(("total", "said"), [(10_000_000, True), (3_000_000, False)])
def test_a_run_of_hours_says_its_expected_time_once(caplog, total, said):
    """10M env steps at 1,000 a second (compile left out): about 2.8 hours, said once in the log; 3M (50 min): not."""
    import logging

    clock = Clock()
    drawn = compiled_bar(clock)
    task = task_at(0, total)
    task.time_breakdown_s = {"compile": 0.0}
    drawn.callback.on_train_epoch_start(None, task)
    with caplog.at_level(logging.INFO, logger="pipeline.runtime.progress_bar"):
        task.time_breakdown_s = {"compile": 30.0}
        for i, done in enumerate([1_000, 4_000, 8_000, 12_000]):  # 31 s, then 3, 4, 4 s: said at 8 s worked (>= 5)
            clock.now += 31.0 if i == 0 else (done - [1_000, 4_000, 8_000][i - 1]) / 1000
            task.now = Progress(done, total, "env steps", {})
            drawn.callback.on_train_batch_end(None, task, None, None, i)
    lines = [r.getMessage() for r in caplog.records]
    if said:
        assert lines == ["expected time: about 2.8 h more for 9,992,000 env steps at 1,000 per second (compile time left "
                         "out); Ctrl-C stops it with a checkpoint to resume from"]
    else:
        assert lines == []

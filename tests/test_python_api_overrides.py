"""What a notebook user reaches for: `dir(pipeline)` (tab completion) lists the API without importing torch, and
`pipeline.run` takes its overrides as a dict as well as the command line's strings."""

import subprocess
import sys

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from pipeline.api import overrides_of


def test_dir_lists_the_api_and_imports_nothing_heavy():
    code = ("import sys, pipeline; print(sorted(n for n in dir(pipeline) if not n.startswith('_'))); "
            "print(any(m in sys.modules for m in ('torch', 'lightning')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["['Agent', 'TrainedModel', 'load', 'run']", "False"]


@pytest.mark.parametrize("value", [5000, 0.1, 3e-4, True, None, [64, 64], "ALE/Pong-v5", "my run", "it's", "a\\b",
                                   "ends\\", "x=y,z", ["a b", 1]])
def test_a_dict_value_reads_back_as_the_same_value(value):
    (override,) = OverridesParser.create().parse_overrides(overrides_of({"some.key": value}))
    assert override.key_or_group == "some.key" and override.value() == value


def test_dict_overrides_are_the_command_lines_in_order():
    assert overrides_of({"seed": 3, "task.total_steps": 5000, "model.hidden": [32, 32], "trainer": "debug"}) == [
        "seed=3", "task.total_steps=5000", "model.hidden=[32,32]", "trainer=debug"]


@pytest.mark.slow
def test_run_takes_a_dict_of_overrides(tmp_path):
    import pipeline

    (record,) = pipeline.run("supervised_digits", {"trainer": "debug", "seed": 3, "optimizer.lr": 0.0025,
                                                    "hydra.run.dir": str(tmp_path)})
    assert record["status"] == "ok" and record["seed"] == 3 and record["run_dir"] == str(tmp_path)
    assert record["config"]["optimizer.lr"] == 0.0025

"""A switch a task does not honour is said in one line, not silently ignored."""

import logging

from pipeline.runtime.run import run


def test_device_compile_on_a_lightning_loop_task_says_it_runs_eagerly(make_cfg, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="pipeline"):
        (record,) = run(make_cfg("experiment=supervised_digits", "trainer=debug", "device.compile=true"), tmp_path)
    assert record["status"] == "ok", record["error"]
    said = [r.getMessage() for r in caplog.records if "device.compile" in r.getMessage()]
    assert said == ["device.compile=true: SupervisedTask trains in Lightning's loop, which is not compiled (the RL tasks "
                    "compile their updates); it runs eagerly"]

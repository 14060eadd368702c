"""The resume command a run prints is one a shell and Hydra read back as the same run dir, whatever its name."""

import shlex

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from pipeline.runtime.context import JobContext, path_override

DIRS = ["/tmp/x/run", "/tmp/sweep/0_seed=0", "/tmp/sweep/3_seed=3,optimizer.lr=0.01", "/tmp/a b/[1]", "/tmp/it's $HOME"]


@pytest.mark.parametrize("path", DIRS)
def test_a_path_override_reads_back_as_the_path(path):
    (word,) = shlex.split(path_override("hydra.run.dir", path))
    (parsed,) = OverridesParser.create().parse_overrides([word])
    assert parsed.key_or_group == "hydra.run.dir" and parsed.value() == path


@pytest.mark.parametrize("path", DIRS)
def test_the_resume_command_of_a_job_dir_parses(path):
    ctx = JobContext(run_dir=path, overrides=["experiment=dqn_cartpole", "seed=3"])
    words = shlex.split(ctx.resume_command())
    assert words[:3] == ["python", "-m", "pipeline"] and words[-1] == "ckpt_path=last"
    parsed = OverridesParser.create().parse_overrides(words[3:])
    assert {o.key_or_group: o.value() for o in parsed}["hydra.run.dir"] == path

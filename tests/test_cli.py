"""The command line: bad input gets one clear line and a non-zero exit; help lists the groups."""

import subprocess
import sys

import pytest

from pipeline_testing import read_result, run_cli


def test_unknown_group_option_names_the_group():
    proc = run_cli("experiment=supervised_digits", "model=nope")
    assert proc.returncode != 0
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "'model'" in err[0] and "nope" in err[0] and "mlp" in err[0]


def test_unknown_option_inside_a_sweep_list():
    proc = run_cli("-m", "experiment=supervised_digits", "optimizer=adam,adamz")
    assert proc.returncode != 0 and "adamz" in proc.stderr and "'optimizer'" in proc.stderr


@pytest.mark.parametrize(
    ("override", "names", "fix"),
    [
        ("optimizer.lr=abc", "optimizer.lr", "optimizer.lr=0.001"),
        ("+data.extra=???", "data.extra", "data.extra="),
        ("seed=abc", "seed", "seed=0"),
        ("seed=1.5", "seed=1.5", "seed=0"),
        ("seed=-1", "seed=-1", "seed=0"),
        ("seeds_per_process=0", "seeds_per_process=0", ">= 1"),
        ("task.gamma=1.5", "task.gamma=1.5", "task.gamma=0.99"),
        ("model.hidden=[64,0]", "model.hidden", "model.hidden=[128,128]"),
        ("checkpoint.every_s=-5", "checkpoint.every_s=-5", "checkpoint.every_s=60"),
        ("checkpoint.every_steps=-100", "checkpoint.every_steps=-100", "checkpoint.every_steps=10000"),
        ("device.num_threads=0", "device.num_threads=0", "device.num_threads=1"),
        ("device.num_threads=-2", "device.num_threads=-2", "device.num_threads=1"),
        ("+callbacks.x=1", "callbacks.x", "_target_"),
        ("+device.foo=1", "device.foo", "num_threads"),
        ("+trainer.precision=16-mixed", "trainer.precision", "device.precision"),
        ("model=null", "model=null", "model=none"),
        ("optimizer.lrr=0.1", "optimizer has no key 'lrr'", "did you mean optimizer.lr?"),
        # The preset's model.hidden belongs to its own model option: model=none drops it, and DQN needs a model.
        ("model=none", "model=none: task=dqn builds its network from the model group", "model=actor_critic|"),
        ("task.gama=0.9", "task has no key 'gama'", "task.gamma?"),
        ("~device", "~device", "device=auto|cpu"),
    ],
)
def test_bad_value_is_one_line_and_no_record(tmp_path, override, names, fix):
    """Refused at start-up: exit 2, one line on stderr naming the key and the fix, no traceback, no result.json."""
    run_dir = tmp_path / "run"
    proc = run_cli("experiment=dqn_cartpole", "trainer=debug", override, f"hydra.run.dir={run_dir}")
    assert proc.returncode == 2, proc.stdout[-1000:] + proc.stderr[-1000:]
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1, proc.stderr
    assert names in err[0] and fix in err[0]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not run_dir.exists()  # nothing is created before the config is valid


@pytest.mark.parametrize(
    ("override", "names", "fix"),
    [
        ("data.path={tmp}", "a directory, not a file", "data.path=<dir>/<file>.csv"),
        ("data.path={tmp}/none.csv", "file not found", "CSV of logged bids"),
        ("data.n_bidders=0", "data.n_bidders=0", "data.n_bidders=2 or more"),
        ("data.n_bidders=1", "data.n_bidders=1", "data.n_bidders=2 or more"),
        ("data.n_bidders=5000", "data.n_bidders=5000", "2 to 100 bidders"),
        ("data.n_bidders=2.5", "data.n_bidders=2.5", "data.n_bidders=2 or more"),
    ],
)
def test_bad_auction_data_is_one_line_before_a_run_dir_exists(tmp_path, override, names, fix):
    """The fault probe saw these fail only once the data loaded: a run dir made and a failed record written."""
    proc = run_cli("experiment=rmac_auction", override.format(tmp=tmp_path), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-1000:] + proc.stderr[-1000:]
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and names in err[0] and fix in err[0], proc.stderr
    assert not (tmp_path / "outputs").exists()


def test_a_config_error_leaves_no_run_dir_in_outputs(tmp_path):
    proc = run_cli("experiment=supervised_digits", "trainer=debug", "optimizer.lr=abc", cwd=tmp_path)
    assert proc.returncode == 2 and "optimizer.lr" in proc.stderr
    assert not (tmp_path / "outputs").exists()


def _imported_modules(stderr: str) -> set[str]:
    """The modules `python -X importtime` reports (its lines: 'import time: self | cumulative | name')."""
    return {line.rsplit("|", 1)[-1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.slow
def test_a_refused_command_changes_nothing_and_answers_before_lightning_loads(tmp_path):
    """A finished run in a dir: a plain rerun, a resume with a changed key and a resume while the dir is owned are
    each refused in one line; the dir's .hydra/ config and record stay as they were; Lightning is never imported."""
    run_dir = tmp_path / "run"
    first = run_cli("experiment=dqn_cartpole", "trainer=debug", f"hydra.run.dir={run_dir}")
    assert first.returncode == 0, first.stderr[-2000:]
    before = {p: p.read_bytes() for p in [run_dir / ".hydra" / "config.yaml", run_dir / "result.json"]}
    attempts = [
        (["task.gamma=0.5", "ckpt_path=last"], "task.gamma (0.99 -> 0.5)"),
        (["model.hidden=[8]", "ckpt_path=last"], "model.hidden"),
        ([], "already holds a finished run"),
    ]
    for extra, named in attempts:
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "pipeline", "experiment=dqn_cartpole", "trainer=debug",
             f"hydra.run.dir={run_dir}", *extra], capture_output=True, text=True, timeout=300, cwd=tmp_path,
        )
        errors = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
        assert proc.returncode == 1 and len(errors) == 1 and named in errors[0], proc.stderr[-2000:]
        assert not any(m == "lightning" or m.startswith("lightning.") for m in _imported_modules(proc.stderr))
        assert {p: p.read_bytes() for p in before} == before


@pytest.mark.slow
def test_removing_an_optional_group_reads_as_none(tmp_path):
    proc = run_cli("experiment=supervised_digits", "trainer=debug", "~scheduler", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert read_result(tmp_path)["status"] == "ok"


def test_check_values_directly(make_cfg):
    """The checks run.py calls before writing a record, on configs composed as the CLI does."""
    from pipeline.config.checks import ConfigError, check_values

    check_values(make_cfg("experiment=dqn_cartpole", "seed=4294967295", "task.gamma=0", "model.hidden=[1]"))
    for bad in ("seed=true", "task.gamma=-0.01", "model.hidden=[8,-2]", "seeds_per_process=1.5"):
        with pytest.raises(ConfigError):
            check_values(make_cfg("experiment=dqn_cartpole", bad))


@pytest.mark.slow
def test_console_script_imports_modules_from_the_current_folder(tmp_path):
    """`pipeline` (the installed script) finds a user's module in the current folder like `python -m pipeline`."""
    import subprocess
    from pathlib import Path

    (tmp_path / "my_callbacks.py").write_text(
        "from pathlib import Path\nfrom lightning.pytorch.callbacks import Callback\n\n"
        "class Touch(Callback):\n    def on_train_end(self, trainer, pl_module):\n        Path('touched').write_text('yes')\n"
    )
    script = Path(sys.executable).parent / "pipeline"
    proc = subprocess.run(
        [str(script), "experiment=supervised_digits", "trainer=debug", "+callbacks.touch._target_=my_callbacks.Touch",
         f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert read_result(tmp_path / "run")["status"] == "ok"
    assert (tmp_path / "touched").read_text() == "yes"


def test_help_lists_groups_and_options():
    proc = run_cli("--help")
    assert proc.returncode == 0
    for group in ("model", "loss", "optimizer", "scheduler", "device", "seeding", "logger", "trainer", "data", "env", "experiment"):
        assert f"{group}:" in proc.stdout, group
    assert "rmsprop" in proc.stdout and "cosine" in proc.stdout


@pytest.mark.parametrize("group", ["loss", "optimizer", "scheduler", "device", "logger", "trainer", "callbacks"])
def test_group_options_compose(make_cfg, group):
    from pipeline.config.checks import group_options

    for option in group_options()[group]:
        if group == "device" and option in ("cuda", "mps"):
            continue  # composes, but would fail at start-up on this machine (tested below)
        cfg = make_cfg("experiment=supervised_digits", f"{group}={option}")
        assert cfg[group] is not None


@pytest.mark.slow
def test_cuda_request_without_gpu_is_one_clear_line(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    proc = run_cli("experiment=supervised_digits", "device=cuda", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "device=cpu" in err[0]
    assert not (tmp_path / "result.json").exists()


@pytest.mark.slow
def test_installed_wheel_runs_from_another_directory(tmp_path):
    """`pip install .` (not editable) ships the configs: run from a folder with no conf/ in sight."""
    import subprocess

    from pipeline_testing import ROOT

    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target", str(target), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )
    assert (target / "pipeline" / "conf" / "experiment" / "supervised_digits.yaml").is_file()
    where = subprocess.run(
        [sys.executable, "-c", "import pipeline; print(pipeline.__file__)"],
        capture_output=True, text=True, cwd=tmp_path, env={"PYTHONPATH": str(target)}, check=True,
    )
    assert where.stdout.startswith(str(target))
    proc = run_cli(
        "experiment=supervised_digits", "trainer=debug", f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path, env={"PYTHONPATH": str(target)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = read_result(tmp_path / "run")
    assert record["status"] == "ok"
    assert record["run_dir"] == str(tmp_path / "run")


def test_a_run_dir_that_cannot_be_made_is_one_line_before_anything(tmp_path):
    """An immutable parent dir (chattr +i: refused even to root): one line, exit 1, no Hydra traceback."""
    parent = tmp_path / "locked"
    parent.mkdir()
    if subprocess.run(["chattr", "+i", str(parent)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i needs root and a file system that supports it")
    try:
        proc = run_cli("experiment=dqn_cartpole", "trainer=debug", f"hydra.run.dir={parent / 'run'}")
    finally:
        subprocess.run(["chattr", "-i", str(parent)], check=False)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(err) == 1 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-2000:]
    assert f"cannot create the run dir {parent / 'run'}" in err[0] and "hydra.run.dir=<dir>" in err[0]
    assert list(parent.iterdir()) == []

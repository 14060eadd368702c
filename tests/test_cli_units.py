"""cli.py's plain functions and the front door it wraps (pipeline.runtime.start, which pipeline.run goes through
too), called in this process (tests/test_cli.py drives the same through `python -m pipeline`).

Every expected line is written out here as a user reads it, not rebuilt from the code's own pieces.
"""

from __future__ import annotations

import os
import sys
import warnings

import pytest
from omegaconf import OmegaConf

from pipeline import cli
from pipeline.config.checks import runtime_choices
from pipeline.config.errors import ConfigError
from pipeline.config.startup import check_run
from pipeline.runtime import start
from pipeline.runtime.preflight import RunRefused


@pytest.mark.parametrize("argv", [["--config-dir", "/x"], ["-cd", "/x"], ["--config-path", "/x"], ["-cp", "/x"],
                                  ["--config-dir=/x"], ["--config-path=/x"], ["hydra.searchpath=[file:///x]"],
                                  ["experiment=mine", "+hydra.searchpath=[pkg://mine]"]])
def test_a_users_config_folder_is_recognised_in_every_spelling(argv):
    assert start.adds_config_dirs(argv) is True


@pytest.mark.parametrize("argv", [[], ["experiment=dqn_cartpole"], ["--cfg", "job"], ["-m", "seed=0,1"],
                                  ["hydra.run.dir=/tmp/config-dir"], ["--config-dirs"]])
def test_other_arguments_are_not_a_config_folder(argv):
    assert start.adds_config_dirs(argv) is False


HYDRA_UNKNOWN = "Could not override '{}'.\nTo append to your config use +{}=...\nKey '{}' is not in struct"


def unknown(key: str) -> str:
    return HYDRA_UNKNOWN.format(key, key, key.rpartition(".")[2])


def test_an_unknown_key_is_one_line_with_the_closest_real_key():
    line = start.unknown_key_line(unknown("optimizer.lrr"), ["optimizer.lrr=0.1"])
    assert line == ("optimizer.lrr=0.1: optimizer has no key 'lrr'; did you mean optimizer.lr? "
                    "to add a new key: +optimizer.lrr=0.1")


def test_the_closest_key_is_looked_up_in_the_config_the_other_arguments_compose():
    # learning_starts exists in the DQN task only: the hint needs experiment=dqn_cartpole to be composed too.
    argv = ["experiment=dqn_cartpole", "task.lerning_starts=5"]
    assert start.unknown_key_line(unknown("task.lerning_starts"), argv) == (
        "task.lerning_starts=5: task has no key 'lerning_starts'; did you mean task.learning_starts? "
        "to add a new key: +task.lerning_starts=5")


def test_without_a_close_key_or_a_parent_the_line_has_no_hint():
    assert start.unknown_key_line(unknown("optimizer.zzzzzz"), ["optimizer.zzzzzz=1"]) == (
        "optimizer.zzzzzz=1: optimizer has no key 'zzzzzz'; to add a new key: +optimizer.zzzzzz=1")
    assert start.unknown_key_line(unknown("sed"), ["sed=3"]) == "sed=3: the config has no key 'sed'; to add a new key: +sed=3"


def test_a_typed_override_prefix_is_kept_and_the_plus_not_doubled():
    assert start.unknown_key_line(unknown("optimizer.lrr"), ["~optimizer.lrr"]) == (
        "~optimizer.lrr: optimizer has no key 'lrr'; did you mean optimizer.lr? to add a new key: +~optimizer.lrr")
    assert start.unknown_key_line(unknown("optimizer.lrr"), ["+optimizer.lrr=1"]).endswith("to add a new key: +optimizer.lrr=1")


def test_a_key_that_was_not_typed_as_is_is_named_as_hydra_named_it():
    assert start.unknown_key_line(unknown("optimizer.lrr"), []) == (
        "optimizer.lrr: optimizer has no key 'lrr'; did you mean optimizer.lr? to add a new key: +optimizer.lrr")


def test_the_hint_is_dropped_when_the_other_arguments_do_not_compose():
    line = start.unknown_key_line(unknown("optimizer.lrr"), ["experiment=no_such_preset", "optimizer.lrr=0.1"])
    assert line == "optimizer.lrr=0.1: optimizer has no key 'lrr'; to add a new key: +optimizer.lrr=0.1"


@pytest.mark.parametrize("message", ["Could not load 'experiment/nope'", "Error merging override x", ""])
def test_other_hydra_errors_are_left_to_hydra(message):
    assert start.unknown_key_line(message, ["x=1"]) is None


def test_a_writable_run_dir_passes_and_the_probe_leaves_nothing(tmp_path):
    start.check_writable(tmp_path / "a" / "b" / "run")
    assert list(tmp_path.iterdir()) == [] and not (tmp_path / "a").exists()
    start.check_writable(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_run_dir_that_cannot_be_made_is_one_line_naming_the_dir_the_cause_and_the_fix(tmp_path, monkeypatch):
    (tmp_path / "a_file").write_text("x")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RunRefused) as refused:
        start.check_writable(tmp_path / "a_file" / "run")
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"cannot create the run dir {tmp_path / 'a_file' / 'run'}: ")
    assert line.endswith(f" in {tmp_path / 'a_file'}; choose a writable dir with hydra.run.dir=<dir>")
    # A relative run dir is looked up from the current folder.
    with pytest.raises(RunRefused) as refused:
        start.check_writable(type(tmp_path)("a_file/run/deeper"))
    assert f" in {tmp_path / 'a_file'}; " in str(refused.value)


@pytest.mark.parametrize("accelerator", ["auto", "cpu", "CPU", "Auto", None])
def test_a_device_every_machine_has_passes(accelerator):
    start.check_device(accelerator)


@pytest.mark.parametrize("accelerator", ["cuda", "CUDA", "gpu"])
def test_a_gpu_on_a_machine_without_one_is_a_config_error(accelerator, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ConfigError) as error:
        start.check_device(accelerator)
    assert "device=cpu" in str(error.value)


def cli_cfg(*overrides: str):
    """The job's config and the chosen group options, as the CLI composes them."""
    from hydra import compose, initialize_config_module
    from omegaconf import open_dict

    with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
    choices = runtime_choices(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, choices


def test_a_bad_value_is_one_line_and_exit_2(capsys, tmp_path):
    code, err = single_run_refusal(["experiment=supervised_digits", "optimizer.lr=abc", f"hydra.run.dir={tmp_path / 'r'}"],
                                   capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and "optimizer.lr" in err[0]


def test_a_good_config_passes_the_checks(make_cfg):
    check_run(make_cfg("experiment=supervised_digits"))
    check_run(make_cfg("experiment=dqn_cartpole", "device=cpu"))


def test_a_missing_value_is_refused(make_cfg):
    cfg = make_cfg("experiment=supervised_digits")
    cfg.optimizer.lr = "???"
    with pytest.raises(ConfigError, match="^missing required value 'optimizer.lr'"):
        check_run(cfg)


def test_a_device_refusal_goes_through_the_same_line(capsys, monkeypatch, tmp_path):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    code, err = single_run_refusal(["experiment=supervised_digits", "device=cuda", f"hydra.run.dir={tmp_path / 'r'}"], capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and "device=cpu" in err[0]
    assert not (tmp_path / "r").exists()


def single_run_refusal(argv, capsys) -> tuple[int, list[str]]:
    with pytest.raises(SystemExit) as stop:
        cli._check_single_run_first(argv)
    return stop.value.code, capsys.readouterr().err.strip().splitlines()


def test_a_single_runs_unknown_key_is_refused_before_anything_is_written(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code, err = single_run_refusal(["experiment=supervised_digits", "optimizer.lrr=0.1", f"hydra.run.dir={run_dir}"], capsys)
    assert code == 2 and err == ["error: optimizer.lrr=0.1: optimizer has no key 'lrr'; did you mean optimizer.lr? "
                                 "to add a new key: +optimizer.lrr=0.1"]
    assert not run_dir.exists()


def test_a_single_runs_bad_value_and_unwritable_dir_are_refused(tmp_path, capsys):
    code, err = single_run_refusal(["experiment=supervised_digits", "optimizer.lr=abc", f"hydra.run.dir={tmp_path / 'r'}"], capsys)
    assert code == 2 and len(err) == 1 and "optimizer.lr" in err[0]
    (tmp_path / "f").write_text("x")
    code, err = single_run_refusal(["experiment=supervised_digits", f"hydra.run.dir={tmp_path / 'f' / 'r'}"], capsys)
    assert code == 1 and len(err) == 1 and err[0].startswith("error: cannot create the run dir")


def test_a_run_dir_in_use_is_refused_with_exit_1(tmp_path, capsys):
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # Another process owns the dir (a lock this process held would be its own: the CLI's, shared by its run).
    owner = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                              "from pipeline.runtime.rundir import RunDirLock; RunDirLock(Path(sys.argv[1])).acquire(); "
                              "print('held', flush=True); time.sleep(600)", str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline().strip() == "held"
        code, err = single_run_refusal(["experiment=supervised_digits", f"hydra.run.dir={run_dir}"], capsys)
    finally:
        owner.kill()
        owner.wait()
    assert code == 1 and len(err) == 1 and "is in use by process" in err[0] and str(owner.pid) in err[0]


def test_a_good_single_run_passes_holds_the_dirs_lock_and_leaves_nothing_once_released(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for argv, run_dir in ([["experiment=supervised_digits", f"hydra.run.dir={tmp_path / 'a' / 'run'}"], tmp_path / "a" / "run"],
                          [["experiment=supervised_digits"], None]):  # Hydra's default dir under ./outputs
        held = cli._check_single_run_first(argv)
        assert held.lock.path.is_file() and (run_dir is None or held.lock.path.parent == run_dir == held.run_dir)
        assert argv[-1].startswith("hydra.run.dir=")  # Hydra runs in the dir that was locked, whatever the clock says
        assert held.plan.ckpt is None and not held.plan.extending and held.checked.task_target.endswith("SupervisedTask")
        held.release()
    assert list(tmp_path.iterdir()) == [] and capsys.readouterr().err == ""


@pytest.mark.parametrize("argv", [["-m", "optimizer.lrr=1"], ["--cfg", "job", "optimizer.lr=-1"]])
def test_sweeps_and_flags_are_left_to_hydra(argv, capsys):
    assert cli._check_single_run_first(argv) is None
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("argv, line", [
    (["experiment=no_such_preset"], "error: unknown option 'no_such_preset' for config group 'experiment'; choose one of: "),
    (["hydra/launcher=jobib"], "error: unknown option 'jobib' for config group 'hydra/launcher'; did you mean "
                               "hydra/launcher=joblib? choose one of: basic, joblib, slurm, submitit_local, submitit_slurm"),
])
def test_an_option_hydra_cannot_find_is_one_line(argv, line, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli._check_single_run_first(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith(line) and len(err.strip().splitlines()) == 1, err


def test_hydras_fourteen_lines_for_a_missing_option_become_one():
    """Hydra 1.3's message for `hydra/launcher=jobib`, as it prints it."""
    message = ("In 'hydra/config': Could not find 'hydra/launcher/jobib'\n\nAvailable options in 'hydra/launcher':\n"
               "\tbasic\n\tjoblib\n\tsubmitit_local\nConfig search path:\n\tprovider=hydra, path=pkg://hydra.conf\n")
    assert start.missing_option_line(message) == (
        "unknown option 'jobib' for config group 'hydra/launcher'; did you mean hydra/launcher=joblib? choose one "
        "of: basic, joblib, submitit_local")
    assert start.missing_option_line("Could not override 'x'") is None


@pytest.fixture
def main_env(tmp_path, monkeypatch):
    """A process as `python -m pipeline` starts in, given back afterwards: cwd, sys.path, argv, WANDB_MODE, the
    warning filters, and Hydra's global state (an in-process Hydra app leaves its config behind, which later
    in-process runs would take for their own)."""
    from hydra.core.singleton import Singleton

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "argv", ["pipeline"])
    monkeypatch.delenv("WANDB_MODE", raising=False)
    hydra_state = Singleton.get_state()
    try:
        with warnings.catch_warnings():
            yield tmp_path
    finally:
        Singleton.set_state(hydra_state)


def test_main_refuses_an_unknown_group_option_in_one_line_after_setting_up_the_process(main_env, capsys):
    with pytest.raises(SystemExit) as stop:
        cli._main(["optimizer=nope"])
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == "error: unknown option 'nope' for config group 'optimizer'; choose one of: adam, adamw, none, rmsprop, sgd"
    assert sys.path[0] == str(main_env)  # the user's modules in the current folder are importable
    assert os.environ["WANDB_MODE"] == "offline"
    # runtime.quiet's exact-message filters are installed for the whole process.
    assert any(f[0] == "ignore" and f[1] is not None and f[1].pattern.startswith("The `srun` command") for f in warnings.filters)


def test_main_refuses_a_single_runs_unknown_key(main_env, capsys):
    with pytest.raises(SystemExit) as stop:
        cli._main(["experiment=supervised_digits", "optimizer.lrr=0.1"])
    assert stop.value.code == 2 and "did you mean optimizer.lr?" in capsys.readouterr().err


def test_main_keeps_a_users_wandb_mode_and_path(main_env, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    sys.path.insert(0, str(main_env))
    with pytest.raises(SystemExit):
        cli._main(["model=nope"])
    assert os.environ["WANDB_MODE"] == "disabled" and sys.path.count(str(main_env)) == 1


def test_main_with_a_users_config_folder_skips_the_packaged_group_check(main_env, capsys):
    """`model=mine` may exist only in the user's folder: the packaged groups must not refuse it first."""
    user = main_env / "conf" / "model"
    user.mkdir(parents=True)
    (user / "mine.yaml").write_text("_target_: pipeline.nets.mlp.MLP\nhidden: [8]\n")
    with pytest.raises(SystemExit) as stop:
        cli._main([f"--config-dir={main_env / 'conf'}", "model=mine", "--cfg", "job"])
    out = capsys.readouterr()
    assert stop.value.code == 0, out.err[-2000:]
    assert OmegaConf.create(out.out).model.hidden == [8], out.out[-2000:]


def test_a_config_folder_whose_name_holds_an_equals_sign():
    assert start.adds_config_dirs(["--config-dir=/data/run=3/conf"]) is True


def test_a_value_holding_an_equals_sign_is_still_named_as_typed():
    assert start.unknown_key_line(unknown("optimizer.lrr"), ["optimizer.lrr=a=b"]) == (
        "optimizer.lrr=a=b: optimizer has no key 'lrr'; did you mean optimizer.lr? to add a new key: +optimizer.lrr=a=b")


def test_a_key_starting_with_x_is_not_taken_for_a_prefix():
    assert start.unknown_key_line(unknown("Xray"), ["Xray=1"]) == "Xray=1: the config has no key 'Xray'; to add a new key: +Xray=1"


def test_the_checks_compose_quietly(tmp_path):
    """No "version_base is not specified" (or any other) warning from the start-up checks' own composes."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli._check_single_run_first(["experiment=supervised_digits", f"hydra.run.dir={tmp_path / 'run'}"]).release()
        start.unknown_key_line(unknown("optimizer.lrr"), ["optimizer.lrr=0.1"])
    assert [str(w.message) for w in caught if "version_base" in str(w.message)] == []


def test_a_setting_the_chosen_device_option_lacks_is_refused(capsys, tmp_path):
    """device is a closed group: `+device.foo` would be ignored. The check needs the options the user chose."""
    line = "error: device.foo is not a setting of device=cpu (it would be ignored); its settings: "
    code, err = single_run_refusal(["experiment=supervised_digits", "device=cpu", "+device.foo=1",
                                    f"hydra.run.dir={tmp_path / 'r'}"], capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith(line), err
    cfg, choices = cli_cfg("experiment=supervised_digits", "device=cpu", "+device.foo=1")
    with pytest.raises(ConfigError) as refused:
        check_run(cfg, choices)
    assert f"error: {refused.value}".startswith(line)


@pytest.mark.parametrize("accelerator", ["auto", "cpu", "CPU", "Auto", None])
def test_a_device_every_machine_has_is_not_even_looked_up(accelerator, monkeypatch):
    from pipeline.runtime import devices

    monkeypatch.setattr(devices, "resolve_accelerator", lambda name: pytest.fail(f"looked up {name!r}"))
    start.check_device(accelerator)


def test_flags_are_left_to_hydra_without_composing(monkeypatch):
    import hydra

    monkeypatch.setattr(hydra, "compose", lambda *a, **k: pytest.fail("composed"))
    for argv in (["-m", "seed=0,1"], ["--cfg", "job"], ["experiment=dqn_cartpole", "--help"]):
        assert cli._check_single_run_first(argv) is None


@pytest.fixture
def signals_back():
    import signal

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def test_main_reads_the_command_line_when_given_no_arguments(main_env, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["pipeline", "optimizer=nope", "model=nope"])
    with pytest.raises(SystemExit) as stop:
        cli._main(None)
    assert stop.value.code == 2 and "config group 'optimizer'" in capsys.readouterr().err


def test_main_uses_the_arguments_it_is_given(main_env, capsys, monkeypatch, signals_back):
    monkeypatch.setattr(sys, "argv", ["pipeline", "model=nope"])
    with pytest.raises(SystemExit) as stop:
        cli.main(["optimizer=nope"])
    assert stop.value.code == 2 and "config group 'optimizer'" in capsys.readouterr().err


def test_a_length_typed_with_trainer_debug_lifts_the_debug_cap_it_would_run_into(caplog):
    with caplog.at_level("WARNING", logger="pipeline"):
        argv = start.typed_lengths_win(["experiment=dqn_cartpole", "trainer=debug", "task.total_steps=1000"])
    assert argv == ["experiment=dqn_cartpole", "trainer=debug", "task.total_steps=1000", "trainer.limit_train_batches=null"]
    assert caplog.messages == ["trainer=debug: task.total_steps was typed, so debug's trainer.limit_train_batches cap is "
                               "lifted (trainer.limit_train_batches=null)"]
    assert start.typed_lengths_win(["trainer=debug", "trainer.max_steps=50"])[-1] == "trainer.max_epochs=-1"
    # A cap the user typed stays; without trainer=debug, or without a typed length, nothing changes.
    for argv in (["trainer=debug", "task.total_steps=1000", "trainer.limit_train_batches=5"],
                 ["task.total_steps=1000"], ["trainer=debug", "task.gamma=0.9"]):
        assert start.typed_lengths_win(list(argv)) == argv

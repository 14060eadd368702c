"""The suite's warm interpreter (tests/forkserver.py) must answer as a fresh `python -m pipeline` does."""

import os
import subprocess
import sys

import pytest

from pipeline_testing import ROOT, _same_import_env, run_cli


def fresh(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline"}
    return subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=timeout)


@pytest.mark.parametrize("args", [("optimizer.lr=abc",), ("--help",), ("experiment=no_such_preset",)])
def test_a_forked_run_prints_and_exits_as_a_fresh_interpreter_does(args):
    forked, direct = run_cli(*args), fresh(*args)
    assert forked.returncode == direct.returncode
    assert forked.stdout == direct.stdout
    assert forked.stderr.strip().splitlines()[-1:] == direct.stderr.strip().splitlines()[-1:]


def test_a_forked_run_gets_the_cwd_and_environment_it_is_given(tmp_path):
    # A relative run dir lands under the cwd given, not the server's; the environment given reaches the run.
    proc = run_cli("experiment=cem_cartpole", "trainer=debug", "hydra.run.dir=rel_dir", cwd=tmp_path,
                   env={"WANDB_MODE": "disabled"})
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-1500:]
    assert (tmp_path / "rel_dir" / "result.json").is_file()
    assert not (ROOT / "rel_dir").exists()
    shown = run_cli("experiment=cem_cartpole", "+probe=${oc.env:FORKSERVER_PROBE}", "--cfg", "job", "--resolve",
                    env={"FORKSERVER_PROBE": "value-from-the-test"})
    assert shown.returncode == 0 and "probe: value-from-the-test" in shown.stdout, shown.stdout[-800:] + shown.stderr[-800:]


def test_a_run_past_its_timeout_is_killed_and_raises_as_subprocess_run_does():
    with pytest.raises(subprocess.TimeoutExpired):
        run_cli("experiment=dqn_cartpole", "hydra.run.dir=/tmp/forkserver-timeout-test", timeout=2)


def test_variables_read_while_torch_imports_send_the_run_to_a_fresh_interpreter():
    base = {"PATH": "/bin", "WANDB_MODE": "offline"}
    assert _same_import_env(base, {**base, "WANDB_MODE": "disabled", "HOME": "/x"})
    for key in ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "PYTHONHASHSEED", "MKL_NUM_THREADS", "PL_GLOBAL_SEED"):
        assert not _same_import_env(base, {**base, key: "1"}), key

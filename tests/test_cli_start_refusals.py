"""Inputs that reached a traceback: one line, exit 2, before anything is written."""

import pytest

from pipeline_testing import run_cli

QUICK = ("experiment=supervised_digits", "trainer=debug")


def one_line_refusal(tmp_path, *args, code=2):
    done = run_cli(*QUICK, *args, cwd=tmp_path)
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == code and len(lines) == 1, lines
    assert "Traceback" not in lines[0] and lines[0].startswith("error: ")
    assert list(tmp_path.iterdir()) == []  # no run dir, no outputs/
    return lines[0]


@pytest.mark.parametrize("value", ["a=b,c", "my run (2)", "x,y"])
def test_a_run_dir_hydras_grammar_cannot_read_gets_its_quoted_form(tmp_path, value):
    line = one_line_refusal(tmp_path, f"hydra.run.dir=out/{value}")
    assert f"hydra.run.dir='out/{value}'" in line and "quote it" in line, line


def test_the_quoted_form_it_offers_is_accepted(tmp_path):
    line = one_line_refusal(tmp_path, "hydra.run.dir=out/a=b,c")
    typed = line.split("quote it: ", 1)[1].split(", typed in a shell", 1)[0]
    done = run_cli(*QUICK, typed, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (tmp_path / "out" / "a=b,c" / "result.json").is_file()


def test_a_five_thousand_digit_number_is_one_line(tmp_path):
    line = one_line_refusal(tmp_path, "seed=" + "9" * 5000)
    assert "5000 digits" in line and line.startswith("error: seed=") and len(line) < 300, line


@pytest.mark.parametrize("key", ["hydra.run.dir", "name", "hydra.sweep.dir"])
def test_a_name_longer_than_the_file_system_takes_is_one_line(tmp_path, key):
    long = "n" * 300
    line = one_line_refusal(tmp_path, f"{key}={'out/' + long if key != 'name' else long}")
    assert "300 bytes" in line and "255" in line, line


def test_an_empty_sweep_dir_is_refused(tmp_path):
    line = one_line_refusal(tmp_path, "-m", "seed=0,1", "hydra.sweep.dir=")
    assert "hydra.sweep.dir= is empty" in line


@pytest.mark.slow
def test_a_simulator_whose_import_raises_oserror_is_one_line(tmp_path):
    """MuJoCo installed without the GL library it loads: its import raises OSError (38 lines of traceback before)."""
    fake = tmp_path / "site" / "mujoco"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise OSError("libGL.so.1: cannot open shared object file: No such file or directory")\n')
    work = tmp_path / "work"
    work.mkdir()
    done = run_cli("experiment=sac_halfcheetah", "trainer=debug", cwd=work, env={"PYTHONPATH": str(tmp_path / "site")})
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and lines == [
        "error: env.id=HalfCheetah-v5: the mujoco package is installed but cannot be loaded (OSError: libGL.so.1: cannot "
        "open shared object file: No such file or directory); repair its installation, or choose another env"], lines
    assert list(work.iterdir()) == []

"""docs/bring_your_own.md's network commands, as written: a user's own ResMLP for supervised learning and a user's own
actor-critic for PPO, four seeds in one process each (tests/user_envs: my_nets.py and conf/model/), and each seed's
model.pt loaded into the user's own class."""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline_testing import read_result

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "bring_your_own.md"


def documented(marker: str) -> list[str]:
    return [line for line in DOC.read_text().splitlines() if line.startswith("(cd tests/user_envs && ") and marker in line]


@pytest.fixture
def work(tmp_path):
    folder = tmp_path / "tests" / "user_envs"
    shutil.copytree(ROOT / "tests" / "user_envs", folder, ignore=shutil.ignore_patterns("__pycache__", "outputs"))
    return folder


def run(command: str, work: Path) -> subprocess.CompletedProcess:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # `python` is this interpreter
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=1200, cwd=work.parents[1],
                          env={**os.environ, "PATH": path, "WANDB_MODE": "offline"})
    assert done.returncode == 0, f"{command}\n{done.stdout[-1500:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.slow
def test_a_users_resmlp_trains_four_digit_classifiers_and_loads_into_its_class(work):
    train, load = documented("outputs/resmlp")
    run(train, work)
    # The page's file itself, under a name of its own: another test's `my_nets` may already be in sys.modules.
    spec = importlib.util.spec_from_file_location("bring_your_own_my_nets", work / "my_nets.py")
    my_nets = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(my_nets)
    accuracies = []
    for seed in range(4):
        record = read_result(work / "outputs" / "resmlp" / f"seed{seed}")
        assert record["status"] == "ok" and record["seed"] == seed
        accuracies.append(record["metrics"]["test/acc"])
        net = my_nets.ResMLP(64, 10)
        net.load_state_dict(torch.load(work / "outputs" / "resmlp" / f"seed{seed}" / "model.pt", weights_only=True))
    # Ten classes: chance is 0.1; three epochs of a 64-wide residual net read digits far better than that.
    assert min(accuracies) > 0.8, accuracies
    assert len(set(accuracies)) > 1  # four seeds, four networks
    assert "ResMLP(" in run(load, work).stdout


@pytest.mark.slow
def test_a_users_actor_critic_trains_four_ppo_seeds(work):
    (train,) = documented("outputs/ppo_res")
    run(train, work)
    returns = []
    for seed in range(4):
        record = read_result(work / "outputs" / "ppo_res" / f"seed{seed}")
        assert record["status"] == "ok"
        returns.append(record["metrics"]["eval/return_mean"])
        state = torch.load(work / "outputs" / "ppo_res" / f"seed{seed}" / "model.pt", weights_only=True)
        assert {"torso.2.weight", "pi.weight", "v.weight"} <= set(state)  # the user's own module's names
    # CartPole's random policy returns ~22; 20k env steps of PPO take every seed well past it.
    assert min(returns) > 100, returns

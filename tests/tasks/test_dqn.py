"""DQN: the pieces pinned by shape and arithmetic, then proof that it learns CartPole."""

import numpy as np
import pytest
import torch
from torch import nn

from pipeline.nets.mlp import MLP
from pipeline.rl.targets import freeze
from pipeline.run import run
from pipeline.tasks.dqn import DQNTask, q_of_actions, td_targets
from pipeline_testing import read_result, run_cli


def test_gather_selects_the_taken_action():
    q_values = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    actions = torch.tensor([1, 0, 1])
    q = q_of_actions(q_values, actions)
    assert q.shape == (3,)
    assert torch.equal(q, torch.tensor([2.0, 3.0, 6.0]))


def test_td_targets_by_hand_and_double_dqn():
    online, target = nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        online.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))  # Q_online(s') = s'
        target.weight.copy_(torch.tensor([[0.0, 1.0], [1.0, 0.0]]))  # Q_target(s') = reversed s'
    next_obs = torch.tensor([[1.0, 3.0], [2.0, 0.5]])
    rewards, dones = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    plain = td_targets(target, online, rewards, next_obs, dones, gamma=0.5, double=False)
    # max of reversed s' = 3 -> 1 + 0.5 * 3; the second transition terminated: reward only.
    assert torch.allclose(plain, torch.tensor([2.5, 0.0]))
    double = td_targets(target, online, rewards, next_obs, dones, gamma=0.5, double=True)
    # online argmax of [1, 3] is action 1; the target's Q for action 1 is s'[0] = 1 -> 1 + 0.5 * 1.
    assert torch.allclose(double, torch.tensor([1.5, 0.0]))
    assert not plain.requires_grad


def test_target_network_receives_no_gradient():
    def factory(in_features, out_features):
        return MLP(in_features, out_features, hidden=(16,))

    task = DQNTask(net=factory, loss=nn.SmoothL1Loss(), optimizer=torch.optim.Adam, env={"id": "CartPole-v1"})
    before = [p.clone() for p in task.target_net.parameters()]
    obs = torch.randn(8, 4)
    q = q_of_actions(task.net(obs), torch.randint(0, 2, (8,)))
    target = td_targets(task.target_net, task.net, torch.ones(8), torch.randn(8, 4), torch.zeros(8), 0.99, True)
    nn.SmoothL1Loss()(q, target).backward()
    assert all(p.grad is None and not p.requires_grad for p in task.target_net.parameters())
    assert all(p.grad is not None for p in task.net.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, task.target_net.parameters()))
    assert freeze(nn.Linear(2, 2)).weight.requires_grad is False


def test_dqn_learns_cartpole(make_cfg, tmp_path):
    """A short budget on a fixed seed: a random policy scores ~20, the learned greedy policy far more."""
    cfg = make_cfg(
        "experiment=dqn_cartpole", "trainer.enable_progress_bar=false", "task.total_steps=6000",
        "task.eval_every=2000", "task.stop_at_return=null", "model.hidden=[64,64]", "task.gradient_steps=128", "seed=0",
    )
    record = run(cfg, tmp_path)
    assert record["status"] == "ok", record["error"]
    assert record["env_steps"] == 6000  # the last of 24 rounds is cut to the budget
    assert record["metrics"]["eval/return_mean"] >= 150
    assert set(record["time_breakdown_s"]) >= {"env", "act", "learn", "eval"}
    assert record["env_steps_per_s"] > 0


def test_model_pt_reproduces_the_greedy_return(make_cfg, tmp_path):
    cfg = make_cfg("experiment=dqn_cartpole", "trainer.enable_progress_bar=false", "task.total_steps=3000",
                   "model.hidden=[32]", "task.final_eval_episodes=5")
    record = run(cfg, tmp_path)
    assert record["status"] == "ok", record["error"]
    from pipeline.rl.envs import evaluate_greedy
    from pipeline.tasks.dqn import FINAL_EVAL_SEED_OFFSET

    net = MLP(4, 2, hidden=(32,))
    net.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))
    net.eval()
    returns = evaluate_greedy(lambda o: net(o).argmax(1), "CartPole-v1", 5, 0 + FINAL_EVAL_SEED_OFFSET)
    assert np.mean(returns) == pytest.approx(record["metrics"]["eval/return_mean"])


@pytest.mark.parametrize("variant", [("model=dueling",), ("model=noisy",), ("task.target_update=soft", "task.double_dqn=true", "loss=mse")])
def test_variants_run(make_cfg, tmp_path, variant):
    cfg = make_cfg("experiment=dqn_cartpole", "trainer=debug", "task.learning_starts=256", "model.hidden=[32]", *variant)
    record = run(cfg, tmp_path)
    assert record["status"] == "ok", record["error"]
    assert record["metrics"]["train/updates"] > 0


def test_end_to_end_debug_run(tmp_path):
    proc = run_cli("experiment=dqn_cartpole", "trainer=debug", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = read_result(tmp_path)
    assert record["status"] == "ok"
    assert record["env_steps"] == 3 * 256
    assert record["threshold"] == 475
    for key in ("env_steps_per_s", "time_breakdown_s", "metrics"):
        assert record[key]
    assert "eval/return_mean" in record["metrics"] and "eval/return_std" in record["metrics"]
    assert (tmp_path / "model.pt").is_file() and (tmp_path / "metrics.csv").is_file()

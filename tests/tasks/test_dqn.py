"""DQN for K agents: the pieces pinned by arithmetic, every option for K = 1 and K > 1, and proof that it learns."""


import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from pipeline.nets.heads import DuelingQNet, NoisyQNet
from pipeline.nets.mlp import MLP
from pipeline.rl.schedules import epsilon_at
from pipeline.rl.targets import freeze
from pipeline.runtime.run import run
from pipeline.tasks.dqn import DQNTask, td_targets
from pipeline_testing import read_result, run_cli


def _linear(weight) -> nn.Linear:
    layer = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(weight))
    return layer


def test_td_targets_by_hand_come_from_the_target_network():
    online = _linear([[1.0, 0.0], [0.0, 1.0]])  # Q_online(s') = s'
    target = _linear([[0.0, 1.0], [1.0, 0.0]])  # Q_target(s') = reversed s'
    # [K=1, N=2]: one agent, two transitions.
    next_obs = torch.tensor([[[1.0, 3.0], [2.0, 0.5]]])
    rewards, dones = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    plain = td_targets(target, online, rewards, next_obs, dones, gamma=0.5, double=False)
    # max of reversed s' = 3 -> 1 + 0.5 * 3; the second transition terminated: reward only.
    assert torch.allclose(plain, torch.tensor([[2.5, 0.0]]))
    # Target and online nets disagree: the value must be the target's (a target built from the online
    # net would give 3 here instead of 2).
    shrink = _linear([[0.0, 0.5], [0.5, 0.0]])  # Q_target(s') = reversed s' / 2
    from_target = td_targets(shrink, online, torch.zeros(1, 1), torch.tensor([[[4.0, 3.0]]]), torch.zeros(1, 1), 1.0, False)
    assert torch.allclose(from_target, torch.tensor([[2.0]]))
    # Double DQN: the online net picks the action, the target net values it. Q_target(s'=[4, 1]) = [1, 4].
    next_obs = torch.tensor([[[4.0, 1.0]]])
    picks_1 = td_targets(target, _linear([[0.0, 0.0], [0.0, 1.0]]), torch.zeros(1, 1), next_obs, torch.zeros(1, 1), 1.0, True)
    assert torch.allclose(picks_1, torch.tensor([[4.0]]))
    picks_0 = td_targets(target, _linear([[1.0, 0.0], [0.0, 0.0]]), torch.zeros(1, 1), next_obs, torch.zeros(1, 1), 1.0, True)
    assert torch.allclose(picks_0, torch.tensor([[1.0]]))
    assert not plain.requires_grad


def test_td_targets_keep_agents_apart():
    """Agent k's targets use only agent k's rewards, dones and next states."""
    net = nn.Linear(3, 2)
    rewards = torch.tensor([[1.0, 2.0], [10.0, 20.0]])
    dones = torch.tensor([[1.0, 1.0], [1.0, 1.0]])
    out = td_targets(net, net, rewards, torch.randn(2, 2, 3), dones, 0.99, double=False)
    assert torch.equal(out, rewards)


def _factory(in_features, out_features):
    return MLP(in_features, out_features, hidden=(16,))


def test_target_network_receives_no_gradient():
    task = DQNTask.create(net=_factory, loss=nn.SmoothL1Loss(), optimizer=torch.optim.Adam, env={"id": "CartPole-v1"}, n_agents=2)
    before = [p.clone() for p in task.target_net.parameters()]
    q = task.net(torch.randn(2, 8, 4)).gather(2, torch.randint(0, 2, (2, 8, 1))).squeeze(2)
    target = td_targets(task.target_net, task.net, torch.ones(2, 8), torch.randn(2, 8, 4), torch.zeros(2, 8), 0.99, True)
    task.loss_fn(q, target).mean(1).sum().backward()
    assert all(p.grad is None and not p.requires_grad for p in task.target_net.parameters())
    assert all(p.grad is not None for p in task.net.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, task.target_net.parameters()))
    assert freeze(nn.Linear(2, 2)).weight.requires_grad is False


def test_agent_i_starts_from_the_single_run_weights_of_its_seed():
    batch = DQNTask.create(net=_factory, loss=nn.SmoothL1Loss(), optimizer=torch.optim.Adam, env={"id": "CartPole-v1"}, seed=5, n_agents=3)
    single = DQNTask.create(net=_factory, loss=nn.SmoothL1Loss(), optimizer=torch.optim.Adam, env={"id": "CartPole-v1"}, seed=6)
    member = batch.agent_state_dict(1)
    for key, value in single.agent_state_dict(0).items():
        assert torch.equal(member[key], value), key


def test_epsilon_as_the_run_uses_it_follows_the_schedule(make_cfg, tmp_path):
    """Read epsilon from the run's own curve: it falls from eps_start to eps_end over eps_duration, never rises."""
    (record,) = run(make_cfg("experiment=dqn_cartpole", "trainer.enable_progress_bar=false", "task.total_steps=3000",
                             "task.eps_duration=2000", "task.log_every=256", "task.gradient_steps=0"), tmp_path)
    assert record["status"] == "ok", record["error"]
    curve = pd.read_csv(tmp_path / "metrics.csv").dropna(subset=["train/epsilon"])
    eps = curve["train/epsilon"].to_numpy()
    steps = curve["step"].to_numpy()
    assert np.all(np.diff(eps) <= 1e-12) and eps[0] > 0.8 and eps[-1] == pytest.approx(0.04)
    for step, value in zip(steps, eps):
        assert value == pytest.approx(epsilon_at(int(step), 1.0, 0.04, 2000))


def test_model_pt_reproduces_the_greedy_return(make_cfg, tmp_path):
    cfg = make_cfg("experiment=dqn_cartpole", "trainer.enable_progress_bar=false", "task.total_steps=3000",
                   "model.hidden=[32]", "task.final_eval_episodes=5")
    (record,) = run(cfg, tmp_path)
    assert record["status"] == "ok", record["error"]
    from pipeline.rl.envs import evaluate_greedy
    from pipeline.tasks.rl_task import FINAL_EVAL_SEED_OFFSET

    net = MLP(4, 2, hidden=(32,))
    net.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))
    net.eval()
    returns = evaluate_greedy(lambda o: net(o).argmax(1), "CartPole-v1", 5, 0 + FINAL_EVAL_SEED_OFFSET)
    assert np.mean(returns) == pytest.approx(record["metrics"]["eval/return_mean"])


VARIANTS = {
    "dueling": (("model=dueling", "model.hidden=[32]"), DuelingQNet, {"hidden": (32,)}),
    "noisy": (("model=noisy", "model.hidden=[32]"), NoisyQNet, {"hidden": (32,)}),
    "soft-double-mse": (("model.hidden=[32]", "task.target_update=soft", "task.double_dqn=true", "loss=mse"), MLP, {"hidden": (32,)}),
    "sgd-step": (("model.hidden=[32]", "optimizer=sgd", "scheduler=step", "task.max_grad_norm=null"), MLP, {"hidden": (32,)}),
}


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_option_runs_for_any_k(make_cfg, tmp_path, variant, k):
    overrides, cls, kwargs = VARIANTS[variant]
    cfg = make_cfg("experiment=dqn_cartpole", "trainer.enable_progress_bar=false", "task.total_steps=768",
                   "task.learning_starts=256", "task.eval_every=512", "task.eval_episodes=2", "task.final_eval_episodes=2",
                   f"seeds_per_process={k}", *overrides)
    records = run(cfg, tmp_path)
    assert len(records) == k and [r["seed"] for r in records] == list(range(k))
    for record in records:
        assert record["status"] == "ok", record["error"]
        assert record["metrics"]["train/updates"] > 0 and record["env_steps"] == 768
        net = (cls(4, 2, **kwargs) if cls is not MLP else MLP(4, 2, **kwargs))
        net.load_state_dict(torch.load(f"{record['run_dir']}/model.pt", weights_only=True))


def test_k_agents_with_a_tensor_env_and_envs_per_agent(make_cfg, tmp_path):
    cfg = make_cfg("experiment=dqn_cartpole", "trainer.enable_progress_bar=false", "seeds_per_process=4", "seed=7",
                   "env=cartpole_tensor", "task.envs_per_agent=4", "task.total_steps=2048", "model.hidden=[32,32]")
    records = run(cfg, tmp_path)
    assert sorted(p.name for p in tmp_path.glob("seed*")) == ["seed10", "seed7", "seed8", "seed9"]
    for seed, record in zip((7, 8, 9, 10), records):
        assert record["status"] == "ok" and record["seed"] == seed and record["seeds_per_process"] == 4
        on_disk = read_result(tmp_path / f"seed{seed}")
        assert on_disk["env_steps"] == 2048 and on_disk["metrics"] == record["metrics"]
        assert on_disk["metric_bounds"]["eval/return_mean"] == [0.0, 500.0]
        curve = pd.read_csv(tmp_path / f"seed{seed}" / "metrics.csv")
        assert curve["step"].is_monotonic_increasing and curve["step"].max() == 2048
    assert not (tmp_path / "result.json").exists()  # no synthetic batch record


def test_other_tasks_refuse_several_seeds_per_process_once_before_any_record(tmp_path):
    proc = run_cli("experiment=gan_digits", "seeds_per_process=2", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2
    assert (proc.stdout + proc.stderr).count("trains one seed per process") == 1
    assert not list(tmp_path.rglob("result.json"))  # refused before any work: no failed records


@pytest.mark.slow
def test_end_to_end_debug_run(tmp_path):
    proc = run_cli("experiment=dqn_cartpole", "trainer=debug", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = read_result(tmp_path)
    assert record["status"] == "ok" and record["schema_version"] == 2
    assert record["threshold"] == 475
    assert record["env_steps"] > 0 and record["env_steps_per_s"] > 0
    assert {"env", "act"} <= set(record["time_breakdown_s"])
    assert "eval/return_mean" in record["metrics"] and "eval/return_std" in record["metrics"]
    net = MLP(4, 2, hidden=(128, 128))
    net.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))
    assert "final_eval/return_mean" in (tmp_path / "metrics.csv").read_text().splitlines()[0]


@pytest.mark.slow
def test_dqn_cartpole_solves_on_most_seeds(make_cfg, tmp_path):
    """The preset's recipe, seeds 0-2 in one process: at least 2 of 3 reach a greedy 475 within its budget.

    Measured (single-seed runs, this machine): seeds 0-9 all reached 475 within 35k-68k env steps
    (final 20-episode evaluations 482-500); the bar leaves one seed of margin.
    """
    records = run(make_cfg("experiment=dqn_cartpole", "trainer.enable_progress_bar=false", "seeds_per_process=3"), tmp_path)
    solved = [r for r in records if r["status"] == "ok" and r["time_to_threshold_s"] is not None]
    assert len(solved) >= 2, [(r["seed"], r["metrics"], r["early_stop"]) for r in records]
    assert sum(r["metrics"]["eval/return_mean"] >= 400 for r in records) >= 2


def test_agent_i_of_a_batch_replays_the_agent_of_its_seed_in_another_batch(make_cfg, tmp_path):
    """Without updates, every stream of agent i (init weights, env seeds, exploration draws, evaluation seeds) is
    that of seed `seed + i` wherever it sits: agent 1 of seeds 10-12 and agent 0 of seeds 11-13 have equal curves and
    final returns. Both batches run the same code on the same shapes, so their greedy decisions agree on any CPU (a
    single run's K = 1 kernels could flip a near tie); the single run's initial weights are the agent's, exactly."""
    common = ("experiment=dqn_cartpole", "trainer.enable_progress_bar=false", "task.total_steps=3072",
              "task.gradient_steps=0", "task.log_every=512", "task.eps_duration=2048", "task.eval_every=1024",
              "seeds_per_process=3")
    batch = run(make_cfg(*common, "seed=10"), tmp_path / "batch")
    other = run(make_cfg(*common, "seed=11"), tmp_path / "other")
    assert batch[1]["seed"] == other[0]["seed"] == 11 and batch[1]["status"] == other[0]["status"] == "ok"
    assert batch[1]["metrics"] == other[0]["metrics"]
    a = pd.read_csv(tmp_path / "batch" / "seed11" / "metrics.csv").drop(columns=["perf/env_steps_per_s"])
    b = pd.read_csv(tmp_path / "other" / "seed11" / "metrics.csv").drop(columns=["perf/env_steps_per_s"])
    pd.testing.assert_frame_equal(a, b)
    assert batch[0]["metrics"] != batch[1]["metrics"]  # and the agents are not copies of each other
    short = [o for o in common if o.startswith(("experiment", "trainer", "task.gradient"))]  # no updates: init weights
    (single,) = run(make_cfg(*short, "task.total_steps=64", "task.learning_starts=0", "task.eval_every=64", "seed=11"),
                    tmp_path / "single")
    saved, alone = (torch.load(tmp_path / d / "model.pt", weights_only=True) for d in ("batch/seed11", "single"))
    assert single["seed"] == 11 and saved.keys() == alone.keys() and all(torch.equal(saved[k], alone[k]) for k in saved)


def test_the_one_env_fast_path_trains_exactly_like_the_general_loop(make_cfg, tmp_path, monkeypatch):
    """K = 1 with one gymnasium env on CPU steps the env in numpy; the general tensor loop must give the same weights."""
    overrides = ("experiment=dqn_cartpole", "trainer.enable_progress_bar=false", "seed=3", "task.total_steps=3000",
                 "task.max_grad_norm=null", "checkpoint.enabled=false", "model.hidden=[32]")
    (fast,) = run(make_cfg(*overrides), tmp_path / "fast")
    import pipeline.tasks.dqn as dqn_module

    monkeypatch.setattr(dqn_module, "GymVectorEnv", type("NotTheFastPath", (), {}))
    (general,) = run(make_cfg(*overrides), tmp_path / "general")
    assert fast["status"] == general["status"] == "ok"
    a = torch.load(tmp_path / "fast" / "model.pt", weights_only=True)
    b = torch.load(tmp_path / "general" / "model.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert fast["metrics"] == general["metrics"]


def test_capture_video_records_each_seed_final_policy(make_cfg, tmp_path):
    import imageio.v2 as imageio

    records = run(make_cfg("experiment=dqn_cartpole", "trainer=debug", "task.capture_video=true", "seeds_per_process=2"), tmp_path)
    for record in records:
        assert record["status"] == "ok", record["error"]
        (video,) = record["videos"]
        assert video.startswith(record["run_dir"]) and video.endswith(".mp4")
        frames = imageio.mimread(video, memtest=False)
        # CartPole pays 1 per step: an episode of R steps is R + 1 frames (the first and every step's).
        assert len(frames) == int(record["video_returns"][0]) + 1 and frames[0].ndim == 3

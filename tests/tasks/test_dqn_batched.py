"""Seed-batched DQN: K agents that each behave like their own run, trained in one process."""

import functools
import json

import lightning as L
import numpy as np
import pytest
import torch
from torch import nn

from pipeline.nets.factory import make_net
from pipeline.nets.mlp import MLP
from pipeline.rl.cartpole_tensor import episode_returns
from pipeline.run import run
from pipeline.tasks.dqn import EVAL_SEED_OFFSET, FINAL_EVAL_SEED_OFFSET, DQNTask
from pipeline.tasks.dqn_batched import BatchedDQNTask, BatchedReplay

HIDDEN = (64, 64)


def make_task(n_agents=4, seed=0, **hp) -> BatchedDQNTask:
    return BatchedDQNTask(
        net=functools.partial(MLP, hidden=HIDDEN),
        loss=nn.SmoothL1Loss(),
        optimizer=functools.partial(torch.optim.Adam, lr=2.3e-3),
        env={"id": "CartPole-v1", "dtype": "float64"},
        n_agents=n_agents,
        seed=seed,
        **hp,
    )


def fit(task: BatchedDQNTask, tmp_path) -> list[dict]:
    trainer = L.Trainer(
        accelerator="cpu", devices=1, precision="32-true", logger=False, default_root_dir=str(tmp_path),
        max_epochs=1, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        num_sanity_val_steps=0, limit_val_batches=0,
    )
    return task.fit_and_evaluate(trainer, None, None)


def greedy_of(state: dict, hidden=HIDDEN) -> MLP:
    net = MLP(4, 2, hidden)
    net.load_state_dict(state)
    return net.eval()


def mlp_returns(net: MLP, seeds: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return episode_returns(lambda obs: net(obs).argmax(1), seeds)


def test_agents_start_from_their_single_seed_runs_weights():
    task = make_task(n_agents=3, seed=5)
    for i in range(3):
        torch.manual_seed(5 + i)  # what seed_everything(5 + i) leaves for the single-seed task's net
        single = DQNTask(net=functools.partial(MLP, hidden=HIDDEN), loss=nn.SmoothL1Loss(), optimizer=torch.optim.Adam,
                         env={"id": "CartPole-v1"}, seed=5 + i)
        for name, value in single.net.state_dict().items():
            assert torch.equal(task.agent_state_dict(i)[name], value)
    torch.manual_seed(6)
    assert all(torch.equal(a, b) for a, b in zip(make_net(functools.partial(MLP, hidden=HIDDEN), 4, 2).state_dict().values(),
                                                 task.agent_state_dict(1).values()))


def test_replay_keeps_agents_apart_and_wraps():
    buffer = BatchedReplay(n_agents=3, capacity=5, obs_shape=(2,), device=torch.device("cpu"))
    for t in range(7):  # 7 steps into 5 slots: the first two are overwritten
        obs = torch.tensor([[k * 100 + t, 0.0] for k in range(3)]).view(1, 3, 2)
        buffer.add(obs, torch.ones(1, 3, dtype=torch.int64), torch.ones(1, 3), obs + 1, torch.zeros(1, 3, dtype=torch.bool))
    assert len(buffer) == 5
    gens = [torch.Generator().manual_seed(k) for k in range(3)]
    batch = buffer.sample(4, 8, gens)
    assert batch.obs.shape == (4, 3, 8, 2) and batch.actions.shape == (4, 3, 8)
    owner = torch.div(batch.obs[..., 0], 100, rounding_mode="floor")
    assert torch.equal(owner, torch.arange(3).view(1, 3, 1).expand(4, 3, 8).float())
    assert (batch.obs[..., 0] % 100 >= 2).all()  # steps 0 and 1 were overwritten
    assert torch.equal(batch.next_obs, batch.obs + 1)
    buffer.keep_agents_(torch.tensor([2]))
    kept = buffer.sample(1, 16, gens[2:])
    assert (torch.div(kept.obs[..., 0], 100, rounding_mode="floor") == 2).all()


@pytest.mark.slow
def test_batched_dqn_learns_cartpole(tmp_path):
    """Random play scores ~20; four agents after 8k steps each score far more."""
    task = make_task(n_agents=4, total_steps=8000, gradient_steps=64, eval_every=2000)
    finals = fit(task, tmp_path)
    returns = [m["eval/return_mean"] for m in finals]
    assert np.mean(returns) >= 100, returns
    assert min(returns) >= 40, returns
    assert task.env_steps == 8000
    assert set(task.time_breakdown_s) >= {"act", "env", "learn", "eval", "final_eval"}
    extras = task.agent_extras(0)
    assert extras["env_steps"] == 8000 and extras["threshold"] == 475.0 and extras["seeds_per_process"] == 4
    assert [e["env_step"] for e in extras["evaluations"]] == [2048, 4096, 6144, 8000]


def test_model_reproduces_the_agents_greedy_play_and_the_run_reproduces_exactly(tmp_path):
    def short_run(path):
        task = make_task(n_agents=3, seed=2, total_steps=1536, learning_starts=512, gradient_steps=8,
                         eval_every=1024, final_eval_episodes=4, envs_per_agent=2)
        return task, fit(task, path)

    task, finals = short_run(tmp_path / "a")
    again, finals_again = short_run(tmp_path / "b")
    assert finals == finals_again
    def without_timing(curves):
        return [{step: {k: v for k, v in row.items() if not k.startswith("perf/")} for step, row in c.items()} for c in curves]

    assert without_timing(task.curves) == without_timing(again.curves)
    obs = torch.randn(64, 4)
    for i in range(3):
        state = task.agent_state_dict(i)
        assert all(torch.equal(v, again.agent_state_dict(i)[k]) for k, v in state.items())
        net = greedy_of(state)
        with torch.no_grad():
            member = task.agents_net(obs.unsqueeze(0).expand(3, -1, -1))[i]
            assert torch.equal(net(obs).argmax(1), member.argmax(1))
        seeds = [2 + i + FINAL_EVAL_SEED_OFFSET + j for j in range(4)]
        assert mlp_returns(net, seeds).mean().item() == pytest.approx(finals[i]["eval/return_mean"])
    # Six rounds of 256 env steps; the buffers hold 512 from the second on: five rounds of 8 updates.
    assert task.env_steps == 1536 and finals[0]["train/updates"] == 5 * 8


def test_stopped_agents_are_frozen_at_the_evaluation_that_stopped_them(tmp_path):
    # A low bar: some agents stop at an early evaluation, the rest keep learning without them.
    task = make_task(n_agents=4, seed=0, total_steps=4096, learning_starts=512, gradient_steps=32, eval_every=512,
                     stop_at_return=40)
    finals = fit(task, tmp_path)
    stopped = [i for i in range(4) if task.early_stop[i] is not None]
    assert stopped, "expected at least one agent to reach the low bar"
    for i in stopped:
        step, mean, _ = task.evaluations[i][-1]
        assert task.early_stop[i]["env_step"] == step == task.stop_step[i] and mean >= 40
        # The weights it left with are the ones that played that evaluation.
        seeds = [i + EVAL_SEED_OFFSET + j for j in range(10)]
        assert mlp_returns(greedy_of(task.agent_state_dict(i)), seeds).mean().item() == pytest.approx(mean)
        assert task.agent_extras(i)["env_steps"] == step
        assert max(task.curves[i]) == step  # no rows after it stopped
    if len(stopped) == 4:
        assert task.env_steps == max(task.stop_step)  # the run ends when the last one stops
    assert len(finals) == 4


def test_agent_curves_csv(tmp_path):
    task = make_task(n_agents=2, total_steps=2048, learning_starts=512, gradient_steps=4, eval_every=1024, log_every=512)
    fit(task, tmp_path)
    task.write_agent_curves(1, tmp_path / "metrics.csv")
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    header = lines[0].split(",")
    assert header[0] == "step"
    for column in ("eval/return_mean", "eval/return_std", "train/episodic_return", "train/loss", "train/epsilon",
                   "final_eval/return_mean"):
        assert column in header
    steps = [int(line.split(",")[0]) for line in lines[1:]]
    assert steps == sorted(steps) and steps[-1] == 2048


def test_rejects_what_it_cannot_batch():
    with pytest.raises(ValueError, match="tensor envs"):
        BatchedDQNTask(net=MLP, loss=nn.SmoothL1Loss(), optimizer=torch.optim.Adam, env={"id": "MountainCar-v0"})
    with pytest.raises(ValueError, match="multiple of"):
        make_task(train_frequency=100, envs_per_agent=3)


def test_preset_runs_through_run_and_writes_one_record_per_seed(make_cfg, tmp_path):
    cfg = make_cfg("experiment=dqn_cartpole_batched", "seeds_per_process=2", "seed=3", "trainer.enable_progress_bar=false",
                   "task.total_steps=1024", "task.learning_starts=512", "task.eval_every=512", "task.final_eval_episodes=3",
                   "model.hidden=[16]")
    summary = run(cfg, tmp_path)
    assert summary["status"] == "ok", summary["error"]
    for seed in (3, 4):
        record = json.loads((tmp_path / f"seed{seed}" / "result.json").read_text())
        assert record["status"] == "ok" and record["seed"] == seed
        assert record["primary_metric"] == "eval/return_mean" and "eval/return_mean" in record["metrics"]
        assert record["env_steps"] == 1024 and record["seeds_per_process"] == 2
        net = MLP(4, 2, (16,))
        net.load_state_dict(torch.load(tmp_path / f"seed{seed}" / "model.pt", weights_only=True))
        assert (tmp_path / f"seed{seed}" / "metrics.csv").read_text().startswith("step,")

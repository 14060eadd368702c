"""Seed-batched supervised learning: K MLPs on digits in one process, each an ordinary model in the end."""

import functools
import json

import lightning as L
import pytest
import torch
from torch import nn

from pipeline.data.digits import DigitsDataModule
from pipeline.nets.ensemble import per_member_grad_norm
from pipeline.nets.mlp import MLP
from pipeline.run import run
from pipeline.tasks.supervised_batched import BatchedSupervisedTask

HIDDEN = (64,)


def make_task(n_agents=4, seed=0, loss=None, hidden=HIDDEN, **kwargs) -> BatchedSupervisedTask:
    return BatchedSupervisedTask(
        net=functools.partial(MLP, hidden=hidden),
        loss=loss or nn.CrossEntropyLoss(),
        optimizer=functools.partial(torch.optim.Adam, lr=0.005),
        in_features=64,
        n_classes=10,
        n_agents=n_agents,
        seed=seed,
        **kwargs,
    )


def trainer(tmp_path, epochs: int, **kwargs) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu", devices=1, precision="32-true", logger=False, default_root_dir=str(tmp_path), max_epochs=epochs,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0, **kwargs,
    )


def accuracy(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    net.eval()
    with torch.no_grad():
        return (net(x).argmax(1) == y).float().mean().item()


@pytest.fixture
def digits():
    data = DigitsDataModule(batch_size=64)
    data.setup("fit")
    return data


def test_every_member_learns_digits_and_exports_an_ordinary_mlp(digits, tmp_path):
    task = make_task(n_agents=4)
    finals = task.fit_and_evaluate(trainer(tmp_path, epochs=15), digits, None)
    assert len(finals) == 4
    x_test, y_test = digits.splits["test"].tensors
    for i, metrics in enumerate(finals):
        assert metrics["test/acc"] > 0.9, finals
        net = MLP(64, 10, HIDDEN)
        net.load_state_dict(task.agent_state_dict(i))
        assert accuracy(net, x_test, y_test) == pytest.approx(metrics["test/acc"], abs=1e-6)
    # Different seeds, different members.
    assert not torch.equal(task.agent_state_dict(0)["net.0.weight"], task.agent_state_dict(1)["net.0.weight"])
    task.write_agent_curves(2, tmp_path / "metrics.csv")
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    header = lines[0].split(",")
    assert header[0] == "step" and {"train/loss", "train/acc", "val/loss", "val/acc", "test/acc", "test/loss"} <= set(header)
    assert [int(line.split(",")[0]) for line in lines[1:]] == list(range(16))  # epochs 0-14, then the test row


def test_members_train_exactly_as_they_would_alone(digits, tmp_path):
    """Member i of a batch of 3 equals member 0 of a batch of 1 with seed + i: nothing couples them."""
    def weights(n_agents, seed, member):
        task = make_task(n_agents=n_agents, seed=seed, hidden=(16,))
        task.fit_and_evaluate(trainer(tmp_path, epochs=2, limit_val_batches=0), digits, None)
        return task.agent_state_dict(member)

    batched = weights(3, 10, member=2)
    alone = weights(1, 12, member=0)
    for name, value in alone.items():
        assert torch.allclose(batched[name], value, atol=1e-5), name


def test_gradient_norm_clipping_is_per_member(digits, tmp_path):
    task = make_task(n_agents=2)
    finals = task.fit_and_evaluate(trainer(tmp_path, epochs=1, gradient_clip_val=0.5, limit_val_batches=0), digits, None)
    assert all(m["test/acc"] > 0.5 for m in finals)
    x = torch.randn(2, 8, 64)
    out = task.net(x) * torch.tensor([1000.0, 1.0]).view(2, 1, 1)
    out.sum().backward()
    params = list(task.net.parameters())
    norms = per_member_grad_norm(params)
    small_before = [p.grad[1].clone() for p in params]
    # A bound between the two members' norms: only the large one is clipped, to exactly the bound.
    bound = 2 * norms[1].item()
    assert norms[0] > bound
    task.configure_gradient_clipping(None, gradient_clip_val=bound)
    assert all(torch.equal(p.grad[1], g) for p, g in zip(params, small_before))
    assert per_member_grad_norm(params)[0].item() == pytest.approx(bound, rel=1e-4)


@pytest.mark.parametrize("loss", [nn.BCEWithLogitsLoss(), nn.MSELoss()])
def test_other_target_kinds_run(digits, tmp_path, loss):
    task = make_task(n_agents=2, loss=loss)
    finals = task.fit_and_evaluate(trainer(tmp_path, epochs=1, limit_train_batches=3, limit_val_batches=1), digits, None)
    assert all(0.0 <= m["test/acc"] <= 1.0 for m in finals)


def test_preset_runs_through_run_and_writes_one_record_per_seed(make_cfg, tmp_path):
    cfg = make_cfg("experiment=supervised_digits_batched", "seeds_per_process=2", "seed=4", "trainer=debug")
    summary = run(cfg, tmp_path)
    assert summary["status"] == "ok", summary["error"]
    for seed in (4, 5):
        record = json.loads((tmp_path / f"seed{seed}" / "result.json").read_text())
        assert record["status"] == "ok" and record["seed"] == seed and "test/acc" in record["metrics"]
        net = MLP(64, 10, (256, 128), dropout=0.2)
        net.load_state_dict(torch.load(tmp_path / f"seed{seed}" / "model.pt", weights_only=True))

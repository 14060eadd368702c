"""SupervisedTask's behaviours pinned on tiny data, each test well under a second (mutation testing runs them).

Every expectation is computed here independently of the task: a plain network loaded with member
i's starting weights, trained by hand with torch on member i's own data order, is what member i of
a K-member run must end with; losses and accuracies are checked against hand-computed values.
"""

import math
from dataclasses import dataclass

import lightning as L
import optuna
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pipeline.nets.mlp import MLP
from pipeline.report.stats import fast_iqm
from pipeline.runtime.loggers import CurveLogger
from pipeline.store.curves import CurveLog
from pipeline.tasks.supervised import SupervisedTask, split_tensors, target_kind
from pipeline.tune.pruning import PRUNED_REASON, TrialReporter

IN, C = 3, 3


@dataclass
class Sizes:
    """What the task reads from its datamodule when it is built (the data itself comes to fit_and_evaluate)."""

    in_features: int
    n_classes: int


class TinyData(L.LightningDataModule):
    """Ten training samples (batches of 4, 4 and 2), six validation and five test samples, integer labels.

    Like most datamodules it builds the splits of the stage it is set up for (None: every stage).
    """

    def __init__(self, batch_size: int | None = 4, n_train: int = 10):
        super().__init__()
        g = torch.Generator().manual_seed(123)

        def split(n):
            return TensorDataset(torch.randn(n, IN, generator=g), torch.randint(0, C, (n,), generator=g))

        self.all = {"train": split(n_train), "val": split(6), "test": split(5)}
        self.data = {}
        if batch_size is not None:
            self.batch_size = batch_size

    def setup(self, stage=None):
        for name in {"fit": ("train", "val"), "test": ("test",), None: ("train", "val", "test")}.get(stage, ()):
            self.data[name] = self.all[name]

    def train_dataloader(self):
        return DataLoader(self.data["train"], batch_size=4, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.data["val"], batch_size=4)

    def test_dataloader(self):
        return DataLoader(self.data["test"], batch_size=4)


def net(in_features, out_features):
    return MLP(in_features, out_features, hidden=(5,))


def sgd(lr):
    return lambda params: torch.optim.SGD(params, lr=lr)


def make_task(loss=None, lr=0.1, seed=0, k=1, **kwargs):
    return SupervisedTask.create(net=kwargs.pop("net", net), loss=loss or nn.CrossEntropyLoss(), optimizer=kwargs.pop("optimizer", sgd(lr)),
                                 datamodule=Sizes(IN, C), seed=seed, n_agents=k, **kwargs)


def trainer(epochs=1, **kwargs):
    kwargs = {"logger": False, "enable_checkpointing": False, "num_sanity_val_steps": 0, **kwargs}
    return L.Trainer(accelerator="cpu", devices=1, max_epochs=epochs, enable_progress_bar=False,
                     enable_model_summary=False, **kwargs)


def fit(task, tmp_path, epochs=1, data=None, **trainer_kwargs):
    task.curves = [CurveLog(tmp_path / f"agent{i}.csv") for i in range(task.n_agents)]
    metrics = task.fit_and_evaluate(trainer(epochs, **trainer_kwargs), data or TinyData(), None)
    return metrics


def plain(task, i):
    """Member i as an ordinary network."""
    single = net(IN, 1 if task.kind == "regression" else task.n_classes)
    single.load_state_dict(task.agent_state_dict(i))
    return single


def train_by_hand(single, x, y, order, batch_size, lr, epochs=1, clip=None, loss_fn=None):
    """Plain SGD over `order` in minibatches: the run of one seed, written out."""
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    for epoch_order in order[:epochs]:
        for start in range(0, len(epoch_order), batch_size):
            idx = epoch_order[start : start + batch_size]
            single.zero_grad()
            loss_fn(single(x[idx]), y[idx]).backward()
            if clip is not None:
                clip(single.parameters())
            with torch.no_grad():
                for p in single.parameters():
                    p -= lr * p.grad
    return single


def orders(seed, n, epochs):
    g = torch.Generator().manual_seed(seed)
    return [torch.randperm(n, generator=g) for _ in range(epochs)]


def assert_same_weights(a: nn.Module, b: nn.Module, atol=1e-6):
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.allclose(x, y, atol=atol), name


# ---- pure pieces -------------------------------------------------------------------------------


def test_the_loss_decides_the_target_kind_and_the_output_width():
    assert target_kind(nn.CrossEntropyLoss()) == target_kind(nn.NLLLoss()) == "classification"
    assert target_kind(nn.BCEWithLogitsLoss()) == target_kind(nn.BCELoss()) == "one_vs_all"
    assert target_kind(nn.MSELoss()) == target_kind(nn.L1Loss()) == "regression"
    x = torch.randn(2, 4, IN)
    assert make_task(nn.CrossEntropyLoss(), k=2).net(x).shape == (2, 4, C)
    assert make_task(nn.BCEWithLogitsLoss(), k=2).net(x).shape == (2, 4, C)
    assert make_task(nn.MSELoss(), k=2).net(x).shape == (2, 4, 1)


def test_a_split_is_read_in_dataset_order_whatever_the_loader_shuffles():
    x, y = torch.arange(2000.0).view(-1, 1), torch.arange(2000)
    torch.manual_seed(0)
    got_x, got_y = split_tensors(DataLoader(TensorDataset(x, y), batch_size=7, shuffle=True))
    assert torch.equal(got_x, x) and torch.equal(got_y, y)  # 2000 > one 1024 read: both chunks, in order


def test_bad_values_are_refused():
    with pytest.raises(ValueError, match="seeds_per_process must be positive"):
        make_task(k=0)
    with pytest.raises(ValueError, match="scheduler_interval='batch'; choose epoch or step"):
        make_task(scheduler_interval="batch")


def test_by_default_one_member_of_seed_0():
    task = SupervisedTask.create(net=net, loss=nn.CrossEntropyLoss(), optimizer=sgd(0.1), datamodule=Sizes(IN, C))
    assert task.agent_seeds == [0] and task.n_agents == 1
    assert_same_weights(plain(task, 0), plain(make_task(seed=0), 0), atol=0)


def test_members_start_as_the_single_runs_of_their_seeds():
    batch, single = make_task(seed=5, k=3), make_task(seed=6)
    assert batch.agent_seeds == [5, 6, 7]
    assert_same_weights(plain(batch, 1), plain(single, 0), atol=0)


def test_per_member_loss_and_accuracy_by_hand():
    # Two members, two samples, two classes; logits chosen so the numbers are known.
    task = SupervisedTask.create(net=net, loss=nn.CrossEntropyLoss(), optimizer=sgd(0.1), datamodule=Sizes(IN, 2), n_agents=2)
    out = torch.tensor([[[0.0, 0.0], [2.0, 0.0]], [[0.0, math.log(3.0)], [0.0, 0.0]]])
    y = torch.tensor([[0, 1], [1, 1]])
    loss, acc, mae = task.per_member(out, y)
    # member 0: -log(1/2) and -log(1/(1+e^2)); member 1: -log(3/4) and -log(1/2)
    expected = [(math.log(2) + math.log(1 + math.e**2)) / 2, (math.log(4 / 3) + math.log(2)) / 2]
    assert loss.tolist() == pytest.approx(expected)
    # argmax of a tie is class 0: member 0 gets sample 0 right and sample 1 wrong; member 1 gets 1 of 2.
    assert acc.tolist() == [0.5, 0.5] and mae is None


def test_one_vs_all_loss_by_hand():
    task = SupervisedTask.create(net=net, loss=nn.BCEWithLogitsLoss(), optimizer=sgd(0.1), datamodule=Sizes(IN, 4))
    # each sample has one logit log 3 (sigmoid 3/4) and three 0s (sigmoid 1/2); labels 1, 2, 2 (class 3 never
    # appears, yet is one of the outputs)
    t = math.log(3.0)
    out = torch.tensor([[[0.0, t, 0.0, 0.0], [0.0, 0.0, t, 0.0], [t, 0.0, 0.0, 0.0]]])
    loss, acc, mae = task.per_member(out, torch.tensor([[1, 2, 2]]))
    # samples 0 and 1: the label's output -log(3/4), three others -log(1/2); sample 2: -log(1/4) on output 0,
    # -log(1/2) on the other three (its label's included)
    assert loss.tolist() == pytest.approx([(2 * (3 * math.log(2) + math.log(4 / 3)) + math.log(4) + 3 * math.log(2)) / 12])
    assert acc.tolist() == [pytest.approx(2 / 3)] and mae is None  # each sample's highest output is its class, but the last's


def test_regression_loss_accuracy_and_mae_by_hand():
    task = SupervisedTask.create(net=net, loss=nn.MSELoss(), optimizer=sgd(0.1), datamodule=Sizes(IN, 3))
    out = torch.tensor([[[0.4], [2.6], [-1.0], [5.0], [1.6]]])  # rounds to 0, 3 -> clamped 2, -1 -> clamped 0, 5 -> 2, 2
    y = torch.tensor([[0, 2, 0, 2, 1]])  # integer labels, regressed as numbers
    loss, acc, mae = task.per_member(out, y)
    assert loss.tolist() == pytest.approx([(0.16 + 0.36 + 1.0 + 9.0 + 0.36) / 5])
    assert mae.tolist() == pytest.approx([(0.4 + 0.6 + 1.0 + 3.0 + 0.6) / 5])
    assert acc.tolist() == [pytest.approx(0.8)]  # 1.6 -> 2 against label 1 is the one miss


# ---- training ---------------------------------------------------------------------------------


def test_each_member_trains_exactly_like_the_single_run_of_its_seed_by_hand(tmp_path):
    """Two epochs of SGD over batches 4, 4, 2 in each member's own order: member i = plain SGD of seed i's net."""
    task = make_task(lr=0.3, seed=4, k=2)
    start = [plain(task, i) for i in range(2)]
    fit(task, tmp_path, epochs=2)
    x, y = TinyData().all["train"].tensors
    for i, seed in enumerate((4, 5)):
        expected = train_by_hand(start[i], x, y, orders(seed, 10, 2), 4, 0.3, epochs=2)
        assert_same_weights(plain(task, i), expected)


@pytest.mark.parametrize("algorithm", [None, "norm"])
def test_gradient_norm_clipping_is_per_member(tmp_path, algorithm):
    """A norm over the whole stack would shrink the member with small gradients: each is clipped alone."""
    task = make_task(lr=0.5, seed=0, k=2)
    with torch.no_grad():  # member 1's gradients are far larger than member 0's
        for p in task.net.parameters():
            p[1].mul_(8.0)
    start = [plain(task, i) for i in range(2)]
    fit(task, tmp_path, gradient_clip_val=0.25, gradient_clip_algorithm=algorithm)
    x, y = TinyData().all["train"].tensors
    for i in range(2):
        expected = train_by_hand(start[i], x, y, orders(i, 10, 1), 4, 0.5,
                                 clip=lambda ps: nn.utils.clip_grad_norm_(list(ps), 0.25))
        assert_same_weights(plain(task, i), expected)


def test_gradient_value_clipping(tmp_path):
    task = make_task(lr=0.5, seed=0, k=2)
    start = [plain(task, i) for i in range(2)]
    fit(task, tmp_path, gradient_clip_val=0.01, gradient_clip_algorithm="value")
    x, y = TinyData().all["train"].tensors
    for i in range(2):
        expected = train_by_hand(start[i], x, y, orders(i, 10, 1), 4, 0.5,
                                 clip=lambda ps: nn.utils.clip_grad_value_(list(ps), 0.01))
        assert_same_weights(plain(task, i), expected)


def _full(task, i, x, y):
    with torch.no_grad():
        out = plain(task, i)(x)
    return nn.functional.cross_entropy(out, y).item(), (out.argmax(1) == y).float().mean().item()


def test_epoch_curves_are_sample_weighted_means_per_member(tmp_path):
    """lr 0: weights fixed, so the train curve over batches 4, 4, 2 is the whole training set's loss and accuracy."""
    task = make_task(lr=0.0, seed=1, k=2)
    metrics = fit(task, tmp_path, epochs=2)
    data = TinyData().all
    for i in range(2):
        rows = task.curves[i].rows
        assert sorted(rows) == [0, 1, 2]
        for split in ("train", "val"):
            loss, acc = _full(task, i, *data[split].tensors)
            for epoch in (0, 1):
                assert rows[epoch][f"{split}/loss"] == pytest.approx(loss, rel=1e-6), (i, split, epoch)
                assert rows[epoch][f"{split}/acc"] == pytest.approx(acc), (i, split, epoch)
        assert rows[0]["train/lr"] == rows[1]["train/lr"] == 0.0
        loss, acc = _full(task, i, *data["test"].tensors)
        assert metrics[i] == pytest.approx({"test/acc": acc, "test/loss": loss})
        # the final metrics land on the curve after the last epoch
        assert rows[2] == pytest.approx({"test/acc": acc, "test/loss": loss})
    assert task.curves[0].rows[0]["train/loss"] != task.curves[1].rows[0]["train/loss"]
    assert set(task.time_breakdown_s) == {"fit", "test"} and all(v > 0 for v in task.time_breakdown_s.values())


def test_regression_reports_mae(tmp_path):
    task = make_task(nn.MSELoss(), lr=0.0, k=2)
    metrics = fit(task, tmp_path)  # integer labels, regressed as numbers
    x, y = TinyData().all["test"].tensors
    assert y.dtype == torch.int64
    for i in range(2):
        with torch.no_grad():
            value = plain(task, i)(x).squeeze(1)
        assert metrics[i]["test/mae"] == pytest.approx((value - y).abs().mean().item(), rel=1e-6)
        assert metrics[i]["test/loss"] == pytest.approx(((value - y) ** 2).mean().item(), rel=1e-6)
        for split in ("train", "val"):  # lr 0: the epoch's sample-weighted mean is the whole split's
            xs, ys = TinyData().all[split].tensors
            with torch.no_grad():
                values = plain(task, i)(xs).squeeze(1)
            assert task.curves[i].rows[0][f"{split}/mae"] == pytest.approx((values - ys).abs().mean().item(), rel=1e-6)


def test_batch_size_comes_from_the_datamodule_or_its_loader(tmp_path):
    task = make_task()
    task.attach_data(TinyData(batch_size=3))
    assert task.batch_size == 3 and task.n_batches() == 4  # ceil(10 / 3)
    task.attach_data(TinyData(batch_size=None))  # no attribute: the training loader's (4)
    assert task.batch_size == 4 and task.n_batches() == 3
    assert len(task.train_dataloader()) == 3 and len(task.val_dataloader()) == len(task.test_dataloader()) == 1


@pytest.mark.parametrize("interval, expected", [("epoch", [1.0, 2**-1, 2**-2]), ("step", [1.0, 2**-3, 2**-6])])
def test_the_scheduler_steps_the_learning_rate(tmp_path, interval, expected):
    """StepLR(1, 0.5): halved after each epoch, or after each of the 3 batches.

    The rate the weights saw is pinned by SGD by hand with those rates. The curve's train/lr at epoch e
    is the rate epoch e started with (its first batch's), as Lightning's LearningRateMonitor logs it;
    before, it was the rate after epoch e's scheduler steps, one epoch ahead.
    """
    task = make_task(lr=1.0, k=2, scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 1, 0.5),
                     scheduler_interval=interval)
    start = [plain(task, i) for i in range(2)]
    fit(task, tmp_path, epochs=3)
    lrs = [task.curves[0].rows[e]["train/lr"] for e in range(3)]
    assert lrs == expected
    x, y = TinyData().all["train"].tensors
    for i in range(2):
        single, rate = start[i], 1.0
        for order in orders(i, 10, 3):
            for s in range(0, 10, 4):
                single.zero_grad()
                nn.functional.cross_entropy(single(x[order[s : s + 4]]), y[order[s : s + 4]]).backward()
                with torch.no_grad():
                    for p in single.parameters():
                        p -= rate * p.grad
                rate *= 0.5 if interval == "step" else 1.0
            rate *= 0.5 if interval == "epoch" else 1.0
        assert_same_weights(plain(task, i), single, atol=1e-5)


# ---- logging, pruning, checkpoints, the record ------------------------------------------------


def test_one_member_also_logs_to_the_loggers_several_do_not(tmp_path):
    for k in (1, 2):
        log = CurveLog(tmp_path / f"logger{k}.csv")
        task = make_task(lr=0.0, k=k)
        fit(task, tmp_path, epochs=2, logger=CurveLogger(log))
        own = {s: {key: v for key, v in row.items() if "/" in key} for s, row in log.rows.items()}
        if k == 1:
            assert own == task.curves[0].rows
            assert all(row["epoch"] == s for s, row in log.rows.items())  # the epoch, as a column of its own
        else:
            assert own == {} or all(not row for row in own.values())


def test_the_tuner_sees_the_members_validation_accuracy_and_prunes(tmp_path):
    """A pruner that prunes at once: training stops after epoch 0's validation, and the record says why."""
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.ThresholdPruner(lower=2.0))
    trial = study.ask()
    task = make_task(lr=0.1, k=4)
    task.trial_reporter = TrialReporter(trial)
    fit(task, tmp_path, epochs=3)
    accs = [task.curves[i].rows[0]["val/acc"] for i in range(4)]
    assert fast_iqm(accs) != fast_iqm([task.curves[i].rows[0]["train/acc"] for i in range(4)])  # it is the validation's
    assert trial.storage.get_trial(trial._trial_id).intermediate_values == {0: pytest.approx(fast_iqm(accs))}
    # Epoch 0 trained and validated; nothing trained after it: the only later row is the final test.
    rows = task.curves[0].rows
    assert sorted(rows) == [0, 1] and "val/acc" in rows[0]
    assert sorted(rows[1]) == ["test/acc", "test/loss"]
    record = task.agent_record(0)
    assert record["early_stop"] == {"epoch": 0, "reason": PRUNED_REASON}
    assert record["metric_bounds"] == {"test/acc": [0.0, 1.0], "val/acc": [0.0, 1.0]}
    assert "early_stop" not in make_task().agent_record(0)


def test_a_resumed_fit_continues_exactly(tmp_path):
    """One epoch, a Lightning checkpoint, then a second epoch from it: the weights of two epochs in one go."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    whole = make_task(lr=0.3, seed=2, k=2)
    fit(whole, tmp_path / "whole", epochs=2)

    first = make_task(lr=0.3, seed=2, k=2)
    first.curves = [CurveLog(tmp_path / "first" / f"a{i}.csv") for i in range(2)]
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    first.time_breakdown_s = {"earlier_segment": 1.5}  # what a resumed run had spent before this segment
    first.fit_and_evaluate(trainer(1, enable_checkpointing=True, callbacks=[ckpt]), TinyData(), None)
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert saved["pipeline"]["agent_seeds"] == [2, 3] and len(saved["pipeline"]["generators"]) == 2

    resumed = make_task(lr=0.3, seed=2, k=2)
    resumed.curves = [CurveLog(tmp_path / "resumed" / f"a{i}.csv") for i in range(2)]
    resumed.fit_and_evaluate(trainer(2), TinyData(), str(tmp_path / "ckpt" / "last.ckpt"))
    for i in range(2):
        assert_same_weights(plain(resumed, i), plain(whole, i), atol=0)
    # the earlier segments' time is carried on
    assert resumed.time_breakdown_s["earlier_segment"] == 1.5 and resumed.time_breakdown_s["fit"] > 0

    other = make_task(lr=0.3, seed=3, k=2)
    with pytest.raises(ValueError, match=r"checkpoint holds seeds \[2, 3\], this run has \[3, 4\]; resume with the same seed and seeds_per_process"):
        other.on_load_checkpoint(saved)
    other.on_load_checkpoint({})  # a checkpoint without the pipeline's part: nothing to restore
    assert other._resume_extra is None


def test_a_resumed_fit_with_dropout_continues_exactly(tmp_path):
    """Dropout draws from the global RNG: 1 epoch + a resume to 3 ends bitwise where 3 epochs in one go end.

    (The resumed fit creates its first data iterator before on_train_start, which draws a base seed from the
    global RNG: restored there, the checkpoint's RNG state came one draw too late.)
    """
    from lightning.pytorch.callbacks import ModelCheckpoint

    def dropout_net(in_features, out_features):
        return MLP(in_features, out_features, hidden=(16,), dropout=0.5)

    torch.manual_seed(0)  # the global RNG (dropout's) as the lifecycle's seed_everything leaves it
    whole = make_task(lr=0.3, seed=2, k=2, net=dropout_net)
    whole_metrics = fit(whole, tmp_path / "whole", epochs=3)

    torch.manual_seed(0)
    first = make_task(lr=0.3, seed=2, k=2, net=dropout_net)
    first.curves = [CurveLog(tmp_path / "first" / f"a{i}.csv") for i in range(2)]
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    first.fit_and_evaluate(trainer(1, enable_checkpointing=True, callbacks=[ckpt]), TinyData(), None)

    resumed = make_task(lr=0.3, seed=2, k=2, net=dropout_net)
    resumed.curves = [CurveLog(tmp_path / "resumed" / f"a{i}.csv") for i in range(2)]
    resumed_metrics = resumed.fit_and_evaluate(trainer(3), TinyData(), str(tmp_path / "ckpt" / "last.ckpt"))
    for i in range(2):
        mine, straight = resumed.agent_state_dict(i), whole.agent_state_dict(i)
        assert all(torch.equal(mine[k], straight[k]) for k in straight)
    assert resumed_metrics == whole_metrics


def test_agent_state_dict_is_the_plain_network_of_that_member(tmp_path):
    task = make_task(k=2, seed=0)
    fit(task, tmp_path)
    x = torch.randn(4, IN)
    for i in range(2):
        single = net(IN, C)
        single.load_state_dict(task.agent_state_dict(i))
        with torch.no_grad():
            assert torch.allclose(single(x), task.net(x.unsqueeze(0).expand(2, -1, -1))[i], atol=1e-6)


def test_what_callbacks_and_the_progress_bar_see(tmp_path):
    """Callbacks see metrics.csv's names (the members' means): exactly what the task declares a monitor may name."""
    task = make_task(lr=0.0, k=3)
    tr = trainer(2)
    task.curves = [CurveLog(tmp_path / f"a{i}.csv") for i in range(3)]
    task.attach_data(TinyData())
    tr.fit(task)  # (fit_and_evaluate's test afterwards starts Lightning's metrics afresh)
    assert set(tr.progress_bar_metrics) == {"train/loss", "val/acc"}
    assert set(tr.callback_metrics) == {"train/loss", "val/acc", "val/loss"} == set(SupervisedTask.Config.monitorable_metrics)
    rows = [task.curves[i].rows[1] for i in range(3)]
    for key in ("train/loss", "val/acc", "val/loss"):
        assert float(tr.callback_metrics[key]) == pytest.approx(sum(r[key] for r in rows) / 3, rel=1e-6), key


def test_a_sanity_validation_before_training_changes_nothing(tmp_path):
    plain_run, checked = make_task(lr=0.3, k=2), make_task(lr=0.3, k=2)
    fit(plain_run, tmp_path / "a", epochs=2)
    fit(checked, tmp_path / "b", epochs=2, num_sanity_val_steps=1)
    assert checked.curves[0].rows == plain_run.curves[0].rows and checked.curves[1].rows == plain_run.curves[1].rows


def test_the_wall_time_is_split_into_fit_and_test(tmp_path):
    import time

    task = make_task(k=2)
    t0 = time.perf_counter()
    fit(task, tmp_path)
    wall = time.perf_counter() - t0
    assert 0 < task.time_breakdown_s["fit"] + task.time_breakdown_s["test"] <= wall


def test_a_non_finite_loss_names_its_step(tmp_path):
    from pipeline.tasks.base import NonFiniteLossError

    task = make_task(k=2)
    with torch.no_grad():
        next(task.net.parameters())[1].fill_(float("nan"))  # member 1 only: the run still stops
    with pytest.raises(NonFiniteLossError, match="loss became nan at step 0; lower the learning rate"):
        fit(task, tmp_path)


def test_a_checkpoint_is_loaded_as_plain_weights_only(tmp_path):
    """A checkpoint holding an arbitrary pickled object is refused (weights_only loading), not executed."""
    from pathlib import Path

    from lightning.pytorch.callbacks import ModelCheckpoint

    first = make_task(k=2)
    first.curves = [CurveLog(tmp_path / f"a{i}.csv") for i in range(2)]
    first.fit_and_evaluate(trainer(1, enable_checkpointing=True, callbacks=[ModelCheckpoint(dirpath=tmp_path, save_last=True)]),
                           TinyData(), None)
    state = torch.load(tmp_path / "last.ckpt", weights_only=True)
    state["note"] = Path("an object a plain-weights load refuses")
    torch.save(state, tmp_path / "tampered.ckpt")
    resumed = make_task(k=2)
    resumed.curves = [CurveLog(tmp_path / f"b{i}.csv") for i in range(2)]
    with pytest.raises(Exception, match="Weights only load failed"):
        resumed.fit_and_evaluate(trainer(2), TinyData(), str(tmp_path / "tampered.ckpt"))

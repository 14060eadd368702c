"""GANTask's behaviours pinned on tiny setups, each test well under a second (mutation testing runs them).

The pair here is one linear layer each way on 1x2x2 images from a 3-dim noise; the data a dozen random
images; the sample-quality judge a stand-in that records what it is shown (tests/tasks/test_gan.py and
test_gan_metrics_units.py cover the real judges). Expectations come from outside the task: a training step
is redone by hand with plain copies of the nets, torch autograd and the SGD rule; noise from generators
seeded by hand; pictures from numbers worked out on paper.
"""

import copy
import re
import time
from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import Logger, TensorBoardLogger, WandbLogger
from matplotlib import image as mpimg
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pipeline.tasks import gan as gan_module
from pipeline.tasks.base import NonFiniteLossError
from pipeline.tasks.configs import ClassifierSettings, FrameFeatureSettings
from pipeline.tasks.gan import GANTask, image_grid, save_png

SHAPE = (1, 2, 2)
LATENT = 3
NEVER = 10**6


class Pair(nn.Module):
    """A generator noise -> 1x2x2 image in [-1, 1] and a discriminator image -> one logit per image."""

    def __init__(self, image_shape=SHAPE, latent_dim=LATENT, batch_norm=False, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.latent_dim = latent_dim
        size = int(np.prod(image_shape))
        layers = [nn.Linear(latent_dim, size)] + ([nn.BatchNorm1d(size)] if batch_norm else [])
        self.generator = nn.Sequential(*layers, nn.Tanh(), nn.Unflatten(1, tuple(image_shape)))
        self.discriminator = nn.Sequential(nn.Flatten(), nn.Linear(size, 1), nn.Flatten(0))


class Images(L.LightningDataModule):
    """12 random images per split; labels (2 classes) only when `labelled`."""

    def __init__(self, n=12, batch_size=4, as_tensor=False, labelled=True):
        super().__init__()
        gen = torch.Generator().manual_seed(1)
        self.images = {s: torch.rand(n, *SHAPE, generator=gen) * 2 - 1 for s in ("train", "test")}
        self.batch_size, self.as_tensor = batch_size, as_tensor
        self.image_shape, self.n_classes = SHAPE, 2 if labelled else None
        if labelled:
            self.real_labels = lambda split: torch.arange(n) % 2 + {"train": 0, "test": 10}[split]

    def real_images(self, split):
        return self.images[split]

    def train_dataloader(self):
        data = self.images["train"] if self.as_tensor else TensorDataset(self.images["train"])
        return DataLoader(data, batch_size=self.batch_size, shuffle=False)


class Judge:
    """Stands in for gan_metrics' scorers: records what it is shown, scores by simple sums."""

    n_needed = 5

    def __init__(self):
        self.scored, self.references = [], []

    def reference(self, images, labels):
        self.references.append((images, labels))
        return {"inception_score_real": 4.0, "frechet_distance_real": 0.5}

    def score(self, images):
        images = images.clone()
        self.scored.append(images)
        return {"inception_score": 2.0 + float(images.sum()), "frechet_distance": 7.0 + float(images.abs().sum())}


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """Lightning's default_root_dir is the working directory: runs without a run_dir write their samples there."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def built(monkeypatch):
    """Replaces build_quality with one that records its arguments and hands out Judges."""
    calls = []

    def build(kind, image_shape, real_train, n_classes, **settings):
        calls.append(SimpleNamespace(kind=kind, image_shape=image_shape, real_train=real_train(), n_classes=n_classes,
                                     settings=settings, judge=Judge()))
        return calls[-1].judge

    monkeypatch.setattr(gan_module, "build_quality", build)
    return calls


class ListLogger(Logger):
    def __init__(self):
        super().__init__()
        self.rows = []

    name = property(lambda self: "list")
    version = property(lambda self: 0)

    def log_metrics(self, metrics, step=None):
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, *args, **kwargs):
        pass


class Recorder:
    """Any method call is recorded as (name, args, kwargs, whether the task's pair was in train mode)."""

    def __init__(self, task=None):
        self.calls, self.task = [], task

    def __getattr__(self, name):
        def call(*args, **kwargs):
            training = None if self.task is None else self.task.gan.training
            self.calls.append((name, args, kwargs, training))

        return call


class FakeTensorBoard(TensorBoardLogger):
    def __init__(self, task=None):  # no event files: the experiment is a Recorder
        super().__init__(save_dir="/nonexistent-tensorboard")
        self.recorder = Recorder(task)

    @property
    def experiment(self):
        return self.recorder

    def log_hyperparams(self, *args, **kwargs):
        pass

    def save(self):
        pass

    def finalize(self, status):
        pass


class FakeWandb(WandbLogger):
    def __init__(self):
        self.images = []

    def log_image(self, **kwargs):
        self.images.append(kwargs)


def sgd(lr=0.1):
    return lambda params: torch.optim.SGD(params, lr=lr)


def make(cls=GANTask, datamodule=None, pair=None, **values):
    settings = dict(net=pair if pair is not None else Pair(), loss=nn.BCEWithLogitsLoss(), optimizer=sgd(),
                    datamodule=datamodule if datamodule is not None else Images(), eval_every_n_epochs=0,
                    sample_every_n_epochs=0, log_every_n_steps=NEVER, histogram_every_n_steps=0, log_graph=False,
                    n_grid_samples=4)
    settings.update(values)
    return cls.create(**settings)


def trainer(batches=1, epochs=1, loggers=None, **kwargs):
    return L.Trainer(accelerator="cpu", devices=1, max_epochs=epochs, limit_train_batches=batches, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                     logger=loggers if loggers is not None else False, **kwargs)


def attach(task, loggers=(), **values):
    """A stand-in trainer for the methods that only read the trainer's loggers, epoch, directory and process count."""
    fields = dict(loggers=list(loggers), current_epoch=0, max_epochs=1, lr_scheduler_configs=[], default_root_dir="/nowhere",
                  world_size=1, global_rank=0)
    fields.update(values)
    task._trainer = SimpleNamespace(**fields)
    return task


class Spy(GANTask):
    """Records the noise, what each step saw and returned, and the nets' parameters around the steps."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.zs, self.d_calls, self.g_calls = [], [], []

    def noise(self, n):
        z = super().noise(n)
        self.zs.append(z.clone())
        return z

    def discriminator_step(self, real, fake):
        self.d_calls.append(dict(real=real.clone(), fake_grad=fake.requires_grad, grad_flags=self._flags()))
        out = super().discriminator_step(real, fake)
        self.d_calls[-1]["out"] = out
        return out

    def generator_step(self, fake):
        self.g_calls.append(dict(grad_flags=self._flags()))
        out = super().generator_step(fake)
        self.g_calls[-1]["out"] = out
        return out

    def _flags(self):
        return [p.requires_grad for p in self.gan.parameters()]


def params(net):
    return [p.detach().clone() for p in net.parameters()]


def close(a, b, atol=1e-6):
    return len(a) == len(b) and all(torch.allclose(x, y, atol=atol) for x, y in zip(a, b))


def by_hand(pair, real, z, lr, real_target, g_turn):
    """One training step on plain copies: D's update (fake detached), then G's against the updated D."""
    loss = nn.BCEWithLogitsLoss()
    G, D = copy.deepcopy(pair.generator), copy.deepcopy(pair.discriminator)
    fake = G(z)
    real_logits, fake_logits = D(real), D(fake.detach())
    d_loss = loss(real_logits, torch.full_like(real_logits, real_target)) + loss(fake_logits, torch.zeros_like(fake_logits))
    d_grads = torch.autograd.grad(d_loss, list(D.parameters()))
    with torch.no_grad():
        for p, g in zip(D.parameters(), d_grads):
            p -= lr * g
    out = dict(G=G, D=D, d_loss=float(d_loss.detach()), d_grads=d_grads,
               d_real=float(torch.sigmoid(real_logits.detach()).mean()), d_fake=float(torch.sigmoid(fake_logits.detach()).mean()))
    if g_turn:
        logits = D(fake)
        g_loss = loss(logits, torch.ones_like(logits))
        g_grads = torch.autograd.grad(g_loss, list(G.parameters()))
        with torch.no_grad():
            for p, g in zip(G.parameters(), g_grads):
                p -= lr * g
        out.update(g_loss=float(g_loss.detach()), g_grads=g_grads)
    return out


# ---- construction --------------------------------------------------------------------------------


def test_missing_parts_are_refused_naming_the_config_group():
    cases = [
        (dict(net=None), "task=gan needs net: choose a pair with model=gan_mlp|gan_dcgan"),
        (dict(loss=None), "task=gan needs loss: use loss=bce (classic GAN) or loss=mse (least squares)"),
        (dict(optimizer=None), "task=gan needs optimizer: choose one with optimizer=adam"),
        (dict(datamodule=None), "task=gan needs datamodule: choose images with data=digit_images|atari_frames"),
    ]
    for values, message in cases:
        settings = dict(net=Pair(), loss=nn.MSELoss(), optimizer=sgd(), datamodule=Images(), **{})
        settings.update(values)
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            GANTask.create(**settings)


@pytest.mark.parametrize("loss", [nn.CrossEntropyLoss(), nn.NLLLoss(), nn.BCELoss()])
def test_probability_losses_are_refused_with_the_fix(loss):
    name = type(loss).__name__
    with pytest.raises(ValueError, match=rf"^task=gan needs a loss on logits and 0/1 targets \(the discriminator outputs "
                                         rf"logits\); got {name}: use loss=bce \(classic GAN\) or loss=mse \(least squares\)$"):
        make(loss=loss)


def test_bad_settings_are_refused_in_one_line():
    for values in (dict(d_steps_per_g_step=0), dict(label_smoothing=-0.01), dict(label_smoothing=0.5)):
        d, s = values.get("d_steps_per_g_step", 1), values.get("label_smoothing", 0.0)
        with pytest.raises(ValueError, match=rf"^task\.d_steps_per_g_step={d} must be >= 1 and "
                                             rf"task\.label_smoothing={s} in \[0, 0\.5\)$"):
            make(**values)
    with pytest.raises(ValueError, match=r"^task\.quality='fid'; choose one of auto, classifier, frames$"):
        make(quality="fid")
    # The edges that are allowed.
    assert make(label_smoothing=0.0).real_target == 1.0
    assert make(label_smoothing=0.49).real_target == pytest.approx(0.51)
    assert make(d_steps_per_g_step=1).d_steps_per_g_step == 1


def test_settings_are_kept_with_their_types(tmp_path):
    shapes = []

    def factory(image_shape):
        shapes.append(image_shape)
        return Pair()

    dm = Images()
    dm.image_shape, dm.n_classes = [1, 2, 2], np.int64(2)
    task = make(pair=factory, datamodule=dm, run_dir=str(tmp_path), d_steps_per_g_step=3.0, label_smoothing=0.25,
                eval_every_n_epochs=4.0, sample_every_n_epochs=6.0, log_every_n_steps=0, histogram_every_n_steps=9.0,
                log_graph=1, n_grid_samples=5)
    assert shapes == [(1, 2, 2)] and type(shapes[0]) is tuple
    assert task.config.d_steps_per_g_step == 3.0 and task.config.n_grid_samples == 5 and task.seed == 0
    assert task.image_shape == (1, 2, 2) and all(type(s) is int for s in task.image_shape)
    assert task.n_classes == 2 and type(task.n_classes) is int
    assert task.run_dir == tmp_path and isinstance(task.run_dir, type(tmp_path))
    assert task.d_steps_per_g_step == 3 and type(task.d_steps_per_g_step) is int
    assert task.real_target == 0.75
    assert (task.eval_every_n_epochs, task.sample_every_n_epochs, task.histogram_every_n_steps) == (4, 6, 9)
    assert all(type(v) is int for v in (task.eval_every_n_epochs, task.sample_every_n_epochs, task.histogram_every_n_steps))
    assert task.log_every_n_steps == 1  # 0 would never log: at least every step
    assert task.log_graph is True
    assert task.automatic_optimization is False
    assert (task.iterations, task.generator_steps, task.start_scores, task.reference_scores, task.quality) == (0, 0, {}, {}, None)
    assert task._recent == {} and task._last_logged == {} and task._graph_logged is False
    assert task._last_eval is None and task._resume_rng is None
    assert make(log_every_n_steps=7).log_every_n_steps == 7
    # A ready module is used as it is; without a run directory there is none.
    pair = Pair()
    plain = make(pair=pair)
    assert plain.gan is pair and plain.run_dir is None and plain.log_graph is False
    dm.n_classes = None
    assert make(datamodule=dm).n_classes is None


def test_the_judge_follows_the_labels_unless_chosen():
    labelled, frames = make(), make(datamodule=Images(labelled=False))
    assert labelled.quality_kind == "classifier"
    assert (labelled.primary_metric, labelled.primary_curve, labelled.higher_is_better) == (
        "eval/inception_score", "eval/inception_score", True)
    assert frames.quality_kind == "frames"
    assert (frames.primary_metric, frames.primary_curve, frames.higher_is_better) == (
        "eval/frechet_distance", "eval/frechet_distance", False)
    chosen = make(quality="frames")
    assert chosen.quality_kind == "frames" and chosen.primary_metric == "eval/frechet_distance"
    assert make(datamodule=Images(labelled=False), quality="classifier").quality_kind == "classifier"
    # The class-level declarations stay as they were for other instances.
    assert GANTask.primary_metric == "eval/inception_score" and labelled.higher_is_better


def test_grid_noise_is_seeded_apart_and_not_saved():
    task = make(seed=7, n_grid_samples=6)
    expected = torch.randn(6, LATENT, generator=torch.Generator().manual_seed(7 + 15_485_863))
    assert torch.equal(task.grid_noise, expected)
    assert "grid_noise" not in task.state_dict() and "grid_noise" in dict(task.named_buffers())


def test_quality_settings_reach_the_scorer(built):
    dm = Images()
    task = make(datamodule=dm, classifier=ClassifierSettings(hidden=[3], epochs=2), frame_features=FrameFeatureSettings(channels=[2]),
                n_eval_samples=33.0, coverage_threshold=1, cache_dir="/c")
    task.prepare_quality(dm)
    (call,) = built
    assert call.kind == "classifier" and call.image_shape == SHAPE and call.n_classes == 2
    assert torch.equal(call.real_train[0], dm.images["train"]) and torch.equal(call.real_train[1], torch.arange(12) % 2)
    assert call.settings["classifier"] == dict(path=None, hidden=[3], act="relu", dropout=0.2, epochs=2, lr=0.002,
                                               weight_decay=0.0001, batch_size=64, seed=0)
    assert call.settings["frame_features"] == dict(feature_seed=0, channels=[2], pooled_size=8)
    assert call.settings["n_samples"] == 33 and type(call.settings["n_samples"]) is int
    assert call.settings["coverage_threshold"] == 1.0 and type(call.settings["coverage_threshold"]) is float
    assert call.settings["cache_dir"] == "/c"
    assert set(call.settings) == {"classifier", "frame_features", "n_samples", "coverage_threshold", "cache_dir"}


def test_prepare_quality_scores_the_real_data(built):
    dm = Images()
    task = make(datamodule=dm)
    task.prepare_quality(dm)
    judge = built[0].judge
    assert task.quality is judge
    ((images, labels),) = judge.references
    assert torch.equal(images, dm.images["test"]) and torch.equal(labels, torch.arange(12) % 2 + 10)
    # The floor: the first n_needed training images, scored as samples.
    (train,) = judge.scored
    assert torch.equal(train, dm.images["train"][:5])
    assert task.reference_scores == {"inception_score_real": 4.0, "frechet_distance_real": 0.5,
                                     "frechet_distance_train": 7.0 + float(dm.images["train"][:5].abs().sum())}


def test_prepare_quality_without_labels_and_without_real_images(built):
    dm = Images(labelled=False)
    task = make(datamodule=dm)
    task.prepare_quality(dm)
    assert built[0].kind == "frames" and built[0].n_classes is None and built[0].real_train[1] is None
    assert built[0].judge.references[0][1] is None
    message = r"^task=gan scores samples against datamodule\.real_images\('test'\); use data=digit_images or data=atari_frames$"
    for bad in (None, SimpleNamespace()):
        with pytest.raises(ValueError, match=message):
            task.prepare_quality(bad)


# ---- Lightning plumbing ------------------------------------------------------------------------


def test_each_optimizer_holds_one_net_and_schedulers_follow():
    task = make()
    opt_g, opt_d = task.configure_optimizers()
    assert [p for g in opt_g.param_groups for p in g["params"]] == list(task.gan.generator.parameters())
    assert [p for g in opt_d.param_groups for p in g["params"]] == list(task.gan.discriminator.parameters())
    task = make(scheduler=lambda opt: ("scheduled", opt))
    optimizers, schedulers = task.configure_optimizers()
    assert len(optimizers) == 2 and schedulers == [("scheduled", optimizers[0]), ("scheduled", optimizers[1])]


def test_forward_is_the_generator():
    task = make()
    z = torch.randn(4, LATENT)
    assert torch.equal(task(z), task.gan.generator(z))


def test_training_noise_draws_from_the_global_stream():
    task = make()
    torch.manual_seed(11)
    z = task.noise(4)
    torch.manual_seed(11)
    assert torch.equal(z, torch.randn(4, LATENT))


def test_adversarial_loss_targets_a_constant():
    task = make(loss=nn.MSELoss())
    logits = torch.tensor([0.0, 1.0, 3.0])
    assert float(task.adversarial_loss(logits, 0.5)) == pytest.approx((0.25 + 0.25 + 6.25) / 3)


# ---- the algorithm -----------------------------------------------------------------------------


@pytest.mark.parametrize("as_tensor", [False, True])
def test_one_step_matches_the_gan_update_by_hand(built, as_tensor):
    pair = Pair()
    before = copy.deepcopy(pair)
    dm = Images(as_tensor=as_tensor)
    task = make(Spy, pair=pair, datamodule=dm, label_smoothing=0.1)
    task.fit_and_evaluate(trainer(1), dm, None)
    ((z,),) = [task.zs]
    assert z.shape == (4, LATENT)  # one noise vector per real image
    real = dm.images["train"][:4]
    assert torch.equal(task.d_calls[0]["real"], real)
    hand = by_hand(before, real, z, 0.1, 0.9, g_turn=True)
    assert close(params(task.gan.discriminator), params(hand["D"]))
    assert close(params(task.gan.generator), params(hand["G"]))
    # The gradients each net keeps are those of its own loss (D's parameters were off during G's step).
    assert close([p.grad for p in task.gan.discriminator.parameters()], list(hand["d_grads"]))
    assert close([p.grad for p in task.gan.generator.parameters()], list(hand["g_grads"]))
    out = {**task.d_calls[0]["out"], **task.g_calls[0]["out"]}
    for key in ("d_loss", "d_real", "d_fake", "g_loss"):
        assert float(out[key]) == pytest.approx(hand[key], rel=1e-5), key
        assert not out[key].requires_grad
    assert task.d_calls[0]["fake_grad"] is True
    # Each step runs with only its own net's parameters switched on; afterwards all are on again.
    n_g = len(list(task.gan.generator.parameters()))
    n_d = len(list(task.gan.discriminator.parameters()))
    assert task.g_calls[0]["grad_flags"] == [True] * (n_g + n_d)  # between the steps: all on
    assert all(p.requires_grad for p in task.gan.parameters())
    assert (task.iterations, task.generator_steps) == (1, 1)


def test_discriminator_steps_between_generator_steps(built):
    pair = Pair(seed=3)
    before = copy.deepcopy(pair)
    dm = Images()
    task = make(Spy, pair=pair, datamodule=dm, d_steps_per_g_step=2)
    task.fit_and_evaluate(trainer(3), dm, None)
    assert (task.iterations, task.generator_steps, len(task.d_calls), len(task.g_calls)) == (3, 1, 3, 1)
    # Only batch 2 is the generator's: its noise goes through G with gradients, the others' without.
    assert [c["fake_grad"] for c in task.d_calls] == [False, True, False]
    G, D = before.generator, before.discriminator
    for i, (z, real) in enumerate(zip(task.zs, dm.images["train"].split(4))):
        hand = by_hand(nn.ModuleDict(dict(generator=G, discriminator=D)), real, z, 0.1, 1.0, g_turn=i == 1)
        assert float(task.d_calls[i]["out"]["d_loss"]) == pytest.approx(hand["d_loss"], rel=1e-5)
        G, D = hand["G"], hand["D"]
    assert float(task.g_calls[0]["out"]["g_loss"]) > 0
    assert close(params(task.gan.discriminator), params(D)) and close(params(task.gan.generator), params(G))


def test_progress_is_logged_as_window_means_every_n_steps(built):
    logger = ListLogger()
    dm = Images(n=20)
    task = make(Spy, datamodule=dm, log_every_n_steps=2, d_steps_per_g_step=2)
    t = trainer(5, loggers=[logger], log_every_n_steps=1)
    task.fit_and_evaluate(t, dm, None)
    rows = [(step, m) for step, m in logger.rows if any(k.startswith("train/") for k in m)]
    d = [float(c["out"]["d_loss"]) for c in task.d_calls]
    real = [float(c["out"]["d_real"]) for c in task.d_calls]
    g = [float(c["out"]["g_loss"]) for c in task.g_calls]
    assert [step for step, _ in rows] == [2, 4, 5]  # the last partial window when training ends
    fake = [float(c["out"]["d_fake"]) for c in task.d_calls]
    assert rows[0][1] == pytest.approx({"epoch": 0.0, "train/d_loss": (d[0] + d[1]) / 2, "train/g_loss": g[0],
                                        "train/d_real": (real[0] + real[1]) / 2, "train/d_fake": (fake[0] + fake[1]) / 2}, rel=1e-6)
    assert rows[1][1]["train/d_loss"] == pytest.approx((d[2] + d[3]) / 2, rel=1e-6) and rows[1][1]["train/g_loss"] == pytest.approx(g[1])
    assert set(rows[2][1]) == {"epoch", "train/d_loss", "train/d_real", "train/d_fake"}
    assert rows[2][1]["train/d_loss"] == pytest.approx(d[4], rel=1e-6)
    assert t.progress_bar_metrics["d_loss"] == pytest.approx((d[2] + d[3]) / 2, rel=1e-6)
    assert task._last_logged["train/d_loss"] == pytest.approx(d[4], rel=1e-6)
    assert all(type(v) is float for v in task._last_logged.values())
    assert task.generator_steps == 2 and task.iterations == 5
    # The progress bar's d_loss stays off the loggers (they have train/d_loss at the batch count).
    assert not [m for _, m in logger.rows if "d_loss" in m]


def test_a_non_finite_loss_stops_the_run_with_the_fix(built):
    dm = Images()
    dm.images["train"][1, 0, 0, 0] = float("nan")
    task = make(datamodule=dm, log_every_n_steps=1)
    with pytest.raises(NonFiniteLossError, match=r"^loss became nan at step 1; lower optimizer\.lr or use loss=mse \(least squares\)$"):
        task.fit_and_evaluate(trainer(1), dm, None)
    # Only the losses are checked: a non-finite mean probability alone is logged as it is.
    task = attach(make(), [ListLogger()])
    task._recent = {"d_real": [torch.tensor(float("nan"))], "d_loss": [torch.tensor(1.0)], "g_loss": []}
    task.log_progress()
    assert task._recent == {} and np.isnan(task._last_logged["train/d_real"]) and "train/g_loss" not in task._last_logged


def test_histograms_go_to_tensorboard_every_n_steps(built):
    tb = FakeTensorBoard()
    task = make(histogram_every_n_steps=2)
    task.fit_and_evaluate(trainer(4, loggers=[tb], log_every_n_steps=NEVER), Images(n=16), None)
    hists = [(args[0], args[2]) for name, args, _, _ in tb.recorder.calls if name == "add_histogram"]
    names = ["weights/generator.0.weight", "weights/generator.0.bias", "weights/discriminator.1.weight", "weights/discriminator.1.bias"]
    assert hists == [(n, 2) for n in names] + [(n, 4) for n in names]
    last = [args[1] for name, args, _, _ in tb.recorder.calls if name == "add_histogram"][-4:]
    assert close(last, params(task.gan)) and all(not v.requires_grad for v in last)


def test_histograms_every_step_or_never(built):
    for every, steps in ((1, [1, 2]), (0, [])):
        tb = FakeTensorBoard()
        make(histogram_every_n_steps=every).fit_and_evaluate(trainer(2, loggers=[tb], log_every_n_steps=NEVER), Images(), None)
        assert [args[2] for name, args, _, _ in tb.recorder.calls if name == "add_histogram"][::4] == steps


def test_histogram_time_counts_as_logging():
    task = attach(make(), [FakeTensorBoard(), ListLogger()])
    task.time_breakdown_s = {"log": 2.0}
    t0 = time.perf_counter()
    task._log_histograms()
    elapsed = time.perf_counter() - t0
    assert set(task.time_breakdown_s) == {"log"} and 2.0 <= task.time_breakdown_s["log"] <= 2.0 + elapsed


def test_graph_is_traced_once_in_eval_mode():
    task = make(log_graph=True)
    tb = FakeTensorBoard(task)
    attach(task, [tb, ListLogger()])
    task.gan.train()
    task._log_graph_once()
    task._log_graph_once()
    ((name, args, _, training),) = tb.recorder.calls
    assert name == "add_graph" and args[0] is task.gan and torch.equal(args[1], task.grid_noise[:2]) and training is False
    assert task.gan.training and task._graph_logged
    task.gan.eval()
    task._graph_logged = False
    task._log_graph_once()
    assert not task.gan.training and len(tb.recorder.calls) == 2
    # Not without a TensorBoard, not when switched off.
    for task in (attach(make(log_graph=True), [ListLogger()]), attach(make(log_graph=False), [FakeTensorBoard()])):
        task._log_graph_once()
        assert task._graph_logged is False
        assert all(not lg.recorder.calls for lg in task.loggers if isinstance(lg, FakeTensorBoard))


def test_on_train_start_scores_once(built):
    task = make(log_graph=True)
    tb = FakeTensorBoard(task)
    attach(task, [tb])
    task.prepare_quality(Images())
    task.on_train_start()
    assert task.start_scores == {"inception_score": pytest.approx(2.0 + float(built[0].judge.scored[-1].sum())),
                                 "frechet_distance": pytest.approx(7.0 + float(built[0].judge.scored[-1].abs().sum()))}
    assert tb.recorder.calls[0][0] == "add_graph"
    kept = {"inception_score": -1.0}
    task.start_scores = kept
    n = len(built[0].judge.scored)
    task.on_train_start()
    assert task.start_scores is kept and len(built[0].judge.scored) == n


def test_on_fit_start_prepares_once_and_restores_the_saved_rng(built):
    dm = Images()
    task = attach(make(datamodule=dm), datamodule=dm)
    task.on_fit_start()
    assert len(built) == 1 and task.quality is built[0].judge and task.time_breakdown_s["quality_setup"] >= 0
    task.on_fit_start()
    assert len(built) == 1
    torch.manual_seed(5)
    task.on_load_checkpoint({"gan_progress": {"rng": gan_module.rng_state()}})
    expected = torch.rand(3)
    torch.manual_seed(99)
    task.on_fit_start()
    assert torch.equal(torch.rand(3), expected) and task._resume_rng is None
    torch.manual_seed(99)
    untouched = torch.rand(3)
    torch.manual_seed(99)
    task.on_fit_start()  # nothing left to restore
    assert torch.equal(torch.rand(3), untouched)


def test_checkpoint_keeps_the_counters_start_scores_and_rng():
    task = make()
    task.iterations, task.generator_steps, task.start_scores = 12, 4, {"inception_score": 1.5}
    torch.manual_seed(3)
    checkpoint = {}
    task.on_save_checkpoint(checkpoint)
    progress = checkpoint["gan_progress"]
    assert {k: progress[k] for k in ("iterations", "generator_steps", "start_scores")} == {
        "iterations": 12, "generator_steps": 4, "start_scores": {"inception_score": 1.5}}
    assert torch.equal(progress["rng"]["torch"], torch.manual_seed(3).get_state())
    other = make()
    other.on_load_checkpoint(checkpoint)
    assert (other.iterations, other.generator_steps, other.start_scores) == (12, 4, {"inception_score": 1.5})
    assert other.start_scores is not progress["start_scores"]
    assert other._resume_rng is progress["rng"]
    # A checkpoint from before progress was saved starts from zero.
    other.on_load_checkpoint({})
    assert (other.iterations, other.generator_steps, other.start_scores, other._resume_rng) == (0, 0, {}, None)


class Scheduler:
    def __init__(self):
        self.steps = 0

    def step(self):
        self.steps += 1


class EpochSpy(GANTask):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.events = []

    def evaluate_now(self):
        self.events.append(("eval", self.current_epoch))

    def save_samples(self, path, tag):
        self.events.append(("samples", path, tag))


@pytest.mark.parametrize("n_schedulers", [0, 1, 2])
def test_epoch_end_steps_schedulers_and_evaluates_and_draws_when_due(tmp_path, n_schedulers):
    schedulers = [Scheduler() for _ in range(n_schedulers)]
    task = make(EpochSpy, run_dir=tmp_path, eval_every_n_epochs=2, sample_every_n_epochs=3)
    attach(task, max_epochs=5, lr_scheduler_configs=[SimpleNamespace(scheduler=s) for s in schedulers])
    for epoch in range(5):
        task._trainer.current_epoch = epoch
        task.on_train_epoch_end()
    assert [s.steps for s in schedulers] == [5] * n_schedulers
    assert task.events == [("eval", 1), ("samples", tmp_path / "samples" / "epoch_0003.png", "samples"), ("eval", 3),
                           ("eval", 4), ("samples", tmp_path / "samples" / "epoch_0005.png", "samples")]


@pytest.mark.parametrize("max_epochs", [-1, None])
def test_epoch_end_without_an_epoch_limit_keeps_the_schedule(max_epochs):
    # trainer.max_epochs=-1 with trainer.max_steps: no epoch is the last, fit_and_evaluate scores the end.
    task = make(EpochSpy, eval_every_n_epochs=2, sample_every_n_epochs=0)
    attach(task, max_epochs=max_epochs)
    for epoch in range(3):
        task._trainer.current_epoch = epoch
        task.on_train_epoch_end()
    assert task.events == [("eval", 1)]


def test_epoch_end_without_run_dir_and_with_both_switched_off():
    task = make(EpochSpy, eval_every_n_epochs=1, sample_every_n_epochs=1)
    attach(task, max_epochs=3, default_root_dir="/root/x", current_epoch=0)
    task.on_train_epoch_end()
    assert task.events == [("eval", 0), ("samples", gan_module.Path("/root/x/samples/epoch_0001.png"), "samples")]
    off = attach(make(EpochSpy), max_epochs=1)
    off.on_train_epoch_end()
    assert off.events == []


# ---- measuring and showing -----------------------------------------------------------------------


@pytest.mark.parametrize("was_training", [True, False])
def test_generate_runs_in_eval_mode_without_gradients(was_training):
    pair = Pair(batch_norm=True)
    pair.generator[1].running_mean.fill_(0.5)
    task = make(pair=pair)
    task.gan.train(was_training)
    z = torch.randn(6, LATENT)
    out = task.generate(z)
    assert out.shape == (6, *SHAPE)
    plain = copy.deepcopy(pair.generator).eval()
    assert torch.allclose(out, plain(z)) and not out.requires_grad
    assert task.gan.training is was_training and task.gan.generator[1].training is was_training
    assert torch.equal(pair.generator[1].running_mean, torch.full((4,), 0.5))  # untouched by the pass


def test_generate_goes_in_chunks_of_1024():
    task = make()
    sizes = []
    task.gan.generator.register_forward_pre_hook(lambda module, args: sizes.append(len(args[0])))
    assert task.generate(torch.zeros(2049, LATENT)).shape == (2049, *SHAPE)
    assert sizes == [1024, 1024, 1]


def test_noise_and_generation_happen_on_the_tasks_device():
    task = make().to("meta")  # a device other than the CPU where the noise is drawn
    assert task.noise(3).device.type == "meta"
    assert task.generate(torch.zeros(2, LATENT)).device.type == "meta"


def test_score_uses_the_evaluation_noise_or_a_given_seed(built):
    task = make(seed=4)
    task.prepare_quality(Images())
    judge = built[0].judge
    scores = task.score()
    z = torch.randn(5, LATENT, generator=torch.Generator().manual_seed(4 + 104_729))
    expected = copy.deepcopy(task.gan.generator).eval()(z).detach()
    assert torch.allclose(judge.scored[-1], expected)
    assert scores == {"inception_score": pytest.approx(2.0 + float(expected.sum()), rel=1e-5),
                      "frechet_distance": pytest.approx(7.0 + float(expected.abs().sum()), rel=1e-5)}
    task.score(seed=8.0)
    z = torch.randn(5, LATENT, generator=torch.Generator().manual_seed(8))
    assert torch.allclose(judge.scored[-1], task.gan.generator(z).detach())


def test_evaluate_now_logs_once_per_batch_count(built):
    logger = ListLogger()
    task = attach(make(), [logger], current_epoch=2)
    task.prepare_quality(Images())
    task.iterations = 7
    first = task.evaluate_now()
    assert logger.rows == [(7, {"epoch": 2.0, "eval/inception_score": first["inception_score"],
                                "eval/frechet_distance": first["frechet_distance"]})]
    assert task._last_eval == (7, first) and task.time_breakdown_s["eval"] >= 0
    n = len(built[0].judge.scored)
    assert task.evaluate_now() is first and len(logger.rows) == 1 and len(built[0].judge.scored) == n
    task.iterations = 8
    task.gan.generator[0].bias.data += 1.0
    second = task.evaluate_now()
    assert second != first and [step for step, _ in logger.rows] == [7, 8]


def test_samples_go_to_disk_tensorboard_and_wandb(tmp_path):
    tb, wb = FakeTensorBoard(), FakeWandb()
    task = attach(make(n_grid_samples=3), [tb, wb, ListLogger()])
    task.iterations = 9
    path = task.save_samples(tmp_path / "deep" / "s.png", tag="pics")
    assert path == tmp_path / "deep" / "s.png" and path.is_file()
    expected = (copy.deepcopy(task.gan.generator).eval()(task.grid_noise).detach().clamp(-1, 1) + 1) / 2
    # 3 images of 2x2 in 2 columns with 1-pixel gaps: 7 x 7 pixels, scaled up 37 times to at least 256.
    written = mpimg.imread(path)[..., 0]
    assert written.shape == (259, 259)
    assert written[37 * 1, 37 * 1] == pytest.approx(float(expected[0, 0, 0, 0]), abs=1 / 255)
    assert written[37 * 2, 37 * 5] == pytest.approx(float(expected[1, 0, 1, 1]), abs=1 / 255)
    assert written[37 * 4, 37 * 2] == pytest.approx(float(expected[2, 0, 0, 1]), abs=1 / 255)
    assert written[37 * 4, 37 * 5] == pytest.approx(0.5, abs=1 / 255) and written[0, 0] == pytest.approx(0.5, abs=1 / 255)
    ((name, args, kwargs, _),) = tb.recorder.calls
    assert name == "add_image" and args[0] == "pics" and args[2] == 9 and kwargs == {"dataformats": "HW"}
    assert args[1].shape == (259, 259) and np.allclose(args[1], written, atol=1 / 255)
    assert wb.images == [dict(key="pics", images=[str(path)], step=9)]
    assert task.time_breakdown_s["samples"] >= 0


def test_colour_samples_are_logged_as_hwc(tmp_path):
    shape = (3, 2, 2)
    tb = FakeTensorBoard()
    task = attach(make(pair=Pair(image_shape=shape), n_grid_samples=1), [tb])
    task.save_samples(tmp_path / "c.png", tag="t")
    assert tb.recorder.calls[0][2] == {"dataformats": "HWC"} and tb.recorder.calls[0][1][1].ndim == 3


def test_image_grid_by_hand():
    images = torch.tensor([-1.0, 0.0, 1.0, 3.0, -2.0]).view(5, 1, 1, 1)
    grid = image_grid(images)  # 5 images: 3 columns (ceil sqrt 5), 2 rows
    expected = np.full((5, 7), 0.5, dtype=np.float32)
    expected[1, 1], expected[1, 3], expected[1, 5], expected[3, 1], expected[3, 3] = 0.0, 0.5, 1.0, 1.0, 0.0
    assert grid.dtype == np.float32 and np.array_equal(grid, expected)
    assert image_grid(images, ncol=5, pad=0).tolist() == [[0.0, 0.5, 1.0, 1.0, 0.0]]
    two = torch.tensor([[[[-1.0, 1.0], [1.0, -1.0]]], [[[0.0, 0.0], [0.0, 0.0]]]])
    assert image_grid(two, ncol=1, pad=2).tolist() == [[0.5] * 6] * 2 + [[0.5, 0.5, 0.0, 1.0, 0.5, 0.5], [0.5, 0.5, 1.0, 0.0, 0.5, 0.5]] + \
        [[0.5] * 6] * 2 + [[0.5, 0.5, 0.5, 0.5, 0.5, 0.5]] * 2 + [[0.5] * 6] * 2
    four = torch.zeros(1, 4, 1, 1)
    four[0, :, 0, 0] = torch.tensor([1.0, -1.0, 0.0, 1.0])
    rgb = image_grid(four, pad=1)
    assert rgb.shape == (3, 3, 3) and rgb[1, 1].tolist() == [1.0, 0.0, 0.5] and rgb[0, 0].tolist() == [0.5] * 3
    assert image_grid(torch.zeros(1, 1, 1, 1, requires_grad=True)).shape == (3, 3)


def test_save_png_scales_by_a_whole_factor_in_fixed_grey_levels(tmp_path):
    grid = np.array([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]], dtype=np.float32)
    big = save_png(grid, tmp_path / "a" / "z" / "b.png")
    assert big.shape == (2 * 86, 3 * 86)  # ceil(256 / 3) = 86
    assert save_png(grid[:, :2], tmp_path / "e.png").shape == (256, 256)  # exactly 128 times
    read = mpimg.imread(tmp_path / "a" / "z" / "b.png")
    assert read.shape == (172, 258, 4) and np.allclose(read[..., :3], 128 / 255, atol=1 / 255)  # not stretched to 0..1
    small = save_png(np.array([[0.0, 1.0]]), tmp_path / "c.png", min_side=1)
    assert small.tolist() == [[0.0, 1.0]] and mpimg.imread(tmp_path / "c.png")[0, :, 0].tolist() == [0.0, 1.0]
    rgb = save_png(np.full((2, 2, 3), 0.25), tmp_path / "d.png", min_side=5)
    read = mpimg.imread(tmp_path / "d.png")
    assert rgb.shape == (6, 6, 3) and read.shape[:2] == (6, 6) and np.allclose(read[..., :3], 64 / 255, atol=1 / 255)


def test_log_progress_and_log_use_batches_as_steps():
    logger = ListLogger()
    task = attach(make(), [logger, ListLogger()], current_epoch=3)
    task.iterations = 6
    task._recent = {"d_loss": [torch.tensor(1.0), torch.tensor(2.0)], "g_loss": [torch.tensor(4.0)]}
    task.log_progress()
    assert logger.rows == [(6, {"epoch": 3.0, "train/d_loss": 1.5, "train/g_loss": 4.0})]
    assert task.loggers[1].rows == logger.rows and task.time_breakdown_s["log"] >= 0
    assert task._last_logged == {"train/d_loss": 1.5, "train/g_loss": 4.0}
    task._recent = {"g_loss": [torch.tensor(6.0)]}
    task.log_progress()
    assert task._last_logged == {"train/d_loss": 1.5, "train/g_loss": 6.0}


# ---- the contract with run.py ----------------------------------------------------------------


def test_fit_and_evaluate_returns_the_records_metrics(built, tmp_path):
    dm = Images()
    logger = ListLogger()
    task = make(Spy, datamodule=dm, run_dir=tmp_path, eval_every_n_epochs=1, sample_every_n_epochs=1, log_every_n_steps=2)
    (metrics,) = task.fit_and_evaluate(trainer(3, loggers=[logger], log_every_n_steps=NEVER), dm, None)
    judge = built[0].judge
    # Scored: the training floor, the start, the end of the epoch; the final evaluation reuses the last.
    assert len(judge.scored) == 3
    start, final = task.start_scores, task._last_eval[1]
    assert task._last_eval[0] == 3 and start != final
    assert metrics["eval/inception_score"] == final["inception_score"] and metrics["eval/frechet_distance"] == final["frechet_distance"]
    assert metrics["eval/inception_score_start"] == start["inception_score"]
    assert metrics["eval/frechet_distance_start"] == start["frechet_distance"]
    assert metrics["eval/inception_score_real"] == 4.0 and metrics["eval/frechet_distance_real"] == 0.5
    assert metrics["eval/frechet_distance_train"] == task.reference_scores["frechet_distance_train"]
    assert metrics["eval/inception_score_ratio"] == pytest.approx(final["inception_score"] / 4.0)
    d = [float(c["out"]["d_loss"]) for c in task.d_calls]
    assert metrics["train/d_loss"] == pytest.approx(d[2], rel=1e-6)  # the last, partial window, logged at the end
    assert set(metrics) == {"eval/inception_score", "eval/frechet_distance", "eval/inception_score_start",
                            "eval/frechet_distance_start", "eval/inception_score_real", "eval/frechet_distance_real",
                            "eval/frechet_distance_train", "eval/inception_score_ratio", "train/d_loss", "train/d_real",
                            "train/d_fake", "train/g_loss"}
    assert (tmp_path / "samples.png").is_file() and (tmp_path / "samples" / "epoch_0001.png").is_file()
    t = task.time_breakdown_s
    assert {"train", "eval", "samples", "log", "quality_setup"} <= set(t) and t["train"] > 0
    eval_steps = [step for step, m in logger.rows if "eval/inception_score" in m]
    assert eval_steps == [0, 3]


def test_final_metrics_by_hand():
    task = make()
    task.reference_scores = {"inception_score_real": 8.0, "frechet_distance_real": 1.0}
    assert task.final_metrics({"inception_score": 2.0, "frechet_distance": 3.0}) == {
        "eval/inception_score": 2.0, "eval/frechet_distance": 3.0, "eval/inception_score_real": 8.0,
        "eval/frechet_distance_real": 1.0, "eval/inception_score_ratio": 0.25}
    frames = make(datamodule=Images(labelled=False))
    frames.reference_scores = {"frechet_distance_real": 1.0}
    assert frames.final_metrics({"frechet_distance": 3.0}) == {"eval/frechet_distance": 3.0, "eval/frechet_distance_real": 1.0}


def test_evaluate_model_scores_a_saved_generator_like_the_run(built):
    dm = Images()
    source = make(pair=Pair(seed=5))
    task = make(pair=Pair(seed=6), seed=2)
    task.load_agent_state_dict(source.agent_state_dict(0))
    metrics = task.evaluate_model(dm, "test")
    z = torch.randn(5, LATENT, generator=torch.Generator().manual_seed(2 + 104_729))
    images = source.gan.generator(z).detach()
    assert torch.allclose(built[-1].judge.scored[-1], images)
    assert metrics == {"eval/inception_score": pytest.approx(2.0 + float(images.sum()), rel=1e-5),
                       "eval/frechet_distance": pytest.approx(7.0 + float(images.abs().sum()), rel=1e-5),
                       "eval/inception_score_real": 4.0, "eval/frechet_distance_real": 0.5,
                       "eval/frechet_distance_train": pytest.approx(7.0 + float(dm.images["train"][:5].abs().sum())),
                       "eval/inception_score_ratio": pytest.approx((2.0 + float(images.sum())) / 4.0, rel=1e-5)}
    task.evaluate_model(dm, "test", seed=1)
    z = torch.randn(5, LATENT, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(built[-1].judge.scored[-1], source.gan.generator(z).detach())


def test_agent_record_and_state_dict():
    task = make()
    task.iterations, task.generator_steps = 10, 5
    assert task.agent_record(0) == {"quality": "classifier", "iterations": 10, "generator_steps": 5, "samples_png": "samples.png"}
    assert make(quality="frames").agent_record(0)["quality"] == "frames"
    state = task.agent_state_dict(0)
    assert list(state) == ["generator.0.weight", "generator.0.bias", "discriminator.1.weight", "discriminator.1.bias"]
    assert all(torch.equal(state[k], v) and not state[k].requires_grad for k, v in task.gan.state_dict().items())
    with pytest.raises(RuntimeError, match="Missing key"):
        task.load_agent_state_dict({"generator.0.weight": state["generator.0.weight"]})


class FakeFit:
    """A trainer whose fit only books time to the phases the task counts apart from training."""

    def __init__(self, booked, loggers=()):
        self.loggers, self.current_epoch, self.calls, self.booked = list(loggers), 0, [], booked
        self.world_size, self.global_rank = 1, 0  # one process

    def fit(self, task, datamodule, ckpt_path):
        self.calls.append((task, datamodule, ckpt_path))
        for phase, seconds in self.booked.items():
            task.add_time(phase, seconds)


# Before the fit, 100 s of evaluating and 10 s of drawing were booked; the fit itself takes ~0 s.
@pytest.mark.parametrize("booked, elsewhere", [
    (dict(eval=5.0, samples=1.0, log=2.0, quality_setup=3.0, other=50.0), 11.0),
    (dict(eval=5.0, samples=1.0), 6.0),  # nothing logged, no judge set up (it was ready)
])
def test_training_time_is_the_fit_minus_what_it_spent_elsewhere(built, tmp_path, booked, elsewhere):
    dm = Images()
    task = make(datamodule=dm, run_dir=tmp_path)
    tb = FakeTensorBoard()
    fake = FakeFit(booked, [tb])
    task._trainer = fake
    task.prepare_quality(dm)
    task.time_breakdown_s = {"eval": 100.0, "samples": 10.0}
    t0 = time.perf_counter()
    task.fit_and_evaluate(fake, dm, "last.ckpt")
    elapsed = time.perf_counter() - t0
    assert fake.calls == [(task, dm, "last.ckpt")]
    assert -elsewhere <= task.time_breakdown_s["train"] <= -elsewhere + elapsed
    assert [args[0] for name, args, _, _ in tb.recorder.calls if name == "add_image"] == ["samples_final"]

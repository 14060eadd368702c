"""Generative adversarial networks (Goodfellow et al. 2014) as a Lightning module with manual optimization.

One training step reads like the classic loop:

1. discriminator step: D learns to tell a real batch (target 1 - label_smoothing) from generated images
   (target 0); the generated images are detached, so no gradient of this step reaches the generator;
2. every `d_steps_per_g_step`-th batch, a generator step: G learns to make D say "real" about its
   images (the non-saturating loss); `toggle_optimizer` switches D's gradients off meanwhile.

The adversarial loss is any loss on logits and 0/1 targets: BCE-with-logits (loss=bce, the classic GAN)
or least squares (loss=mse, LSGAN). Sample quality is measured, not eyeballed (`gan_metrics`): before
training, every `eval_every_n_epochs` epochs, and at the end, always on the same noise. A grid of samples
from a fixed noise batch is saved as PNG every `sample_every_n_epochs` epochs (and sent to TensorBoard
and W&B when they log); the final grid is `<run dir>/samples.png`.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger
from torch import nn

from pipeline.store.checkpoint import rng_state, set_rng_state
from pipeline.tasks.base import Task, TaskParts, check_finite
from pipeline.tasks.configs import GANConfig
from pipeline.tasks.gan_metrics import build_quality

QUALITIES = ("auto", "classifier", "frames")
# Noise for evaluation and for the picture grid comes from its own seeded stream, away from training's,
# and is the same at every evaluation, so the curve shows the generator changing, not the noise.
EVAL_NOISE_OFFSET = 104_729
GRID_NOISE_OFFSET = 15_485_863
_PROBABILITY_LOSSES = (nn.CrossEntropyLoss, nn.NLLLoss, nn.BCELoss)


def image_grid(images: torch.Tensor, ncol: int | None = None, pad: int = 1) -> np.ndarray:
    """(N, C, H, W) images in [-1, 1] -> one (rows*H, cols*W) or (.., .., 3) array in [0, 1], tiles separated by `pad`."""
    x = ((images.detach().float().cpu().clamp(-1, 1) + 1.0) / 2.0).numpy()
    n, c, h, w = x.shape
    ncol = int(ncol or int(np.ceil(np.sqrt(n))))
    nrow = int(np.ceil(n / ncol))
    # Mid-grey gaps: white ones would merge with white image borders (e.g. the bars of Pong).
    grid = np.full((c, nrow * (h + pad) + pad, ncol * (w + pad) + pad), 0.5, dtype=np.float32)
    for i in range(n):
        r, col = divmod(i, ncol)
        top, left = pad + r * (h + pad), pad + col * (w + pad)
        grid[:, top : top + h, left : left + w] = x[i]
    return grid[0] if c == 1 else grid[:3].transpose(1, 2, 0)


def save_png(grid: np.ndarray, path: Path, min_side: int = 256) -> np.ndarray:
    """Write the grid, scaled up by a whole factor (nearest neighbour) so small images stay sharp; returns what was written."""
    from matplotlib import image as mpimg

    scale = max(1, int(np.ceil(min_side / max(grid.shape[:2]))))
    big = np.repeat(np.repeat(grid, scale, axis=0), scale, axis=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    mpimg.imsave(path, big, cmap="gray" if big.ndim == 2 else None, vmin=0.0, vmax=1.0)
    return big


class GANTask(Task):
    Config = GANConfig
    primary_metric = "eval/inception_score"
    primary_curve = "eval/inception_score"
    # The real split the scores are measured against (prepare_quality's reference).
    eval_splits = ("test",)
    # D's update leaves G without a gradient (and G's update D): DDP looks for the unused ones.
    ddp_unused_parameters = True

    def __init__(self, config: GANConfig, parts: TaskParts):
        super().__init__(config, parts)
        net = parts.require("net", "gan", "choose a pair with model=gan_mlp|gan_dcgan")
        loss = parts.require("loss", "gan", "use loss=bce (classic GAN) or loss=mse (least squares)")
        optimizer = parts.require("optimizer", "gan", "choose one with optimizer=adam")
        data = parts.require("datamodule", "gan", "choose images with data=digit_images|atari_frames")
        image_shape, n_classes = data.image_shape, data.n_classes
        d_steps_per_g_step, label_smoothing, quality = config.d_steps_per_g_step, config.label_smoothing, config.quality
        if isinstance(loss, _PROBABILITY_LOSSES):
            raise ValueError(
                f"task=gan needs a loss on logits and 0/1 targets (the discriminator outputs logits); "
                f"got {type(loss).__name__}: use loss=bce (classic GAN) or loss=mse (least squares)"
            )
        if int(d_steps_per_g_step) < 1 or not 0.0 <= float(label_smoothing) < 0.5:
            raise ValueError(
                f"task.d_steps_per_g_step={d_steps_per_g_step} must be >= 1 and task.label_smoothing={label_smoothing} in [0, 0.5)"
            )
        if quality not in QUALITIES:
            raise ValueError(f"task.quality={quality!r}; choose one of {', '.join(QUALITIES)}")
        scheduler, run_dir = parts.scheduler, parts.run_dir
        self.automatic_optimization = False
        self.gan = net if isinstance(net, nn.Module) else net(image_shape=tuple(image_shape))
        self.loss_fn = loss
        self.optimizer_factory, self.scheduler_factory = optimizer, scheduler
        self.image_shape = tuple(int(s) for s in image_shape)
        self.n_classes = None if n_classes is None else int(n_classes)
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.d_steps_per_g_step = int(d_steps_per_g_step)
        self.real_target = 1.0 - float(label_smoothing)
        # Labelled data is scored by a classifier; frames without labels in a fixed feature space.
        self.quality_kind = ("classifier" if self.n_classes else "frames") if quality == "auto" else quality
        if self.quality_kind == "frames":
            self.primary_metric = self.primary_curve = "eval/frechet_distance"
            self.higher_is_better = False
        self.quality_settings = dict(
            classifier=asdict(config.classifier), frame_features=asdict(config.frame_features),
            n_samples=int(config.n_eval_samples), coverage_threshold=float(config.coverage_threshold), cache_dir=config.cache_dir,
        )
        self.eval_every_n_epochs, self.sample_every_n_epochs = int(config.eval_every_n_epochs), int(config.sample_every_n_epochs)
        self.log_every_n_steps = max(1, int(config.log_every_n_steps))
        self.histogram_every_n_steps = int(config.histogram_every_n_steps)
        self.log_graph = bool(config.log_graph)
        grid_noise = torch.randn(int(config.n_grid_samples), self.gan.latent_dim, generator=torch.Generator().manual_seed(self.seed + GRID_NOISE_OFFSET))
        self.register_buffer("grid_noise", grid_noise, persistent=False)
        # Progress (saved in checkpoints, so a resumed run continues its counters and keeps its start scores).
        self.iterations = 0
        self.generator_steps = 0
        self.start_scores: dict[str, float] = {}
        self.reference_scores: dict[str, float] = {}
        self.quality = None
        self._recent: dict[str, list[torch.Tensor]] = {}
        self._last_logged: dict[str, float] = {}
        self._graph_logged = False
        self._last_eval: tuple[int, dict[str, float]] | None = None
        self._resume_rng: dict | None = None

    # ---- Lightning plumbing ------------------------------------------------------------------------
    def configure_optimizers(self):
        optimizers = [self.optimizer_factory(self.gan.generator.parameters()), self.optimizer_factory(self.gan.discriminator.parameters())]
        if self.scheduler_factory is None:
            return optimizers
        return optimizers, [self.scheduler_factory(opt) for opt in optimizers]

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.gan.generator(z)

    def on_fit_start(self) -> None:
        if self.quality is None:
            t0 = time.perf_counter()
            self.prepare_quality(self.trainer.datamodule)
            self.add_time("quality_setup", time.perf_counter() - t0)
        if self._resume_rng is not None:
            # The generator's noise, the discriminator's dropout and the data order draw from the global RNG.
            # Restored here, before the resumed fit creates its first data iterator (the straight run creates
            # it after the checkpoint, at the epoch's start); the sanity check in between runs under isolate_rng.
            set_rng_state(self._resume_rng)
            self._resume_rng = None

    def on_train_start(self) -> None:
        self._log_graph_once()
        if not self.start_scores:
            self.start_scores = self.evaluate_now()

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["gan_progress"] = {
            "iterations": self.iterations, "generator_steps": self.generator_steps, "start_scores": self.start_scores,
            "rng": rng_state(),
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        progress = checkpoint.get("gan_progress", {})
        self.iterations = int(progress.get("iterations", 0))
        self.generator_steps = int(progress.get("generator_steps", 0))
        self.start_scores = dict(progress.get("start_scores", {}))
        self._resume_rng = progress.get("rng")

    # ---- the algorithm -----------------------------------------------------------------------------
    def noise(self, n: int) -> torch.Tensor:
        return torch.randn(n, self.gan.latent_dim, device=self.device)

    def adversarial_loss(self, logits: torch.Tensor, target: float) -> torch.Tensor:
        return self.loss_fn(logits, torch.full_like(logits, target))

    def discriminator_step(self, real: torch.Tensor, fake: torch.Tensor) -> dict[str, torch.Tensor]:
        """One update of D on a real and a generated batch; `fake` is detached so G receives nothing."""
        opt_d = self.optimizers()[1]
        self.toggle_optimizer(opt_d)
        real_logits = self.gan.discriminator(real)
        fake_logits = self.gan.discriminator(fake.detach())
        loss = self.adversarial_loss(real_logits, self.real_target) + self.adversarial_loss(fake_logits, 0.0)
        opt_d.zero_grad(set_to_none=True)
        self.manual_backward(loss)
        opt_d.step()
        self.untoggle_optimizer(opt_d)
        return {
            "d_loss": loss.detach(),
            "d_real": torch.sigmoid(real_logits.detach()).mean(),
            "d_fake": torch.sigmoid(fake_logits.detach()).mean(),
        }

    def generator_step(self, fake: torch.Tensor) -> dict[str, torch.Tensor]:
        """One update of G: make D call `fake` real (non-saturating loss); D's parameters are toggled off."""
        opt_g = self.optimizers()[0]
        self.toggle_optimizer(opt_g)
        loss = self.adversarial_loss(self.gan.discriminator(fake), 1.0)
        opt_g.zero_grad(set_to_none=True)
        self.manual_backward(loss)
        opt_g.step()
        self.untoggle_optimizer(opt_g)
        self.generator_steps += 1
        return {"g_loss": loss.detach()}

    def training_step(self, batch, batch_idx):
        real = batch[0] if isinstance(batch, list | tuple) else batch
        self.iterations += 1
        g_turn = self.iterations % self.d_steps_per_g_step == 0
        z = self.noise(real.shape[0])
        # One generator pass serves both steps when G also learns this batch (as in the DCGAN reference).
        with torch.set_grad_enabled(g_turn):
            fake = self.gan.generator(z)
        stats = self.discriminator_step(real, fake)
        if g_turn:
            stats.update(self.generator_step(fake))
        for key, value in stats.items():
            self._recent.setdefault(key, []).append(value)
        if self.iterations % self.log_every_n_steps == 0:
            self.log_progress()
            self.log("d_loss", self._last_logged["train/d_loss"], prog_bar=True, logger=False, on_step=True, sync_dist=True)
        if self.histogram_every_n_steps > 0 and self.iterations % self.histogram_every_n_steps == 0:
            self._log_histograms()
        return None

    def on_train_epoch_end(self) -> None:
        schedulers = self.lr_schedulers()
        for scheduler in schedulers if isinstance(schedulers, list) else [schedulers] if schedulers else []:
            scheduler.step()
        epoch = self.current_epoch + 1
        # max_epochs -1 (a run bounded by trainer.max_steps): no epoch is the last; fit_and_evaluate scores the end.
        max_epochs = self.trainer.max_epochs
        last = max_epochs is not None and 0 <= max_epochs <= epoch
        if self.eval_every_n_epochs > 0 and (epoch % self.eval_every_n_epochs == 0 or last):
            self.evaluate_now()
        if self.sample_every_n_epochs > 0 and (epoch % self.sample_every_n_epochs == 0 or last):
            self.save_samples(self._out_dir() / "samples" / f"epoch_{epoch:04d}.png", tag="samples")

    # ---- measuring and showing -----------------------------------------------------------------------
    def prepare_quality(self, datamodule) -> None:
        """Build the scorer and its real-data reference from `datamodule.real_images('train'|'test')`."""
        if datamodule is None or not hasattr(datamodule, "real_images"):
            raise ValueError("task=gan scores samples against datamodule.real_images('test'); use data=digit_images or data=atari_frames")

        def real_train():
            labels = datamodule.real_labels("train") if hasattr(datamodule, "real_labels") else None
            return datamodule.real_images("train"), labels

        self.quality = build_quality(self.quality_kind, self.image_shape, real_train, self.n_classes, **self.quality_settings)
        test_labels = datamodule.real_labels("test") if hasattr(datamodule, "real_labels") else None
        self.reference_scores = self.quality.reference(datamodule.real_images("test"), test_labels)
        # The floor for a generator that reproduces its training data exactly.
        train_scores = self.quality.score(datamodule.real_images("train")[: self.quality.n_needed])
        self.reference_scores["frechet_distance_train"] = train_scores["frechet_distance"]

    def generate(self, z: torch.Tensor) -> torch.Tensor:
        """G(z) in eval mode (BatchNorm running statistics) under inference_mode, then back to train mode."""
        was_training = self.gan.training
        self.gan.eval()
        try:
            with torch.inference_mode():
                return torch.cat([self.gan.generator(chunk.to(self.device)) for chunk in z.split(1024)])
        finally:
            self.gan.train(was_training)

    def score(self, seed: int | None = None) -> dict[str, float]:
        """The scores of G on noise from `seed` (None: seed + EVAL_NOISE_OFFSET, the noise of every evaluation)."""
        seed = self.seed + EVAL_NOISE_OFFSET if seed is None else int(seed)
        z = torch.randn(self.quality.n_needed, self.gan.latent_dim, generator=torch.Generator().manual_seed(seed))
        return self.quality.score(self.generate(z))

    def evaluate_now(self) -> dict[str, float]:
        """Score the generator and add a point to the eval curves (once per batch count: the last epoch's is the final)."""
        if self._last_eval is not None and self._last_eval[0] == self.iterations:
            return self._last_eval[1]
        t0 = time.perf_counter()
        scores = self.score()
        self._log({f"eval/{k}": v for k, v in scores.items()})
        self._last_eval = (self.iterations, scores)
        self.add_time("eval", time.perf_counter() - t0)
        return scores

    def save_samples(self, path: Path, tag: str) -> Path:
        if self._trainer is not None and self.global_rank != 0:  # a run on several processes: rank 0 writes
            return path
        t0 = time.perf_counter()
        grid = save_png(image_grid(self.generate(self.grid_noise)), path)
        for logger in self.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_image(tag, grid, self.iterations, dataformats="HW" if grid.ndim == 2 else "HWC")
            elif isinstance(logger, WandbLogger):
                # The PNG itself, not the array: wandb >= 0.2x casts float pixels in [0, 1] straight to
                # uint8 (all black), and the file guarantees W&B shows exactly what is on disk.
                logger.log_image(key=tag, images=[str(path)], step=self.iterations)
        self.add_time("samples", time.perf_counter() - t0)
        return path

    def log_progress(self) -> None:
        t0 = time.perf_counter()
        # One host sync per log interval, not per step.
        means = {f"train/{k}": torch.stack(v).mean() for k, v in self._recent.items() if v}
        self._recent = {}
        if means and self.trainer.world_size > 1:  # every rank's batches (all log at the same iterations)
            reduced = self.trainer.strategy.reduce(torch.stack(list(means.values())), reduce_op="mean")
            means = dict(zip(means, reduced))
        for key, value in means.items():
            if key.endswith("_loss"):
                check_finite(value, self.iterations, hint="lower optimizer.lr or use loss=mse (least squares)")
        values = {k: float(v.item()) for k, v in means.items()}
        self._last_logged.update(values)
        self._log(values)
        self.add_time("log", time.perf_counter() - t0)

    def _log(self, metrics: dict[str, float]) -> None:
        # Straight to the loggers with batches as the x axis (self.log per step is expensive, and
        # Lightning's global_step counts both optimizers' steps).
        for logger in self.loggers:
            logger.log_metrics({"epoch": float(self.current_epoch), **metrics}, step=self.iterations)

    def _tensorboards(self) -> list[TensorBoardLogger]:
        return [lg for lg in self.loggers if isinstance(lg, TensorBoardLogger)]

    def _log_histograms(self) -> None:
        t0 = time.perf_counter()
        for tb in self._tensorboards():
            for name, param in self.gan.named_parameters():
                tb.experiment.add_histogram(f"weights/{name}", param.detach().cpu(), self.iterations)
        self.add_time("log", time.perf_counter() - t0)

    def _log_graph_once(self) -> None:
        if not self.log_graph or self._graph_logged or not self._tensorboards():
            return
        # Traced in eval mode: BatchNorm statistics and dropout draws of the training run stay untouched.
        was_training = self.gan.training
        self.gan.eval()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for tb in self._tensorboards():
                    tb.experiment.add_graph(self.gan, self.grid_noise[:2])
        finally:
            self.gan.train(was_training)
        self._graph_logged = True

    def _out_dir(self) -> Path:
        return self.run_dir if self.run_dir is not None else Path(self.trainer.default_root_dir)

    # ---- the contract with run.py ----------------------------------------------------------------
    def fit_and_evaluate(self, trainer, datamodule, ckpt_path) -> list[dict[str, float]]:
        # "train" is the fit minus what the fit spent measuring, drawing and logging (counted under those).
        others = ("eval", "samples", "log", "quality_setup")
        before = sum(self.time_breakdown_s.get(k, 0.0) for k in others)
        t0 = time.perf_counter()
        trainer.fit(self, datamodule=datamodule, ckpt_path=ckpt_path)
        fit_s = time.perf_counter() - t0
        self.add_time("train", fit_s - (sum(self.time_breakdown_s.get(k, 0.0) for k in others) - before))
        if self._recent:
            self.log_progress()
        final = self.evaluate_now()
        self.save_samples(self._out_dir() / "samples.png", tag="samples_final")
        metrics = {f"eval/{k}": v for k, v in final.items()}
        metrics.update({f"eval/{k}_start": v for k, v in self.start_scores.items()})
        metrics.update(self.final_metrics(final))
        metrics.update(self._last_logged)
        return [metrics]

    def final_metrics(self, scores: dict[str, float]) -> dict[str, float]:
        """The record's `eval/...` metrics of a score: the score, the real data's reference and (classifier) their ratio."""
        metrics = {f"eval/{k}": v for k, v in scores.items()}
        metrics.update({f"eval/{k}": v for k, v in self.reference_scores.items()})
        if self.quality_kind == "classifier":
            metrics["eval/inception_score_ratio"] = scores["inception_score"] / self.reference_scores["inception_score_real"]
        return metrics

    def load_agent_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.gan.load_state_dict(state_dict)

    def evaluate_model(self, datamodule, split: str, seed: int | None = None) -> dict[str, float]:
        """The saved generator scored as the run's final evaluation scores it: the same judge (the cached classifier or
        fixed frame features), the same real test reference, and by default the same noise (`seed`: other noise)."""
        self.prepare_quality(datamodule)
        return self.final_metrics(self.score(seed))

    def agent_record(self, i: int) -> dict:
        return {
            "quality": self.quality_kind,
            "iterations": self.iterations,
            "generator_steps": self.generator_steps,
            "samples_png": "samples.png",
        }

    def agent_state_dict(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu() for k, v in self.gan.state_dict().items()}


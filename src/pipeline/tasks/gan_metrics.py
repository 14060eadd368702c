"""Measured sample quality for GANs: an Inception-style score, class coverage and Fréchet distances.

Two ways to score, chosen by the data:

- `ClassifierQuality` (labelled images such as the digits): a classifier of the supervised task's kind
  (`pipeline.nets.mlp.MLP` on [0, 1] pixels) gives p(y|x) for the Inception score
  exp(E_x KL(p(y|x) || p(y))) and for class coverage, and its penultimate layer is the feature space of
  the Fréchet distance. The classifier is trained on the fly on the train split (seeded, a few seconds) and
  cached by a hash of its settings and data, or loaded from a supervised run's `model.pt`.
- `FrameQuality` (unlabelled frames such as Atari screens): a Fréchet distance in a fixed feature space,
  area-downsampled pixels (layout: where things are) concatenated with globally pooled features of a
  random, never-trained conv net seeded with a fixed seed (texture and edges), plus per-pixel statistics.
  Random conv features are a known stand-in for a pretrained network when none fits the domain; the
  distance is only comparable between runs with the same `feature_seed` and frame size.

Each reports the same numbers for real data as a reference: the score of the real test set and the
Fréchet distance between two halves of it. The generated samples are scored against the second half,
with as many samples as that half holds, so both distances carry the same small-sample bias.

Everything runs on CPU in float64 where it matters, under its own RNG, so scoring never changes the
training run it measures.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import warnings
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import scipy.linalg
import torch
from torch import nn

from pipeline.data.atari_frames import cache_root
from pipeline.nets.mlp import MLP
from pipeline.store.layout import MODEL

log = logging.getLogger(__name__)

# The halves of the real test set and the classifier's weights get their own seeds, away from training's.
SPLIT_SEED_OFFSET = 7_919


# ---- the numbers ---------------------------------------------------------------------------------------


def inception_score(probs: torch.Tensor | np.ndarray, eps: float = 1e-12) -> float:
    """exp(E_x KL(p(y|x) || p(y))): 1 for samples the classifier cannot tell apart, K for confident, balanced ones."""
    p = np.asarray(probs, dtype=np.float64)
    marginal = p.mean(axis=0, keepdims=True)
    kl = (p * (np.log(p + eps) - np.log(marginal + eps))).sum(axis=1)
    return float(np.exp(kl.mean()))


def class_coverage(probs: torch.Tensor | np.ndarray, threshold: float = 0.25) -> tuple[float, int]:
    """(fraction, count) of classes predicted for at least `threshold` x the uniform share (1/K) of the samples."""
    p = np.asarray(probs)
    n_classes = p.shape[1]
    share = np.bincount(p.argmax(axis=1), minlength=n_classes) / len(p)
    covered = int((share >= threshold / n_classes).sum())
    return covered / n_classes, covered


def frechet_distance(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> float:
    """||mu_a - mu_b||^2 + Tr(S_a + S_b - 2 (S_a S_b)^(1/2)) between Gaussians fitted to two feature sets (N, D)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or min(len(a), len(b)) < 2:
        raise ValueError(f"frechet_distance needs two (N>=2, D) feature sets of equal D; got {a.shape} and {b.shape}")
    mu_a, mu_b = a.mean(axis=0), b.mean(axis=0)
    cov_a, cov_b = np.atleast_2d(np.cov(a, rowvar=False)), np.atleast_2d(np.cov(b, rowvar=False))
    with warnings.catch_warnings():
        # Dead ReLU units make covariances singular; sqrtm warns, and the result is checked below.
        warnings.simplefilter("ignore", scipy.linalg.LinAlgWarning)
        covmean = scipy.linalg.sqrtm(cov_a @ cov_b)
        if not np.isfinite(covmean).all():
            # A tiny ridge is the usual fix when the singular product defeats sqrtm.
            ridge = np.eye(len(cov_a)) * 1e-6
            covmean = scipy.linalg.sqrtm((cov_a + ridge) @ (cov_b + ridge))
    covmean = np.real(covmean)
    diff = mu_a - mu_b
    return float(max(diff @ diff + np.trace(cov_a) + np.trace(cov_b) - 2.0 * np.trace(covmean), 0.0))


def two_halves(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded random split of range(n) into two halves of equal size."""
    order = torch.from_numpy(np.random.default_rng(seed + SPLIT_SEED_OFFSET).permutation(n))
    half = n // 2
    return order[:half], order[half : 2 * half]


# ---- the digits classifier ---------------------------------------------------------------------------


def penultimate(classifier: MLP, x: torch.Tensor) -> torch.Tensor:
    """The MLP's last hidden activations: the feature space of the Fréchet distance."""
    return classifier.net[:-1](x.flatten(1))


def _fingerprint(*arrays: torch.Tensor) -> str:
    digest = hashlib.sha256()
    for a in arrays:
        digest.update(a.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def train_classifier(
    x: torch.Tensor,
    y: torch.Tensor,
    n_classes: int,
    hidden: Sequence[int] = (128, 64),
    act: str = "relu",
    dropout: float = 0.2,
    epochs: int = 60,
    lr: float = 2e-3,
    weight_decay: float = 1e-4,
    batch_size: int = 64,
    seed: int = 0,
) -> MLP:
    """A plain, seeded Adam loop (no Lightning: it runs inside another run's fit and must not touch its loggers)."""
    x = x.detach().float().flatten(1).cpu()
    y = y.detach().long().cpu()
    # fork_rng: the classifier's initialisation and shuffling leave the training run's RNG untouched,
    # so a run that finds the classifier cached is identical to one that trains it.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = MLP(x.shape[1], int(n_classes), hidden=hidden, act=act, dropout=dropout)
        opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(int(epochs), 1))
        loss_fn = nn.CrossEntropyLoss()
        net.train()
        for _ in range(int(epochs)):
            for idx in torch.randperm(len(x)).split(int(batch_size)):
                opt.zero_grad(set_to_none=True)
                loss_fn(net(x[idx]), y[idx]).backward()
                opt.step()
            sched.step()
    return net.eval()


def _what_is_wrong(path: Path, exc: BaseException) -> str:
    """Name the problem from the file itself: torch's own messages suggest `weights_only=False`, which we never do."""
    head = path.read_bytes()[:512]
    if not head:
        return "the file is empty"
    if head.startswith(b"PK\x03\x04"):
        if zipfile.is_zipfile(path):
            return "it holds pickled Python objects that a weights-only load refuses (save `model.state_dict()`, not the model)"
        return "it is a truncated or corrupt torch archive"
    try:
        head.decode("utf-8")
        return "it is a text file, not a torch checkpoint"
    except UnicodeDecodeError:
        return f"it is not a torch checkpoint ({type(exc).__name__})"


def load_state_dict_file(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """A state_dict from `path`, weights-only; any bad file becomes one ValueError naming the file and what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file; pass the {MODEL} of a supervised run (task.classifier.path)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(f"{path} cannot be loaded: {_what_is_wrong(path, exc)}") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path} cannot be loaded: it holds a {type(state).__name__}, not a state_dict of tensors")
    return state


def cached_classifier(
    x: torch.Tensor, y: torch.Tensor, n_classes: int, cache_dir: str | None = None, **settings
) -> tuple[MLP, Path, bool]:
    """`train_classifier`, cached under <cache>/gan_classifier/<hash of settings, data, torch version>.pt.

    Returns (classifier, path, loaded_from_cache).
    """
    spec = {
        "n_classes": int(n_classes), "in_features": int(x[0].numel()), "data": _fingerprint(x.float(), y.long()),
        "torch": torch.__version__, **{k: list(v) if isinstance(v, tuple | list) else v for k, v in settings.items()},
    }
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_root(cache_dir) / "gan_classifier" / f"{key}.pt"
    hidden = settings.get("hidden", (128, 64))
    net = MLP(spec["in_features"], n_classes, hidden=hidden, act=settings.get("act", "relu"), dropout=settings.get("dropout", 0.2))
    if path.is_file():
        try:
            net.load_state_dict(load_state_dict_file(path))
            return net.eval(), path, True
        except (ValueError, RuntimeError) as exc:  # RuntimeError: tensors of the wrong shapes
            # A run killed mid-copy or a full disk leaves a bad file; without this every later run fails on it.
            log.warning(f"gan quality: cached classifier unusable ({exc}); rebuilding it")
            path.unlink(missing_ok=True)
    net = train_classifier(x, y, n_classes, **settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written under a temporary name and renamed: runs of a parallel sweep never read half a file.
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp")
    torch.save(net.state_dict(), tmp)
    os.replace(tmp, path)
    return net, path, False


def load_supervised_classifier(path: str | os.PathLike, act: str = "relu") -> MLP:
    """An MLP from a supervised run's `model.pt` (`python -m pipeline experiment=supervised_digits`).

    The layer sizes are read from the weights; whether the run used dropout shows in the layer indices.
    The activation is not in a state_dict, so it is an argument.
    """
    state = load_state_dict_file(path)
    linear = sorted((int(k.split(".")[1]), v) for k, v in state.items() if k.startswith("net.") and k.endswith(".weight"))
    if len(linear) < 2 or any(w.dim() != 2 for _, w in linear):
        raise ValueError(f"{path} is not an MLP state_dict with hidden layers (keys net.<i>.weight)")
    indices = [i for i, _ in linear]
    gaps = {b - a for a, b in zip(indices[:-1], indices[1:])}
    if gaps not in ({2}, {3}):
        raise ValueError(f"{path}: unexpected layer layout {indices}")
    hidden = [w.shape[0] for _, w in linear[:-1]]
    net = MLP(linear[0][1].shape[1], linear[-1][1].shape[0], hidden=hidden, act=act, dropout=0.5 if gaps == {3} else 0.0)
    net.load_state_dict(state)
    return net.eval()


class ClassifierQuality:
    """Inception score, class coverage and Fréchet distance of [-1, 1] images through a [0, 1]-pixel classifier."""

    def __init__(self, classifier: MLP, n_samples: int = 1000, coverage_threshold: float = 0.25, seed: int = 0):
        self.classifier = classifier.eval().cpu()
        self.n_classes = int(classifier.out_features)
        self.n_samples = int(n_samples)
        self.coverage_threshold = float(coverage_threshold)
        self.seed = int(seed)
        self.reference_features: torch.Tensor | None = None

    @torch.inference_mode()
    def _outputs(self, images: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
        x = ((images.detach().float().cpu() + 1.0) / 2.0).flatten(1)
        feats = penultimate(self.classifier, x)
        probs = torch.softmax(self.classifier.net[-1](feats), dim=1)
        return probs.double().numpy(), feats

    def reference(self, real_test: torch.Tensor, real_test_labels: torch.Tensor | None = None) -> dict[str, float]:
        """Fix the reference half of the real test set; the scores of real data, keyed `<name>_real`."""
        probs, feats = self._outputs(real_test)
        first, second = two_halves(len(real_test), self.seed)
        self.reference_features = feats[second]
        scores = {"inception_score": inception_score(probs)}
        scores["class_coverage"], covered = class_coverage(probs, self.coverage_threshold)
        scores["classes_covered"] = float(covered)
        scores["frechet_distance"] = frechet_distance(feats[first], self.reference_features)
        if real_test_labels is not None:
            scores["classifier_acc"] = float((probs.argmax(1) == np.asarray(real_test_labels)).mean())
        return {f"{k}_real": v for k, v in scores.items()}

    @property
    def n_needed(self) -> int:
        return max(self.n_samples, len(self.reference_features))

    def score(self, samples: torch.Tensor) -> dict[str, float]:
        """Scores of generated samples (at least `n_needed` of them); the Fréchet distance uses as many as the reference half."""
        if self.reference_features is None:
            raise RuntimeError("call reference(real_test) before score(samples)")
        probs, feats = self._outputs(samples)
        coverage, covered = class_coverage(probs[: self.n_samples], self.coverage_threshold)
        return {
            "inception_score": inception_score(probs[: self.n_samples]),
            "class_coverage": coverage,
            "classes_covered": float(covered),
            "frechet_distance": frechet_distance(feats[: len(self.reference_features)], self.reference_features),
        }


# ---- frames --------------------------------------------------------------------------------------------


class FixedFrameFeatures(nn.Module):
    """area-downsampled pixels (pooled_size^2) + globally pooled ReLU features of a fixed random conv net.

    The conv weights are drawn from a generator seeded with `seed` (Kaiming-normal, biases zero) and
    never trained, so the feature space is the same on every machine with the same torch version.
    """

    def __init__(self, in_channels: int = 1, channels: Sequence[int] = (16, 32, 64), pooled_size: int = 8, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(int(seed))
        layers: list[nn.Module] = []
        width = int(in_channels)
        for c in channels:
            conv = nn.Conv2d(width, int(c), 4, 2, 1)
            with torch.no_grad():
                conv.weight.normal_(0.0, (2.0 / (width * 16)) ** 0.5, generator=gen)
                conv.bias.zero_()
            layers += [conv, nn.ReLU()]
            width = int(c)
        self.conv = nn.Sequential(*layers).requires_grad_(False)
        self.pooled_size = int(pooled_size)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        pixels = nn.functional.adaptive_avg_pool2d(images, self.pooled_size).flatten(1)
        texture = self.conv(images).mean(dim=(2, 3))
        return torch.cat([pixels, texture], dim=1)


def pixel_statistics(images: torch.Tensor) -> dict[str, float]:
    x = images.detach().double().cpu()
    return {"pixel_mean": float(x.mean()), "pixel_std": float(x.std())}


class FrameQuality:
    """Fréchet distance in `FixedFrameFeatures` space, and per-pixel statistics, of [-1, 1] frames."""

    def __init__(self, image_shape: Sequence[int], feature_seed: int = 0, channels: Sequence[int] = (16, 32, 64), pooled_size: int = 8, seed: int = 0):
        self.features = FixedFrameFeatures(int(image_shape[0]), channels, pooled_size, feature_seed).eval()
        self.seed = int(seed)
        self.reference_features: torch.Tensor | None = None
        self.reference_mean: torch.Tensor | None = None
        self.reference_std: torch.Tensor | None = None

    @torch.inference_mode()
    def _features(self, images: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.features(chunk) for chunk in images.detach().float().cpu().split(256)])

    def _pixel_errors(self, images: torch.Tensor) -> dict[str, float]:
        x = images.detach().double().cpu()
        return {
            # How far the per-pixel mean and spread images are from the real ones (mean absolute error).
            "pixel_mean_map_error": float((x.mean(0) - self.reference_mean).abs().mean()),
            "pixel_std_map_error": float((x.std(0) - self.reference_std).abs().mean()),
        }

    def reference(self, real_test: torch.Tensor, real_test_labels: torch.Tensor | None = None) -> dict[str, float]:
        first, second = two_halves(len(real_test), self.seed)
        feats = self._features(real_test)
        self.reference_features = feats[second]
        ref = real_test[second].detach().double().cpu()
        self.reference_mean, self.reference_std = ref.mean(0), ref.std(0)
        scores = {"frechet_distance": frechet_distance(feats[first], self.reference_features)}
        scores.update(pixel_statistics(real_test))
        scores.update(self._pixel_errors(real_test[first]))
        return {f"{k}_real": v for k, v in scores.items()}

    @property
    def n_needed(self) -> int:
        return len(self.reference_features)

    def score(self, samples: torch.Tensor) -> dict[str, float]:
        if self.reference_features is None:
            raise RuntimeError("call reference(real_test) before score(samples)")
        samples = samples[: self.n_needed]
        scores = {"frechet_distance": frechet_distance(self._features(samples), self.reference_features)}
        scores.update(pixel_statistics(samples))
        scores.update(self._pixel_errors(samples))
        return scores


def build_quality(
    kind: str,
    image_shape: Sequence[int],
    real_train: Callable[[], tuple[torch.Tensor, torch.Tensor | None]],
    n_classes: int | None,
    classifier: dict,
    frame_features: dict,
    n_samples: int,
    coverage_threshold: float,
    cache_dir: str | None,
    seed: int = 0,
):
    """The scorer named by `kind` (`classifier` or `frames`); `real_train()` gives the classifier's training data.

    `seed` picks the halves of the real test set; it is not the training seed, so every run of a sweep is
    scored against the same reference half.
    """
    if kind == "frames":
        return FrameQuality(image_shape, seed=seed, **frame_features)
    if kind != "classifier":
        raise ValueError(f"task.quality={kind!r}; choose auto, classifier or frames")
    settings = dict(classifier)
    path = settings.pop("path", None)
    act = settings.get("act", "relu")
    if path:
        net = load_supervised_classifier(path, act=act)
        log.info(f"gan quality: classifier loaded from {path}")
    else:
        x, y = real_train()
        if y is None or not n_classes:
            raise ValueError("task.quality=classifier needs labelled data (data=digit_images); for unlabelled frames use task.quality=frames")
        # The classifier reads [0, 1] pixels, like the supervised digits task that shares its architecture.
        net, cache_path, cached = cached_classifier((x + 1.0) / 2.0, y, n_classes, cache_dir=cache_dir, **settings)
        log.info(f"gan quality: classifier {'loaded from' if cached else 'trained and cached at'} {cache_path}")
    if n_classes and net.out_features != n_classes:
        raise ValueError(f"the quality classifier has {net.out_features} outputs but the data has {n_classes} classes")
    return ClassifierQuality(net, n_samples=n_samples, coverage_threshold=coverage_threshold, seed=seed)

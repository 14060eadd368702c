"""tasks/gan_metrics.py without a GAN run: the numbers on cases worked by hand, the classifier on tiny separable
data, the cache, the loader's layouts and messages, both scorers on a few dozen small images."""

import logging
import math

import numpy as np
import pytest
import torch

from pipeline.nets.mlp import MLP
from pipeline.tasks import gan_metrics as gm


def test_inception_score_by_hand():
    assert gm.inception_score(np.eye(4)) == pytest.approx(4.0, rel=1e-10)  # confident and balanced: K
    assert gm.inception_score(np.full((5, 3), 1 / 3)) == pytest.approx(1.0, rel=1e-12)  # all alike: 1
    # Two samples [0.9, 0.1] and [0.1, 0.9]: the marginal is uniform, each KL is 0.9 ln 1.8 + 0.1 ln 0.2.
    kl = 0.9 * math.log(1.8) + 0.1 * math.log(0.2)
    assert gm.inception_score(torch.tensor([[0.9, 0.1], [0.1, 0.9]], dtype=torch.float64)) == pytest.approx(math.exp(kl), rel=1e-9)
    # Unbalanced: 3 of class 0, 1 of class 1 (one-hot): marginal [3/4, 1/4], KL = ln(4/3) x 3 and ln 4 once.
    probs = np.array([[1.0, 0.0]] * 3 + [[0.0, 1.0]])
    assert gm.inception_score(probs) == pytest.approx(math.exp((3 * math.log(4 / 3) + math.log(4)) / 4), rel=1e-9)
    # Computed in float64 whatever comes in.
    single = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]], dtype=torch.float32)
    assert gm.inception_score(single) == pytest.approx(gm.inception_score(single.double()), rel=1e-14)
    assert gm.inception_score(probs, eps=0.5) == pytest.approx(
        math.exp((3 * math.log(1.5 / 1.25) + math.log(1.5 / 0.75)) / 4), rel=1e-9)


def test_class_coverage_counts_classes_at_the_threshold_share():
    # 16 samples over 4 classes, argmax counts 11, 4, 1, 0: shares 0.6875, 0.25, 0.0625, 0.
    labels = [0] * 11 + [1] * 4 + [2]
    probs = np.eye(4)[labels] * 0.7 + 0.075
    assert gm.class_coverage(probs) == (0.75, 3)  # 0.25 / 4 = 0.0625: the share at the threshold counts
    assert gm.class_coverage(probs, threshold=1.0) == (0.5, 2)  # 1/4 of the samples or more
    assert gm.class_coverage(torch.tensor(probs), threshold=0.0) == (1.0, 4)
    fraction, count = gm.class_coverage(np.eye(3)[[1, 1]])  # a class never predicted still counts as a class
    assert (fraction, count) == (pytest.approx(1 / 3), 1) and type(count) is int


def test_frechet_distance_by_hand():
    # 1-D: a = {0, 2} (mean 1, variance 2), b = {1, 5} (mean 3, variance 8): 4 + 2 + 8 - 2 sqrt(16) = 6.
    assert gm.frechet_distance([[0.0], [2.0]], [[1.0], [5.0]]) == pytest.approx(6.0, rel=1e-9)
    # 2-D, independent coordinates: the sum of the 1-D distances (variances 2 and 8, 18 and 2).
    a = np.array([[0.0, 0.0], [2.0, 4.0]])
    b = np.array([[1.0, 1.0], [5.0, 3.0]])
    expected = 6.0 + ((2 - 2) ** 2 + 8 + 2 - 2 * 4)
    assert gm.frechet_distance(torch.tensor(a), torch.tensor(b)) == pytest.approx(expected, rel=1e-9)
    same = np.random.default_rng(0).normal(size=(50, 3))
    assert gm.frechet_distance(same, same) == pytest.approx(0.0, abs=1e-9) and gm.frechet_distance(same, same) >= 0.0


def test_frechet_distance_is_computed_in_float64():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(20, 3)).astype(np.float32), rng.normal(1.0, 2.0, size=(30, 3)).astype(np.float32)
    exact = gm.frechet_distance(a.astype(np.float64), b.astype(np.float64))
    assert gm.frechet_distance(a, b.astype(np.float64)) == pytest.approx(exact, rel=1e-13)
    assert gm.frechet_distance(a.astype(np.float64), b) == pytest.approx(exact, rel=1e-13)


def test_a_failed_square_root_is_retried_with_a_small_ridge(monkeypatch):
    real, calls = gm.scipy.linalg.sqrtm, []

    def fails_first(m):
        calls.append(m)
        return np.full_like(m, np.nan) if len(calls) == 1 else real(m)

    monkeypatch.setattr(gm.scipy.linalg, "sqrtm", fails_first)
    a = np.array([[0.0, 1.0], [2.0, 1.0], [1.0, 1.0]])
    b = np.array([[3.0, 1.0], [5.0, 1.0], [4.0, 1.0]])
    d = gm.frechet_distance(a, b)
    cov = np.array([[1.0, 0.0], [0.0, 0.0]])
    ridge = np.eye(2) * 1e-6
    np.testing.assert_allclose(calls[1], (cov + ridge) @ (cov + ridge), rtol=0, atol=1e-15)
    # 3^2 + 2 Tr(cov) - 2 Tr(cov + ridge) = 9 - 4e-6
    assert len(calls) == 2 and d == pytest.approx(9.0 - 4e-6, abs=1e-9)


def test_frechet_distance_with_singular_covariances_is_finite():
    # A dead unit (a constant column) in both: singular covariances, the distance still the live column's.
    a = np.array([[0.0, 1.0], [2.0, 1.0], [1.0, 1.0]])
    b = np.array([[3.0, 1.0], [5.0, 1.0], [4.0, 1.0]])
    assert gm.frechet_distance(a, b) == pytest.approx(9.0, abs=1e-3)
    # Rank-one covariances whose product has a zero eigenvalue of multiplicity two: sqrtm fails, the ridge saves it.
    a = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    b = np.array([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    d = gm.frechet_distance(a, b)
    assert math.isfinite(d) and d == pytest.approx(0.5 + 0.5 + 0.5, abs=1e-2)


@pytest.mark.parametrize(("a", "b"), [
    (np.zeros(4), np.zeros((4, 1))),
    (np.zeros((4, 1)), np.zeros(4)),
    (np.zeros((4, 2)), np.zeros((4, 3))),
    (np.zeros((1, 2)), np.zeros((4, 2))),
    (np.zeros((4, 2)), np.zeros((1, 2))),
])
def test_frechet_distance_refuses_mismatched_feature_sets(a, b):
    with pytest.raises(ValueError, match=r"^frechet_distance needs two \(N>=2, D\) feature sets of equal D; got "):
        gm.frechet_distance(a, b)
    gm.frechet_distance(np.arange(4.0).reshape(2, 2), np.arange(4.0).reshape(2, 2) ** 2)  # two rows are enough


def test_two_halves_are_seeded_disjoint_and_equal():
    first, second = gm.two_halves(9, seed=3)
    assert len(first) == len(second) == 4 and not set(first.tolist()) & set(second.tolist())
    assert set(first.tolist()) | set(second.tolist()) <= set(range(9))
    again = gm.two_halves(9, seed=3)
    assert torch.equal(first, again[0]) and torch.equal(second, again[1])
    assert not torch.equal(gm.two_halves(9, seed=4)[0], first)
    # Its own stream: not the plain split a seed-3 generator gives.
    plain = torch.from_numpy(np.random.default_rng(3).permutation(9))
    assert not torch.equal(plain[:4], first)
    assert [len(h) for h in gm.two_halves(1, 0)] == [0, 0]


def tiny_mlp(in_features=4, out=3, hidden=(5, 6), dropout=0.0, seed=0):
    torch.manual_seed(seed)
    return MLP(in_features, out, hidden=hidden, dropout=dropout)


def test_penultimate_is_the_last_hidden_activation():
    net = tiny_mlp().eval()
    x = torch.randn(7, 2, 2)
    h = torch.relu(net.net[0](x.flatten(1)))
    h = torch.relu(net.net[2](h))
    assert torch.allclose(gm.penultimate(net, x), h)


def test_fingerprint_names_the_bytes():
    x = torch.arange(6.0).reshape(2, 3)
    assert gm._fingerprint(x) == gm._fingerprint(x.clone()) and len(gm._fingerprint(x)) == 16
    assert gm._fingerprint(x) != gm._fingerprint(x + 1) and gm._fingerprint(x, x) != gm._fingerprint(x)
    assert gm._fingerprint(x.t()) == gm._fingerprint(x.t().contiguous())


def separable(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    x = torch.randn(n, 3, generator=g) * 0.3 + (y[:, None] * 2.0 - 1.0)
    return x, y


SMALL = {"hidden": (8,), "act": "relu", "dropout": 0.0, "epochs": 10, "lr": 0.05, "weight_decay": 0.0,
         "batch_size": 8, "seed": 0}


def test_train_classifier_learns_separable_data_and_leaves_the_callers_rng_alone():
    x, y = separable()
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    net = gm.train_classifier(x, y, 2, **SMALL)
    assert torch.equal(torch.rand(3), expected)
    assert not net.training and (net(x).argmax(1) == y).all() and net.out_features == 2
    assert [m.out_features for m in net.net if isinstance(m, torch.nn.Linear)] == [8, 2]
    same = gm.train_classifier(x, y, 2, **SMALL)
    assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), same.state_dict().values()))
    other = gm.train_classifier(x, y, 2, **{**SMALL, "seed": 1})
    assert not torch.equal(other.net[0].weight, net.net[0].weight)


@pytest.mark.parametrize("change", [{"epochs": 11}, {"lr": 0.04}, {"weight_decay": 0.1}, {"batch_size": 7},
                                    {"dropout": 0.3}, {"act": "tanh"}])
def test_train_classifier_uses_each_setting(change):
    x, y = separable()
    base = gm.train_classifier(x, y, 2, **SMALL)
    changed = gm.train_classifier(x, y, 2, **{**SMALL, **change})
    assert not torch.allclose(base(x), changed(x))


def test_train_classifier_with_no_epochs_is_the_seeded_initialisation():
    x, y = separable()
    net = gm.train_classifier(x, y, 2, **{**SMALL, "epochs": 0})
    torch.manual_seed(0)
    fresh = MLP(3, 2, hidden=(8,))
    assert torch.equal(net.net[0].weight, fresh.net[0].weight)


def test_train_classifier_defaults_are_the_configs():
    # conf/task/gan.yaml's classifier settings, read from the file: the defaults give the same net.
    from importlib.resources import files

    import yaml

    settings = yaml.safe_load((files("pipeline.conf") / "task" / "gan.yaml").read_text())["classifier"]
    settings.pop("path")
    x, y = separable(70)  # more than one batch of 64
    by_default, from_config = gm.train_classifier(x, y, 2), gm.train_classifier(x, y, 2, **settings)
    assert all(torch.equal(a, b) for a, b in zip(by_default.state_dict().values(), from_config.state_dict().values()))
    net = gm.train_classifier(x, y, 2, epochs=0)
    assert [m.out_features for m in net.net if isinstance(m, torch.nn.Linear)] == [128, 64, 2]
    assert [m.p for m in net.net if isinstance(m, torch.nn.Dropout)] == [0.2, 0.2]


def test_cached_classifier_trains_once_then_loads_the_same_weights(tmp_path, caplog):
    x, y = separable()
    net, path, cached = gm.cached_classifier(x, y, 2, cache_dir=str(tmp_path), **SMALL)
    assert cached is False and path.parent == tmp_path / "gan_classifier" and path.suffix == ".pt"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left
    again, path2, cached2 = gm.cached_classifier(x, y, 2, cache_dir=str(tmp_path), **SMALL)
    assert (path2, cached2) == (path, True) and not again.training
    assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), again.state_dict().values()))
    # Other settings, other data, other labels: another file; the same settings in another order: the same file.
    assert len(path.stem) == 16 and all(c in "0123456789abcdef" for c in path.stem)
    assert gm.cached_classifier(x, y, 2, cache_dir=str(tmp_path), **{**SMALL, "epochs": 9})[1] != path
    assert gm.cached_classifier(x + 1, y, 2, cache_dir=str(tmp_path), **SMALL)[1] != path
    assert gm.cached_classifier(x, 1 - y, 2, cache_dir=str(tmp_path), **SMALL)[1] != path
    reordered = dict(reversed(list(SMALL.items())))
    assert gm.cached_classifier(x, y, 2, cache_dir=str(tmp_path), **reordered)[1:] == (path, True)
    # A corrupt file is rebuilt, with a note.
    path.write_bytes(b"not a checkpoint")
    with caplog.at_level(logging.WARNING, logger="pipeline.tasks.gan_metrics"):
        rebuilt, _, cached3 = gm.cached_classifier(x, y, 2, cache_dir=str(tmp_path), **SMALL)
    assert cached3 is False and "cached classifier unusable" in caplog.text and "rebuilding it" in caplog.text
    assert torch.equal(rebuilt.net[0].weight, net.net[0].weight)


def test_cached_classifier_builds_the_cached_net_from_the_settings(tmp_path):
    x, y = separable()
    settings = {**SMALL, "hidden": [6, 5], "act": "tanh", "dropout": 0.1}
    net, _, _ = gm.cached_classifier(x, y, 2, cache_dir=str(tmp_path), **settings)
    loaded, _, cached = gm.cached_classifier(x, y, 2, cache_dir=str(tmp_path), **settings)
    assert cached is True and torch.allclose(loaded(x), net(x))
    assert [type(m).__name__ for m in loaded.net] == ["Linear", "Tanh", "Dropout", "Linear", "Tanh", "Dropout", "Linear"]
    assert loaded.net[2].p == 0.1
    # Without settings, the config's defaults: a (128, 64) ReLU net with dropout 0.2.
    net, _, _ = gm.cached_classifier(x[:4], y[:4], 2, cache_dir=str(tmp_path), epochs=0)
    loaded, _, cached = gm.cached_classifier(x[:4], y[:4], 2, cache_dir=str(tmp_path), epochs=0)
    assert cached is True
    assert [type(m).__name__ for m in loaded.net] == ["Linear", "ReLU", "Dropout", "Linear", "ReLU", "Dropout", "Linear"]
    assert loaded.net[0].out_features == 128 and loaded.net[3].out_features == 64 and loaded.net[2].p == 0.2


def test_the_cache_folder_is_made_and_one_sample_is_enough(tmp_path):
    x, y = separable(1)
    _, path, cached = gm.cached_classifier(x, y, 2, cache_dir=str(tmp_path / "new" / "cache"), **{**SMALL, "epochs": 0})
    assert cached is False and path.parent == tmp_path / "new" / "cache" / "gan_classifier" and path.is_file()


def test_a_cached_file_of_the_wrong_shapes_is_rebuilt(tmp_path, caplog):
    x, y = separable()
    _, path, _ = gm.cached_classifier(x, y, 2, cache_dir=str(tmp_path), **SMALL)
    torch.save(MLP(3, 2, hidden=(4,)).state_dict(), path)
    with caplog.at_level(logging.WARNING, logger="pipeline.tasks.gan_metrics"):
        _, _, cached = gm.cached_classifier(x, y, 2, cache_dir=str(tmp_path), **SMALL)
    assert cached is False and "rebuilding it" in caplog.text


@pytest.mark.parametrize(("content", "reason"), [
    (b"", "the file is empty"),
    (b"hello, a text file\n", "it is a text file, not a torch checkpoint"),
    (b"\xff\xfe\x00binary", "it is not a torch checkpoint (UnpicklingError)"),
    (b"PK\x03\x04 truncated", "it is a truncated or corrupt torch archive"),
    (b"a" * 512 + b"\xff", "it is a text file, not a torch checkpoint"),  # the first 512 bytes decide
])
def test_bad_files_are_named_with_what_is_wrong(tmp_path, content, reason):
    path = tmp_path / "model.pt"
    path.write_bytes(content)
    with pytest.raises(ValueError) as err:
        gm.load_state_dict_file(path)
    assert str(err.value) == f"{path} cannot be loaded: {reason}"


def test_a_pickled_model_or_a_non_tensor_dict_is_refused(tmp_path):
    path = tmp_path / "model.pt"
    torch.save(MLP(3, 2), path)
    with pytest.raises(ValueError, match=r"cannot be loaded: it holds pickled Python objects that a weights-only load "
                                         r"refuses \(save `model\.state_dict\(\)`, not the model\)$"):
        gm.load_state_dict_file(path)
    torch.save([torch.zeros(1)], path)
    with pytest.raises(ValueError, match=r"cannot be loaded: it holds a list, not a state_dict of tensors$"):
        gm.load_state_dict_file(path)
    torch.save({"a": torch.zeros(1), "b": 3}, path)
    with pytest.raises(ValueError, match="it holds a dict, not a state_dict of tensors"):
        gm.load_state_dict_file(path)
    with pytest.raises(ValueError, match=r"missing\.pt: no such file; pass the model\.pt of a supervised run"):
        gm.load_state_dict_file(tmp_path / "missing.pt")
    torch.save({"w": torch.ones(2)}, path)
    assert torch.equal(gm.load_state_dict_file(str(path))["w"], torch.ones(2))


@pytest.mark.parametrize(("hidden", "dropout"), [((5,), 0.0), ((5, 6), 0.0), ((5, 6), 0.3), ((7, 5, 6), 0.2)])
def test_a_supervised_mlp_is_rebuilt_from_its_weights(tmp_path, hidden, dropout):
    net = tiny_mlp(hidden=hidden, dropout=dropout).eval()
    torch.save(net.state_dict(), tmp_path / "model.pt")
    loaded = gm.load_supervised_classifier(tmp_path / "model.pt")
    assert not loaded.training and loaded.in_features == 4 and loaded.out_features == 3
    assert [m.out_features for m in loaded.net if isinstance(m, torch.nn.Linear)] == [*hidden, 3]
    assert any(isinstance(m, torch.nn.Dropout) for m in loaded.net) == (dropout > 0)
    x = torch.randn(5, 4)
    assert torch.allclose(loaded(x), net(x))
    tanh = gm.load_supervised_classifier(tmp_path / "model.pt", act="tanh")
    assert isinstance(tanh.net[1], torch.nn.Tanh)


def test_a_state_dict_that_is_no_mlp_is_refused(tmp_path):
    path = tmp_path / "model.pt"
    torch.save({"net.0.weight": torch.zeros(3, 4), "net.0.bias": torch.zeros(3)}, path)
    with pytest.raises(ValueError, match=r"is not an MLP state_dict with hidden layers \(keys net.<i>.weight\)$"):
        gm.load_supervised_classifier(path)
    torch.save({"net.0.weight": torch.zeros(3, 4), "net.2.weight": torch.zeros(3)}, path)
    with pytest.raises(ValueError, match="is not an MLP state_dict"):
        gm.load_supervised_classifier(path)
    torch.save({"net.0.weight": torch.zeros(3, 4), "net.2.weight": torch.zeros(2, 3), "net.6.weight": torch.zeros(2, 2)}, path)
    with pytest.raises(ValueError, match=r": unexpected layer layout \[0, 2, 6\]$"):
        gm.load_supervised_classifier(path)
    torch.save({"net.0.weight": torch.zeros(3, 4), "net.4.weight": torch.zeros(2, 3)}, path)
    with pytest.raises(ValueError, match=r"unexpected layer layout \[0, 4\]"):
        gm.load_supervised_classifier(path)


def classifier_data(n=24):
    # 4-pixel "images" in [-1, 1]; the label is the brightest of the first three pixels.
    g = torch.Generator().manual_seed(5)
    images = torch.rand(n, 1, 2, 2, generator=g) * 2 - 1
    return images, images.flatten(1)[:, :3].argmax(1)


THRESHOLD = 1.5


def test_classifier_quality_reference_and_score_through_the_classifier():
    images, labels = classifier_data()
    net = tiny_mlp(4, 3, hidden=(6, 5), seed=3)
    with torch.no_grad():
        net.net[4].weight.mul_(10)  # confident enough to predict two of the classes
    net.train()
    quality = gm.ClassifierQuality(net, n_samples=5, coverage_threshold=THRESHOLD, seed=2)
    assert not quality.classifier.training and quality.n_classes == 3
    with pytest.raises(RuntimeError, match=r"^call reference\(real_test\) before score\(samples\)$"):
        quality.score(images)
    # What the classifier says about [0, 1] pixels, computed here by hand.
    with torch.no_grad():
        x = ((images + 1) / 2).flatten(1)
        feats = torch.relu(net.net[2](torch.relu(net.net[0](x))))
        probs = torch.softmax(net.net[4](feats), 1).double().numpy()
    first, second = gm.two_halves(24, 2)
    ref = quality.reference(images, labels)
    coverage, covered = gm.class_coverage(probs, THRESHOLD)
    assert (coverage, covered) != gm.class_coverage(probs)  # the threshold matters on these images
    assert ref == pytest.approx({
        "inception_score_real": gm.inception_score(probs), "class_coverage_real": coverage,
        "classes_covered_real": float(covered), "frechet_distance_real": gm.frechet_distance(feats[first], feats[second]),
        "classifier_acc_real": float((probs.argmax(1) == labels.numpy()).mean()),
    })
    assert "classifier_acc_real" not in quality.reference(images)
    assert quality.n_needed == 12  # the reference half outnumbers n_samples
    scores = quality.score(images)
    coverage, covered = gm.class_coverage(probs[:5], THRESHOLD)
    assert (coverage, covered) != gm.class_coverage(probs[:5])
    assert scores == pytest.approx({
        "inception_score": gm.inception_score(probs[:5]), "class_coverage": coverage, "classes_covered": float(covered),
        "frechet_distance": gm.frechet_distance(feats[:12], feats[second]),
    })
    assert gm.ClassifierQuality(net, n_samples=30).n_samples == 30


def test_classifier_quality_defaults():
    quality = gm.ClassifierQuality(tiny_mlp())
    assert (quality.n_samples, quality.coverage_threshold, quality.seed) == (1000, 0.25, 0)
    assert quality.reference_features is None
    images, _ = classifier_data(40)
    quality.reference(images)
    assert quality.n_needed == 1000


def test_fixed_frame_features_are_seeded_kaiming_and_frozen():
    features = gm.FixedFrameFeatures(in_channels=2, channels=(3, 4), pooled_size=2, seed=7)
    convs = [m for m in features.conv if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.stride, c.padding) for c in convs] == [
        (2, 3, (4, 4), (2, 2), (1, 1)), (3, 4, (4, 4), (2, 2), (1, 1))]
    assert all((c.bias == 0).all() and not c.weight.requires_grad for c in convs)
    assert isinstance(features.conv[1], torch.nn.ReLU) and isinstance(features.conv[3], torch.nn.ReLU)
    big = gm.FixedFrameFeatures(in_channels=4, channels=(256,), seed=0)
    assert big.conv[0].weight.std().item() == pytest.approx((2 / (4 * 16)) ** 0.5, rel=0.015)
    assert big.conv[0].weight.mean().item() == pytest.approx(0.0, abs=0.01)
    again = gm.FixedFrameFeatures(in_channels=2, channels=(3, 4), pooled_size=2, seed=7)
    assert torch.equal(again.conv[0].weight, convs[0].weight) and torch.equal(again.conv[2].weight, convs[1].weight)
    assert not torch.equal(gm.FixedFrameFeatures(2, (3, 4), 2, seed=8).conv[0].weight, convs[0].weight)
    images = torch.rand(3, 2, 8, 8)
    out = features(images)
    assert out.shape == (3, 2 * 2 * 2 + 4)
    # The pooled pixels: means of 4x4 blocks.
    assert torch.allclose(out[:, :8], images.reshape(3, 2, 2, 4, 2, 4).mean(dim=(3, 5)).flatten(1))
    h = torch.relu(features.conv[2](torch.relu(features.conv[0](images))))
    assert torch.allclose(out[:, 8:], h.mean(dim=(2, 3)))
    assert gm.FixedFrameFeatures().pooled_size == 8 and gm.FixedFrameFeatures().conv[0].in_channels == 1
    assert torch.equal(gm.FixedFrameFeatures().conv[0].weight, gm.FixedFrameFeatures(1, (16, 32, 64), 8, seed=0).conv[0].weight)
    assert [m.out_channels for m in gm.FixedFrameFeatures().conv if isinstance(m, torch.nn.Conv2d)] == [16, 32, 64]


def test_pixel_statistics_by_hand():
    stats = gm.pixel_statistics(torch.tensor([[-1.0, 1.0], [1.0, 3.0]]))
    assert stats == {"pixel_mean": 1.0, "pixel_std": pytest.approx(math.sqrt(8 / 3))}


def test_frame_quality_reference_and_score():
    g = torch.Generator().manual_seed(1)
    frames = torch.rand(10, 1, 8, 8, generator=g) * 2 - 1
    quality = gm.FrameQuality((1, 8, 8), feature_seed=3, channels=(4,), pooled_size=2, seed=5)
    with pytest.raises(RuntimeError, match=r"^call reference\(real_test\) before score\(samples\)$"):
        quality.score(frames)
    first, second = gm.two_halves(10, 5)
    features = gm.FixedFrameFeatures(1, (4,), 2, seed=3)
    with torch.no_grad():
        feats = features(frames)
    ref = quality.reference(frames)
    a, b = frames[first].double(), frames[second].double()
    assert ref == pytest.approx({
        "frechet_distance_real": gm.frechet_distance(feats[first], feats[second]),
        "pixel_mean_real": float(frames.double().mean()), "pixel_std_real": float(frames.double().std()),
        "pixel_mean_map_error_real": float((a.mean(0) - b.mean(0)).abs().mean()),
        "pixel_std_map_error_real": float((a.std(0) - b.std(0)).abs().mean()),
    })
    assert quality.n_needed == 5
    # The reference half itself scores zero distance and zero map errors; extra samples are dropped.
    scores = quality.score(torch.cat([frames[second], torch.ones(3, 1, 8, 8)]))
    assert scores["frechet_distance"] == pytest.approx(0.0, abs=1e-6)
    assert scores["pixel_mean_map_error"] == 0.0 and scores["pixel_std_map_error"] == 0.0
    assert scores["pixel_mean"] == pytest.approx(float(b.mean())) and scores["pixel_std"] == pytest.approx(float(b.std()))
    assert set(scores) == {"frechet_distance", "pixel_mean", "pixel_std", "pixel_mean_map_error", "pixel_std_map_error"}


def test_frame_quality_features_in_chunks_match_one_pass():
    frames = torch.rand(300, 1, 4, 4) * 2 - 1
    quality = gm.FrameQuality((1, 4, 4), channels=(2,), pooled_size=1)
    with torch.no_grad():
        whole = quality.features(frames)
    assert torch.allclose(quality._features(frames), whole, atol=1e-6)
    assert quality.features.pooled_size == 1 and not quality.features.training and quality.seed == 0


def test_frame_quality_defaults():
    quality = gm.FrameQuality((3, 16, 16))
    convs = [m for m in quality.features.conv if isinstance(m, torch.nn.Conv2d)]
    assert convs[0].in_channels == 3 and [c.out_channels for c in convs] == [16, 32, 64]
    assert torch.equal(convs[0].weight, gm.FixedFrameFeatures(3, seed=0).conv[0].weight)
    assert quality.features.pooled_size == 8 and quality.reference_mean is None and quality.reference_std is None


QUALITY = {"frame_features": {"channels": (2,), "pooled_size": 1}, "n_samples": 7, "coverage_threshold": 0.5,
           "cache_dir": None}


def test_build_quality_frames_and_bad_kinds():
    quality = gm.build_quality("frames", (1, 4, 4), None, None, classifier={}, seed=3,
                               **{**QUALITY, "frame_features": {"channels": (2,), "pooled_size": 1, "feature_seed": 4}})
    assert isinstance(quality, gm.FrameQuality) and quality.seed == 3 and quality.features.pooled_size == 1
    assert torch.equal(quality.features.conv[0].weight, gm.FixedFrameFeatures(1, (2,), 1, seed=4).conv[0].weight)
    with pytest.raises(ValueError, match=r"^task\.quality='auto'; choose auto, classifier or frames$"):
        gm.build_quality("auto", (1, 4, 4), None, None, classifier={}, **QUALITY)


def test_build_quality_trains_a_classifier_on_pixels_in_zero_one(tmp_path, caplog):
    images, labels = classifier_data()
    settings = {**SMALL, "hidden": (5,)}
    with caplog.at_level(logging.INFO, logger="pipeline.tasks.gan_metrics"):
        quality = gm.build_quality("classifier", (1, 2, 2), lambda: (images, labels), 3, classifier=settings,
                                   **{**QUALITY, "cache_dir": str(tmp_path)}, seed=4)
    (cached_file,) = (tmp_path / "gan_classifier").iterdir()
    assert isinstance(quality, gm.ClassifierQuality)
    assert f"gan quality: classifier trained and cached at {cached_file}" in caplog.text
    assert (quality.n_samples, quality.coverage_threshold, quality.seed) == (7, 0.5, 4)
    expected = gm.train_classifier((images + 1) / 2, labels, 3, **settings)
    assert torch.equal(quality.classifier.net[0].weight, expected.net[0].weight)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pipeline.tasks.gan_metrics"):
        gm.build_quality("classifier", (1, 2, 2), lambda: (images, labels), 3, classifier=settings,
                         **{**QUALITY, "cache_dir": str(tmp_path)})
    assert f"gan quality: classifier loaded from {cached_file}" in caplog.text
    with pytest.raises(ValueError, match=r"^task\.quality=classifier needs labelled data \(data=digit_images\); for "
                                         r"unlabelled frames use task\.quality=frames$"):
        gm.build_quality("classifier", (1, 2, 2), lambda: (images, None), 3, classifier=settings, **QUALITY)
    with pytest.raises(ValueError, match="needs labelled data"):
        gm.build_quality("classifier", (1, 2, 2), lambda: (images, labels), None, classifier=settings, **QUALITY)


def test_build_quality_loads_a_supervised_runs_classifier(tmp_path, caplog):
    net = tiny_mlp(4, 3, hidden=(6, 5))
    torch.save(net.state_dict(), tmp_path / "model.pt")
    settings = {"path": str(tmp_path / "model.pt"), "act": "tanh"}
    with caplog.at_level(logging.INFO, logger="pipeline.tasks.gan_metrics"):
        quality = gm.build_quality("classifier", (1, 2, 2), None, 3, classifier=settings, **QUALITY)
    assert f"gan quality: classifier loaded from {tmp_path / 'model.pt'}" in caplog.text
    assert isinstance(quality.classifier.net[1], torch.nn.Tanh) and settings["path"]  # the caller's dict untouched
    assert isinstance(gm.build_quality("classifier", (1, 2, 2), None, 3, classifier={"path": settings["path"]},
                                       **QUALITY).classifier.net[1], torch.nn.ReLU)
    with pytest.raises(ValueError, match=r"^the quality classifier has 3 outputs but the data has 10 classes$"):
        gm.build_quality("classifier", (1, 2, 2), None, 10, classifier=settings, **QUALITY)
    assert gm.build_quality("classifier", (1, 2, 2), None, None, classifier=settings, **QUALITY).n_classes == 3
    assert gm.build_quality("classifier", (1, 2, 2), None, 3, classifier=settings, **QUALITY).seed == 0
    assert gm.build_quality("frames", (1, 4, 4), None, None, classifier={}, **QUALITY).seed == 0

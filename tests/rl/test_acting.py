import functools

import numpy as np
import torch

from pipeline.nets.ensemble import EnsembleMLP, make_ensemble
from pipeline.nets.heads import DuelingQNet
from pipeline.nets.mlp import MLP
from pipeline.rl.acting import NumpyGreedy


def test_numpy_greedy_matches_torch_and_follows_updates():
    torch.manual_seed(0)
    net = MLP(4, 3, hidden=(32, 16), act="tanh")
    fast = NumpyGreedy.for_net(net)
    obs = np.random.default_rng(0).normal(size=(200, 4)).astype(np.float32)
    with torch.no_grad():
        expected = net(torch.from_numpy(obs)).argmax(1).numpy()
    assert [fast(o) for o in obs] == expected.tolist()
    with torch.no_grad():
        net.net[-1].bias.copy_(torch.tensor([0.0, 100.0, 0.0]))
    assert fast(obs[0]) == int(expected[0])  # a stale mirror until refreshed
    fast.refresh()
    assert all(fast(o) == 1 for o in obs[:20])


def test_other_networks_keep_the_torch_path():
    assert NumpyGreedy.for_net(DuelingQNet(4, 2, hidden=(8,))) is None
    assert NumpyGreedy.for_net(MLP(4, 2, hidden=(8,), dropout=0.1)) is None


def ensemble_of(k: int, **kwargs) -> EnsembleMLP:
    return EnsembleMLP.from_factory(functools.partial(MLP, hidden=(32, 16), **kwargs), range(k), 4, 3)


def torch_greedy(ensemble: EnsembleMLP, obs: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return ensemble(torch.from_numpy(obs)).argmax(2).numpy()


def test_ensemble_mirror_matches_every_member_and_follows_updates_and_shrinking():
    ensemble = ensemble_of(3, act="tanh")
    fast = NumpyGreedy.for_net(ensemble)
    obs = np.random.default_rng(0).normal(size=(3, 50, 4)).astype(np.float32)
    actions = fast(obs)
    assert actions.dtype == np.int64 and actions.shape == (3, 50)
    np.testing.assert_array_equal(actions, torch_greedy(ensemble, obs))
    assert len(np.unique(actions)) > 1  # a mirror stuck on one action would not pass for a real one
    with torch.no_grad():
        ensemble.net[-1].bias[1, 0].copy_(torch.tensor([0.0, 0.0, 100.0]))
    fast.refresh()
    actions = fast(obs)
    assert (actions[1] == 2).all()
    np.testing.assert_array_equal(actions, torch_greedy(ensemble, obs))
    ensemble.keep_members_(torch.tensor([1, 0]))
    fast.refresh()
    np.testing.assert_array_equal(fast(obs[[1, 0]]), torch_greedy(ensemble, obs[[1, 0]]))
    assert (fast(obs[[1, 0]])[0] == 2).all()


def test_ensemble_mirror_reads_one_observation_per_member():
    ensemble = ensemble_of(4)
    obs = np.random.default_rng(1).normal(size=(4, 1, 4)).astype(np.float32)
    np.testing.assert_array_equal(NumpyGreedy.for_net(ensemble)(obs), torch_greedy(ensemble, obs))


def test_ensembles_it_cannot_mirror_keep_the_torch_path():
    assert NumpyGreedy.for_net(ensemble_of(2, dropout=0.1)) is None
    assert (
        NumpyGreedy.for_net(make_ensemble(functools.partial(DuelingQNet, hidden=(8,)), [0, 1], (4,), 2))
        is None
    )


def test_a_plain_sequential_mirrors_without_bias_with_inert_dropout_and_flat_or_shaped_observations():
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(4, 32, bias=False), torch.nn.Dropout(0.0), torch.nn.ReLU(), torch.nn.Linear(32, 3)
    )
    fast = NumpyGreedy.for_net(net)
    assert fast is not None
    obs = np.random.default_rng(2).normal(scale=3.0, size=(200, 4)).astype(np.float32)
    with torch.no_grad():
        expected = net(torch.from_numpy(obs)).argmax(1).numpy()
    assert len(set(expected.tolist())) == 3  # every action is greedy somewhere: a constant mirror fails
    assert [fast(o) for o in obs] == expected.tolist()
    assert [fast(o.reshape(2, 2)) for o in obs[:20]] == expected[
        :20
    ].tolist()  # shaped observations are flattened


def test_an_ensemble_of_bias_free_layers_mirrors():
    torch.manual_seed(0)
    members = [
        torch.nn.Sequential(
            torch.nn.Linear(4, 16, bias=False), torch.nn.ReLU(), torch.nn.Linear(16, 3, bias=False)
        )
        for _ in range(2)
    ]
    ensemble = EnsembleMLP(members)
    obs = np.random.default_rng(3).normal(size=(2, 30, 4)).astype(np.float32)
    np.testing.assert_array_equal(NumpyGreedy.for_net(ensemble)(obs), torch_greedy(ensemble, obs))

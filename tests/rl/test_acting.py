import functools

import numpy as np
import torch

from pipeline.nets.ensemble import EnsembleMLP, make_ensemble
from pipeline.nets.heads import DuelingQNet
from pipeline.nets.mlp import MLP
from pipeline.rl.acting import NumpyGreedy


def assert_greedy(actions, q_values: torch.Tensor) -> None:
    """`actions` are greedy for `q_values` [..., A] up to float32 rounding.

    The mirror computes in numpy (its own BLAS) and torch in its own kernels: where two actions' values lie within
    rounding of each other either one is greedy, on some machine. Rounding of a float32 matmul this small is about
    (inner size) x 6e-8 x (size of the terms); 1e-4 of the largest value is far above it and far below the gap
    between two actions of a random net (about 0.1), so a wrong action still fails. Most rows must be clear-cut.
    """
    q = q_values.double()
    actions = torch.as_tensor(np.asarray(actions)).view(q.shape[:-1])
    tol = 1e-4 * max(1.0, float(q.abs().max()))
    chosen = q.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    assert bool((chosen >= q.max(-1).values - tol).all()), (chosen - q.max(-1).values).min()
    top2 = q.topk(2, -1).values
    assert float(((top2[..., 0] - top2[..., 1]) > tol).double().mean()) > 0.95


def test_numpy_greedy_matches_torch_and_follows_updates():
    torch.manual_seed(0)
    net = MLP(4, 3, hidden=(32, 16), act="tanh")
    fast = NumpyGreedy.for_net(net)
    obs = np.random.default_rng(0).normal(size=(200, 4)).astype(np.float32)
    with torch.no_grad():
        expected = net(torch.from_numpy(obs)).argmax(1).numpy()
    assert_greedy([fast(o) for o in obs], torch_q(net, obs))
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


def torch_q(net, obs: np.ndarray) -> torch.Tensor:
    with torch.inference_mode():
        return net(torch.from_numpy(obs))


def test_ensemble_mirror_matches_every_member_and_follows_updates_and_shrinking():
    ensemble = ensemble_of(3, act="tanh")
    fast = NumpyGreedy.for_net(ensemble)
    obs = np.random.default_rng(0).normal(size=(3, 50, 4)).astype(np.float32)
    actions = fast(obs)
    assert actions.dtype == np.int64 and actions.shape == (3, 50)
    assert_greedy(actions, torch_q(ensemble, obs))
    assert len(np.unique(actions)) > 1  # a mirror stuck on one action would not pass for a real one
    with torch.no_grad():
        ensemble.net[-1].bias[1, 0].copy_(torch.tensor([0.0, 0.0, 100.0]))
    fast.refresh()
    actions = fast(obs)
    assert (actions[1] == 2).all()
    assert_greedy(actions, torch_q(ensemble, obs))
    ensemble.keep_members_(torch.tensor([1, 0]))
    fast.refresh()
    assert_greedy(fast(obs[[1, 0]]), torch_q(ensemble, obs[[1, 0]]))
    assert (fast(obs[[1, 0]])[0] == 2).all()


def test_ensemble_mirror_reads_one_observation_per_member():
    ensemble = ensemble_of(4)
    obs = np.random.default_rng(1).normal(size=(4, 1, 4)).astype(np.float32)
    assert_greedy(NumpyGreedy.for_net(ensemble)(obs), torch_q(ensemble, obs))


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
    assert_greedy([fast(o) for o in obs], torch_q(net, obs))
    assert_greedy([fast(o.reshape(2, 2)) for o in obs[:20]], torch_q(net, obs[:20]))  # shaped observations are flattened


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
    assert_greedy(NumpyGreedy.for_net(ensemble)(obs), torch_q(ensemble, obs))

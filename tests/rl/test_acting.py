import numpy as np
import torch

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

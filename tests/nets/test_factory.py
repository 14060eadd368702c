"""make_net: every model factory gets its sizes as in_features= and out_features=."""

import functools

import torch

from pipeline.nets.cnn import AtariCNN
from pipeline.nets.factory import make_net
from pipeline.nets.heads import DuelingQNet
from pipeline.nets.mlp import MLP


def test_an_mlp_gets_in_and_out_features_as_a_partial_or_a_class():
    for factory in (functools.partial(MLP, hidden=(8,)), MLP):
        net = make_net(factory, 5, 3)
        assert isinstance(net, MLP) and (net.in_features, net.out_features) == (5, 3)


def test_a_q_head_gets_one_output_per_action():
    net = make_net(functools.partial(DuelingQNet, hidden=(8,)), 4, 6)
    assert net(torch.zeros(2, 4)).shape == (2, 6)


def test_a_conv_net_takes_the_same_size_names():
    net = make_net(functools.partial(AtariCNN, in_channels=1), 84 * 84, 5)
    assert isinstance(net, AtariCNN) and net.head[-1].out_features == 5
    assert net.features[0].in_channels == 1


def test_sizes_arrive_as_python_ints():
    seen = {}

    def factory(in_features, out_features):
        seen.update(in_features=in_features, out_features=out_features)
        return MLP(in_features, out_features)

    make_net(factory, torch.tensor(4), torch.tensor(2))
    assert seen == {"in_features": 4, "out_features": 2} and all(type(v) is int for v in seen.values())

"""The hand-written TD gradient is autograd's gradient, for every member, loss and depth it accepts."""

import functools

import pytest
import torch
from torch import nn

from pipeline.nets.ensemble import EnsembleMLP, make_ensemble
from pipeline.nets.heads import DuelingQNet
from pipeline.nets.mlp import MLP
from pipeline.nets.td_grad import loss_derivative, relu_mlp_layers, td_grads_


def ensemble(k: int, hidden, act: str = "relu", dropout: float = 0.0) -> EnsembleMLP:
    return EnsembleMLP.from_factory(
        functools.partial(MLP, hidden=hidden, act=act, dropout=dropout), list(range(k)), 6, 3
    )


def autograd_reference(net: EnsembleMLP, loss: nn.Module, obs, actions, target):
    net.zero_grad(set_to_none=True)
    q = net(obs).gather(2, actions.unsqueeze(2)).squeeze(2)
    loss_fn = type(loss)(reduction="none", **({"beta": loss.beta} if hasattr(loss, "beta") else {}))
    loss_fn(q, target).mean(1).sum().backward()
    return q.detach(), [p.grad.clone() for p in net.parameters()]


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("hidden", [(16,), (16, 8), (12, 10, 7)])
@pytest.mark.parametrize("loss", [nn.SmoothL1Loss(beta=1.0), nn.SmoothL1Loss(beta=0.3), nn.MSELoss()], ids=["huber1", "huber0.3", "mse"])
def test_hand_gradient_equals_autograd(k, hidden, loss):
    net = ensemble(k, hidden)
    g = torch.Generator().manual_seed(1)
    # Targets spread over several units, so Huber's clipped and quadratic regions are both visited.
    obs, actions = torch.randn(k, 40, 6, generator=g), torch.randint(0, 3, (k, 40), generator=g)
    target = 2.0 * torch.randn(k, 40, generator=g)
    q_ref, grads_ref = autograd_reference(net, loss, obs, actions, target)
    net.zero_grad(set_to_none=True)
    q = td_grads_(relu_mlp_layers(net), obs, actions, target, loss_derivative(loss))
    torch.testing.assert_close(q, q_ref, rtol=0, atol=0)
    for (name, p), ref in zip(net.named_parameters(), grads_ref):
        torch.testing.assert_close(p.grad, ref, rtol=1e-5, atol=1e-7, msg=lambda m, name=name: f"{name}: {m}")
        assert p.grad.abs().sum() > 0, name


def test_members_get_their_own_gradient():
    """Member i's gradient in a K = 3 ensemble is the gradient it gets in a one-member ensemble."""
    net3 = ensemble(3, (16, 8))
    g = torch.Generator().manual_seed(2)
    obs, actions, target = torch.randn(3, 20, 6, generator=g), torch.randint(0, 3, (3, 20), generator=g), torch.randn(3, 20, generator=g)
    td_grads_(relu_mlp_layers(net3), obs, actions, target, 1.0)
    for i in range(3):
        net1 = EnsembleMLP.from_factory(functools.partial(MLP, hidden=(16, 8)), [i], 6, 3)
        td_grads_(relu_mlp_layers(net1), obs[i : i + 1], actions[i : i + 1], target[i : i + 1], 1.0)
        for p3, p1 in zip(net3.parameters(), net1.parameters()):
            torch.testing.assert_close(p3.grad[i : i + 1], p1.grad, rtol=1e-6, atol=1e-8)


def test_only_relu_mlps_and_td_losses_are_written_out():
    assert relu_mlp_layers(ensemble(2, (8, 8))) is not None
    assert relu_mlp_layers(ensemble(2, (8, 8), act="tanh")) is None
    assert relu_mlp_layers(ensemble(2, (8, 8), dropout=0.1)) is None
    dueling = make_ensemble(functools.partial(DuelingQNet, hidden=(8,)), [0, 1], (6,), 3)
    assert relu_mlp_layers(dueling) is None
    assert loss_derivative(nn.SmoothL1Loss(beta=0.5)) == 0.5
    assert loss_derivative(nn.MSELoss()) == 0.0
    assert loss_derivative(nn.SmoothL1Loss(beta=0.0)) is None  # L1: not written out
    assert loss_derivative(nn.HuberLoss()) is None
    assert loss_derivative(nn.L1Loss()) is None


@pytest.mark.parametrize("chunk_elements", [1, 300, 1 << 18])
def test_chunked_forward_equals_the_network(monkeypatch, chunk_elements):
    """The no-grad forward used for a round's TD targets gives the network's outputs, however it is chunked."""
    import pipeline.nets.td_grad as td_grad

    monkeypatch.setattr(td_grad, "CHUNK_ELEMENTS", chunk_elements)
    net = ensemble(3, (16, 8))
    x = torch.randn(3, 50, 6, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = net(x)
    out = td_grad.relu_mlp_forward(relu_mlp_layers(net), x)
    assert out.shape == expected.shape == (3, 50, 3)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-7)


class _Net(nn.Module):
    def __init__(self, *layers):
        super().__init__()
        self.net = nn.Sequential(*layers)


def test_a_net_ending_in_relu_or_without_biases_keeps_autograd():
    """The written-out gradient assumes Linear -> ReLU -> ... -> Linear with biases; anything else is refused."""
    torch.manual_seed(0)
    ends_in_relu = EnsembleMLP([_Net(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3), nn.ReLU()) for _ in range(2)])
    no_bias = EnsembleMLP([_Net(nn.Linear(6, 8, bias=False), nn.ReLU(), nn.Linear(8, 3, bias=False)) for _ in range(2)])
    plain = EnsembleMLP([_Net(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)) for _ in range(2)])
    assert relu_mlp_layers(ends_in_relu) is None
    assert relu_mlp_layers(no_bias) is None
    assert [layer.out_features for layer in relu_mlp_layers(plain)] == [8, 3]

"""The plain MLP: its layers, its activations, the inputs it accepts."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from pipeline.nets.mlp import MLP, Tanh, activation


def test_layers_run_in_to_hidden_to_out_with_the_activation_between():
    net = MLP(4, 2, hidden=(8, 16), act="tanh")
    linears = [m for m in net.net if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(4, 8), (8, 16), (16, 2)]
    assert [type(m) for m in net.net] == [nn.Linear, Tanh, nn.Linear, Tanh, nn.Linear]
    assert (net.in_features, net.out_features) == (4, 2)
    x = torch.randn(3, 4)
    h = torch.tanh(linears[1](torch.tanh(linears[0](x))))
    assert torch.allclose(net(x), linears[2](h), atol=1e-6)


def test_defaults_are_two_hidden_layers_of_64_with_relu_and_no_dropout():
    net = MLP(4, 2)
    assert [type(m) for m in net.net] == [nn.Linear, nn.ReLU, nn.Linear, nn.ReLU, nn.Linear]
    assert [m.out_features for m in net.net if isinstance(m, nn.Linear)] == [64, 64, 2]


def test_dropout_follows_each_hidden_activation_only_when_asked_for():
    net = MLP(4, 2, hidden=(8, 8), dropout=0.25)
    assert [type(m) for m in net.net] == [
        nn.Linear,
        nn.ReLU,
        nn.Dropout,
        nn.Linear,
        nn.ReLU,
        nn.Dropout,
        nn.Linear,
    ]
    assert all(m.p == 0.25 for m in net.net if isinstance(m, nn.Dropout))


@pytest.mark.parametrize(
    "name, fn",
    [("relu", F.relu), ("tanh", torch.tanh), ("leaky_relu", F.leaky_relu), ("gelu", F.gelu), ("elu", F.elu)],
)
def test_each_activation_name_gives_its_function(name, fn):
    x = torch.linspace(-2, 2, 9)
    assert torch.allclose(activation(name)()(x), fn(x))


def test_an_unknown_activation_names_the_choices():
    with pytest.raises(
        ValueError,
        match=r"unknown activation 'swish'; choose one of \['elu', 'gelu', 'leaky_relu', 'relu', 'tanh'\]",
    ):
        activation("swish")


def test_image_shaped_and_unbatched_inputs_give_the_outputs_of_the_flat_batch():
    torch.manual_seed(0)
    net = MLP(4, 3, hidden=(8,))
    x = torch.randn(5, 2, 2)
    batch = net(x.view(5, 4))
    assert torch.equal(net(x), batch)  # [N, 2, 2] is flattened to [N, 4]
    assert torch.allclose(net(x[1].view(4)), batch[1], atol=1e-6)  # one input without a batch axis


@pytest.mark.parametrize("shape", [(5, 7), (16, 8, 64), (16, 128, 64), (3, 200, 100)])
@pytest.mark.parametrize("grad", [False, True])
def test_the_tanh_activation_is_tanh_in_value_and_gradient_at_every_size(shape, grad):
    # Large float32 CPU tensors go through 2 sigmoid(2x) - 1: float32 rounding near 0 bounds the difference
    # by a few units of 2^-24 (sigmoid within 4 ulps) (the output's absolute scale is 1); small tensors and float64 are torch.tanh's.
    gen = torch.Generator().manual_seed(0)
    for dtype, tol in ((torch.float32, 8 * 2.0**-24), (torch.float64, 0.0)):
        x = (torch.randn(shape, generator=gen, dtype=dtype) * 3).requires_grad_(grad)
        upstream = torch.randn(shape, generator=gen, dtype=dtype)
        with torch.set_grad_enabled(grad):
            y = Tanh()(x)
        ref_x = x.detach().clone().requires_grad_(grad)
        ref = torch.tanh(ref_x)
        assert y.dtype == dtype and y.shape == x.shape
        assert (y.detach() - ref.detach()).abs().max().item() <= tol
        if grad:
            y.backward(upstream)
            ref.backward(upstream)
            # d tanh = 1 - y^2 from the saved output: the output's error, doubled, times |upstream|.
            bound = 2 * tol * upstream.abs().max().item() + 1e-12
            assert (x.grad - ref_x.grad).abs().max().item() <= bound
        else:
            assert not y.requires_grad


def test_the_tanh_form_is_chosen_by_size_dtype_device_and_autograd():
    """Which form runs is a speed choice (the values agree within float32 rounding, above): pinned bitwise here, the
    same ops computed by hand, so a threshold or a condition that drifts is seen."""
    from pipeline.nets.mlp import FAST_TANH_MIN_NUMEL, FAST_TANH_NOGRAD_MIN_NUMEL

    assert FAST_TANH_NOGRAD_MIN_NUMEL < FAST_TANH_MIN_NUMEL
    gen = torch.Generator().manual_seed(1)

    def sigmoid_form(x):
        return torch.sigmoid(x * 2).mul_(2).sub_(1)

    def case(n, dtype=torch.float32, grad=False):
        return (torch.randn(n, generator=gen, dtype=dtype) * 3).requires_grad_(grad)

    def out(x):
        return Tanh()(x).detach()

    # Without autograd (no_grad, or an input that needs no gradient): the form from FAST_TANH_NOGRAD_MIN_NUMEL values.
    for n, form in ((FAST_TANH_NOGRAD_MIN_NUMEL - 1, torch.tanh), (FAST_TANH_NOGRAD_MIN_NUMEL, sigmoid_form)):
        x = case(n)
        assert torch.equal(out(x), form(x))
        with torch.no_grad():
            y = case(n, grad=True)
            assert torch.equal(out(y), form(y.detach()))
    # With autograd: from FAST_TANH_MIN_NUMEL values (below it the Function's overhead loses).
    for n, form in ((FAST_TANH_MIN_NUMEL - 1, torch.tanh), (FAST_TANH_MIN_NUMEL, sigmoid_form)):
        x = case(n, grad=True)
        y = Tanh()(x)
        assert torch.equal(y.detach(), form(x.detach()))
        assert y.grad_fn is not None
    # float64 always torch.tanh, at any size.
    x = case(FAST_TANH_MIN_NUMEL, dtype=torch.float64)
    assert torch.equal(out(x), torch.tanh(x))

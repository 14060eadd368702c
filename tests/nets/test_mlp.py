"""The plain MLP: its layers, its activations, the inputs it accepts."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from pipeline.nets import mlp
from pipeline.nets.mlp import MLP, Tanh, activation, eager_tanh_form, mkl_tanh_is_vectorised


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


FORMS = ("tanh", "sigmoid")


@pytest.fixture
def tanh_form(monkeypatch):
    """Force the eager form Tanh takes for large float32 CPU tensors, whatever this machine picks."""

    def force(form: str) -> None:
        monkeypatch.setattr(mlp, "eager_tanh_form", lambda: form)

    return force


def sigmoid_form(x):
    return torch.sigmoid(x * 2).mul_(2).sub_(1)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("shape", [(5, 7), (16, 8, 64), (16, 128, 64), (3, 200, 100)])
@pytest.mark.parametrize("grad", [False, True])
def test_the_tanh_activation_is_tanh_in_value_and_gradient_at_every_size_in_either_form(tanh_form, form, shape, grad):
    # Against tanh in float64 of the same float32 inputs (exact in float64). Float32 tanh is within ~1 ulp of |y| <= 1
    # (2^-24 absolute); the sigmoid form: sigmoid within 4 ulps of s in (0, 1) (4 * 2^-24 absolute), doubled, plus
    # the rounding of 2s - 1: under 9 * 2^-24. The gradient g = u (1 - y^2) from the float32 output: 2 |y| times
    # the output's error, plus the roundings of y^2, 1 - y^2 (2^-25 each) and the product (2^-24 of |g| <= |u|).
    tanh_form(form)
    tol = 9 * 2.0**-24
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        x = (torch.randn(shape, generator=gen, dtype=dtype) * 3).requires_grad_(grad)
        upstream = torch.randn(shape, generator=gen, dtype=dtype)
        with torch.set_grad_enabled(grad):
            y = Tanh()(x)
        x64 = x.detach().double().requires_grad_(grad)
        ref = torch.tanh(x64)
        assert y.dtype == dtype and y.shape == x.shape
        scale = 1.0 if dtype == torch.float32 else 2.0**-29  # float64 in and out: float64's own rounding
        assert (y.detach().double() - ref.detach()).abs().max().item() <= tol * scale
        if grad:
            y.backward(upstream)
            ref.backward(upstream.double())
            bound = (2 * tol + 2 * 2.0**-24) * scale * upstream.abs().max().item()
            assert (x.grad.double() - x64.grad).abs().max().item() <= bound
        else:
            assert not y.requires_grad


def test_the_sigmoid_form_is_chosen_by_size_dtype_device_and_autograd(tanh_form):
    """Which form runs is a speed choice (the values agree within float32 rounding, above): pinned bitwise here, the
    same ops computed by hand, so a threshold or a condition that drifts is seen."""
    from pipeline.nets.mlp import FAST_TANH_MIN_NUMEL, FAST_TANH_NOGRAD_MIN_NUMEL

    tanh_form("sigmoid")
    assert FAST_TANH_NOGRAD_MIN_NUMEL < FAST_TANH_MIN_NUMEL
    gen = torch.Generator().manual_seed(1)

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


def test_where_torch_tanh_is_chosen_it_runs_at_every_size_with_and_without_autograd(tanh_form):
    tanh_form("tanh")
    gen = torch.Generator().manual_seed(2)
    for n in (100, 8192, 32768, 65536):
        x = torch.randn(n, generator=gen) * 3
        assert torch.equal(Tanh()(x), torch.tanh(x))
        xg = x.clone().requires_grad_()
        y = Tanh()(xg)
        assert torch.equal(y.detach(), torch.tanh(x))
        assert type(y.grad_fn).__name__ == "TanhBackward0"


def test_under_torch_compile_the_traced_graph_keeps_the_sigmoid_form_whatever_the_eager_choice(tanh_form):
    # The compiled path is the size rule alone (the compiler fuses the form): the eager choice must not reach it.
    n = mlp.FAST_TANH_MIN_NUMEL
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm.code)
        return gm.forward

    for form in FORMS:
        tanh_form(form)
        graphs.clear()
        torch._dynamo.reset()
        with torch.no_grad():
            torch.compile(Tanh(), backend=capture, dynamic=False)(torch.randn(n))
        assert len(graphs) == 1 and "sigmoid" in graphs[0] and "tanh" not in graphs[0]
    torch._dynamo.reset()


# /proc/cpuinfo's first lines on three machines (flags cut to the ones that matter, plus neighbours).
SAPPHIRE_RAPIDS = (
    "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor\n"
    "flags\t\t: fpu sse4_2 avx avx2 avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl avx512_bf16\n"
    "processor\t: 1\nvendor_id\t: GenuineIntel\n"
)
EPYC_ZEN4 = (
    "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654 96-Core Processor\n"
    "flags\t\t: fpu sse4_2 avx avx2 avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl avx512_bf16\n"
)
INTEL_AVX2_ONLY = (
    "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Core(TM) i7-12700\n"
    "flags\t\t: fpu sse4_2 avx avx2 fma avx_vnni\n"
)


@pytest.mark.parametrize(
    "cpuinfo, has_mkl, environ, fast",
    [
        (SAPPHIRE_RAPIDS, True, {}, True),
        (SAPPHIRE_RAPIDS, False, {}, False),  # no MKL: torch's own tanh
        (EPYC_ZEN4, True, {}, False),  # MKL's vendor check: its generic kernel on AMD, AVX-512 or not
        (INTEL_AVX2_ONLY, True, {}, False),  # MKL's AVX2 kernel is the slow one too
        ("", True, {}, False),  # no /proc/cpuinfo: nothing known
        (SAPPHIRE_RAPIDS, True, {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}, False),
        (SAPPHIRE_RAPIDS, True, {"MKL_ENABLE_INSTRUCTIONS": "AVX2_E1"}, False),
        (SAPPHIRE_RAPIDS, True, {"MKL_CBWR": "COMPATIBLE"}, False),
        (SAPPHIRE_RAPIDS, True, {"MKL_CBWR": "AVX2,STRICT"}, False),
        (SAPPHIRE_RAPIDS, True, {"MKL_CBWR": "SSE4_2"}, False),
        (SAPPHIRE_RAPIDS, True, {"MKL_CBWR": "AVX512,STRICT", "MKL_ENABLE_INSTRUCTIONS": "AVX512_E1"}, True),
        (SAPPHIRE_RAPIDS, True, {"MKL_CBWR": "AUTO"}, True),
        (SAPPHIRE_RAPIDS, True, {"MKL_ENABLE_INSTRUCTIONS": "avx2"}, True),  # MKL ignores a lower-case value
        (SAPPHIRE_RAPIDS.replace(" avx512bw", ""), True, {}, False),  # AVX-512 without BW: not MKL's AVX-512 path
    ],
)
def test_torch_tanh_counts_as_fast_only_for_mkls_avx512_kernel_on_an_intel_cpu(cpuinfo, has_mkl, environ, fast):
    assert mkl_tanh_is_vectorised(cpuinfo, has_mkl, environ) is fast


@pytest.fixture
def fresh_choice():
    eager_tanh_form.cache_clear()
    yield
    eager_tanh_form.cache_clear()


def test_the_eager_form_is_decided_once_per_process_and_the_same_on_every_call(fresh_choice, monkeypatch):
    first = eager_tanh_form()
    assert first in FORMS
    assert [eager_tanh_form() for _ in range(3)] == [first] * 3
    with monkeypatch.context() as env:
        # Decided once: a later change of the environment does not move it.
        env.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")
        assert eager_tanh_form() == first
        # A fresh decision (a new process) reads the environment: MKL capped below AVX-512 is the sigmoid form anywhere.
        eager_tanh_form.cache_clear()
        assert eager_tanh_form() == "sigmoid"
    eager_tanh_form.cache_clear()
    assert eager_tanh_form() == first

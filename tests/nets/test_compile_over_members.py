"""`compile_over_members`: static graphs while the member count stays the first call's, one symbolic graph from the
first shrink on, and the compiled results equal eager's throughout."""

import contextlib
import functools
import logging

import pytest
import torch

from pipeline.nets.ensemble import compile_over_members, compiled_graphs, make_ensemble
from pipeline.nets.mlp import MLP

OBS, ACTIONS, ROWS = 4, 2, 8  # 4 features, as CartPole's: equal to K = 4 at the start
# float32 sums over 4 and 16 inputs, reordered by the compiler: a few ulps of outputs of size ~1
ATOL = RTOL = 1e-5


def ensemble(k: int):
    return make_ensemble(functools.partial(MLP, hidden=(16,), act="tanh"), range(k), (OBS,), ACTIONS)


def q_values(net, obs):
    return net(obs).tanh()


def q_values_of_a_clock(rows, net):  # rows [OBS, K]: the member axis second, as PPO's env clock
    return net(rows.t().unsqueeze(1)).tanh()


@contextlib.contextmanager
def created_symbols():
    """The symbolic sizes dynamo creates while the block runs (its shape environment's `create_symbol` log lines)."""
    logger = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    lines = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    lines[:] = [line for line in lines if line.startswith("create_symbol")]


def shrink(net, keep):
    net.keep_members_(torch.tensor(keep))


@pytest.mark.slow
@pytest.mark.long  # four graphs compiled cold on a fresh machine: ~40 s (`make test-long`)
def test_a_fixed_member_count_runs_one_static_graph_and_the_first_shrink_adds_one_symbolic_graph():
    torch._dynamo.reset()
    net = ensemble(4)
    compiled = compile_over_members(q_values, "cpu")
    obs = torch.randn(4, ROWS, OBS)
    with torch.no_grad():
        eager = q_values(net, obs)  # the members' outputs before any shrink
    graphs = compiled_graphs()
    with created_symbols() as static_symbols:
        for _ in range(2):
            torch.testing.assert_close(compiled(net, obs), eager, atol=ATOL, rtol=RTOL)
    assert compiled_graphs() == graphs + 1, "K = 4 twice: one graph"
    assert static_symbols == [], "the first member count's graph has symbolic sizes"

    shrink(net, [0, 2, 3])  # agent 1 stopped
    with created_symbols() as symbols:
        for _ in range(2):
            torch.testing.assert_close(compiled(net, obs[[0, 2, 3]]), eager[[0, 2, 3]], atol=ATOL, rtol=RTOL)
    assert compiled_graphs() == graphs + 2, "the first shrink: exactly one more graph"
    assert any("L['obs'].size()[0]" in line for line in symbols), f"the member axis is not symbolic: {symbols}"

    # Another wrapper over the same ensemble, first called now: the first one has marked the parameters dynamic, so
    # a static graph of them would not be static; it starts symbolic.
    other = compile_over_members(q_values_of_a_clock, "cpu", member_axes={0: 1})
    with created_symbols() as symbols:
        torch.testing.assert_close(other(obs[[0, 2, 3], 0].t(), net), eager[[0, 2, 3], :1], atol=ATOL, rtol=RTOL)
    assert compiled_graphs() == graphs + 3 and symbols, "a wrapper first called after a shrink: one symbolic graph"

    shrink(net, [0, 2])  # agents 0 and 3 left
    for _ in range(2):
        torch.testing.assert_close(compiled(net, obs[[0, 3]]), eager[[0, 3]], atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(other(obs[[0, 3], 0].t(), net), eager[[0, 3], :1], atol=ATOL, rtol=RTOL)
    assert compiled_graphs() == graphs + 3, "K = 2 reuses the symbolic graphs"


@pytest.mark.slow
def test_the_member_axis_member_axes_names_is_the_one_read_for_the_switch():
    torch._dynamo.reset()
    net = ensemble(4)
    compiled = compile_over_members(q_values_of_a_clock, "cpu", member_axes={0: 1})
    rows = torch.randn(OBS, 4)  # [OBS, K]: its first axis never changes, its second is the member axis
    with torch.no_grad():
        eager = q_values_of_a_clock(rows, net)
    graphs = compiled_graphs()
    with created_symbols() as static_symbols:
        torch.testing.assert_close(compiled(rows, net), eager, atol=ATOL, rtol=RTOL)
    assert static_symbols == [], "the first member count's graph has symbolic sizes"
    for keep, survivors in (([1, 2, 3], [1, 2, 3]), ([0, 2], [1, 3])):
        shrink(net, keep)
        torch.testing.assert_close(compiled(rows[:, survivors], net), eager[survivors], atol=ATOL, rtol=RTOL)
    assert compiled_graphs() == graphs + 2, "K = 4, then one graph for K = 3 and 2"

    # A new wrapper of the same function over a new ensemble of 5 (a second task in the process) starts static again
    # (a graph of its own, no symbols), though dynamo has seen the function's member axis change and holds a graph for
    # any K >= 2 of it.
    net, rows = ensemble(5), torch.randn(OBS, 5)
    with torch.no_grad():
        eager = q_values_of_a_clock(rows, net)
    with created_symbols() as static_symbols:
        compiled = compile_over_members(q_values_of_a_clock, "cpu", member_axes={0: 1})
        torch.testing.assert_close(compiled(rows, net), eager, atol=ATOL, rtol=RTOL)
    assert static_symbols == [] and compiled_graphs() == graphs + 3, "a second task's first graph is not static"

"""`device.compile=true` for SAC and TD3: the K-agent critic and actor steps through torch.compile give eager's results.

Two tasks of the same seeds, one eager and one compiled, fill their replays with the same warm-up transitions, then
take the same gradient steps on the same draws (each agent's generator gives both the same minibatches and noise):
their weights agree within float32 tolerance, also after the batch shrinks twice (agents stop), with one new graph per
compiled loss at the first shrink and none at the second. Tolerance as in test_compiled_updates: Adam with eps = 1e-3
makes a step Lipschitz in the gradient, so over U updates a weight moves at most U * lr / eps * 1e-6 apart.
"""

import functools
from types import SimpleNamespace

import pytest
import torch

from pipeline.nets.continuous_control import DeterministicActor, SquashedGaussianActor
from pipeline.nets.ensemble import compiled_graphs
from pipeline.tasks.sac import SACTask
from pipeline.tasks.td3 import TD3Task
from pipeline_testing import assert_compile_booked_apart

# Each test compiles its graphs cold on a fresh machine (C++ kernels through g++: 18-78 s a test): `make test-long`.
pytestmark = [pytest.mark.slow, pytest.mark.long]

PENDULUM = {"id": "Pendulum-v1", "backend": "tensor", "dtype": "float64"}
LR, ADAM_EPS, GRAD_RTOL = 0.01, 1e-3, 1e-6
ALGOS = {"sac": (SACTask, SquashedGaussianActor, {"policy_frequency": 2}),
         "td3": (TD3Task, DeterministicActor, {"policy_frequency": 2})}


def make(algo: str, compiled: bool):
    cls, actor, own = ALGOS[algo]
    task = cls.create(net=functools.partial(actor, hidden=(16, 16)), env=PENDULUM, n_agents=4, seed=7, learning_starts=40,
                      batch_size=16, buffer_size=200, critic_hidden=[16, 16], policy_lr=LR, q_lr=LR,
                      optimizer=functools.partial(torch.optim.Adam, eps=ADAM_EPS), **own)
    task.compile_updates = compiled
    task.on_fit_start()
    task.configure_optimizers()
    task.optimizers = lambda: SimpleNamespace(optimizer=task.actor_opt)
    for _ in range(40):  # uniform warm-up actions from each agent's generator: the same transitions in both
        task.act_and_store()
    return task


def nets(task):
    names = ("net", "critic", "critic_target") + (("actor_target",) if hasattr(task, "actor_target") else ())
    return {f"{n}.{k}": v.detach().clone() for n in names for k, v in getattr(task, n).state_dict().items()}


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_compiled_offpolicy_steps_equal_eager_and_compile_once_more_when_the_batch_first_shrinks(algo):
    torch._dynamo.reset()
    eager, compiled = make(algo, False), make(algo, True)
    assert torch.equal(eager.buffer.state_dict()["obs"], compiled.buffer.state_dict()["obs"])
    updates, graphs = 0, []
    for phase, keep in enumerate((None, [0, 2, 3], [0, 1])):  # K goes 4 -> 3 -> 2
        if keep is not None:
            graphs.append(compiled_graphs())
            for task in (eager, compiled):
                task.keep_slots_(keep)
        for _ in range(6):
            for task in (eager, compiled):
                task.learn_step(task.sample_batch())
            updates += 1
        bound = updates * LR / ADAM_EPS * GRAD_RTOL
        a, b = nets(eager), nets(compiled)
        for name in a:
            assert torch.allclose(b[name], a[name], atol=bound, rtol=0), (phase, name, (b[name] - a[name]).abs().max())
        assert compiled._recent.keys() == eager._recent.keys()
        for key, values in eager._recent.items():
            assert compiled._recent[key].tolist() == pytest.approx(values.tolist(), rel=1e-4, abs=1e-5), key
    assert compiled.slots == [0, 2] and len(compiled.compiled_losses) == 2
    # K = 4's graphs were static; the first shrink compiled one symbolic-K graph per loss (critic, actor), the second none.
    assert compiled_graphs() - graphs[0] == 2, "the first shrink did not compile exactly one symbolic-K graph per loss"
    assert compiled_graphs() == graphs[1], "the compiled steps recompiled when the batch shrank again"


def test_iterate_books_compile_time_apart_from_learning():
    torch._dynamo.reset()
    assert_compile_booked_apart(make("sac", True))

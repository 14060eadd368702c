"""`device.compile=true`: PPO's and DQN's K-agent update through torch.compile gives eager's results.

Each test drives two tasks of the same seeds by hand, one eager and one compiled, through the same rollouts / replay
draws: after a few updates their losses and weights agree within float32 tolerance, and after the batch shrinks (an
agent stops) the compiled task keeps agreeing on the surviving agents without compiling a new graph.

Tolerance: the compiled kernels sum in another order than eager's, so a gradient differs by a few float32 roundings
of its terms (relative ~1e-6 here). The optimizer is Adam with eps = 1e-3, which makes a step Lipschitz in the
gradient (|d step| <= lr / eps * |d grad|): over U updates a weight moves at most U * lr / eps * 1e-6 apart, which is
the bound asserted (with plain Adam's eps = 1e-8 a gradient that rounds to about zero could flip a step's sign).
"""

import functools
from types import SimpleNamespace

import pytest
import torch

from pipeline.nets.actor_critic import ActorCritic
from pipeline.nets.ensemble import compiled_graphs
from pipeline.nets.mlp import MLP
from pipeline.tasks.dqn import DQNTask
from pipeline.tasks.ppo import PPOTask

pytestmark = pytest.mark.slow

CART = {"id": "CartPole-v1", "backend": "tensor", "dtype": "float64"}
NEVER = 10**9
LR, ADAM_EPS, GRAD_RTOL = 0.01, 1e-3, 1e-6


def adam():
    return functools.partial(torch.optim.Adam, lr=LR, eps=ADAM_EPS, fused=True)


def start(task, compiled):
    task.compile_updates = compiled
    opt = task.configure_optimizers()
    opt = opt["optimizer"] if isinstance(opt, dict) else opt
    task.optimizers = lambda: SimpleNamespace(optimizer=opt)
    task.lr_schedulers = lambda: None
    task.curves = [SimpleNamespace(log=lambda step, row: None) for _ in range(task.n_agents)]
    task.on_fit_start()
    task.on_train_start()
    return task


def weights(task):
    return {k: v.detach().clone() for k, v in task.net.named_parameters()}


def assert_close(eager, compiled, updates, losses_eager, losses_compiled):
    bound = updates * LR / ADAM_EPS * GRAD_RTOL
    for name, w in weights(eager).items():
        assert torch.allclose(weights(compiled)[name], w, atol=bound, rtol=0), (name, (weights(compiled)[name] - w).abs().max())
    for key, values in losses_eager.items():
        assert losses_compiled[key] == pytest.approx(values, rel=1e-4, abs=1e-5), key


def test_ppo_compiled_updates_equal_eager_and_survive_a_shrink_without_recompiling():
    torch._dynamo.reset()

    def make():
        return PPOTask.create(net=functools.partial(ActorCritic, hidden=(16, 16)), optimizer=adam(), env=CART, n_agents=4,
                              seed=11, total_steps=10**6, envs_per_agent=2, num_steps=16, num_minibatches=2, update_epochs=2,
                              eval_every=NEVER, log_every=NEVER, eval_episodes=1, final_eval_episodes=1)

    eager, compiled = start(make(), False), start(make(), True)
    torch.manual_seed(0)
    updates = 0
    for it in range(4):
        if it == 2:  # agent 1 stops, then agent 3 (of the original four) a step later: K goes 4 -> 3 -> 2
            graphs = compiled_graphs()
        if it in (2, 3):
            for task in (eager, compiled):
                task.keep_slots_([0, 2, 3] if it == 2 else [0, 1])
        rollout = eager.rollout()  # both learn from the same rollout (the action noise is the process's)
        eager.learn(rollout)
        compiled.learn(rollout)
        updates += 2 * 2
        assert eager.slots == compiled.slots
        assert_close(eager, compiled, updates, eager.recent, compiled.recent)
    assert compiled.slots == [0, 2]
    assert compiled_graphs() == graphs, "the compiled update recompiled when the batch shrank"
    assert compiled.time_breakdown_s.get("compile", 0.0) == 0.0  # learn() alone: iterate() books it
    assert compiled.compile_s > 0.0


def test_ppo_iterate_books_compile_time_apart_from_learning():
    torch._dynamo.reset()
    task = PPOTask.create(net=functools.partial(ActorCritic, hidden=(8,)), optimizer=adam(), env=CART, n_agents=2, seed=3,
                          total_steps=10**6, envs_per_agent=2, num_steps=8, num_minibatches=1, update_epochs=1,
                          eval_every=NEVER, log_every=NEVER, eval_episodes=1, final_eval_episodes=1)
    start(task, True)
    task.iterate()
    first = dict(task.time_breakdown_s)
    task.iterate()
    # The first iteration compiled: its compiling is booked apart; the second compiled nothing and only learnt.
    assert first["compile"] == pytest.approx(task.compile_s) and first["compile"] > 0.0
    assert task.time_breakdown_s["compile"] == first["compile"]
    assert task.time_breakdown_s["learn"] > first.get("learn", 0.0)


@pytest.mark.parametrize("hand_gradients", [True, False], ids=["hand-written", "autograd"])
def test_dqn_compiled_updates_equal_eager_and_survive_a_shrink_without_recompiling(hand_gradients):
    torch._dynamo.reset()

    def make():
        return DQNTask.create(net=functools.partial(MLP, hidden=(16, 16)), optimizer=adam(), loss=torch.nn.SmoothL1Loss(),
                              env=CART, n_agents=4, seed=5, total_steps=10**6, envs_per_agent=2, buffer_size=1000,
                              batch_size=8, learning_starts=32, train_frequency=32, gradient_steps=3, eval_every=NEVER,
                              log_every=NEVER, eval_episodes=1, final_eval_episodes=1, fast_acting=False,
                              hand_gradients=hand_gradients)

    eager, compiled = start(make(), False), start(make(), True)
    assert (eager.hand_beta is not None) == hand_gradients
    for task in (eager, compiled):  # the same transitions: each agent explores with its own generator
        task.collect(32)
    assert torch.equal(eager.buffer.state_dict()["obs"], compiled.buffer.state_dict()["obs"])
    updates = 0
    for it in range(4):
        if it == 2:
            graphs = compiled_graphs()
        if it in (2, 3):
            for task in (eager, compiled):
                task.keep_slots_([0, 2, 3] if it == 2 else [0, 1])
        eager.learn()
        compiled.learn()
        updates += 3
        assert_close(eager, compiled, updates, {a: eager.recent[a]["loss"] for a in eager.slots},
                     {a: compiled.recent[a]["loss"] for a in compiled.slots})
    assert compiled_graphs() == graphs, "the compiled update recompiled when the batch shrank"
    assert compiled.compile_s > 0.0

"""`device.compile=true`: PPO's and DQN's K-agent update through torch.compile gives eager's results.

Each test drives two tasks of the same seeds by hand, one eager and one compiled, through the same rollouts / replay
draws: after a few updates their losses and weights agree within float32 tolerance, and after the batch shrinks (an
agent stops) the compiled task keeps agreeing on the surviving agents without compiling a new graph.

Tolerance: the compiled kernels sum in another order than eager's, so a gradient differs by a few float32 roundings
of its terms (relative ~1e-6 here). The optimizer is Adam with eps = 1e-3, which makes a step Lipschitz in the
gradient (|d step| <= lr / eps * |d grad|): over U updates a weight moves at most U * lr / eps * 1e-6 apart, which is
the bound asserted (with plain Adam's eps = 1e-8 a gradient that rounds to about zero could flip a step's sign).
"""

import copy
import functools
from types import SimpleNamespace

import pytest
import torch

from pipeline.nets.actor_critic import ActorCritic
from pipeline.nets.ensemble import compiled_graphs
from pipeline.nets.mlp import MLP
from pipeline.tasks.dqn import DQNTask
from pipeline.tasks.ppo import PPOTask
from pipeline_testing import assert_compile_booked_apart

# Each test compiles its graphs cold on a fresh machine (C++ kernels through g++: 18-78 s a test): `make test-long`.
pytestmark = [pytest.mark.slow, pytest.mark.long]

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


def test_ppo_compiled_updates_equal_eager_and_compile_once_more_when_the_batch_first_shrinks():
    torch._dynamo.reset()

    def make():
        return PPOTask.create(net=functools.partial(ActorCritic, hidden=(16, 16)), optimizer=adam(), env=CART, n_agents=4,
                              seed=11, total_steps=10**6, envs_per_agent=2, num_steps=16, num_minibatches=2, update_epochs=2,
                              eval_every=NEVER, log_every=NEVER, eval_episodes=1, final_eval_episodes=1)

    eager, compiled = start(make(), False), start(make(), True)
    torch.manual_seed(0)
    updates = 0
    graphs = []
    for it in range(4):
        if it in (2, 3):  # agent 1 stops, then agent 3 (of the original four) a step later: K goes 4 -> 3 -> 2
            graphs.append(compiled_graphs())
            for task in (eager, compiled):
                task.keep_slots_([0, 2, 3] if it == 2 else [0, 1])
        rollout = eager.rollout()  # both learn from the same rollout (the action noise is the process's)
        eager.learn(rollout)
        compiled.learn(rollout)
        updates += 2 * 2
        assert eager.slots == compiled.slots
        assert_close(eager, compiled, updates, eager.recent, compiled.recent)
    assert compiled.slots == [0, 2]
    # K = 4's graph was static; the first shrink compiled the one symbolic-K graph, the second compiled nothing.
    assert compiled_graphs() - graphs[0] == 1, "the first shrink did not compile exactly one symbolic-K graph"
    assert compiled_graphs() == graphs[1], "the compiled update recompiled when the batch shrank again"
    assert compiled.time_breakdown_s.get("compile", 0.0) == 0.0  # learn() alone: iterate() books it
    assert compiled.compile_s > 0.0


def test_ppo_iterate_books_compile_time_apart_from_learning():
    torch._dynamo.reset()
    task = PPOTask.create(net=functools.partial(ActorCritic, hidden=(8,)), optimizer=adam(), env=CART, n_agents=2, seed=3,
                          total_steps=10**6, envs_per_agent=2, num_steps=8, num_minibatches=1, update_epochs=1,
                          eval_every=NEVER, log_every=NEVER, eval_episodes=1, final_eval_episodes=1)
    start(task, True)
    assert_compile_booked_apart(task)


@pytest.mark.parametrize("hand_gradients", [True, False], ids=["hand-written", "autograd"])
def test_dqn_compiled_updates_equal_eager_and_compile_once_more_when_the_batch_first_shrinks(hand_gradients):
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
    graphs = []
    for it in range(4):
        if it in (2, 3):
            graphs.append(compiled_graphs())
            for task in (eager, compiled):
                task.keep_slots_([0, 2, 3] if it == 2 else [0, 1])
        eager.learn()
        compiled.learn()
        updates += 3
        assert_close(eager, compiled, updates, {a: eager.recent[a]["loss"] for a in eager.slots},
                     {a: compiled.recent[a]["loss"] for a in compiled.slots})
    assert compiled_graphs() - graphs[0] == 1, "the first shrink did not compile exactly one symbolic-K graph"
    assert compiled_graphs() == graphs[1], "the compiled update recompiled when the batch shrank again"
    assert compiled.compile_s > 0.0


# ---- the compiled rollout step (policy, sampling, tensor env step, episode returns: one graph per step) ----------------
# Tolerance: the compiled graph sums the 16-wide layers in another order than eager's bmm: each of a value's or a
# logit's 3 layers moves by at most a few float32 roundings of its terms (|terms| summed <= ~4 here), so outputs agree to
# ROLL_ATOL = 3 layers x 16 terms x 4 x 2^-24 ~ 1.2e-5; the float64 env to float64 rounding, its float32 observations
# to one float32 rounding. An action is the argmax of logits - log(-log u): it is the same on both sides wherever the
# top two perturbed logits are further apart than twice that bound, which the test checks for its seeds first.
ROLL_ATOL = 1.2e-5


def ppo_pair(env=CART, k=4, seed=11):
    def make():
        return PPOTask.create(net=functools.partial(ActorCritic, hidden=(16, 16)), optimizer=adam(), env=env, n_agents=k,
                              seed=seed, total_steps=10**6, envs_per_agent=2, num_steps=24, num_minibatches=2,
                              update_epochs=1, eval_every=NEVER, log_every=NEVER, eval_episodes=1, final_eval_episodes=1)

    return start(make(), False), start(make(), True)


def noise_margin(task, rollout, seed):
    """The smallest gap between the top two Gumbel-perturbed logits of the rollout's draws (the global generator's,
    re-drawn from `seed` in the rollout's order: one [K, E, A] uniform per step)."""
    torch.manual_seed(seed)
    T, K, E = rollout.actions.shape
    u = torch.stack([torch.rand(K, E, 2) for _ in range(T)])
    logits = torch.stack([task.net(rollout.obs[t])[0] for t in range(T)]).detach()
    top2 = (logits - torch.log(-torch.log(u))).topk(2, -1).values
    return float((top2[..., 0] - top2[..., 1]).min())


def rollout_mismatch(eager, compiled, a, b) -> str | None:
    """Where two rollouts of one state and one seed differ beyond the derived tolerance (None: they agree)."""
    exact = ("actions", "terminated", "truncated") if not a.actions.is_floating_point() else ("terminated", "truncated")
    for name in exact:
        if not torch.equal(getattr(a, name), getattr(b, name)):
            return name
    for name in ("obs", "actions", "log_probs", "values", "rewards", "final_values", "last_values"):
        x, y = getattr(a, name), getattr(b, name)
        if not torch.allclose(x, y, rtol=2**-23, atol=ROLL_ATOL):
            return f"{name}: {(x - y).abs().max():.3g}"
    ea, ca = eager.env.env, compiled.env.env
    # Equal discrete actions leave the float64 physics equal to its rounding; continuous actions differ by up to
    # ROLL_ATOL, which moves a state by no more than that (Pendulum: a step adds 0.15 x the torque to the speed).
    state_atol = 1e-12 if not a.actions.is_floating_point() else ROLL_ATOL
    if not (torch.equal(ea.elapsed, ca.elapsed) and torch.equal(ea.episodes, ca.episodes)
            and torch.allclose(ea.rows, ca.rows, rtol=1e-12, atol=state_atol)):
        return f"env clock: {(ea.rows - ca.rows).abs().max():.3g}"
    if not torch.allclose(eager.episode_return, compiled.episode_return, rtol=0, atol=ROLL_ATOL) or eager.episode_returns != compiled.episode_returns:
        return "episode returns"
    return None


def stale_rollout(task, old_net, seed):
    """The rollout a stale compiled step would give after the batch shrank: the step still reading the members the
    parameters had before (the first K rows of the old stack), the rest of the iteration as it is. The task's state
    is put back afterwards."""
    env = task.env.env
    clock, obs, ret, returns, steps = env.clock(), task.obs, task.episode_return, [list(r) for r in task.episode_returns], task.env_steps
    live = task.rollout_step()
    stale = copy.deepcopy(task.net)
    with torch.no_grad():
        for p, q in zip(stale.parameters(), old_net.parameters()):
            p.copy_(q[: p.shape[0]])
    task.rollout_step = lambda: lambda net, *args: live(stale, *args)
    try:
        torch.manual_seed(seed)
        return task.rollout()
    finally:
        del task.rollout_step
        env.set_clock(clock)
        task.obs, task.episode_return, task.episode_returns, task.env_steps = obs, ret, returns, steps


def test_ppo_compiled_rollout_equals_eager_and_compiles_once_more_when_the_batch_first_shrinks():
    torch._dynamo.reset()
    eager, compiled = ppo_pair(env={**CART, "kwargs": {"max_episode_steps": 20}})
    graphs = []
    for it, seed in enumerate((0, 1, 2)):
        before = copy.deepcopy(compiled.net)
        if it in (1, 2):  # agent 1 stops, then agent 3 (of the original four): K goes 4 -> 3 -> 2
            graphs.append(compiled_graphs())
            for task in (eager, compiled):
                task.keep_slots_([0, 2, 3] if it == 1 else [0, 1])
        torch.manual_seed(seed)
        a = eager.rollout()
        if it == 1:  # the check below catches a compiled step that kept reading the members it had before the shrink
            assert rollout_mismatch(eager, compiled, a, stale_rollout(compiled, before, seed)) is not None
        torch.manual_seed(seed)
        b = compiled.rollout()
        if it == 0:
            assert compiled.compile_s > 0.0 and compiled.time_breakdown_s["compile"] == pytest.approx(compiled.compile_s)
        assert noise_margin(eager, a, seed) > 4 * ROLL_ATOL  # the seeds leave no action to rounding
        # Episodes end (terminated, and truncated at the 20-step limit: bootstrapped from V(final obs)) and restart.
        assert a.terminated.any() and a.truncated.any() and (a.final_values != 0).any()
        assert rollout_mismatch(eager, compiled, a, b) is None, (it, rollout_mismatch(eager, compiled, a, b))
    assert compiled.slots == [0, 2]
    assert compiled_graphs() - graphs[0] == 1, "the first shrink did not compile exactly one symbolic-K rollout graph"
    assert compiled_graphs() == graphs[1], "the compiled rollout step recompiled when the batch shrank again"


def test_ppo_compiled_rollout_of_a_gaussian_policy_equals_eager():
    """Pendulum (continuous): the compiled step samples mean + std * noise from the same normals and clips for the env."""
    torch._dynamo.reset()
    eager, compiled = ppo_pair(env={"id": "Pendulum-v1", "backend": "tensor", "dtype": "float64",
                                    "kwargs": {"max_episode_steps": 10}}, k=2)
    for seed in (0, 1):
        torch.manual_seed(seed)
        a = eager.rollout()
        torch.manual_seed(seed)
        b = compiled.rollout()
        assert a.truncated.any() and (a.actions.abs() > 2).any()  # time limits hit; some actions sent clipped
        assert rollout_mismatch(eager, compiled, a, b) is None, (seed, rollout_mismatch(eager, compiled, a, b))
    assert compiled.compile_s > 0.0

"""docs/add_an_algorithm.md's DDPG (tests/example_algorithm/ddpg.py: one QNet critic on the off-policy actor-critic
layer), driven in process: its losses are the paper's on a batch computed by hand, agent i of a K = 2 batch trains like
the single run of its seed, and the layer shrinks and checkpoints its one critic per agent as it does TwinQ."""

import functools
import io

import torch

from example_algorithm.ddpg import DDPGTask, ddpg_actor_losses, ddpg_critic_losses
from pipeline.nets.continuous_control import DeterministicActor, QNet
from pipeline.nets.stacked import StackedModule
from pipeline.rl.replay import Transitions
from pipeline_testing import fit_ready
from tasks.test_sac_td3_units import PENDULUM, train

SMALL = {"learning_starts": 20, "batch_size": 16, "buffer_size": 300, "critic_hidden": [16, 16],
         "optimizer": torch.optim.Adam}
NETS = ("net", "actor_target", "critic", "critic_target")


def make(n_agents: int = 1, seed: int = 0, **overrides) -> DDPGTask:
    task = DDPGTask.create(net=functools.partial(DeterministicActor, hidden=(16, 16)), env=PENDULUM, n_agents=n_agents,
                           seed=seed, **{**SMALL, **overrides})
    return fit_ready(task)


def plain(task: DDPGTask, name: str, i: int) -> torch.nn.Module:
    """Agent i's network `name` as the plain module (what the single run holds)."""
    module = QNet(3, 1, (16, 16)) if "critic" in name else DeterministicActor(3, 1, (16, 16), [-2.0], [2.0])
    module.load_state_dict(getattr(task, name).member_state_dict(i))
    return module


def test_one_qnet_per_agent_stacked_generically():
    task = make(n_agents=2)
    assert isinstance(task.critic, StackedModule) and task.critics_per_agent == 1
    assert isinstance(task.critic_target, StackedModule) and task.critic.n_members == 2
    assert task.critic_opt.param_groups[0]["lr"] == task.config.q_lr and task.config.policy_frequency == 1


def test_the_losses_are_the_papers_on_a_batch_computed_by_hand():
    task = make(n_agents=2, gamma=0.9)
    train(task, 30)  # move the networks off their initialisation: the targets now differ from the learning nets
    g = torch.Generator().manual_seed(0)
    obs, next_obs = torch.randn(2, 3, 3, generator=g), torch.randn(2, 3, 3, generator=g)
    actions = torch.rand(2, 3, 1, generator=g) * 2 - 1
    rewards, terminated = torch.randn(2, 3, generator=g), torch.tensor([[False, True, False], [True, False, False]])
    loss, q_mean = ddpg_critic_losses(task.actor_target, task.critic, task.critic_target, obs, actions, rewards, next_obs,
                                      terminated, 0.9)
    actor_loss = ddpg_actor_losses(task.net, task.critic, obs)
    for k in range(2):
        critic, target_critic = plain(task, "critic", k), plain(task, "critic_target", k)
        actor, target_actor = plain(task, "net", k), plain(task, "actor_target", k)
        with torch.no_grad():
            losses, qs, values = [], [], []
            for b in range(3):  # one transition at a time, the formula as the paper writes it
                y = rewards[k, b] + 0.9 * (0.0 if terminated[k, b] else 1.0) * target_critic(next_obs[k, b:b + 1], target_actor.unit(next_obs[k, b:b + 1]))[0]
                q = critic(obs[k, b:b + 1], actions[k, b:b + 1])[0]
                losses.append((q - y) ** 2)
                qs.append(q)
                values.append(critic(obs[k, b:b + 1], actor.unit(obs[k, b:b + 1]))[0])
        assert torch.allclose(loss[k], torch.stack(losses).mean(), atol=1e-5), k
        assert torch.allclose(q_mean[k], torch.stack(qs).mean(), atol=1e-5)
        assert torch.allclose(actor_loss[k], -torch.stack(values).mean(), atol=1e-5)
    assert loss.requires_grad and not q_mean.requires_grad  # the target carries no gradient; the logged mean none


def test_agent_i_of_a_batch_of_two_trains_like_the_single_run_of_its_seed():
    batch = make(n_agents=2, seed=5)
    alone = [make(n_agents=1, seed=5 + i) for i in range(2)]
    train(batch, 24)  # 4 updates: the first ones, closely
    for task in alone:
        train(task, 24)
    assert batch.updates == [4, 4] and all(task.updates == [4] for task in alone)
    for i, single in enumerate(alone):
        for name in NETS:
            mine, theirs = getattr(batch, name).member_state_dict(i), getattr(single, name).member_state_dict(0)
            # The same draws (agent i's generator is the single run's); vmap's batched kernels sum in another order.
            assert all(torch.allclose(mine[k], theirs[k], atol=1e-6) for k in theirs), (i, name)
    train(batch, 36)
    for task in alone:
        train(task, 36)
    for i, single in enumerate(alone):
        for name in NETS:
            mine, theirs = getattr(batch, name).member_state_dict(i), getattr(single, name).member_state_dict(0)
            assert all(torch.allclose(mine[k], theirs[k], atol=1e-4) for k in theirs), (i, name)
    first = next(iter(batch.net.member_state_dict(0)))
    assert not torch.allclose(batch.net.member_state_dict(0)[first], batch.net.member_state_dict(1)[first])


def test_every_critic_step_moves_the_actor_and_both_targets_by_tau():
    task = make(n_agents=2, tau=0.5)
    train(task, 20)  # no update yet: learning starts after step 20
    before = {name: {k: v.clone() for k, v in getattr(task, name).state_dict().items()} for name in NETS}
    task.learn_step(task.sample_batch())
    after = {name: getattr(task, name).state_dict() for name in NETS}
    assert all(any(not torch.equal(v, before[name][k]) for k, v in after[name].items()) for name in NETS)
    for target, online in (("actor_target", "net"), ("critic_target", "critic")):
        for k, v in after[target].items():
            assert torch.allclose(v, 0.5 * before[target][k] + 0.5 * after[online][k], atol=1e-6), (target, k)


def test_a_stopped_agent_leaves_with_its_critic_its_targets_and_their_moments():
    task = make(n_agents=3)
    train(task, 40)
    kept = {name: getattr(task, name).member_state_dict(2) for name in NETS}
    moment = {n: task.critic_opt.state[p]["exp_avg"][2].clone() for n, p in task.critic.named_parameters()}
    task.stop_agents({0: "test", 1: "test"})
    assert task.slots == [2] and task.buffer.n_agents == 1
    for name in NETS:
        assert getattr(task, name).n_members == 1
        assert all(torch.equal(v, getattr(task, name).member_state_dict(0)[k]) for k, v in kept[name].items()), name
    assert all(torch.equal(task.critic_opt.state[p]["exp_avg"][0], moment[n]) for n, p in task.critic.named_parameters())
    train(task, 10)  # the one agent left goes on learning
    assert task.updates == [20, 20, 30]


def test_a_checkpoint_continues_bitwise():
    task = make(n_agents=2)
    train(task, 40)
    buffer = io.BytesIO()
    torch.save(task.checkpoint_state(), buffer)  # as the lifecycle stores it, read back with weights_only
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert state["format"] == "example.ddpg/1" and state["replay"]["size"] == 40
    resumed = DDPGTask.create(net=functools.partial(DeterministicActor, hidden=(16, 16)), env=PENDULUM, n_agents=2, **SMALL)
    assert resumed.load_checkpoint_state(state) == 40
    fit_ready(resumed).on_train_start()
    train(task, 20)
    train(resumed, 20)
    for name in NETS:
        a, b = getattr(task, name).state_dict(), getattr(resumed, name).state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a), name


def test_a_batch_from_the_buffer_has_the_losses_shapes():
    task = make(n_agents=2)
    train(task, 20)
    batch = task.sample_batch()
    assert isinstance(batch, Transitions)
    loss, q_mean = ddpg_critic_losses(task.actor_target, task.critic, task.critic_target, *batch, 0.99)
    assert loss.shape == (2,) and q_mean.shape == (2,) and ddpg_actor_losses(task.net, task.critic, batch.obs).shape == (2,)

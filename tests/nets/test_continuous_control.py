"""Actors and twin critics for continuous actions, and their K-agent forms: each member is the plain network."""

import copy
import functools

import pytest
import torch

from pipeline.nets.continuous_control import (
    DeterministicActor,
    EnsembleTwinQ,
    QNet,
    SquashedGaussianActor,
    TwinQ,
    bounded_log_std,
    make_offpolicy_agents,
)
from pipeline.nets.ensemble import keep_optimizer_members_
from pipeline.nets.stacked import StackedModule
from pipeline.rl.targets import soft_update

OBS, ACT = 5, 2


LOW, HIGH = [-2.0, 0.0], [2.0, 1.0]


def _agents(actor_cls, seeds, hidden=(16, 16)):
    actor = functools.partial(actor_cls, hidden=hidden, action_low=LOW, action_high=HIGH)
    return make_offpolicy_agents(actor, lambda o, a: TwinQ(o, a, hidden), seeds, OBS, ACT)


def _single(actor_cls, seed, hidden=(16, 16)):
    torch.manual_seed(seed)
    return actor_cls(OBS, ACT, hidden, LOW, HIGH), TwinQ(OBS, ACT, hidden)


@pytest.mark.parametrize("actor_cls", [SquashedGaussianActor, DeterministicActor])
def test_member_i_is_the_single_run_of_its_seed(actor_cls):
    actors, critics = _agents(actor_cls, [3, 9])
    obs, actions = torch.randn(2, 7, OBS), torch.rand(2, 7, ACT) * 2 - 1
    q1, q2 = critics(obs, actions)
    out = actors.distribution(obs) if actor_cls is SquashedGaussianActor else actors.unit(obs)
    for i, seed in enumerate([3, 9]):
        actor, critic = _single(actor_cls, seed)
        assert actor.state_dict().keys() == actors.member_state_dict(i).keys()
        for k, v in actor.state_dict().items():
            assert torch.equal(v, actors.member_state_dict(i)[k])
        for k, v in critic.state_dict().items():
            assert torch.equal(v, critics.member_state_dict(i)[k]), k
        s1, s2 = critic(obs[i], actions[i])
        assert torch.allclose(q1[i], s1, atol=1e-6) and torch.allclose(q2[i], s2, atol=1e-6)
        if actor_cls is SquashedGaussianActor:
            assert all(torch.allclose(a[i], b, atol=1e-6) for a, b in zip(out, actor.distribution(obs[i])))
        else:
            assert torch.allclose(out[i], actor.unit(obs[i]), atol=1e-6)
        # The deterministic action, in the env's units, is what the plain network's forward gives.
        assert torch.allclose(actors(obs)[i], actor(obs[i]), atol=1e-6)


@pytest.mark.parametrize("actor_cls", [SquashedGaussianActor, DeterministicActor])
def test_forward_is_the_deterministic_action_within_the_bounds(actor_cls):
    actor = actor_cls(OBS, ACT, (8,), LOW, HIGH)
    with torch.no_grad():
        for p in actor.parameters():
            p.mul_(100)  # saturate tanh: the actions reach the bounds
        actions = actor(torch.randn(500, OBS))
        unit = torch.tanh(actor.distribution(torch.randn(3, OBS))[0]) if actor_cls is SquashedGaussianActor else None
    assert (actions[:, 0] >= -2).all() and (actions[:, 0] <= 2).all() and (actions[:, 1] >= 0).all() and (actions[:, 1] <= 1).all()
    assert actions[:, 0].min() < -1.9 and actions[:, 0].max() > 1.9 and actions[:, 1].max() > 0.95
    assert unit is None or unit.abs().max() <= 1
    assert set(actor.state_dict()) >= {"bounds.scale", "bounds.bias"}
    with pytest.raises(ValueError, match="low < high"):
        actor_cls(OBS, ACT, (8,), [1.0, 0.0], [0.0, 1.0])


def test_the_twin_critics_are_independent_networks():
    _, critics = _agents(SquashedGaussianActor, [0])
    q1, q2 = critics(torch.randn(1, 4, OBS), torch.zeros(1, 4, ACT))
    assert not torch.allclose(q1, q2)
    critic = TwinQ(OBS, ACT)
    loaded = EnsembleTwinQ([TwinQ(OBS, ACT), TwinQ(OBS, ACT)])
    loaded.load_member_state_dict(1, critic.state_dict())
    obs, act = torch.randn(2, 3, OBS), torch.zeros(2, 3, ACT)
    assert torch.allclose(loaded(obs, act)[1][1], critic(obs[1], act[1])[1], atol=1e-6)
    with pytest.raises(ValueError, match="do not fit a TwinQ"):
        loaded.load_member_state_dict(0, {"q1.net.0.weight": torch.zeros(1)})


def test_keeping_agents_keeps_both_their_critics_and_the_optimizer_state():
    _, critics = _agents(DeterministicActor, [0, 1, 2])
    opt = torch.optim.Adam(critics.parameters(), lr=1e-3)
    q1, q2 = critics(torch.randn(3, 4, OBS), torch.zeros(3, 4, ACT))
    (q1.sum() + q2.sum()).backward()
    opt.step()
    before = critics.member_state_dict(2)
    moments = {name: opt.state[p]["exp_avg"].clone() for name, p in critics.named_parameters()}
    keep = torch.tensor([2])
    pairs = critics.keep_members_(keep)
    keep_optimizer_members_(opt, pairs, torch.cat([keep, keep + 3]), 6)
    assert critics.n_members == 1
    after = critics.member_state_dict(0)
    assert all(torch.equal(before[k], after[k]) for k in before)
    for name, p in critics.named_parameters():
        # Agent 2's q1 was member 2 of 6, its q2 member 5.
        assert torch.equal(opt.state[p]["exp_avg"], moments[name][[2, 5]])


def test_a_loss_summed_over_agents_gives_each_its_own_gradient():
    actors, critics = _agents(SquashedGaussianActor, [4, 5])
    obs = torch.randn(2, 6, OBS)
    mean, log_std = actors.distribution(obs)
    q1, _ = critics(obs, torch.tanh(mean))
    (q1.mean(-1).sum() + log_std.sum()).backward()
    actor, critic = _single(SquashedGaussianActor, 5)
    m, ls = actor.distribution(obs[1])
    (critic.q1(obs[1], torch.tanh(m)).mean() + ls.sum()).backward()
    grad = actors.trunk[0].weight.grad[1].t()
    assert torch.allclose(grad, actor.trunk[0].weight.grad, atol=1e-5)


def test_polyak_averaging_of_stacked_critics():
    _, online = _agents(DeterministicActor, [0, 1])
    _, target = _agents(DeterministicActor, [7, 8])
    old = {k: v.clone() for k, v in target.state_dict().items()}
    soft_update(target, online, 0.005)
    for k, v in target.state_dict().items():
        assert torch.allclose(v, 0.995 * old[k] + 0.005 * online.state_dict()[k], atol=1e-7)


def test_bounded_log_std_and_errors():
    assert torch.allclose(bounded_log_std(torch.tensor([-100.0, 0.0, 100.0])), torch.tensor([-5.0, -1.5, 2.0]))
    with pytest.raises(ValueError, match="at least one seed"):
        make_offpolicy_agents(SquashedGaussianActor, TwinQ, [], OBS, ACT)
    with pytest.raises(ValueError, match="needs critics that are nn.Modules; got function"):
        make_offpolicy_agents(SquashedGaussianActor, lambda o, a: (lambda obs, act: obs), [0], OBS, ACT)


def test_a_critic_other_than_twin_q_is_stacked_generically_one_member_per_agent():
    """DDPG's one QNet per agent: member i is the single run's critic (built after its actor, as that run builds it);
    it shrinks with the optimizer's moments, copies as a target, and loads into a plain QNet."""
    actor = functools.partial(DeterministicActor, hidden=(16, 16), action_low=LOW, action_high=HIGH)
    actors, critics = make_offpolicy_agents(actor, lambda o, a: QNet(o, a, (16, 16)), [3, 9, 4], OBS, ACT)
    assert isinstance(critics, StackedModule) and critics.n_members == 3
    assert next(critics.parameters()).shape[0] == 3  # one critic per agent: critics_per_agent = 1
    obs, actions = torch.randn(3, 7, OBS), torch.rand(3, 7, ACT) * 2 - 1
    q = critics(obs, actions)
    assert q.shape == (3, 7)
    for i, seed in enumerate([3, 9, 4]):
        torch.manual_seed(seed)
        DeterministicActor(OBS, ACT, (16, 16), LOW, HIGH)
        single = QNet(OBS, ACT, (16, 16))
        assert critics.member_state_dict(i).keys() == single.state_dict().keys()
        assert all(torch.equal(v, critics.member_state_dict(i)[k]) for k, v in single.state_dict().items())
        assert torch.allclose(q[i], single(obs[i], actions[i]), atol=1e-6)
    opt = torch.optim.Adam(critics.parameters(), lr=1e-3)
    critics(obs, actions).sum().backward()
    opt.step()
    target = copy.deepcopy(critics)
    before = critics.member_state_dict(2)
    moments = {name: opt.state[p]["exp_avg"].clone() for name, p in critics.named_parameters()}
    keep = torch.tensor([2, 0])
    keep_optimizer_members_(opt, critics.keep_members_(keep), keep, 3)
    target.keep_members_(keep)
    assert critics.n_members == 2 and target.n_members == 2
    assert all(torch.equal(before[k], v) for k, v in critics.member_state_dict(0).items())
    for name, p in critics.named_parameters():
        assert torch.equal(opt.state[p]["exp_avg"], moments[name][[2, 0]])
    soft_update(target, critics, 0.5)  # the target's structure follows the online critics' after both shrank
    plain = QNet(OBS, ACT, (16, 16))
    plain.load_state_dict(critics.member_state_dict(1))
    assert torch.allclose(critics(obs[:2], actions[:2])[1], plain(obs[1], actions[1]), atol=1e-6)

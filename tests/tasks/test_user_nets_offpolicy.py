"""SAC and TD3 with an actor of the user's own (not from pipeline.nets) at K = 1 and 3: agent i trains like the single run
of its seed, the actor's state_dict loads into the user's class, a checkpoint continues bitwise, an agent stops and
leaves the batch, and an actor that breaks the contract (`pipeline.nets.contracts.SAC` / `TD3`) is refused in one line.
"""

import functools
import io
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from pipeline.nets.continuous_control import ActionBounds, bounded_log_std
from pipeline.nets.stacked import StackedModule
from pipeline.tasks.sac import SACTask
from pipeline.tasks.td3 import TD3Task
from tasks.test_sac_td3_units import train

PENDULUM = {"id": "Pendulum-v1", "backend": "tensor"}
SMALL = {"learning_starts": 20, "batch_size": 16, "buffer_size": 300, "critic_hidden": [16, 16], "optimizer": torch.optim.Adam}
# The same draws (agent i's generator is the single run's), vmap's batched kernels against the plain module's: float32
# rounding compounded over 40 Adam steps of the actor and critics, as tests/tasks/test_sac_td3_units.py allows ours.
TOL = 1e-4


class Trunk(nn.Module):
    """A user's trunk: a skip connection around a LayerNorm'd layer."""

    def __init__(self, in_features, width):
        super().__init__()
        self.inp = nn.Linear(in_features, width)
        self.norm = nn.LayerNorm(width)
        self.hidden = nn.Linear(width, width)

    def forward(self, x):
        h = torch.relu(self.inp(x))
        return h + torch.relu(self.hidden(self.norm(h)))


class MyGaussianActor(nn.Module):
    def __init__(self, in_features, out_features, action_low=None, action_high=None, width=16):
        super().__init__()
        self.trunk = Trunk(in_features, width)
        self.mean = nn.Linear(width, out_features)
        self.raw_log_std = nn.Linear(width, out_features)
        self.bounds = ActionBounds(out_features, action_low, action_high)

    def distribution(self, obs):
        h = self.trunk(obs)
        return self.mean(h), bounded_log_std(self.raw_log_std(h))

    def forward(self, obs):
        return self.bounds(torch.tanh(self.distribution(obs)[0]))


class MyDeterministicActor(nn.Module):
    def __init__(self, in_features, out_features, action_low=None, action_high=None, width=16):
        super().__init__()
        self.trunk = Trunk(in_features, width)
        self.head = nn.Linear(width, out_features)
        self.bounds = ActionBounds(out_features, action_low, action_high)

    def unit(self, obs):
        return torch.tanh(self.head(self.trunk(obs)))

    def forward(self, obs):
        return self.bounds(self.unit(obs))


ALGOS = {"sac": (SACTask, MyGaussianActor, {"policy_frequency": 1}), "td3": (TD3Task, MyDeterministicActor, {"policy_frequency": 2})}


def make(algo, n_agents=1, seed=0, start=True, **overrides):
    cls, actor, own = ALGOS[algo]
    task = cls.create(net=functools.partial(actor, width=16), env=PENDULUM, n_agents=n_agents, seed=seed, **{**SMALL, **own, **overrides})
    if start:
        task.on_fit_start()
        task.configure_optimizers()
        task.optimizers = lambda: SimpleNamespace(optimizer=task.actor_opt)
    return task


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_agent_i_of_a_user_actor_batch_trains_like_the_single_run_of_its_seed(algo):
    batch, alone = make(algo, n_agents=3, seed=4), make(algo, n_agents=1, seed=6)
    assert type(batch.net) is StackedModule and type(alone.net) is StackedModule
    assert all(torch.equal(v, alone.net.member_state_dict(0)[k]) for k, v in batch.net.member_state_dict(2).items())
    train(batch, 60)
    train(alone, 60)
    assert batch.updates == [40, 40, 40] and alone.updates == [40]
    for net in ("net", "critic", "critic_target"):
        mine, single = getattr(batch, net).member_state_dict(2), getattr(alone, net).member_state_dict(0)
        assert mine.keys() == single.keys()
        for k in single:
            assert torch.allclose(mine[k], single[k], atol=TOL), (net, k)
    first = "trunk.inp.weight"
    assert not torch.allclose(batch.net.member_state_dict(1)[first], batch.net.member_state_dict(2)[first])
    # model.pt: the user's class, acting as the stacked agent does (the deterministic action in the env's units)
    cls = ALGOS[algo][1]
    mine = cls(3, 1, action_low=[-2.0], action_high=[2.0])
    mine.load_state_dict(batch.agent_state_dict(1))
    obs = torch.randn(5, 3)
    with torch.no_grad():
        assert torch.allclose(mine(obs), batch.net(obs.expand(3, -1, -1))[1], atol=1e-6)
        assert mine(obs).abs().max() <= 2.0
    assert batch.evaluation_returns(1, 10_000).shape == (3, 1)


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_a_user_actor_batch_continues_bitwise_from_a_checkpoint_and_an_agent_stops(algo):
    task = make(algo, n_agents=3)
    train(task, 50)
    buffer = io.BytesIO()
    torch.save(task.checkpoint_state(), buffer)
    buffer.seek(0)
    resumed = make(algo, n_agents=3, start=False)
    assert resumed.load_checkpoint_state(torch.load(buffer, weights_only=True)) == 50
    resumed.on_fit_start()
    resumed.configure_optimizers()
    resumed.optimizers = lambda: SimpleNamespace(optimizer=resumed.actor_opt)
    resumed.on_train_start()
    for t in (task, resumed):
        train(t, 10)
        t.stop_agents({1: "test"})  # agent 1's actor, Adam moments, replay rows and envs leave the batch
        train(t, 20)
    assert task.slots == [0, 2] and task.net.n_members == 2 and task.updates == [60, 40, 60]
    for net in ("net", "critic", "critic_target"):
        a, b = getattr(task, net).state_dict(), getattr(resumed, net).state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a), net
    assert all(torch.equal(v, resumed.agent_state_dict(1)[k]) for k, v in task.agent_state_dict(1).items())


def test_an_actor_that_breaks_the_contract_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^task=td3 needs model=deterministic_actor or an actor of your own: .*; "
                                         r"<class '.*MyGaussianActor'> has no unit$"):
        TD3Task.create(net=MyGaussianActor, env=PENDULUM, **SMALL)

    class NoBounds(nn.Module):
        def __init__(self, in_features, out_features, action_low=None, action_high=None):
            super().__init__()
            self.head = nn.Linear(in_features, out_features)

        def unit(self, obs):
            return torch.tanh(self.head(obs))

        def forward(self, obs):
            return self.unit(obs)

    with pytest.raises(ValueError, match=r"^task=td3 needs .*; <class '.*NoBounds'> has no bounds$"):
        TD3Task.create(net=NoBounds, env=PENDULUM, **SMALL)

    def unbounded(in_features, out_features):
        return MyGaussianActor(in_features, out_features)

    with pytest.raises(ValueError, match=r"^task=sac needs .*; building <function .*unbounded.*> failed: .*'action_low'$"):
        SACTask.create(net=unbounded, env=PENDULUM, **SMALL)

    class WideMean(MyGaussianActor):
        def distribution(self, obs):
            mean, log_std = super().distribution(obs)
            return torch.cat([mean, mean], -1), log_std

    with pytest.raises(ValueError, match=r"^task=sac needs .*; WideMean.forward\(x \[N, 3\]\) returned \[N, 2\], expected \[N, 1\]$"):
        SACTask.create(net=WideMean, env=PENDULUM, **SMALL)

"""Each RL task's model contract (`pipeline.nets.contracts`), which the start-up check binds a model of the user's own
against before anything is built, names exactly the keywords the task really passes to the model's constructor: when
it trains (K = 1 and K = 3, our networks and a user's own) and when its policy builds the plain network for a replay,
`pipeline.load` or an export (`Policy.network`). A keyword the contract leaves out lets a model that cannot take it
pass the check and fail after the run dir is written; one it adds refuses a model the task could build.

The keywords are recorded from the real builds (a factory that notes what it is called with), not taken from the
contracts.
"""

import functools

import pytest
import torch
from torch import nn

from pipeline.nets.actor_critic import ActorCritic
from pipeline.nets.continuous_control import DeterministicActor, SquashedGaussianActor
from pipeline.nets.contracts import BY_TASK
from pipeline.nets.mlp import MLP
from pipeline.tasks.cem import CEMTask
from pipeline.tasks.dqn import DQNTask
from pipeline.tasks.ppo import PPOTask
from pipeline.tasks.sac import SACTask
from pipeline.tasks.td3 import TD3Task

CART = {"id": "CartPole-v1", "backend": "tensor"}
PEND = {"id": "Pendulum-v1", "backend": "tensor"}
ADAM = functools.partial(torch.optim.Adam, lr=1e-3)


class UsersNet(nn.Module):
    """A user's model taking anything (**kwargs), so every keyword the task passes reaches the record."""

    def __init__(self, **kwargs):
        super().__init__()
        self.inner = kwargs.pop("_build")(**kwargs)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.inner, name)

    def forward(self, *args):
        return self.inner(*args)


def recording(build, seen: list[frozenset[str]], users_own: bool):
    """A model factory that notes the keywords of each call, then builds `build(**them)` (ours, or a user's wrapper)."""

    def factory(**kwargs):
        seen.append(frozenset(kwargs))
        return UsersNet(_build=build, **kwargs) if users_own else build(**kwargs)

    return factory


CASES = {
    "dqn": (DQNTask, functools.partial(MLP, hidden=(8,)), CART, {"loss": nn.SmoothL1Loss()}),
    "cem": (CEMTask, functools.partial(MLP, hidden=(8,)), CART, {"episodes_per_batch": 3, "max_iterations": 1}),
    "ppo-discrete": (PPOTask, functools.partial(ActorCritic, hidden=(8,)), CART, {}),
    "ppo-continuous": (PPOTask, functools.partial(ActorCritic, hidden=(8,)), PEND, {}),
    "sac": (SACTask, functools.partial(SquashedGaussianActor, hidden=(8,)), PEND, {}),
    "td3": (TD3Task, functools.partial(DeterministicActor, hidden=(8,)), PEND, {}),
}


@pytest.mark.parametrize("users_own", [False, True], ids=["ours", "users-own"])
@pytest.mark.parametrize("case", CASES)
def test_the_contract_names_exactly_the_keywords_the_task_passes(case, users_own):
    cls, build, env, settings = CASES[case]
    seen: list[frozenset[str]] = []
    for k in (1, 3):
        task = cls.create(net=recording(build, seen, users_own), env=env, optimizer=ADAM, n_agents=k, **settings)
    assert len(seen) >= 1 + 3  # every member of both builds went through the factory
    # What a replay, pipeline.load and an export build from model.pt: the policy's plain network.
    task.policy.network(recording(build, seen, users_own), task.observation_space, task.action_space)
    contract = BY_TASK[case.split("-")[0]]
    assert set(seen) == {frozenset(contract.constructor)}, (case, sorted(map(sorted, set(seen))), contract.constructor)

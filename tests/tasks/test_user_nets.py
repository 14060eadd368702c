"""A network of the user's own (not from pipeline.nets) trains in every task at K = 1 and K = 3 like our own networks:
agent i of a batch trains like the single run of its seed, each agent's weights load into the user's class, checkpoints
continue exactly, agents stop and leave the batch, and a model that breaks its task's contract is refused in one line.

The modules are written here as a user would: a skip connection, LayerNorm, Dropout, a learnt scalar; a BatchNorm one.
Expectations come from outside the tasks: a plain module of the user's class loaded with agent i's starting weights and
trained by hand, or the single run of the agent's seed.
"""

import functools
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from torch import nn

from pipeline.nets.actor_critic import LogStd
from pipeline.nets.stacked import StackedActorCritic, StackedModule
from pipeline.store.curves import CurveLog
from pipeline.tasks import ppo
from pipeline.tasks.cem import CEMTask
from pipeline.tasks.dqn import DQNTask
from pipeline.tasks.ppo import PPOTask
from pipeline.tasks.supervised import SupervisedTask
from test_supervised_units import IN, C, Sizes, TinyData, orders, train_by_hand

CART = {"id": "CartPole-v1", "backend": "tensor", "dtype": "float64"}
PEND = {"id": "Pendulum-v1", "backend": "tensor", "dtype": "float64"}
NEVER = 10**9
# Agent i's arithmetic is its plain module's in another kernel (vmap's batched matmuls against the plain module's mm):
# float32 rounding of sums of a few dozen O(1) terms per op, compounded over a handful of steps: 1e-5 against weights
# that the steps move by 1e-3 or more.
TOL = 1e-5


class ResMLP(nn.Module):
    """A user's network: in -> width, a residual block with LayerNorm and Dropout, -> out, times a learnt scale."""

    def __init__(self, in_features, out_features, width=8, dropout=0.0):
        super().__init__()
        self.inp = nn.Linear(in_features, width)
        self.norm = nn.LayerNorm(width)
        self.hidden = nn.Linear(width, width)
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(width, out_features)
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x):
        h = torch.relu(self.inp(x.flatten(1)))
        h = h + self.drop(torch.relu(self.hidden(self.norm(h))))
        return self.out(h) * self.scale


class BatchNormMLP(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, out_features))

    def forward(self, x):
        return self.net(x)


class ResActorCritic(nn.Module):
    """A user's actor-critic for PPO: (logits or a Gaussian's mean [N, out], value [N]); continuous: log_std.value."""

    def __init__(self, in_features, out_features, continuous=False, width=8):
        super().__init__()
        self.torso = ResMLP(in_features, width, width=width)
        self.pi = nn.Linear(width, out_features)
        self.v = nn.Linear(width, 1)
        self.log_std = LogStd(out_features, -0.5) if continuous else None

    def forward(self, obs):
        h = torch.tanh(self.torso(obs))
        return self.pi(h), self.v(h).squeeze(-1)


def plain(cls, state, *args, **kwargs):
    """The user's own class, loaded with an agent's state_dict (what its model.pt holds): strict keys and shapes."""
    module = cls(*args, **kwargs)
    module.load_state_dict({k: v.detach().clone() for k, v in state.items()})
    return module


def close(a: dict, b: dict, atol=TOL) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k].float(), b[k].float(), atol=atol, rtol=0) for k in a)


def equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---- supervised -----------------------------------------------------------------------------------------


def supervised(net, k=1, seed=0, lr=0.3):
    return SupervisedTask.create(net=net, loss=nn.CrossEntropyLoss(), optimizer=lambda p: torch.optim.SGD(p, lr=lr),
                                 datamodule=Sizes(IN, C), seed=seed, n_agents=k)


def supervised_fit(task, tmp_path, epochs=1, ckpt_path=None, **trainer_kwargs):
    task.curves = [CurveLog(tmp_path / f"agent{i}.csv") for i in range(task.n_agents)]
    kwargs = {"logger": False, "enable_checkpointing": False, "num_sanity_val_steps": 0, **trainer_kwargs}
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=epochs, enable_progress_bar=False, enable_model_summary=False, **kwargs)
    return task.fit_and_evaluate(trainer, TinyData(), ckpt_path)


@pytest.mark.parametrize("k", [1, 3])
def test_supervised_each_member_of_a_user_network_trains_like_plain_sgd_of_its_seed(tmp_path, k):
    """Two epochs over batches 4, 4, 2 in each member's own order, gradients clipped per member (member 1's far
    larger): member i is the user's class trained by hand from seed 4 + i's start."""
    factory = functools.partial(ResMLP, width=8)
    task = supervised(factory, k=k, seed=4)
    assert type(task.net) is StackedModule
    with torch.no_grad():
        task.net.module.out.weight[k - 1].mul_(20.0)
    start = [plain(ResMLP, task.agent_state_dict(i), IN, C) for i in range(k)]
    torch.manual_seed(4 + k - 1)
    single = ResMLP(IN, C)
    assert equal(start[k - 1].state_dict(), {**single.state_dict(), "out.weight": single.state_dict()["out.weight"] * 20})
    supervised_fit(task, tmp_path, epochs=2, gradient_clip_val=0.5)
    x, y = TinyData().all["train"].tensors
    for i in range(k):
        expected = train_by_hand(start[i], x, y, orders(4 + i, 10, 2), 4, 0.3, epochs=2,
                                 clip=lambda ps: nn.utils.clip_grad_norm_(list(ps), 0.5))
        assert close(task.agent_state_dict(i), expected.state_dict()), i


def test_supervised_batchnorm_members_keep_their_own_running_statistics(tmp_path):
    task = supervised(BatchNormMLP, k=2, seed=1)
    start = [plain(BatchNormMLP, task.agent_state_dict(i), IN, C) for i in range(2)]
    supervised_fit(task, tmp_path)
    x, y = TinyData().all["train"].tensors
    for i in range(2):
        expected = train_by_hand(start[i], x, y, orders(1 + i, 10, 1), 4, 0.3)
        assert close(task.agent_state_dict(i), expected.state_dict()), i
        assert task.agent_state_dict(i)["net.1.num_batches_tracked"] == 3  # batches of 4, 4 and 2
    assert not torch.allclose(task.agent_state_dict(0)["net.1.running_mean"], task.agent_state_dict(1)["net.1.running_mean"])


def test_supervised_a_user_network_with_dropout_resumes_bitwise(tmp_path):
    """Dropout's per-member masks come from the global RNG, which the checkpoint holds: 1 epoch + a resume to 3 ends
    where 3 epochs in one go end."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    factory = functools.partial(ResMLP, width=16, dropout=0.5)
    torch.manual_seed(0)
    whole = supervised(factory, k=2, seed=2)
    whole_metrics = supervised_fit(whole, tmp_path / "whole", epochs=3)
    torch.manual_seed(0)
    first = supervised(factory, k=2, seed=2)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    supervised_fit(first, tmp_path / "first", epochs=1, enable_checkpointing=True, callbacks=[ckpt])
    resumed = supervised(factory, k=2, seed=2)
    resumed_metrics = supervised_fit(resumed, tmp_path / "resumed", epochs=3, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    for i in range(2):
        assert equal(resumed.agent_state_dict(i), whole.agent_state_dict(i))
    assert resumed_metrics == whole_metrics
    assert not equal(whole.agent_state_dict(0), first.agent_state_dict(0))


def test_supervised_refuses_a_network_whose_output_does_not_fit_in_one_line():
    with pytest.raises(ValueError, match=r"^task=supervised needs model=mlp or a model of your own: model\(in_features=\.\.\., "
                                         r"out_features=\.\.\.\) with .*; ResMLP.forward\(x \[N, 3\]\) returned \[N, 7\], expected \[N, 3\]$"):
        supervised(lambda in_features, out_features: ResMLP(in_features, 7), k=2)


# ---- DQN ------------------------------------------------------------------------------------------------


def dqn(k=1, seed=0, **hp):
    """Random acting throughout (epsilon 1): every agent's transitions come from its own generator and envs, so agent i
    of a batch sees exactly what the single run of its seed sees, and only the updates can differ."""
    settings = dict(total_steps=64, train_frequency=16, gradient_steps=2, batch_size=8, learning_starts=16, eval_every=NEVER,
                    eval_episodes=1, final_eval_episodes=1, log_every=NEVER, buffer_size=1000, eps_start=1.0, eps_end=1.0,
                    optimizer=lambda p: torch.optim.Adam(p, lr=0.01), loss=nn.SmoothL1Loss(), max_grad_norm=0.5,
                    net=functools.partial(ResMLP, width=8), stop_confirm_episodes=0, env=CART)
    settings.update(hp)
    return DQNTask.create(n_agents=k, seed=seed, **settings)


def dqn_fit(task):
    task.curves = [CurveLog(f"/nonexistent-{id(task)}/{i}.csv", flush_every_s=NEVER) for i in range(task.n_agents)]
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, logger=False)
    return task.fit_and_evaluate(trainer, None, None)


def test_dqn_agent_i_of_a_user_network_batch_trains_like_the_single_run_of_its_seed():
    batch, single = dqn(k=3, seed=3), dqn(k=1, seed=4)
    assert type(batch.net) is StackedModule and batch.fast_greedy is None and batch.hand_beta is None
    assert equal(batch.net.member_state_dict(1), single.net.member_state_dict(0))  # the single run's start, exactly
    torch.manual_seed(5)
    dqn_fit(batch)
    dqn_fit(single)
    assert batch.updates == [8, 8, 8] and single.updates == [8]  # 4 rounds of 16 env steps, 2 updates each
    assert close(batch.agent_state_dict(1), single.agent_state_dict(0))
    assert close(batch.target_net.member_state_dict(1), single.target_net.member_state_dict(0))
    assert not close(batch.agent_state_dict(1), batch.agent_state_dict(0), atol=1e-3)
    # model.pt of each seed is the user's class
    x = torch.randn(5, 4)
    for i in range(3):
        mine = plain(ResMLP, batch.agent_state_dict(i), 4, 2, width=8)
        with torch.no_grad():
            assert torch.allclose(mine(x), batch.agents_net(x.expand(3, -1, -1))[i], atol=TOL)


def test_dqn_a_user_network_batch_resumes_exactly():
    hp = dict(k=2, total_steps=96, eval_every=32, log_every=32, eps_start=1.0, eps_end=0.05, eps_duration=48)
    whole = dqn(**hp)
    dqn_fit(whole)
    stopped = dqn(**hp)
    saved = {}

    def hook(final=False):
        if stopped.env_steps == 48 and not final:
            saved["state"] = stopped.checkpoint_state()
            stopped.trainer.should_stop = True

    stopped.checkpoint_hook = hook
    dqn_fit(stopped)
    resumed = dqn(**hp)
    resumed.load_checkpoint_state(saved["state"])
    dqn_fit(resumed)
    for i in range(2):
        assert equal(resumed.agent_state_dict(i), whole.agent_state_dict(i))
        assert equal(resumed.target_net.member_state_dict(i), whole.target_net.member_state_dict(i))
        assert resumed.evaluations[i] == whole.evaluations[i]


def test_dqn_a_stopped_user_network_agent_leaves_the_batch_and_the_others_train_on_as_they_would():
    """Agent 1 stops after the first learning round: its weights are the record's, its rows, Adam moments and
    generator go, and agents 0 and 2 end where they end in a batch nobody left."""
    left, stay = dqn(k=3, total_steps=64), dqn(k=3, total_steps=64)
    rounds = {"n": 0}
    original = left.learn

    def learn_then_stop():
        original()
        rounds["n"] += 1
        if rounds["n"] == 1:
            kept = left.agent_state_dict(1)
            left.stop_agents({1: "test"})
            rounds["kept"] = kept

    left.learn = learn_then_stop
    dqn_fit(left)
    dqn_fit(stay)
    assert left.slots == [0, 2] and left.net.n_members == 2 and left.updates == [8, 2, 8]
    assert equal(left.agent_state_dict(1), rounds["kept"])
    for i in (0, 2):
        assert close(left.agent_state_dict(i), stay.agent_state_dict(i))


def test_dqn_refuses_a_network_without_one_q_value_per_action():
    with pytest.raises(ValueError, match=r"^task=dqn needs model=mlp\|dueling\|noisy\|atari_cnn or a model of your own: .*; "
                                         r"ResMLP.forward\(x \[N, 4\]\) returned \[N, 5\], expected \[N, 2\]$"):
        dqn(k=2, net=lambda in_features, out_features: ResMLP(in_features, 5))


# ---- PPO ------------------------------------------------------------------------------------------------


def ppo_task(k=1, env=CART, seed=0, **hp):
    settings = dict(total_steps=32, envs_per_agent=2, num_steps=4, num_minibatches=2, update_epochs=2, eval_every=NEVER,
                    log_every=NEVER, eval_episodes=1, final_eval_episodes=1, max_grad_norm=0.05)
    settings.update(hp)
    task = PPOTask.create(net=functools.partial(ResActorCritic, width=8), optimizer=functools.partial(torch.optim.Adam, lr=0.01),
                          env=env, n_agents=k, seed=seed, **settings)
    opt = task.configure_optimizers()
    task.optimizers = lambda: SimpleNamespace(optimizer=opt)
    task.curves = [CurveLog(f"/nonexistent-{id(task)}/{i}.csv", flush_every_s=NEVER) for i in range(k)]
    task.on_fit_start()
    task.on_train_start()
    return task


@pytest.mark.parametrize("env", [CART, PEND], ids=["discrete", "continuous"])
def test_ppo_agent_i_of_a_user_network_batch_updates_like_the_single_run_of_its_seed(env):
    """The action noise is the process's (shared), so both learn from the same stored rollout: two epochs of
    shuffled minibatches (each agent's generator), Adam and a per-agent clip."""
    batch, single = ppo_task(k=3, env=env, seed=3), ppo_task(k=1, env=env, seed=4)
    assert type(batch.net) is StackedActorCritic
    continuous = env is PEND
    assert (batch.net.log_std is not None) == continuous
    assert equal(batch.net.member_state_dict(1), single.net.member_state_dict(0))
    torch.manual_seed(0)
    rollout = batch.rollout()
    one = ppo.Rollout(*(v[:, 1:2] for v in rollout[:-1]), last_values=rollout.last_values[1:2])
    single.learn(one)
    before = batch.net.member_state_dict(1)
    batch.learn(rollout)
    assert close(batch.net.member_state_dict(1), single.net.member_state_dict(0))
    assert not close(batch.net.member_state_dict(1), before, atol=1e-4)
    assert batch.recent["train/policy_loss"][1] == pytest.approx(single.recent["train/policy_loss"][0], abs=1e-5)
    state = batch.agent_state_dict(2)
    mine = plain(ResActorCritic, state, *((3, 1) if continuous else (4, 2)), continuous=continuous)
    obs = torch.randn(5, 3 if continuous else 4)
    with torch.no_grad():
        logits, values = batch.net(obs.expand(3, -1, -1))
        assert torch.allclose(mine(obs)[0], logits[2], atol=TOL) and torch.allclose(mine(obs)[1], values[2], atol=TOL)
    assert batch.evaluation_returns(1, 10_000).shape == (3, 1)


def test_ppo_refuses_a_model_that_breaks_the_actor_critic_contract_in_one_line():
    def critic_free(in_features, out_features, continuous=False):
        return ResMLP(in_features, out_features)

    with pytest.raises(ValueError, match=r"^task=ppo needs model=actor_critic or a model of your own: .*; "
                                         r"ResMLP.forward\(x \[N, 4\]\) returned \[N, 2\], expected \(\[N, 2\], \[N\]\)$"):
        PPOTask.create(net=critic_free, optimizer=torch.optim.Adam, env=CART, n_agents=2)

    class NoLogStd(ResActorCritic):
        def __init__(self, in_features, out_features, continuous=False):
            super().__init__(in_features, out_features, continuous=False)

    with pytest.raises(ValueError, match=r"^task=ppo needs .*; NoLogStd has no parameter log_std.value of shape \[1\] for its continuous actions$"):
        PPOTask.create(net=NoLogStd, optimizer=torch.optim.Adam, env=PEND, n_agents=2)
    with pytest.raises(ValueError, match=r"^task=ppo needs .*; building .*ResMLP.* failed: .*'continuous'$"):
        PPOTask.create(net=ResMLP, optimizer=torch.optim.Adam, env=CART)


# ---- CEM ------------------------------------------------------------------------------------------------


def test_cem_agent_i_of_a_user_network_batch_plays_and_fits_like_the_single_run_of_its_seed():
    def cem(k, seed):
        task = CEMTask.create(net=functools.partial(ResMLP, width=8), optimizer=functools.partial(torch.optim.Adam, lr=0.01),
                              env={"id": "CartPole-v1", "kwargs": {"max_episode_steps": 20}}, episodes_per_batch=3,
                              max_iterations=2, stop_confirm_episodes=0, n_agents=k, seed=seed)
        opt = task.configure_optimizers()
        task.optimizers = lambda: SimpleNamespace(optimizer=opt)
        task.curves = None
        return task

    batch, single = cem(3, 3), cem(1, 4)
    assert type(batch.net) is StackedModule
    for _ in range(2):
        batch.iterate()
        single.iterate()
    assert batch.batch_means[1] == single.batch_means[0] and batch.agent_steps[1] == single.agent_steps[0]
    assert close(batch.agent_state_dict(1), single.agent_state_dict(0))
    plain(ResMLP, batch.agent_state_dict(0), 4, 2, width=8)

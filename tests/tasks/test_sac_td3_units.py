"""SAC and TD3 as K-agent tasks, driven in process: agent i trains like the single run of its seed, a stopped agent
leaves the batch with everything it owned, a checkpoint continues bitwise, bad settings are one line."""

import functools
import io

import pytest
import torch

from pipeline.nets.continuous_control import DeterministicActor, SquashedGaussianActor
from pipeline.tasks.sac import SACTask
from pipeline.tasks.td3 import TD3Task
from pipeline_testing import fit_ready

PENDULUM = {"id": "Pendulum-v1", "backend": "tensor"}
SMALL = {"learning_starts": 20, "batch_size": 16, "buffer_size": 300, "critic_hidden": [16, 16],
         "optimizer": functools.partial(torch.optim.Adam, lr=0.1)}  # the tasks set the learning rates
ALGOS = {
    "sac": (SACTask, SquashedGaussianActor, {"policy_frequency": 1}),
    "td3": (TD3Task, DeterministicActor, {"policy_frequency": 2}),
}


def make(algo: str, n_agents: int = 1, seed: int = 0, **overrides):
    cls, actor, own = ALGOS[algo]
    task = cls.create(net=functools.partial(actor, hidden=(16, 16)), env=PENDULUM, n_agents=n_agents, seed=seed,
                      **{**SMALL, **own, **overrides})
    return fit_ready(task)


def train(task, steps: int) -> None:
    for _ in range(steps):
        task.act_and_store()
        if task.env_steps > task.config.learning_starts:
            task.learn_step(task.sample_batch())


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_agent_i_of_a_batch_trains_like_the_single_run_of_its_seed(algo):
    batch, alone = make(algo, n_agents=3, seed=4), make(algo, n_agents=1, seed=6)
    train(batch, 60)
    train(alone, 60)
    assert batch.updates == [40, 40, 40] and alone.updates == [40]
    for net in ("net", "critic", "critic_target"):
        mine, single = getattr(batch, net).member_state_dict(2), getattr(alone, net).member_state_dict(0)
        for k in single:
            # The same draws (agent 2's generator is the single run's); the batched kernels sum in another order.
            assert torch.allclose(mine[k], single[k], atol=1e-4), (net, k)
    first = next(iter(alone.net.member_state_dict(0)))
    assert not torch.allclose(batch.net.member_state_dict(1)[first], batch.net.member_state_dict(2)[first])  # another seed
    assert torch.allclose(batch.buffer.rewards.view(3, -1)[2, :60], alone.buffer.rewards[:60], atol=1e-4)


def test_sac_tunes_each_agents_temperature_toward_the_target_entropy():
    task = make("sac", n_agents=2, alpha_start=1.0, target_entropy=-1.0)
    train(task, 80)
    # Pendulum's one action dimension: an untrained policy's entropy is above -1, so each alpha fell from 1.
    assert (task.log_alpha.detach() < 0).all()
    assert task.log_alpha.detach()[0] != task.log_alpha.detach()[1]
    fixed = make("sac", n_agents=1, alpha=0.3, autotune=False)
    train(fixed, 40)
    assert torch.allclose(fixed.log_alpha.detach().exp(), torch.tensor([0.3]))


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_a_stopped_agent_leaves_the_batch_with_what_it_owned(algo):
    task = make(algo, n_agents=3)
    train(task, 40)
    kept_actor = task.net.member_state_dict(2)
    kept_critic = task.critic.member_state_dict(2)
    moment = task.critic_opt.state[task.critic.q[0].weight]["exp_avg"][[2, 5]].clone()
    task.stop_agents({0: "test", 1: "test"})
    assert task.slots == [2] and task.buffer.n_agents == 1 and task.env.num_envs == 1 and len(task.generators) == 1
    assert all(torch.equal(v, task.net.member_state_dict(0)[k]) for k, v in kept_actor.items())
    assert all(torch.equal(v, task.critic.member_state_dict(0)[k]) for k, v in kept_critic.items())
    assert torch.equal(task.critic_opt.state[task.critic.q[0].weight]["exp_avg"], moment)
    assert task.early_stop[0]["reason"] == "test" and task.stop_step[1] == 40
    train(task, 10)  # the smaller batch goes on learning
    assert task.env_steps == 50 and task.updates == [20, 20, 30]


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_a_checkpoint_continues_bitwise_replay_included(algo):
    task = make(algo, n_agents=2)
    train(task, 50)
    # Through torch.save and a weights_only load, as the lifecycle stores it (which also unshares every tensor).
    buffer = io.BytesIO()
    torch.save(task.checkpoint_state(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert state["replay"] is not None and state["replay"]["size"] == 50
    resumed_task = ALGOS[algo][0].create(net=functools.partial(ALGOS[algo][1], hidden=(16, 16)), env=PENDULUM, n_agents=2,
                                         **{**SMALL, **ALGOS[algo][2]})
    assert resumed_task.load_checkpoint_state(state) == 50
    fit_ready(resumed_task).on_train_start()
    train(task, 30)
    train(resumed_task, 30)
    for net in ("net", "critic", "critic_target"):
        a, b = getattr(task, net).state_dict(), getattr(resumed_task, net).state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a), net
    assert torch.equal(task.buffer.obs, resumed_task.buffer.obs)


def test_bad_settings_are_one_line():
    with pytest.raises(ValueError, match=r"task=sac needs continuous actions .*CartPole-v1"):
        SACTask.create(net=functools.partial(SquashedGaussianActor), env={"id": "CartPole-v1"}, optimizer=SMALL["optimizer"])
    with pytest.raises(ValueError, match=r"task=td3 needs model=deterministic_actor"):
        TD3Task.create(net=functools.partial(SquashedGaussianActor), env=PENDULUM, optimizer=SMALL["optimizer"])


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_the_record_and_model_file_hold_the_plain_actor(algo):
    task = make(algo, n_agents=2)
    train(task, 30)
    assert task.actor_opt.param_groups[0]["lr"] == task.config.policy_lr and task.critic_opt.param_groups[0]["lr"] == task.config.q_lr
    state = task.agent_state_dict(1)
    plain = ALGOS[algo][1](3, 1, (16, 16))
    plain.load_state_dict(state)
    obs = torch.randn(5, 3)
    assert torch.allclose(plain(obs), task.net(obs.expand(2, 5, 3))[1], atol=1e-6)
    assert (plain(obs).abs() <= 2).all()  # Pendulum's torque bounds travel with the weights


def test_td3_updates_its_actor_and_targets_every_policy_frequency_critic_steps():
    task = make("td3", n_agents=2, policy_frequency=2, tau=0.5)
    train(task, 20)  # the buffer holds 20 transitions; no update yet (learning starts after step 20)
    snapshot = {name: {k: v.clone() for k, v in getattr(task, name).state_dict().items()}
                for name in ("net", "actor_target", "critic", "critic_target")}

    def changed(name: str) -> bool:
        return any(not torch.equal(v, snapshot[name][k]) for k, v in getattr(task, name).state_dict().items())

    task.learn_step(task.sample_batch())  # critic step 1: the critics move, nothing else
    assert changed("critic") and not changed("net") and not changed("actor_target") and not changed("critic_target")
    actor_before = {k: v.clone() for k, v in task.net.state_dict().items()}
    task.learn_step(task.sample_batch())  # critic step 2: the actor steps, then both targets move halfway (tau 0.5)
    assert changed("net") and changed("actor_target") and changed("critic_target")
    for k, v in task.actor_target.state_dict().items():
        assert torch.allclose(v, 0.5 * snapshot["actor_target"][k] + 0.5 * task.net.state_dict()[k], atol=1e-6), k
    assert any(not torch.equal(v, actor_before[k]) for k, v in task.net.state_dict().items())


def test_sac_moves_its_target_critics_by_tau_every_target_network_frequency_steps():
    task = make("sac", n_agents=1, target_network_frequency=2, tau=0.25)
    train(task, 20)
    start = {k: v.clone() for k, v in task.critic_target.state_dict().items()}
    task.learn_step(task.sample_batch())
    assert all(torch.equal(v, start[k]) for k, v in task.critic_target.state_dict().items())
    task.learn_step(task.sample_batch())
    online = task.critic.state_dict()
    for k, v in task.critic_target.state_dict().items():
        assert torch.allclose(v, 0.75 * start[k] + 0.25 * online[k], atol=1e-6), k


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_optimizer_lr_is_not_used_and_a_run_that_sets_it_says_so_in_one_line(algo, caplog):
    """The rates are task.policy_lr and task.q_lr (SAC's temperature: q_lr); an optimizer.lr is named as unused."""
    with caplog.at_level("WARNING", logger="pipeline.tasks.offpolicy"):
        task = make(algo, optimizer=functools.partial(torch.optim.Adam, lr=0.05), policy_lr=2e-4, q_lr=7e-4)
    lines = [r.getMessage() for r in caplog.records if r.name == "pipeline.tasks.offpolicy"]
    assert lines == [f"task={algo} does not use optimizer.lr=0.05: its learning rates are task.policy_lr=0.0002 (actor) and "
                     f"task.q_lr=0.0007 (critics{', temperature' if algo == 'sac' else ''}); set those (and optimizer.lr=null "
                     "to silence this)"]
    assert task.actor_opt.param_groups[0]["lr"] == 2e-4 and task.critic_opt.param_groups[0]["lr"] == 7e-4
    if algo == "sac":
        assert task.alpha_opt.param_groups[0]["lr"] == 7e-4
    caplog.clear()
    with caplog.at_level("WARNING", logger="pipeline.tasks.offpolicy"):
        quiet = make(algo, optimizer=functools.partial(torch.optim.Adam, lr=None))
    assert not [r for r in caplog.records if r.name == "pipeline.tasks.offpolicy"]
    assert quiet.actor_opt.param_groups[0]["lr"] == quiet.config.policy_lr


@pytest.mark.parametrize("preset", ["sac_pendulum", "sac_halfcheetah", "td3_halfcheetah"])
def test_the_presets_leave_optimizer_lr_unset(make_cfg, preset):
    assert make_cfg(f"experiment={preset}").optimizer.lr is None

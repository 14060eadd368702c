"""DQNTask's behaviours pinned on tiny runs, each test well under a second (mutation testing runs them).

A run here is a few rounds of 16 env steps with an 8-unit network on CartPole. Expectations come
from outside the task: an update is redone by hand with plain networks and torch autograd, exploration
from the agents' own seeded generators, evaluations with `evaluate_agents` on a plain copy of the
weights, and a K-agent run is compared with the single runs of its seeds.
"""


import lightning as L
import numpy as np
import optuna
import pytest
import torch
from torch import nn

from pipeline.nets.heads import NoisyQNet
from pipeline.nets.mlp import MLP
from pipeline.report.stats import fast_iqm
from pipeline.rl.schedules import epsilon_at
from pipeline.rl.vector import evaluate_agents
from pipeline.runtime.loggers import CurveLogger
from pipeline.store.curves import CurveLog
from pipeline.tasks import rl_task
from pipeline.tasks.dqn import DQNTask, elementwise
from pipeline.tasks.rl_task import EVAL_SEED_OFFSET, FINAL_EVAL_SEED_OFFSET, RLTask
from pipeline.tune.pruning import PRUNED_REASON, TrialReporter

TENSOR = {"id": "CartPole-v1", "backend": "tensor", "dtype": "float64"}
GYM = {"id": "CartPole-v1"}
NEVER = 10**9


def mlp(act="relu"):
    def factory(in_features, out_features):
        return MLP(in_features, out_features, hidden=(8,), act=act)

    return factory


def sgd(lr):
    return lambda params: torch.optim.SGD(params, lr=lr)


def make(k=1, env=TENSOR, act="relu", **hp):
    """A tiny DQN: rounds of 16 env steps, no evaluation or logging during training unless asked, the screening
    evaluation alone deciding a stop."""
    settings = dict(total_steps=64, train_frequency=16, gradient_steps=2, batch_size=8, learning_starts=16,
                    eval_every=NEVER, eval_episodes=1, final_eval_episodes=1, log_every=NEVER, buffer_size=1000,
                    eps_duration=32, optimizer=sgd(0.05), loss=nn.SmoothL1Loss(), net=mlp(act),
                    stop_confirm_episodes=0)  # the stop rule's confirmation: tests/tasks/test_ppo_units.py (RLTask's)
    settings.update(hp)
    return DQNTask.create(env=env, n_agents=k, **settings)


def trainer(**kwargs):
    kwargs = {"logger": False, **kwargs}
    return L.Trainer(accelerator="cpu", devices=1, max_epochs=1, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, **kwargs)


def fit(task, **trainer_kwargs):
    task.curves = [CurveLog(f"/nonexistent-{id(task)}/{i}.csv", flush_every_s=NEVER) for i in range(task.n_agents)]
    return task.fit_and_evaluate(trainer(**trainer_kwargs), None, None)


def plain(state: dict, act="relu") -> MLP:
    net = mlp(act)(4, 2)
    net.load_state_dict({k: v.detach().clone() for k, v in state.items()})
    return net


def member(ensemble, slot, act="relu") -> MLP:
    return plain(ensemble.member_state_dict(slot), act)


def same(a: nn.Module, b: nn.Module, atol=1e-6) -> bool:
    return all(torch.allclose(x, y, atol=atol) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


# ---- construction --------------------------------------------------------------------------------




def test_bad_values_are_refused_in_one_line():
    """The settings' ranges are the Config's (pipeline.tasks.configs, checked at start-up); what depends on the env,
    the loss and the trainer is refused here."""
    with pytest.raises(ValueError, match="DQN needs a discrete action space; Pendulum-v1 has Box"):
        make(env={"id": "Pendulum-v1"})
    for ok in (dict(gamma=0.0), dict(gamma=1.0), dict(gradient_steps=0), dict(save_replay=True), dict(save_replay=False),
               dict(train_frequency=1), dict(total_steps=1)):
        make(**ok)
    # the env's kwargs reach the env: a wrong one fails when the task is built, not later in the run
    with pytest.raises(TypeError, match="unexpected keyword argument 'no_such_option'"):
        make(env={"id": "CartPole-v1", "kwargs": {"no_such_option": 1}})
    with pytest.raises(ValueError, match="^DQN needs a torch loss with a `reduction` \\(loss=huber or loss=mse\\); got Identity$"):
        elementwise(nn.Identity())
    huber = nn.SmoothL1Loss()
    assert elementwise(huber).reduction == "none" and huber.reduction == "mean"  # a copy: the config's loss is untouched
    with pytest.raises(ValueError, match="task=dqn runs in fp32; got device.precision=bf16-mixed"):
        make().fit_and_evaluate(trainer(precision="bf16-mixed"), None, None)


def test_the_constructors_defaults_are_the_configs():
    """DQNTask built from Python without options behaves as conf/task/dqn.yaml configures it."""
    task = DQNTask.create(net=mlp(), loss=nn.SmoothL1Loss(), optimizer=sgd(0.1), env=GYM)
    read = {"envs_per_agent": task.envs_per_agent, "fast_acting": task.fast_acting, "capture_video": task.capture_video,
            "threshold": None if task.threshold == 475.0 else task.threshold}
    assert {k: v == getattr(task.config, k) for k, v in read.items()} == dict.fromkeys(read, True)
    assert task.n_agents == 1 and task.agent_seeds == [0]


def test_what_the_task_reads_from_the_env_and_its_defaults():
    task = make(k=3, seed=4)
    assert task.agent_seeds == [4, 5, 6] and task.slots == [0, 1, 2]
    assert task.obs_shape == (4,) and task.replay_layout()["obs_dtype"] == torch.float32 and task.n_actions == 2
    assert task.threshold == 475.0 and make(threshold=100).threshold == 100.0
    assert task.replay_bytes_per_transition == 2 * 4 * 4 + 8 + 4 + 4
    assert task.net(torch.zeros(3, 5, 4)).shape == (3, 5, 2)
    assert make(fast_acting=False).fast_acting is False and make(capture_video=True).capture_video is True
    assert task.elapsed_s() == 0.0  # no training yet
    # agent 1 starts from the single run's weights of seed 5; the target and the record start equal to it
    single = make(seed=5)
    assert same(member(task.net, 1), member(single.net, 0), atol=0)
    assert same(member(task.target_net, 1), member(task.net, 1), atol=0)
    assert same(member(task.agents_net, 2), member(task.net, 2), atol=0)
    assert not any(p.requires_grad for p in task.target_net.parameters())


def test_epsilon_follows_the_linear_schedule_and_is_zero_for_noisy_nets():
    task = make(eps_start=0.9, eps_end=0.1, eps_duration=40)
    assert [task.epsilon(s) for s in (0, 10, 40, 100)] == pytest.approx([0.9, 0.7, 0.1, 0.1])
    task.env_steps = 20
    assert task.epsilon() == pytest.approx(0.5)
    noisy = make(net=lambda in_features, out_features: NoisyQNet(in_features, out_features, hidden=(8,)))
    assert noisy.noisy and noisy.epsilon(0) == 0.0 and not task.noisy


# ---- acting --------------------------------------------------------------------------------------


def own_draws(seed, n):
    """What agent `seed` draws for a round of n env steps: its coins, then its random actions."""
    g = torch.Generator().manual_seed(seed)
    coins = torch.rand(n, generator=g)
    return coins, torch.randint(0, 2, (n,), generator=g)


@pytest.mark.parametrize("k, env, envs, fast", [(1, GYM, 1, True), (1, GYM, 1, False), (2, TENSOR, 2, True), (2, GYM, 1, False)])
def test_acting_is_epsilon_greedy_with_each_agents_own_draws(k, env, envs, fast):
    """One round of 32 env steps per agent, epsilon 1 -> 0 over it: step t (env steps s) explores iff coin < eps(s)."""
    task = make(k=k, env=env, envs_per_agent=envs, seed=3, total_steps=32, train_frequency=32, learning_starts=NEVER,
                eps_start=1.0, eps_end=0.0, eps_duration=32, fast_acting=fast)
    fit(task)
    assert task.env_steps == 32 and len(task.buffer) == 32  # every env's transitions
    n = 32 // envs
    explored = greedy = 0
    for a in range(k):
        coins, random_actions = own_draws(3 + a, 32)
        coins, random_actions = coins.view(n, envs), random_actions.view(n, envs)
        rows = slice(a * task.buffer.capacity, a * task.buffer.capacity + n * envs)
        obs, actions = task.buffer.obs[rows].view(n, envs, 4), task.buffer.actions[rows].view(n, envs)
        with torch.no_grad():
            best = member(task.net, a)(obs.view(-1, 4)).argmax(1).view(n, envs)
        for t in range(n):
            eps = epsilon_at(t * envs, 1.0, 0.0, 32)
            for e in range(envs):
                if coins[t, e] < eps:
                    assert actions[t, e] == random_actions[t, e], (a, t, e)
                    explored += 1
                else:
                    assert actions[t, e] == best[t, e], (a, t, e)
                    greedy += 1
    assert explored > 5 and greedy > 5  # both branches were exercised


@pytest.mark.parametrize("k, env, envs", [(1, GYM, 1), (2, TENSOR, 2)])
def test_the_replay_holds_each_agents_trajectories_and_episode_returns(k, env, envs):
    """Random play for 96 steps: consecutive transitions chain, CartPole pays 1 a step, an episode's return is its length."""
    task = make(k=k, env=env, envs_per_agent=envs, total_steps=96, train_frequency=32, learning_starts=NEVER, eps_end=1.0)
    fit(task)
    n = 96 // envs
    assert len(task.buffer) == 96
    for a in range(k):
        lengths = []
        for e in range(envs):
            rows = torch.arange(n) * envs + e + a * task.buffer.capacity
            obs, next_obs = task.buffer.obs[rows], task.buffer.next_obs[rows]
            dones = task.buffer.dones[rows]
            assert torch.all(task.buffer.rewards[rows] == 1.0)
            # a terminated CartPole leaves the bounds (|x| > 2.4 or |angle| > 0.2095); otherwise it chains
            fell = (next_obs[:, 0].abs() > 2.4) | (next_obs[:, 2].abs() > 0.2095)
            assert torch.equal(dones.bool(), fell)
            starts = [0]
            for t in range(n - 1):
                if torch.equal(obs[t + 1], next_obs[t]):
                    continue
                assert dones[t] == 1.0, (a, e, t)  # no time limit within 96 steps: only falling ends an episode
                starts.append(t + 1)
            lengths += [b - s for s, b in zip(starts, starts[1:])]
        assert sorted(task.episode_returns[a]) == sorted(float(x) for x in lengths)
        assert len(lengths) >= 2


def assert_greedy(actions: torch.Tensor, q_values: torch.Tensor) -> None:
    """`actions` are greedy for `q_values` [B, A] up to float32 rounding: the task acts through its ensemble (or a
    numpy mirror), the test through a plain network, and two kernels may order a near-tie differently. 1e-4 of the
    largest value is far above the rounding of an 8-unit net and far below the gap between two actions (~0.1)."""
    q = q_values.double()
    tol = 1e-4 * max(1.0, float(q.abs().max()))
    chosen = q.gather(1, actions.view(-1, 1)).squeeze(1)
    assert bool((chosen >= q.max(1).values - tol).all()), (actions, q)


def test_random_and_greedy_extremes():
    """eps 1: every action is the agent's random draw; eps 0: every action is its network's argmax."""
    rand = make(k=2, total_steps=16, learning_starts=NEVER, eps_start=1.0, eps_end=1.0, seed=7)
    fit(rand)
    for a in range(2):
        _, actions = own_draws(7 + a, 16)
        assert torch.equal(rand.buffer.actions[a * 1000 : a * 1000 + 16], actions)
    greedy = make(k=2, total_steps=16, learning_starts=NEVER, eps_start=0.0, eps_end=0.0, seed=7)
    fit(greedy)
    for a in range(2):
        obs = greedy.buffer.obs[a * 1000 : a * 1000 + 16]
        with torch.no_grad():
            assert_greedy(greedy.buffer.actions[a * 1000 : a * 1000 + 16], member(greedy.net, a)(obs))


@pytest.mark.parametrize("k, env, fast", [(1, GYM, True), (1, GYM, False), (2, TENSOR, True)])
def test_greedy_acting_uses_the_weights_after_each_rounds_updates(k, env, fast):
    task = make(k=k, env=env, eps_start=0.0, eps_end=0.0, total_steps=64, gradient_steps=8, optimizer=sgd(1.0), seed=1,
                fast_acting=fast)
    nets = {}
    task.checkpoint_hook = lambda final=False: nets.setdefault(task.env_steps, [member(task.net, a) for a in range(k)])
    start = [member(task.net, a) for a in range(k)]
    fit(task)
    assert (task.fast_greedy is not None) is fast
    changed = 0
    for a in range(k):
        for r, acting in enumerate([start[a]] + [nets[s][a] for s in (16, 32, 48)]):
            rows = slice(a * 1000 + 16 * r, a * 1000 + 16 * (r + 1))
            with torch.no_grad():
                assert_greedy(task.buffer.actions[rows], acting(task.buffer.obs[rows]))
                changed += int((start[a](task.buffer.obs[rows]).argmax(1) != task.buffer.actions[rows]).any())
    assert changed  # the updates changed some greedy choice, so stale weights would show


def test_a_non_finite_loss_stops_the_run_with_a_hint():
    from pipeline.tasks.base import NonFiniteLossError

    task = make(total_steps=32, learning_starts=NEVER)
    fit(task)
    with torch.no_grad():
        next(task.net.parameters())[0, 0, 0] = float("nan")
    with pytest.raises(NonFiniteLossError, match=r"^loss became nan at step 32; lower optimizer\.lr, use loss=huber or set task\.max_grad_norm$"):
        task.learn()


# ---- one update, by hand -----------------------------------------------------------------------


def update_by_hand(task, act, loss_fn, lr, gamma, double, clip, tau=None):
    """Redo `task.learn()` with plain networks, agent by agent: the expected online and target weights, losses and Qs."""
    K, G, B = len(task.slots), task.config.gradient_steps, task.config.batch_size
    online = [member(task.net, s, act) for s in range(K)]
    target = [member(task.target_net, s, act) for s in range(K)]
    generators = []
    for g in task.generators:
        generators.append(torch.Generator())
        generators[-1].set_state(g.get_state())
    batches = task.buffer.sample(G, B, generators)
    losses, qs = np.zeros((K, G)), np.zeros((K, G))
    for g in range(G):
        for i in range(K):
            obs, actions, rewards, next_obs, dones = (x[g, i] for x in batches)
            with torch.no_grad():
                next_q = target[i](next_obs)
                if double:
                    value = next_q.gather(1, online[i](next_obs).argmax(1, keepdim=True)).squeeze(1)
                else:
                    value = next_q.max(1).values
                y = rewards + gamma * (1 - dones) * value
            q = online[i](obs).gather(1, actions.view(-1, 1)).squeeze(1)
            loss = loss_fn(q, y)
            online[i].zero_grad()
            loss.backward()
            if clip:
                nn.utils.clip_grad_norm_(online[i].parameters(), clip)
            with torch.no_grad():
                for p in online[i].parameters():
                    p -= lr * p.grad
                if tau is not None:
                    for t, p in zip(target[i].parameters(), online[i].parameters()):
                        t.copy_(tau * p + (1 - tau) * t)
            losses[i, g], qs[i, g] = loss.item(), q.mean().item()
    return online, target, losses.mean(1), qs.mean(1)


UPDATES = {
    "k1-huber-relu": dict(k=1, loss=nn.SmoothL1Loss(), act="relu", double=False, clip=10.0),
    "k2-mse-relu-clipped": dict(k=2, loss=nn.MSELoss(), act="relu", double=False, clip=0.05),
    "k2-huber-tanh-double": dict(k=2, loss=nn.SmoothL1Loss(), act="tanh", double=True, clip=None),
    "k3-huber-tanh-clipped": dict(k=3, loss=nn.SmoothL1Loss(), act="tanh", double=False, clip=0.05),
    "k2-mse-relu-double-clipped": dict(k=2, loss=nn.MSELoss(), act="relu", double=True, clip=0.05),
    "k1-mse-tanh-clipped": dict(k=1, loss=nn.MSELoss(), act="tanh", double=False, clip=0.05),
    "k2-l1-relu": dict(k=2, loss=nn.L1Loss(), act="relu", double=False, clip=None),
}


@pytest.mark.parametrize("case", sorted(UPDATES))
def test_an_update_is_each_agents_own_td_step(case):
    """Agent i's update equals a one-agent update on its batch: TD target from ITS target net (which now differs
    from the online net), the loss averaged over its batch, its gradient clipped on its own, its own SGD step."""
    c = UPDATES[case]
    task = make(k=c["k"], act=c["act"], loss=c["loss"], double_dqn=c["double"], max_grad_norm=c["clip"], gamma=0.9,
                optimizer=sgd(0.2), total_steps=48, learning_starts=NEVER, gradient_steps=3, target_update_interval=NEVER)
    with torch.no_grad():  # agents far apart: later agents have larger weights, hence larger gradients
        for p in task.net.parameters():
            p.mul_(torch.arange(1, c["k"] + 1, dtype=p.dtype).view(-1, *[1] * (p.dim() - 1)))
    fit(task)
    with torch.no_grad():  # CartPole pays 1 a step: other rewards and ends, so each transition's own count
        g = torch.Generator().manual_seed(0)
        task.buffer.rewards.copy_(torch.randn(task.buffer.rewards.shape, generator=g))
        task.buffer.dones.copy_((torch.rand(task.buffer.dones.shape, generator=g) < 0.3).float())
    task.learn()  # the first update copies the online net into the target, then moves the online net
    task.log_progress()  # starts a fresh window of losses
    assert not same(member(task.net, 0, c["act"]), member(task.target_net, 0, c["act"]))
    loss_fn = type(c["loss"])()
    online, target, losses, qs = update_by_hand(task, c["act"], loss_fn, 0.2, 0.9, c["double"], c["clip"])
    task.learn()
    for i in range(c["k"]):
        assert same(member(task.net, i, c["act"]), online[i], atol=1e-5), i
        assert same(member(task.target_net, i, c["act"]), target[i], atol=0), i  # no copy within the interval
        assert task.updates[i] == 6
    task.log_progress()
    for i in range(c["k"]):
        row = task.curves[i].rows[48]
        assert row["train/loss"] == pytest.approx(losses[i], rel=1e-5)
        assert row["train/q_mean"] == pytest.approx(qs[i], rel=1e-5, abs=1e-6)


def test_soft_target_updates_after_every_gradient_step():
    task = make(k=2, target_update="soft", tau=0.25, optimizer=sgd(0.2), total_steps=32, learning_starts=NEVER,
                gradient_steps=3)
    fit(task)
    with torch.no_grad():  # a target apart from the online net, so the direction of the average shows
        for p in task.target_net.parameters():
            p.mul_(-2.0)
    online, target, _, _ = update_by_hand(task, "relu", nn.SmoothL1Loss(), 0.2, 0.99, False, 10.0, tau=0.25)
    task.learn()
    for i in range(2):
        assert same(member(task.net, i), online[i], atol=1e-5)
        assert same(member(task.target_net, i), target[i], atol=1e-5)


def test_the_hard_target_copy_comes_once_per_interval():
    """Copies at the first update and whenever env steps cross a multiple of target_update_interval (40 here).

    Rounds end at 16, 32, ..., 96 env steps and each learns: the copies happen in the rounds ending
    at 16, 48 and 80, each before that round's updates.
    """
    task = make(k=2, total_steps=96, target_update_interval=40, gradient_steps=1)
    after_round = []
    task.checkpoint_hook = lambda final=False: after_round.append(
        {"step": task.env_steps, "final": final, "net": [member(task.net, i) for i in range(2)],
         "target": [member(task.target_net, i) for i in range(2)]})
    start = [member(task.net, i) for i in range(2)]
    fit(task)
    # the hook runs after every round, then once more, final, when training ends
    assert [(r["step"], r["final"]) for r in after_round] == [(s, False) for s in (16, 32, 48, 64, 80, 96)] + [(96, True)]
    copied_from = {16: start, 32: start, 48: after_round[1]["net"], 64: after_round[1]["net"],
                   80: after_round[3]["net"], 96: after_round[3]["net"]}
    for r in after_round[:-1]:
        for i in range(2):
            assert same(r["target"][i], copied_from[r["step"]][i], atol=0), (r["step"], i)


# ---- the loop: rounds, learning starts, gradient steps, scheduler ------------------------------


def test_rounds_learning_starts_and_gradient_steps_are_counted():
    """total 40 in rounds of 16: rounds end at 16, 32 and 40 (the last one short); learning once 32 transitions are held."""
    task = make(k=2, total_steps=40, learning_starts=32, gradient_steps=3, optimizer=lambda p: torch.optim.SGD(p, lr=1.0),
                scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 1, 0.5))
    assert len(task.train_dataloader()) == 3 and task.iterations_left() == 3
    metrics = fit(task)
    assert task.env_steps == 40 and len(task.buffer) == 40
    assert task.updates == [6, 6]  # rounds 2 and 3, three updates each
    assert [m["train/updates"] for m in metrics] == [6.0, 6.0]
    # the scheduler steps once per round that learned
    assert task.optimizers().optimizer.param_groups[0]["lr"] == 0.25
    short = make(total_steps=33, learning_starts=NEVER)  # a last round of one env step
    fit(short)
    assert short.env_steps == 33
    none = make(total_steps=32, gradient_steps=0, scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 1, 0.5))
    fit(none)
    assert none.updates == [0] and none.optimizers().optimizer.param_groups[0]["lr"] == 0.05


def test_envs_per_agent_share_the_rounds_env_steps():
    task = make(k=2, envs_per_agent=4, total_steps=40, train_frequency=16, learning_starts=NEVER)
    fit(task)
    # rounds: 4 steps of 4 envs, twice, then ceil(8 / 4) = 2 steps of 4 envs
    assert task.env_steps == 40 and len(task.buffer) == 40 and task.env.num_envs == 8
    task = make(total_steps=40, learning_starts=NEVER)
    task.env_steps = 24  # a resumed run: what is left is ceil(16 / 16) rounds
    assert task.iterations_left() == 1
    task.env_steps = 40
    assert task.iterations_left() == 0 and len(task.train_dataloader()) == 1  # a loader is never empty


def test_agent_i_of_a_batch_trains_like_the_agent_of_its_seed_in_another_batch():
    """With updates, Adam and clipping: agent 1 of seeds 3-4 ends with the weights and curves of agent 0 of seeds 4-5.

    Both batches run the same code on the same shapes (a member's products are its own bmm entries), so the
    greedy decisions are the same ones on any CPU; against a single run (another kernel for K = 1) a near tie
    could flip an argmax and the episodes part, so that comparison stops at the initial weights."""
    common = dict(total_steps=96, gradient_steps=2, eval_every=48, eval_episodes=2, log_every=32,
                  optimizer=lambda p: torch.optim.Adam(p, lr=0.01), max_grad_norm=0.5)
    for env in (TENSOR, GYM):
        batch, other, single = make(k=2, seed=3, env=env, **common), make(k=2, seed=4, env=env, **common), make(seed=4, env=env)
        start = (member(batch.net, 1).state_dict(), member(single.net, 0).state_dict())
        assert all(torch.equal(start[0][k], start[1][k]) for k in start[0])  # the single run's initialisation, exactly
        fit(batch), fit(other)
        assert same(member(batch.net, 1), member(other.net, 0), atol=1e-6)
        assert batch.evaluations[1] == other.evaluations[0]
        assert batch.episode_returns[1] == other.episode_returns[0]
        assert not same(member(batch.net, 0), member(batch.net, 1))
        for step in (32, 64, 96):
            a, b = batch.curves[1].rows[step], other.curves[0].rows[step]
            assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-5), (env, step)


# ---- evaluation, the stop, the record ----------------------------------------------------------


def greedy_means(task, net, slots, agents, episodes, offset):
    """Each agent's greedy return under `net`'s member, by evaluate_agents on a plain copy."""
    out = []
    for slot, agent in zip(slots, agents):
        single = member(net, slot)
        returns = evaluate_agents(lambda obs, m=single: m(obs.flatten(0, 1)).argmax(-1).view(obs.shape[:2]), task.env_cfg,
                                  [task.agent_seeds[agent]], episodes, offset)
        out.append((float(returns.mean()), float(returns.std(unbiased=False))))
    return out


def test_evaluations_happen_when_env_steps_cross_eval_every():
    """Rounds end at 16, ..., 96; eval_every 40: evaluations at 48 and 80 (the rounds crossing 40 and 80), of the weights then."""
    task = make(k=2, total_steps=96, eval_every=40, eval_episodes=3, learning_starts=NEVER)
    expected = greedy_means(task, task.net, [0, 1], [0, 1], 3, EVAL_SEED_OFFSET)  # no learning: the weights stay
    fit(task)
    for a in range(2):
        assert [e[0] for e in task.evaluations[a]] == [48, 80]
        for step, mean, std in task.evaluations[a]:
            assert (mean, std) == pytest.approx(expected[a])
            assert task.curves[a].rows[step]["eval/return_mean"] == pytest.approx(expected[a][0])
            assert task.curves[a].rows[step]["eval/return_std"] == pytest.approx(expected[a][1])
        record = task.agent_record(a)
        assert record["evaluations"] == [{"env_step": s, "return_mean": m, "return_std": sd} for s, m, sd in task.evaluations[a]]


def test_an_agent_that_reaches_stop_at_return_leaves_the_batch_and_the_others_carry_on():
    """Three agents with Adam; the one with the best first evaluation stops there. The other two end with exactly
    the weights they have in a run where nobody stops (their optimizer moments, replay, envs and draws are kept)."""
    common = dict(k=3, seed=1, total_steps=96, eval_every=32, eval_episodes=2, gradient_steps=2, envs_per_agent=2,
                  optimizer=lambda p: torch.optim.Adam(p, lr=0.01))
    free = make(**common)
    fit(free)
    first = [free.evaluations[a][0][1] for a in range(3)]
    best = int(np.argmax(first))
    assert sorted(first)[-1] > sorted(first)[-2]  # a single best agent (else the test would stop two)
    stop = (sorted(first)[-1] + sorted(first)[-2]) / 2
    task = make(**common, stop_at_return=stop, threshold=NEVER)
    metrics = fit(task)
    others = [a for a in range(3) if a != best]
    assert task.slots == others and task.stop_step[best] == 32 and task.stop_step[others[0]] is None
    assert task.early_stop[best] == {"env_step": 32, "reason": f"greedy evaluation mean {first[best]:.1f} >= stop_at_return {stop}"}
    assert task.early_stop[others[0]] is None and task.time_to_threshold_s == [None] * 3
    assert task.agent_env_steps(best) == 32 and task.agent_env_steps(others[0]) == 96
    assert task.total_env_steps() == 32 + 96 + 96
    assert len(task.evaluations[best]) == 1 and len(task.evaluations[others[0]]) == 3
    assert task.agent_record(best)["env_steps"] == 32 and task.agent_record(best)["early_stop"] == task.early_stop[best]
    # the stopped agent's record weights are its weights at the stop: those of the free run's agent at step 32
    assert same(member(task.agents_net, best), plain(free_weights_at(32, common)[best]), atol=1e-6)
    for slot, a in enumerate(others):
        assert same(member(task.net, slot), member(free.net, a), atol=1e-6), a
        assert same(member(task.agents_net, a), member(free.net, a), atol=1e-6), a
        assert task.updates[a] == free.updates[a]
    assert task.updates[best] < free.updates[best]
    # the final evaluation plays every agent's recorded weights
    final = greedy_means(task, task.agents_net, [0, 1, 2], [0, 1, 2], 1, FINAL_EVAL_SEED_OFFSET)
    assert [v for m in metrics for v in (m["eval/return_mean"], m["eval/return_std"])] == pytest.approx([v for f in final for v in f])
    for a in range(3):
        row = task.curves[a].rows[task.agent_env_steps(a)]
        assert row["final_eval/return_mean"] == pytest.approx(final[a][0])
        assert metrics[a]["train/episodes"] == len(task.episode_returns[a])


def free_weights_at(step, common):
    """Every agent's weights after the round ending at `step` of a run without stops."""
    task = make(**common)
    seen = {}
    task.checkpoint_hook = lambda final=False: seen.setdefault(task.env_steps, [task.net.member_state_dict(i) for i in range(3)])
    fit(task)
    return [{k: v.clone() for k, v in s.items()} for s in seen[step]]


def test_all_agents_stopping_ends_training_and_time_to_threshold_is_recorded():
    task = make(k=2, total_steps=96, eval_every=32, eval_episodes=1, stop_at_return=0.0, threshold=0.0, learning_starts=NEVER)
    fit(task)
    assert task.env_steps == 32 and task.slots == [] and task.stop_step == [32, 32]
    assert all(t is not None and 0 < t <= task.elapsed_s() for t in task.time_to_threshold_s)
    assert all(task.agent_record(a)["time_to_threshold_s"] == round(task.time_to_threshold_s[a], 3) for a in range(2))
    assert task.stop_time_s[0] is not None and task.agent_record(0)["env_steps_per_s"] == round(32 / task.stop_time_s[0], 1)
    # a threshold nobody reaches leaves it unset
    high = make(k=2, total_steps=32, eval_every=32, eval_episodes=1, threshold=10_000.0, learning_starts=NEVER)
    fit(high)
    assert high.time_to_threshold_s == [None, None] and high.agent_record(0)["time_to_threshold_s"] is None


def test_reaching_exactly_the_threshold_or_the_stop_counts_and_the_first_time_is_kept():
    probe = make(k=2, eval_episodes=2)
    (m0, _), (m1, _) = greedy_means(probe, probe.net, [0, 1], [0, 1], 2, EVAL_SEED_OFFSET)
    assert m0 != m1
    low, high = min(m0, m1), max(m0, m1)
    # no learning: every evaluation gives the same means; the threshold is the lower mean, the stop the higher
    task = make(k=2, total_steps=96, eval_every=32, eval_episodes=2, learning_starts=NEVER, threshold=low, stop_at_return=high)
    elapsed = {}
    task.checkpoint_hook = lambda final=False: elapsed.setdefault(task.env_steps, task.elapsed_s())
    fit(task)
    top = int(m1 > m0)
    assert task.stop_step[top] == 32 and task.stop_step[1 - top] is None and task.slots == [1 - top]
    # both reached the threshold at the first evaluation (32); later evaluations do not move the time
    assert all(0 < t <= elapsed[32] for t in task.time_to_threshold_s)


def test_the_tuner_sees_every_agents_last_evaluation_and_can_stop_them_all():
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.ThresholdPruner(lower=10_000.0))
    trial = study.ask()
    task = make(k=3, total_steps=96, eval_every=32, eval_episodes=2, learning_starts=NEVER)
    task.trial_reporter = TrialReporter(trial)
    fit(task)
    means = [task.evaluations[a][0][1] for a in range(3)]
    assert trial.storage.get_trial(trial._trial_id).intermediate_values == {32: pytest.approx(fast_iqm(means))}
    assert task.env_steps == 32 and task.early_stop == [{"env_step": 32, "reason": PRUNED_REASON}] * 3


def test_logged_rows_and_the_shared_batch_rows():
    """log_every 96: rows at 96 and 192 (and at the end, 240); epsilon as used, recent returns, losses; each agent's rows
    to its own loggers (with one agent, the lifecycle hands it the trainer's), batch rows to the trainer's loggers."""
    for k in (1, 2):
        shared = CurveLog(f"/nonexistent-shared-{k}.csv", step_key="env_step", flush_every_s=NEVER)
        task = make(k=k, total_steps=240, log_every=96, eval_every=240, eps_duration=200, eps_end=0.1, gradient_steps=1)
        tr = trainer(logger=CurveLogger(shared), log_every_n_steps=1)
        task.curves = [CurveLog(f"/nonexistent-rows-{k}-{i}.csv", flush_every_s=NEVER) for i in range(k)]
        own = [CurveLog(f"/nonexistent-own-{k}-{i}.csv", step_key="env_step", flush_every_s=NEVER) for i in range(k)]
        # as the lifecycle sets them: one agent logs to the trainer's loggers, each of several to its seed's own
        task.agent_loggers = [tr.loggers] if k == 1 else [[CurveLogger(log)] for log in own]
        metrics = task.fit_and_evaluate(tr, None, None)
        # The progress bar counts env steps of the budget from task.progress(); nothing is logged for it per step.
        assert tr.progress_bar_metrics == {} and task.progress()[:3] == (240, 240, "env steps")
        rows = task.curves[0].rows
        assert {s for s, r in rows.items() if "train/epsilon" in r} == {96, 192, 240}
        for step in (96, 192, 240):
            assert rows[step]["train/epsilon"] == pytest.approx(epsilon_at(step, 1.0, 0.1, 200))
            assert rows[step]["perf/env_steps_per_s"] > 0
            assert {"train/loss", "train/q_mean", "train/episodic_return"} <= set(rows[step])
        assert rows[240]["train/episodic_return"] == pytest.approx(np.mean(task.episode_returns[0][-10:]))
        assert len(task.episode_returns[0]) > 10  # the mean is over the last ten only
        # the last row's rate is the run's: env steps over training seconds (as the record's)
        assert rows[240]["perf/env_steps_per_s"] == pytest.approx(240 / task._train_seconds, rel=0.05)
        if k == 1:  # one agent: every row of its curve also goes to the trainer's loggers, and nothing else
            assert shared.rows == rows
        else:
            assert [log.rows for log in own] == [curve.rows for curve in task.curves]  # each agent's rows to its own
            assert task.curves[0].rows != task.curves[1].rows
            assert {key for r in shared.rows.values() for key in r} == {
                "batch/env_steps_per_s", "batch/eval_return_mean", "batch/agents_learning", "batch/final_eval_return_mean"}
            assert shared.rows[240]["batch/env_steps_per_s"] == pytest.approx(480 / task._train_seconds, rel=0.05)
            assert shared.rows[240]["batch/eval_return_mean"] == pytest.approx(np.mean([task.evaluations[a][0][1] for a in range(2)]))
            assert shared.rows[240]["batch/agents_learning"] == 2.0
            assert shared.rows[240]["batch/final_eval_return_mean"] == pytest.approx(np.mean([m["eval/return_mean"] for m in metrics]))
        assert {"act", "env", "learn", "log", "eval", "final_eval"} <= set(task.time_breakdown_s)


@pytest.mark.parametrize("k, env", [(2, TENSOR), (1, GYM)])
def test_time_breakdown_fits_in_the_wall_time(k, env):
    import time

    task = make(k=k, env=env, total_steps=64, eval_every=32, log_every=32)
    t0 = time.perf_counter()
    fit(task)
    wall = time.perf_counter() - t0
    parts = task.time_breakdown_s
    assert set(parts) == {"act", "env", "learn", "eval", "log", "final_eval"}
    assert all(v > 0 for v in parts.values()) and sum(parts.values()) <= wall
    assert 0 < task.elapsed_s() <= wall and task._train_seconds > 0


@pytest.mark.parametrize("k, env", [(2, TENSOR), (1, GYM)])
def test_acting_time_is_summed_over_every_step_of_a_round(k, env, monkeypatch):
    import itertools
    import sys
    import time

    # greedy through torch (no numpy mirror): choosing an action costs about as much as an env step
    task = make(k=k, env=env, total_steps=16, learning_starts=NEVER, eps_start=0.0, eps_end=0.0, fast_acting=False)
    task.curves = [CurveLog(f"/nonexistent-t-{i}.csv", flush_every_s=NEVER) for i in range(k)]
    trainer().fit(task)  # (no final evaluation: the env stays open)
    act, env_s = task.time_breakdown_s["act"], task.time_breakdown_s["env"]
    # A clock that ticks once per reading: what the round adds up is then a count of timed intervals, the same
    # on a quiet machine and a loaded one (a real clock would put a preemption into whichever part was running).
    # Only the task's own readings tick (its module's and RLTask's `step_envs`) (gymnasium's episode statistics read the same clock inside a step).
    ticks, now = itertools.count(1), [0.0]

    def clock() -> float:
        if sys._getframe(1).f_globals.get("__name__") in (DQNTask.__module__, RLTask.__module__):
            now[0] = float(next(ticks))
        return now[0]

    with monkeypatch.context() as m:
        m.setattr(time, "perf_counter", clock)
        task.collect(300)
    act, env_s = task.time_breakdown_s["act"] - act, task.time_breakdown_s["env"] - env_s
    # Every one of the 300 steps is timed, once, in each part (a few more readings around the round are allowed).
    assert 300 <= act <= 303 and 300 <= env_s <= 303, (act, env_s)


def test_the_record_of_each_agent():
    task = make(k=2, total_steps=32, eval_every=32)
    fit(task)
    record = task.agent_record(1)
    assert record["env_id"] == "CartPole-v1" and record["env_steps"] == 32 and record["threshold"] == 475.0
    assert record["metric_bounds"] == {"eval/return_mean": [0.0, 500.0], "train/episodic_return": [0.0, 500.0]}
    assert record["replay_bytes_per_transition"] == 48 and record["early_stop"] is None
    assert record["env_steps_per_s"] == round(32 / task._train_seconds, 1)
    task._train_seconds = 0.3  # rates in env steps per second, to one decimal
    assert task.agent_record(1)["env_steps_per_s"] == 106.7 and task.agent_record(1)["batch_env_steps_per_s"] == 213.3
    assert "replay_restored_on_resume" not in record
    single = make(total_steps=16)
    fit(single)
    assert "batch_env_steps_per_s" not in single.agent_record(0)
    # model.pt's weights: the plain network of that agent
    state = task.agent_state_dict(1)
    assert all(not v.requires_grad for v in state.values())
    assert same(plain(state), member(task.agents_net, 1), atol=0)
    assert same(member(task.agents_net, 1), member(task.net, 1), atol=0)  # at the end, every learning agent is recorded


def noisy_net(in_features, out_features):
    return NoisyQNet(in_features, out_features, hidden=(8,), sigma0=2.0)


@pytest.mark.parametrize("env", [TENSOR, GYM])
def test_greedy_evaluation_of_a_noisy_net_ignores_the_noise_draw(env):
    """Evaluations are greedy: a noisy net is evaluated on its mean weights, so its returns cannot depend on the noise."""
    task = make(k=2, env=env, net=noisy_net)
    draws = []
    for noise_seed in (1, 2, 3):
        task.net.reset_noise([torch.Generator().manual_seed(noise_seed * 10 + i) for i in range(2)])
        draws.append(task.evaluation_returns(4, EVAL_SEED_OFFSET, [0, 1]))
    assert all(np.array_equal(draws[0], d) for d in draws[1:])
    # the same as a plain evaluation of the noise-free (eval mode) net
    task.net.eval()
    expected = evaluate_agents(lambda obs: task.net(obs).argmax(-1), env, task.agent_seeds, 4, EVAL_SEED_OFFSET)
    assert np.array_equal(draws[0], expected.double().numpy())


@pytest.mark.parametrize("net", [noisy_net, lambda in_features, out_features: MLP(in_features, out_features, hidden=(8,), dropout=0.5)], ids=["noisy", "dropout"])
def test_every_evaluation_runs_the_net_in_eval_mode_and_training_resumes_in_train_mode(monkeypatch, net):
    """In-training evaluations, the stop rule's and the final one see net.training False; the learning net is back
    in train mode after each (noise and dropout on for acting and learning)."""

    task = make(k=2, net=net, total_steps=64, eval_every=16, stop_at_return=10**6)
    modes, train_modes_after = [], []
    real = rl_task.evaluate_agents

    def observed(policy, *args, **kwargs):
        hooks = [m.register_forward_pre_hook(lambda mod, inp: modes.append(mod.training)) for m in (task.net, task.agents_net)]
        try:
            return real(policy, *args, **kwargs)
        finally:
            for h in hooks:
                h.remove()
            train_modes_after.append(task.net.training)

    monkeypatch.setattr(rl_task, "evaluate_agents", observed)
    fit(task)
    assert len(train_modes_after) == 4 + 1  # an evaluation every 16 of 64 env steps, and the final one
    assert modes and not any(modes)
    assert all(train_modes_after)


# ---- checkpoints ---------------------------------------------------------------------------------


def stopped_at(step, breakdown=None, **hp):
    """A run that saves its checkpoint state after the round ending at `step` and stops there (as a kill would)."""
    task = make(**hp)
    task.time_breakdown_s = dict(breakdown or {})
    saved = {}

    def hook(final=False):
        if task.env_steps == step and not final:
            saved["state"] = task.checkpoint_state()
            task.trainer.should_stop = True

    task.checkpoint_hook = hook
    fit(task)
    return saved["state"]


@pytest.mark.parametrize("k, env", [(1, GYM), (2, TENSOR), (2, GYM)])
def test_a_resumed_run_continues_exactly(k, env):
    hp = dict(k=k, env=env, total_steps=96, eval_every=32, eval_episodes=1, log_every=32, gradient_steps=2,
              optimizer=lambda p: torch.optim.Adam(p, lr=0.01), scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 2, 0.5))
    whole = make(**hp)
    fit(whole)
    state = stopped_at(48, breakdown={"earlier_segment": 2.5}, **hp)  # after 3 scheduler steps: mid-period
    assert state["progress"]["env_steps"] == 48 and state["replay"] is not None and state["format"] == "pipeline.dqn/4"
    resumed = make(**hp)
    resumed.load_checkpoint_state(state)
    assert resumed.resume_step == 48
    fit(resumed)
    for i in range(k):
        assert same(member(resumed.net, i), member(whole.net, i), atol=0)
        assert same(member(resumed.target_net, i), member(whole.target_net, i), atol=0)
        assert resumed.evaluations[i] == whole.evaluations[i] and resumed.updates[i] == whole.updates[i]
        assert resumed.episode_returns[i] == whole.episode_returns[i]
        assert resumed.agent_record(i)["replay_restored_on_resume"] is True
        for step in (64, 96):  # the rows after the resume, the first one's losses from both sides of it
            assert {k: v for k, v in resumed.curves[i].rows[step].items() if not k.startswith("perf/")} == {
                k: v for k, v in whole.curves[i].rows[step].items() if not k.startswith("perf/")}
        assert set(resumed.curves[i].rows) == {64, 96}  # a log row at 64 (log_every 32 after 32), not at 48
    assert resumed.optimizers().optimizer.param_groups[0]["lr"] == whole.optimizers().optimizer.param_groups[0]["lr"]
    assert resumed.elapsed_s() >= state["elapsed_s"] > 0
    assert resumed.time_breakdown_s["earlier_segment"] == 2.5  # the earlier segments' time is carried on
    assert resumed.optimizers().optimizer.param_groups[0]["lr"] == 0.01 * 0.5**3  # 6 learning rounds, halved every 2


def test_a_resume_without_the_replay_refills_it_and_says_so():
    state = stopped_at(32, k=2, total_steps=64, save_replay=False)
    assert state["replay"] is None
    resumed = make(k=2, total_steps=64, learning_starts=32)
    resumed.load_checkpoint_state(state)
    fit(resumed)
    assert resumed.agent_record(0)["replay_restored_on_resume"] is False
    # 2 updates in each of the rounds ending at 16 and 32 before the checkpoint; after it the empty replay holds
    # 16 transitions at 48 (under learning_starts: no update) and 32 at 64: one more learning round
    assert len(resumed.buffer) == 32 and resumed.updates == [6, 6]


def test_a_scheduler_added_on_resume_starts_fresh():
    state = stopped_at(16, total_steps=32)  # a run without a scheduler
    resumed = make(total_steps=32, optimizer=lambda p: torch.optim.SGD(p, lr=1.0),
                   scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 1, 0.5))
    resumed.load_checkpoint_state(state)
    fit(resumed)
    # the checkpoint's optimizer (lr 0.05) is restored; the new scheduler halves it once, in the one round left
    assert resumed.optimizers().optimizer.param_groups[0]["lr"] == 0.025


def test_the_replay_is_saved_when_it_fits_in_replay_save_max_mb():
    task = make(k=2, total_steps=32, learning_starts=NEVER)
    fit(task)
    held_mb = 2 * 32 * 48 / 2**20
    for save_replay, max_mb, kept in [("auto", held_mb, True), ("auto", held_mb * 0.999, False), (True, 0.0, True), (False, 1e9, False)]:
        task.config.save_replay, task.config.replay_save_max_mb = save_replay, max_mb
        assert (task.checkpoint_state()["replay"] is not None) is kept, (save_replay, max_mb)


def test_resuming_where_an_agent_had_stopped_keeps_only_the_learning_agents():
    hp = dict(k=3, seed=1, total_steps=96, eval_every=32, eval_episodes=2, gradient_steps=2)
    free = make(**hp)
    fit(free)
    first = [free.evaluations[a][0][1] for a in range(3)]
    assert sorted(first)[-1] > sorted(first)[-2]
    hp["stop_at_return"] = (sorted(first)[-1] + sorted(first)[-2]) / 2
    best = int(np.argmax(first))
    whole = make(**hp)
    fit(whole)
    state = stopped_at(64, **hp)
    resumed = make(**hp)
    resumed.load_checkpoint_state(state)
    assert resumed.slots == whole.slots and len(resumed.slots) == 2 and best not in resumed.slots
    fit(resumed)
    for slot in range(2):
        assert same(member(resumed.net, slot), member(whole.net, slot), atol=0)
    for a in range(3):
        assert same(member(resumed.agents_net, a), member(whole.agents_net, a), atol=0)
    assert resumed.stop_step == whole.stop_step and resumed.early_stop == whole.early_stop


def test_a_finished_run_is_not_trained_again_and_bad_checkpoints_are_refused():
    state = stopped_at(32, k=2, total_steps=32)  # the last round's checkpoint: the budget is spent
    again = make(k=2, total_steps=32)
    again.load_checkpoint_state(state)
    assert again.elapsed_s() == state["elapsed_s"] > 0  # the earlier segment's training time, nothing running
    assert [m["train/updates"] for m in fit(again)] == [4.0, 4.0]
    assert not hasattr(again, "buffer") and again.env_steps == 32
    # no training in this segment: no rate to report
    assert again.agent_record(0)["env_steps_per_s"] is None and again.agent_record(0)["batch_env_steps_per_s"] is None
    state = stopped_at(32, k=2, total_steps=32, eval_every=32, stop_at_return=0.0)
    assert state["slots"] == []
    again = make(k=2, total_steps=32, eval_every=32, stop_at_return=0.0)
    again.load_checkpoint_state(state)
    metrics = fit(again)  # only the final evaluation: no env, no buffer
    assert not hasattr(again, "buffer") and len(metrics) == 2 and again.stop_step == [32, 32]
    with pytest.raises(ValueError, match="checkpoint format 'other' is not 'pipeline.dqn/4'"):
        make(k=2).load_checkpoint_state({**state, "format": "other"})
    state = stopped_at(16, k=3, total_steps=32)
    with pytest.raises(ValueError, match=r"^checkpoint holds seeds 0\.\.2 \(3 agents\), this run has 1\.\.3; "
                                         r"resume with the same seed and seeds_per_process$"):
        make(k=3, seed=1).load_checkpoint_state(state)
    state = stopped_at(16, k=2, total_steps=32)
    with pytest.raises(ValueError, match=r"^checkpoint weights do not fit this model \(changed model\.\* since\?\): "
                                         r"Error\(s\) in loading state_dict for EnsembleMLP:$"):
        make(k=2, net=lambda in_features, out_features: MLP(in_features, out_features, hidden=(9,))).load_checkpoint_state(state)


def test_noisy_agents_learn_with_their_own_noise():
    """A noisy net explores by its noise only (epsilon 0), drawn from each agent's generator: agent 1 of a batch = seed 1 alone."""
    def noisy(in_features, out_features):
        return NoisyQNet(in_features, out_features, hidden=(8,))

    batch, single = make(k=2, net=noisy, total_steps=48), make(k=1, seed=1, net=noisy, total_steps=48)
    fit(batch), fit(single)
    a, b = batch.net.member_state_dict(1), single.net.member_state_dict(0)
    assert all(torch.allclose(a[key], b[key], atol=1e-5) for key in a)
    assert batch.updates == [6, 6] and batch.fast_greedy is None


def test_a_noisy_update_draws_fresh_noise_before_its_targets():
    """Each gradient step of a noisy net redraws both nets' noise from the agents' generators, then computes its
    targets and loss: redone here step by step on copies of the networks."""
    import copy

    def noisy(in_features, out_features):
        return NoisyQNet(in_features, out_features, hidden=(8,))

    task = make(k=2, net=noisy, total_steps=32, learning_starts=NEVER, gradient_steps=3, optimizer=sgd(0.1),
                max_grad_norm=None, target_update_interval=NEVER)
    fit(task)
    task.learn()  # the target now lags the online net
    net, target = copy.deepcopy(task.net), copy.deepcopy(task.target_net)
    generators = []
    for g in task.generators:
        generators.append(torch.Generator())
        generators[-1].set_state(g.get_state())
    batches = task.buffer.sample(3, 8, generators)
    for g in range(3):
        obs, actions, rewards, next_obs, dones = (x[g] for x in batches)
        net.reset_noise(generators)
        target.reset_noise(generators)
        with torch.no_grad():
            y = rewards + 0.99 * (1 - dones) * target(next_obs).max(-1).values
        q = net(obs).gather(2, actions.unsqueeze(2)).squeeze(2)
        net.zero_grad()
        nn.functional.smooth_l1_loss(q, y, reduction="none").mean(1).sum().backward()
        with torch.no_grad():
            for p in net.parameters():
                p -= 0.1 * p.grad
    task.learn()
    for (name, a), b in zip(task.net.state_dict().items(), net.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), name


ATARI = {"id": "ALE/Pong-v5", "backend": "gym", "kwargs": {"frame_skip": 4, "screen_size": 84, "noop_max": 30,
                                                            "frame_stack": 4, "terminal_on_life_loss": False, "clip_rewards": True}}


def test_image_observations_stay_uint8_from_the_env_to_the_replay():
    """Atari frames are stored as bytes: 4x less replay memory than float32, and the record says so."""
    task = make(env=ATARI, buffer_size=64)
    frame_bytes = 4 * 84 * 84
    assert task.obs_shape == (4, 84, 84) and task.replay_layout()["obs_dtype"] == torch.uint8
    # obs + next_obs as bytes, then action (int64), reward and done (float32).
    assert task.replay_bytes_per_transition == 2 * frame_bytes + 8 + 4 + 4
    task.on_fit_start()
    try:
        assert task.buffer.obs.dtype == torch.uint8 and task.buffer.next_obs.dtype == torch.uint8
        assert task.buffer.obs.shape[-3:] == (4, 84, 84)
    finally:
        task.env.close()

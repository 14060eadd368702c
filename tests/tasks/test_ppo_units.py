"""PPOTask's behaviours pinned on tiny setups, each test well under a second (mutation testing runs them).

The task is built by hand and driven through its hooks (no Lightning trainer except in one fit): a rollout is a
few lockstep steps of 2 CartPole (or Pendulum) tensor envs per agent with an 8-unit actor-critic. Expectations come
from outside the task: the rollout is replayed with a plain copy of the network on a fresh env, GAE is a loop
written here, an update is redone with a hand-written PPO loss, torch autograd, clip_grad_norm_ and Adam on a plain
ActorCritic, and a K-agent run is compared with the single runs of its seeds.
"""

import functools
import io
import time
from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pipeline.nets.actor_critic import ActorCritic
from pipeline.rl.vector import evaluate_agents, make_vector_env
from pipeline.tasks import base as ppo_base
from pipeline.tasks import ppo, rl_task
from pipeline.tasks.ppo import PPOTask
from pipeline.tune.pruning import PRUNED_REASON
from rl.test_acting import assert_greedy

CART = {"id": "CartPole-v1", "backend": "tensor", "dtype": "float64"}
PEND = {"id": "Pendulum-v1", "backend": "tensor", "dtype": "float64"}
NEVER = 10**9
LR = 0.01


def make(k=1, env=CART, hidden=(8,), lr=LR, **hp):
    settings = dict(total_steps=32, envs_per_agent=2, num_steps=4, num_minibatches=2, update_epochs=1, eval_every=NEVER,
                    log_every=NEVER, eval_episodes=1, final_eval_episodes=1)
    settings.update(hp)
    return PPOTask.create(net=functools.partial(ActorCritic, hidden=hidden), optimizer=functools.partial(torch.optim.Adam, lr=lr),
                          env=env, n_agents=k, **settings)


class Rows:
    def __init__(self):
        self.rows = []

    def log(self, step, row):
        self.rows.append((step, dict(row)))


def start(task):
    """What a fit does before its first step, without Lightning: the optimizer, the envs, the generators."""
    opt = task.configure_optimizers()
    task.optimizers = lambda: SimpleNamespace(optimizer=opt)
    task.curves = [Rows() for _ in range(task.n_agents)]
    task.on_fit_start()
    task.on_train_start()
    return opt


def plain(task, i, continuous=False):
    obs_dim, out = (3, 1) if continuous else (4, 2)
    net = ActorCritic(obs_dim, out, continuous=continuous, hidden=(8,))
    net.load_state_dict({k: v.detach().clone() for k, v in task.net.member_state_dict(i).items()})
    return net


def weights(task, i):
    return {k: v.detach().clone() for k, v in task.net.member_state_dict(i).items()}


def same(a, b, atol=0.0):
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=atol, rtol=0) for k in a)


# ---- construction and bad input ------------------------------------------------------------------


def test_bad_settings_are_refused_in_one_line():
    """The settings' ranges are the Config's (pipeline.tasks.configs, checked at start-up); what depends on the env is
    refused here."""
    for ok in (dict(total_steps=8), dict(gamma=0.0), dict(gamma=1.0), dict(gae_lambda=0.0), dict(gae_lambda=1.0),
               dict(num_minibatches=8), dict(num_steps=1, envs_per_agent=1, num_minibatches=1, total_steps=1)):
        make(**ok)
    with pytest.raises(ValueError, match=r"^task=ppo takes flat Box actions \(shape \(D,\)\); X has Box"):
        ppo.check_action_space("X", ppo.gym.spaces.Box(-1, 1, (2, 2)))
    with pytest.raises(ValueError, match=r"^task=ppo takes Discrete or Box action spaces; X has MultiBinary"):
        ppo.check_action_space("X", ppo.gym.spaces.MultiBinary(3))
    with pytest.raises(ValueError, match=r"and X's are not finite .*; rescale its actions to a bounded Box"):
        ppo.check_action_space("X", ppo.gym.spaces.Box(np.array([-1.0]), np.array([np.inf])))
    with pytest.raises(ValueError, match="are not finite"):
        ppo.check_action_space("X", ppo.gym.spaces.Box(np.array([-np.inf]), np.array([1.0])))
    ppo.check_action_space("X", ppo.gym.spaces.Box(-1, 1, (2,)))
    ppo.check_action_space("X", ppo.gym.spaces.Discrete(3))
    with pytest.raises(ValueError, match=r"^task=ppo runs in fp32; got device.precision=bf16-mixed, use device.precision=32-true$"):
        make().fit_and_evaluate(SimpleNamespace(precision="bf16-mixed"), None, None)
    # the env's kwargs reach the probe env
    with pytest.raises(TypeError, match="no_such_option"):
        make(env={"id": "CartPole-v1", "kwargs": {"no_such_option": 1}})


def test_what_the_task_reads_from_its_env_and_settings():
    task = make(k=2, seed=3, total_steps=36)
    assert task.agent_seeds == [3, 4] and task.obs_shape == (4,) and not task.continuous and task.action_shape == ()
    assert task.batch_per_agent == 8 and task.n_updates == 4  # 36 // 8
    assert task.threshold == 475.0 and make(threshold=100).threshold == 100.0
    assert task.obs_stats is None and task.reward_scaler is None and task.capture_video is False
    assert make(capture_video=True).capture_video is True
    assert task.env_cfg == CART and task.env_id == "CartPole-v1"
    assert task.automatic_optimization is False
    pend = make(env=PEND)
    assert pend.continuous and pend.obs_shape == (3,) and pend.action_shape == (1,)
    assert pend.action_low.tolist() == [-2.0] and pend.action_high.tolist() == [2.0]
    assert "action_low" not in pend.state_dict() and "action_high" not in pend.state_dict()  # not weights
    assert task.elapsed_s() == 0.0  # nothing trained yet
    fresh = task.agent_record(0)
    assert fresh["env_steps"] == 0 and fresh["env_steps_per_s"] is None and fresh["batch_env_steps_per_s"] is None
    assert rl_task.spaces_of("CartPole-v1", {})[1] == ppo.gym.spaces.Discrete(2) and task.observation_space.shape == (4,)
    # agent i starts as the single run of seed + i
    assert same(weights(task, 1), weights(make(seed=4), 0))
    assert not same(weights(task, 0), weights(task, 1))
    opt = task.configure_optimizers()
    assert task.base_lr == LR and len(opt.param_groups[0]["params"]) == len(list(task.net.parameters()))
    assert list(task.train_dataloader()) == [0, 1, 2, 3] and all(type(b) is int for b in task.train_dataloader())
    task.updates = 3
    assert list(task.train_dataloader()) == [0]
    task.updates = 9
    assert list(task.train_dataloader()) == [0]
    assert task.resume_step == 0
    task.env_steps = 17
    assert task.resume_step == 17


# ---- the rollout ---------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2])
def test_a_rollout_is_a_replay_of_the_env_and_the_network(k):
    """4 steps of 2 envs per agent with a 3-step time limit: each env is truncated once, at step 3, return 3."""
    env = {**CART, "kwargs": {"max_episode_steps": 3}}
    task = make(k=k, env=env, seed=5)
    start(task)
    nets = [plain(task, i) for i in range(k)]
    torch.manual_seed(11)
    batch = task.rollout()
    assert task.env_steps == 8
    assert task.episode_returns == [[3.0, 3.0]] * k
    assert task.episode_return.tolist() == [1.0] * (2 * k)  # one step into the next episodes
    assert {"act", "env"} <= set(task.time_breakdown_s)
    replay = make_vector_env(env, [5 + i for i in range(k)], 2)
    obs = replay.reset()
    torch.manual_seed(11)
    for t in range(4):
        o = obs.float().view(k, 2, 4)
        logits = torch.stack([nets[i](o[i])[0] for i in range(k)]).detach()
        values = torch.stack([nets[i](o[i])[1] for i in range(k)]).detach()
        u = torch.rand(logits.shape)
        # The Gumbel-max draw: the task's batched net and the plain nets round differently, so an action counts as
        # drawn where it is the argmax up to that rounding; the replay then steps with the task's actions.
        assert_greedy(batch.actions[t], logits - torch.log(-torch.log(u)))
        actions = batch.actions[t]
        assert torch.equal(batch.obs[t], o)
        assert torch.allclose(batch.log_probs[t], F.log_softmax(logits, -1).gather(-1, actions.unsqueeze(-1)).squeeze(-1))
        assert torch.allclose(batch.values[t], values)
        step = replay.step(actions.reshape(-1))
        assert torch.equal(batch.rewards[t], step.reward.view(k, 2))
        assert torch.equal(batch.terminated[t], step.terminated.view(k, 2))
        assert batch.truncated[t].tolist() == [[t == 2] * 2] * k
        if t == 2:
            final = step.final_obs.float().view(k, 2, 4)
            expected = torch.stack([nets[i](final[i])[1] for i in range(k)]).detach()
            assert torch.allclose(batch.final_values[t], expected)
            assert not torch.allclose(expected, torch.zeros_like(expected))
        else:
            assert torch.equal(batch.final_values[t], torch.zeros(k, 2))
        obs = step.obs
    assert torch.equal(task.obs, obs)
    last = obs.float().view(k, 2, 4)
    assert torch.allclose(batch.last_values, torch.stack([nets[i](last[i])[1] for i in range(k)]).detach())


def test_gaussian_actions_are_clipped_for_the_env_and_stored_unclipped():
    task = make(env=PEND, seed=2)
    start(task)
    with torch.no_grad():
        task.net.log_std.value.fill_(1.5)
    net = plain(task, 0, continuous=True)
    torch.manual_seed(4)
    batch = task.rollout()
    replay = make_vector_env(PEND, [2], 2)
    obs = replay.reset()
    torch.manual_seed(4)
    clipped = 0
    for t in range(4):
        o = obs.float().view(1, 2, 3)
        mean, value = (x.detach() for x in net(o[0]))
        noise = torch.randn(1, 2, 1)
        actions = mean + np.exp(1.5) * noise
        assert torch.equal(batch.obs[t], o)
        assert torch.allclose(batch.actions[t], actions)
        logp = (-0.5 * noise**2 - 1.5 - 0.5 * np.log(2 * np.pi)).sum(-1)
        assert torch.allclose(batch.log_probs[t], logp, atol=1e-5)
        assert torch.allclose(batch.values[t], value)
        clipped += int((actions.abs() > 2).sum())
        step = replay.step(actions.clamp(-2, 2).reshape(2, 1))
        obs = step.obs
    assert clipped > 0
    assert torch.allclose(task.obs, obs)
    # the deterministic policy is the mean clipped to the bounds
    means = torch.tensor([[[3.0], [-0.5], [-7.0]]])
    got = task.evaluation_policy(lambda x: (means, None), None)(torch.zeros(1, 3, 3))
    assert got.tolist() == [[[2.0], [-0.5], [-2.0]]]


def test_deterministic_discrete_actions_are_the_argmax():
    task = make()
    logits = torch.tensor([[[0.1, 0.3], [2.0, -1.0], [-5.0, 5.0]]])
    got = task.evaluation_policy(lambda x: (logits, None), None)(torch.zeros(1, 3, 4))
    assert got.tolist() == [[1, 0, 1]]


# ---- advantages ----------------------------------------------------------------------------------


def test_advantages_are_gae_with_the_truncation_bootstrap():
    """T=3, one agent, 2 envs: env 0 is truncated at t=1 (bootstraps from V(final obs)), env 1 terminates at t=1."""
    task = make(gamma=0.5, gae_lambda=0.5)
    f, t_ = False, True
    batch = ppo.Rollout(
        obs=None, actions=None, log_probs=None,
        rewards=torch.tensor([[[1.0, 1.0]], [[2.0, 2.0]], [[3.0, 3.0]]]),
        values=torch.tensor([[[0.5, 0.5]], [[1.0, 1.0]], [[2.0, 2.0]]]),
        terminated=torch.tensor([[[f, f]], [[f, t_]], [[f, f]]]),
        truncated=torch.tensor([[[f, f]], [[t_, f]], [[f, f]]]),
        final_values=torch.tensor([[[0.0, 0.0]], [[4.0, 9.0]], [[0.0, 0.0]]]),
        last_values=torch.tensor([[8.0, 8.0]]),
    )
    adv, ret = task.advantages(batch)
    # by hand, gamma = lambda = 0.5:
    # env 0: d2 = 3 + .5*8 - 2 = 5; d1 = 2 + .5*4 - 1 = 3 (truncated: V(final)=4, no carry); d0 = 1 + .5*1 - .5 = 1
    #        A2 = 5, A1 = 3, A0 = 1 + .25*3 = 1.75
    # env 1: d2 = 5; d1 = 2 - 1 = 1 (terminated: no bootstrap, no carry); d0 = 1; A0 = 1 + .25*1 = 1.25
    assert adv[:, 0].tolist() == [[1.75, 1.25], [3.0, 1.0], [5.0, 5.0]]
    assert ret[:, 0].tolist() == [[2.25, 1.75], [4.0, 2.0], [7.0, 7.0]]


def gae_by_hand(batch, gamma, lam, dtype=torch.float64):
    """GAE(lambda) of a rollout [T, K, E] written as the paper's loop, one env and one step at a time (in `dtype`;
    float32 rounds as the task's tensors do): the value a step leads to is V(final obs) where it was truncated,
    V(next obs) otherwise (the rollout's last values after the last step), nothing where it terminated; the
    recursion stops at every episode's end."""
    T, K, E = batch.rewards.shape
    g, gl = torch.tensor(gamma, dtype=dtype), torch.tensor(gamma * lam, dtype=dtype)
    adv = torch.zeros(T, K, E, dtype=dtype)
    for k in range(K):
        for e in range(E):
            running = torch.tensor(0.0, dtype=dtype)
            for t in reversed(range(T)):
                terminated, truncated = bool(batch.terminated[t, k, e]), bool(batch.truncated[t, k, e])
                if truncated:
                    following = batch.final_values[t, k, e]
                elif t == T - 1:
                    following = batch.last_values[k, e]
                else:
                    following = batch.values[t + 1, k, e]
                reward, value = batch.rewards[t, k, e].to(dtype), batch.values[t, k, e].to(dtype)
                delta = reward - value if terminated else reward + g * following.to(dtype) - value
                running = delta if terminated or truncated else delta + gl * running
                adv[t, k, e] = running
    return adv, adv + batch.values.to(dtype)


def test_the_task_calls_gae_with_its_own_gamma_and_lambda():
    """gamma 0.9 and lambda 0.5 (unequal: swapping them changes every advantage), on a real rollout of 2 agents with
    truncations: the task's advantages are the loop's above."""
    env = {**CART, "kwargs": {"max_episode_steps": 3}}
    task = make(k=2, env=env, seed=3, gamma=0.9, gae_lambda=0.5)
    start(task)
    batch = task.rollout()
    assert bool(batch.truncated.any())
    adv, ret = task.advantages(batch)
    want_adv, want_ret = gae_by_hand(batch, 0.9, 0.5)
    assert torch.allclose(adv.double(), want_adv, atol=1e-5) and torch.allclose(ret.double(), want_ret, atol=1e-5)
    swapped, _ = gae_by_hand(batch, 0.5, 0.9)
    assert not torch.allclose(swapped, want_adv, atol=1e-3)  # the case tells the two apart


# ---- an update -----------------------------------------------------------------------------------


def hand_update(net, batch, i, adv, ret, seed, lr, hp, n_minibatches=2, epochs=1):
    """PPO's minibatch updates of agent i redone on a plain ActorCritic with plain torch (categorical, or a
    diagonal Gaussian when the net has a log-std)."""
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)

    def flat(x):
        return x[:, i].reshape(-1, *x.shape[3:])

    obs, actions, old_logp, old_v = (flat(x) for x in (batch.obs, batch.actions, batch.log_probs, batch.values))
    adv, ret = flat(adv), flat(ret)
    n = obs.shape[0]
    c = hp["clip_coef"]
    for _ in range(epochs):
        perm = torch.randperm(n, generator=g)
        for idx in perm.view(n_minibatches, -1):
            params, v = net(obs[idx])
            if net.log_std is None:
                logp_all = F.log_softmax(params, -1)
                logp = logp_all.gather(-1, actions[idx].unsqueeze(-1)).squeeze(-1)
                ent = -(logp_all.exp() * logp_all).sum(-1).mean()
            else:
                log_std = net.log_std.value
                z = (actions[idx] - params) / log_std.exp()
                logp = (-0.5 * z**2 - log_std - 0.5 * np.log(2 * np.pi)).sum(-1)
                ent = (0.5 + 0.5 * np.log(2 * np.pi) + log_std).sum() * torch.ones(len(idx)).mean()
            a = adv[idx]
            if hp["norm_adv"]:
                a = (a - a.mean()) / (a.std() + 1e-8)
            ratio = torch.exp(logp - old_logp[idx])
            pg = torch.maximum(-a * ratio, -a * ratio.clamp(1 - c, 1 + c)).mean()
            err = (v - ret[idx]) ** 2
            if hp["clip_value_loss"]:
                moved = old_v[idx] + (v - old_v[idx]).clamp(-c, c)
                err = torch.maximum(err, (moved - ret[idx]) ** 2)
            vl = 0.5 * err.mean()
            loss = pg - hp["ent_coef"] * ent + hp["vf_coef"] * vl
            opt.zero_grad()
            loss.backward()
            if hp["max_grad_norm"] is not None:
                torch.nn.utils.clip_grad_norm_(net.parameters(), hp["max_grad_norm"])
            opt.step()
    return pg, vl, ent, logp, old_logp[idx]


HP = dict(clip_coef=0.2, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, norm_adv=True, clip_value_loss=True)
CASES = [
    dict(),
    dict(clip_coef=0.05, max_grad_norm=None),
    dict(norm_adv=False, clip_value_loss=False, ent_coef=0.3, vf_coef=2.0),
    dict(max_grad_norm=0.01),
    dict(clip_value_loss=False, clip_coef=1e-3, update_epochs=2),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_an_update_is_the_hand_written_ppo_step(case):
    hp = {**HP, **CASES[case]}
    task = make(seed=7, gamma=0.9, gae_lambda=0.8, **hp)
    start(task)
    torch.manual_seed(1)
    batch = task.rollout()
    adv, ret = gae_by_hand(batch, 0.9, 0.8, torch.float32)
    net = plain(task, 0)
    task.learn(batch)
    pg, vl, ent, logp, old = hand_update(net, batch, 0, adv, ret, 7, LR, hp, epochs=hp.get("update_epochs", 1))
    assert same(weights(task, 0), dict(net.state_dict()), atol=1e-6)
    assert task.updates == 1
    recent = task.recent
    assert recent["train/policy_loss"] == [pytest.approx(pg.item(), abs=1e-6)]
    assert recent["train/value_loss"] == [pytest.approx(vl.item(), abs=1e-6)]
    assert recent["train/entropy"] == [pytest.approx(ent.item(), abs=1e-6)]
    log_ratio = (logp - old).detach()
    kl = ((log_ratio.exp() - 1) - log_ratio).mean().item()
    clipfrac = ((log_ratio.exp() - 1).abs() > hp["clip_coef"]).float().mean().item()
    assert recent["train/approx_kl"] == [pytest.approx(kl, abs=1e-7)]
    assert recent["train/clipfrac"] == [pytest.approx(clipfrac)]
    assert recent["train/lr"] == [LR]


def test_a_gaussian_update_is_the_hand_written_ppo_step():
    task = make(env=PEND, seed=5, ent_coef=0.5, max_grad_norm=None)
    start(task)
    with torch.no_grad():
        task.net.log_std.value.fill_(-0.3)
    torch.manual_seed(2)
    batch = task.rollout()
    adv, ret = gae_by_hand(batch, 0.99, 0.95, torch.float32)
    net = plain(task, 0, continuous=True)
    task.learn(batch)
    pg, vl, ent, _, _ = hand_update(net, batch, 0, adv, ret, 5, LR, {**HP, "ent_coef": 0.5, "max_grad_norm": None})
    assert same(weights(task, 0), dict(net.state_dict()), atol=1e-6)
    assert task.net.log_std.value.item() != pytest.approx(-0.3)  # the entropy bonus moved the log-std
    assert task.recent["train/entropy"] == [pytest.approx(ent.item(), abs=1e-6)]
    assert task.recent["train/policy_loss"] == [pytest.approx(pg.item(), abs=1e-6)]


def test_two_epochs_reshuffle_with_the_agents_generator():
    task = make(seed=3, update_epochs=2, num_minibatches=4, anneal_lr=False)
    start(task)
    torch.manual_seed(0)
    batch = task.rollout()
    adv, ret = gae_by_hand(batch, 0.99, 0.95, torch.float32)
    net = plain(task, 0)
    task.learn(batch)
    hand_update(net, batch, 0, adv, ret, 3, LR, HP, n_minibatches=4, epochs=2)
    assert same(weights(task, 0), dict(net.state_dict()), atol=1e-6)


def test_agent_i_of_a_batch_updates_like_the_single_run_of_its_seed():
    """Rollouts differ (the action noise is shared), so both learn from the same stored rollout."""
    pair, single = make(k=2, seed=3), make(seed=4)
    start(pair), start(single)
    torch.manual_seed(0)
    batch = pair.rollout()
    one = ppo.Rollout(*(v[:, 1:] for v in batch[:-1]), last_values=batch.last_values[1:])
    single.learn(one)
    before0 = weights(pair, 0)
    pair.learn(batch)
    assert same(weights(pair, 1), weights(single, 0), atol=1e-6)
    assert not same(weights(pair, 0), before0, atol=1e-4)  # agent 0 learnt too, from its own samples
    assert pair.recent["train/policy_loss"][1] == pytest.approx(single.recent["train/policy_loss"][0], abs=1e-6)
    assert pair.recent["train/lr"] == [LR, LR]


def test_gradients_are_clipped_per_agent():
    """A tiny max_grad_norm: each agent's step is clipped by its own norm, as its single run's is."""
    pair, single = make(k=2, seed=3, max_grad_norm=1e-3), make(seed=4, max_grad_norm=1e-3)
    start(pair), start(single)
    torch.manual_seed(0)
    batch = pair.rollout()
    batch = batch._replace(rewards=batch.rewards * torch.tensor([100.0, 1.0]).view(1, 2, 1))
    one = ppo.Rollout(*(v[:, 1:] for v in batch[:-1]), last_values=batch.last_values[1:])
    single.learn(one)
    pair.learn(batch)
    assert same(weights(pair, 1), weights(single, 0), atol=1e-6)


def test_the_learning_rate_is_annealed_linearly_over_the_iterations():
    task = make(total_steps=32)  # 4 iterations
    start(task)
    lrs = []
    for _ in range(4):
        task.learn(task.rollout())
        lrs.append(task.recent["train/lr"][0])
    assert lrs == pytest.approx([0.01, 0.0075, 0.005, 0.0025])
    flat = make(total_steps=32, anneal_lr=False)
    start(flat)
    for _ in range(2):
        flat.learn(flat.rollout())
    assert flat.recent["train/lr"] == [LR]


def test_a_non_finite_loss_stops_with_a_hint():
    task = make()
    start(task)
    batch = task.rollout()
    batch.rewards[0, 0, 0] = float("nan")
    with pytest.raises(ppo_base.NonFiniteLossError, match=r"^loss became nan at step 8; lower the learning rate or clip gradients$"):
        task.learn(batch)


# ---- normalisation -------------------------------------------------------------------------------


def test_observations_are_normalised_by_each_agents_running_statistics():
    task = make(k=2, seed=1, normalize_obs=True, obs_clip=10.0)
    start(task)
    reset = task.obs.view(2, 2, 4).double()
    assert torch.allclose(task.obs_stats.mean, reset.mean(1), atol=1e-4)
    batch = task.rollout()
    # the first step's inputs, normalised by gymnasium's running statistics of the two reset observations of each
    # agent (count from 1e-4, mean 0, variance 1; Chan et al.'s update), written out here
    n, c = 2, 1e-4
    mean = reset.mean(1) * n / (c + n)
    var = (c + reset.var(1, unbiased=False) * n + reset.mean(1) ** 2 * c * n / (c + n)) / (c + n)
    expected = (reset - mean.unsqueeze(1)) / torch.sqrt(var.unsqueeze(1) + 1e-8)
    assert torch.allclose(batch.obs[0].double(), expected, atol=1e-5)
    # the statistics hold every observation seen: the reset and one per step
    replay = make_vector_env(CART, [1, 2], 2)
    obs = [replay.reset().view(2, 2, 4)]
    for t in range(4):
        obs.append(replay.step(batch.actions[t].reshape(-1)).obs.view(2, 2, 4))
    seen = torch.stack(obs).transpose(0, 1).reshape(2, 10, 4).double()
    assert torch.allclose(task.obs_stats.mean, seen.mean(1), atol=1e-4)
    assert torch.allclose(task.obs_stats.var, seen.var(1, unbiased=False), atol=1e-4)
    assert task.obs_stats.count.tolist() == pytest.approx([10.0001, 10.0001])
    clipped, unclipped = make(normalize_obs=True, obs_clip=0.5), make(normalize_obs=True, obs_clip=10.0)
    start(clipped), start(unclipped)
    first, free = clipped.rollout().obs[0], unclipped.rollout().obs[0]
    assert torch.equal(first, free.clamp(-0.5, 0.5)) and (free.abs() > 0.5).any() and (free.abs() < 0.5).any()
    # the evaluation policy sees normalised observations too
    x = torch.randn(1, 3, 4)
    params, _ = clipped.net(clipped.obs_stats.normalize(x.float(), 0.5))
    assert torch.equal(clipped.evaluation_policy(clipped.net, None)(x), params.argmax(-1))


def test_evaluations_fold_nothing_into_the_observation_statistics(monkeypatch):
    """The statistics count exactly the training observations (2 resets + 8 rollout steps per agent, from 1e-4):
    neither the evaluations during training nor the final one add to them, and the stop rule's neither."""
    task = make(k=2, normalize_obs=True, total_steps=16, eval_every=8, eval_episodes=3, stop_at_return=-1.0)
    start(task)
    task.checkpoint_hook = None
    monkeypatch.setattr(PPOTask, "trainer", property(lambda self: SimpleNamespace(should_stop=False)))
    task.training_step(None, 0)  # a rollout, its update, then an evaluation (crosses 8): both agents pass and stop
    assert task.env_steps == 8 and all(e is not None for e in task.early_stop)
    assert task.obs_stats.count.tolist() == pytest.approx([1e-4 + 2 + 8] * 2, abs=1e-12, rel=0)
    before = {k: v.clone() for k, v in task.obs_stats.state_dict().items()}
    task.evaluation_returns(4, rl_task.FINAL_EVAL_SEED_OFFSET)
    assert same(task.obs_stats.state_dict(), before)


def test_each_finished_episode_is_credited_to_the_agent_whose_env_ran_it():
    """3 agents of 2 envs each, 30 steps of a fresh policy: episodes end at different steps in different envs, so each
    agent's list of finished returns is its own (row r of the vector env is agent r // 2's)."""
    task = make(k=3, seed=4, num_steps=30, total_steps=60, num_minibatches=1)
    start(task)
    batch = task.rollout()
    replay = make_vector_env(CART, [4, 5, 6], 2)
    replay.reset()
    running, expected = [0.0] * 6, [[], [], []]
    for t in range(30):
        step = replay.step(batch.actions[t].reshape(-1))
        for row in range(6):
            running[row] += float(step.reward[row])
            if bool(step.done[row]):
                expected[row // 2].append(running[row])
                running[row] = 0.0
    assert task.episode_returns == expected
    assert all(expected) and len({tuple(x) for x in expected}) == 3  # every agent finished episodes, none the same
    assert task.episode_return.tolist() == running


def test_rewards_are_scaled_for_learning_and_returns_stay_raw():
    env = {**CART, "kwargs": {"max_episode_steps": 3}}
    task = make(env=env, normalize_reward=True, reward_clip=0.5, gamma=0.5)
    start(task)
    batch = task.rollout()
    # every raw reward is 1; the first step's return std is ~0, so it scales far past the clip
    assert batch.rewards[0].tolist() == [[0.5, 0.5]]
    assert (batch.rewards <= 0.5).all() and (batch.rewards > 0).all()
    assert task.episode_returns == [[3.0, 3.0]]
    assert task.reward_scaler.gamma == 0.5
    # the accumulator restarted after the truncation at step 3: one reward since
    assert task.reward_scaler.returns.tolist() == [[1.0, 1.0]]
    unclipped = make(env=env, normalize_reward=True, reward_clip=1000.0)
    start(unclipped)
    # the first return is 1 everywhere: its variance (count from 1e-4, variance 1) is tiny
    var = (1e-4 + 1.0 * 1e-4 * 2 / 2.0001) / 2.0001
    assert unclipped.rollout().rewards[0, 0].tolist() == pytest.approx([1 / np.sqrt(var + 1e-8)] * 2, rel=1e-5)


# ---- the loop, logging, evaluation ---------------------------------------------------------------


def test_training_steps_count_log_and_evaluate_on_schedule(monkeypatch):
    task = make(k=2, total_steps=32, log_every=16, eval_every=24, eval_episodes=2)
    start(task)
    calls = []
    monkeypatch.setattr(rl_task, "evaluate_agents", lambda policy, env, seeds, n, offset, device: (
        calls.append((env, list(seeds), n, offset, task.updates)) or torch.tensor([[1.0, 3.0], [5.0, 9.0]])))
    shared = []
    task._log_shared = lambda metrics, step=None: shared.append((task.env_steps, dict(metrics)))
    saved = []
    # A checkpoint is taken between iterations: after a rollout AND its update (a resume neither loses an update nor
    # redoes a rollout), with the checkpoint's own counters saying so.
    task.checkpoint_hook = lambda final=False: saved.append((task.env_steps, task.updates, final))
    for i in range(4):
        assert task.training_step(None, i) is None
    assert task.env_steps == 32 and task.updates == 4
    assert saved == [(8, 1, False), (16, 2, False), (24, 3, False), (32, 4, False)]
    # crossing 24 once, after that iteration's update: the evaluation scores the updated policy
    assert calls == [(CART, [0, 1], 2, rl_task.EVAL_SEED_OFFSET, 3)]
    assert task.evaluations == [[(24, 2.0, 1.0)], [(24, 7.0, 2.0)]]
    rows = task.curves[1].rows
    logged_at = [s for s, r in rows if "perf/env_steps_per_s" in r]
    assert logged_at == [16, 32]
    step, row = rows[-1]
    assert set(row) == {"perf/env_steps_per_s", "train/policy_loss", "train/value_loss", "train/entropy", "train/approx_kl",
                        "train/clipfrac", "train/lr"} | ({"train/episodic_return"} if task.episode_returns[1] else set())
    assert row["train/lr"] == pytest.approx(LR * 0.25)
    assert row["train/policy_loss"] == task.recent["train/policy_loss"][1]
    assert (24, {"eval/return_mean": 7.0, "eval/return_std": 2.0}) in rows
    assert (24, {"batch/eval_return_mean": 4.5, "batch/agents_learning": 2.0}) in shared
    assert [s for s, m in shared if "batch/env_steps_per_s" in m] == [16, 32]
    assert task.last_log_step == 32
    # the batch rate is K times the per-agent rate
    (rate,) = [m["batch/env_steps_per_s"] for s, m in shared if s == 32]
    assert rate == pytest.approx(2 * row["perf/env_steps_per_s"], rel=0.2)
    # once every iteration is done, a further step stops the fit
    task._trainer = None
    stopped = SimpleNamespace(should_stop=False)
    monkeypatch.setattr(PPOTask, "trainer", property(lambda self: stopped))
    assert task.training_step(None, 4) is None and stopped.should_stop and task.env_steps == 32
    # the end of training logs what is new and saves the final checkpoint
    task.on_train_end()
    assert saved[-1] == (32, 4, True) and len([r for s, r in rows if "perf/env_steps_per_s" in r]) == 2
    task.env_steps = 40
    task.on_train_end()
    assert [s for s, r in task.curves[1].rows if "perf/env_steps_per_s" in r] == [16, 32, 40]


def test_episodic_return_is_the_mean_of_the_last_ten():
    task = make()
    task.curves = [Rows()]
    task.episode_returns = [[100.0] + [float(i) for i in range(10)]]
    task._t_train_start = None
    task._elapsed_before = 2.0
    task.env_steps = 10
    task.log_progress()
    (step, row), = task.curves[0].rows
    assert step == 10 and row == {"perf/env_steps_per_s": 5.0, "train/episodic_return": 4.5}
    task.episode_returns = [[]]
    task._elapsed_before = 0.0
    task.log_progress()
    assert task.curves[0].rows[-1][1] == {"perf/env_steps_per_s": 10 / 1e-9}


def test_a_pruned_trial_stops_the_fit(monkeypatch):
    task = make(k=2)
    start(task)
    monkeypatch.setattr(rl_task, "evaluate_agents", lambda *a, **kw: torch.tensor([[1.0, 3.0], [5.0, 7.0]]))
    stopped = SimpleNamespace(should_stop=False)
    monkeypatch.setattr(PPOTask, "trainer", property(lambda self: stopped))
    reports = []
    task.trial_reporter = SimpleNamespace(report=lambda step, values: reports.append((step, values)) or len(reports) > 1)
    task.env_steps = 8
    task.evaluate_now()
    assert reports == [(8, [2.0, 6.0])] and not stopped.should_stop
    task.evaluate_now()
    assert task.slots == [] and "eval" in task.time_breakdown_s
    assert task.early_stop == [{"env_step": 8, "reason": PRUNED_REASON}] * 2
    task.checkpoint_hook = None
    task.updates = 0
    assert task.training_step(None, 0) is None and stopped.should_stop and task.env_steps == 8  # nothing more runs


def test_evaluation_plays_each_agents_deterministic_policy_on_its_own_seeds():
    task = make(k=2, seed=6)
    got = task.evaluation_returns(2, rl_task.EVAL_SEED_OFFSET)
    assert got.dtype == np.float64 and got.shape == (2, 2)
    # Whole episodes follow argmax decisions, so the expected ones run through the same batched network (a plain net
    # rounds differently and may flip a near tie); that member i is agent i's policy is checked against plain nets.
    obs = torch.randn(2, 200, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert_greedy(task.net(obs)[0].argmax(-1), torch.stack([plain(task, i)(obs[i])[0] for i in range(2)]))

    def policy(obs):
        return task.net(obs.float())[0].argmax(-1)

    expected = evaluate_agents(policy, CART, [6, 7], 2, rl_task.EVAL_SEED_OFFSET)
    assert got.tolist() == expected.double().tolist()
    assert rl_task.EVAL_SEED_OFFSET == 10_000 and rl_task.FINAL_EVAL_SEED_OFFSET == 20_000


def trainer():
    return L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)


def test_a_fit_trains_every_iteration_and_scores_the_final_policy(monkeypatch):
    task = make(k=2, total_steps=16, final_eval_episodes=3)
    task.curves = [Rows(), Rows()]
    offsets = []
    real = rl_task.evaluate_agents
    monkeypatch.setattr(rl_task, "evaluate_agents", lambda *a, **kw: offsets.append((a[3], a[4])) or real(*a, **kw))
    shared = []
    monkeypatch.setattr(PPOTask, "_log_shared", lambda self, metrics, step=None: shared.append(dict(metrics)))
    metrics = task.fit_and_evaluate(trainer(), None, None)
    assert task.updates == 2 and task.env_steps == 16 and offsets == [(3, rl_task.FINAL_EVAL_SEED_OFFSET)]
    nets = [plain(task, i) for i in range(2)]
    expected = evaluate_agents(lambda obs: torch.stack([nets[i](obs[i].float())[0].argmax(-1) for i in range(2)]),
                               CART, [0, 1], 3, rl_task.FINAL_EVAL_SEED_OFFSET).double().numpy()
    for i in range(2):
        assert metrics[i] == {"eval/return_mean": pytest.approx(expected[i].mean()), "eval/return_std": pytest.approx(expected[i].std()),
                              "train/episodes": float(len(task.episode_returns[i])), "train/updates": 2.0}
        assert task.curves[i].rows[-1] == (16, {"final_eval/return_mean": pytest.approx(expected[i].mean()),
                                                "final_eval/return_std": pytest.approx(expected[i].std())})
    assert shared[-1] == {"batch/final_eval_return_mean": pytest.approx(expected.mean())}
    assert task.final_metrics == metrics and "final_eval" in task.time_breakdown_s and task._train_seconds > 0
    # a finished run is not trained again: only the final evaluation is redone
    before = weights(task, 0)
    task.fit_and_evaluate(trainer(), None, None)
    assert task.updates == 2 and same(weights(task, 0), before)
    rec = task.agent_record(1)
    assert rec["env_steps"] == 16 and rec["batch_env_steps_per_s"] == round(2 * 16 / task._train_seconds, 1)
    assert "batch_env_steps_per_s" not in make().agent_record(0)
    sd = task.agent_state_dict(1)
    assert same(sd, weights(task, 1)) and all(v.device.type == "cpu" and not v.requires_grad for v in sd.values())


# ---- checkpoints ---------------------------------------------------------------------------------


def saved_and_loaded(state):
    """Through a file, as the lifecycle keeps it (plain values: weights_only loads)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("hp", [dict(), dict(normalize_obs=True, normalize_reward=True)])
def test_a_resumed_run_continues_exactly(hp):
    env = {**CART, "kwargs": {"max_episode_steps": 3}}
    task = make(k=2, env=env, seed=2, **hp)
    start(task)
    torch.manual_seed(0)
    task.learn(task.rollout())
    task.evaluations = [[(8, 1.0, 0.0)], [(8, 2.0, 0.5)]]
    task.time_to_threshold_s = [None, 1.5]
    task.last_log_step = 8
    state = saved_and_loaded(task.checkpoint_state())
    assert state["format"] == "pipeline.ppo/3" and state["agent_seeds"] == [2, 3] and state["progress"]["env_steps"] == 8
    assert state["progress"]["updates"] == 1 and state["config"]["normalize_obs"] == bool(hp)
    resumed = make(k=2, env=env, seed=2, **hp)
    assert resumed.load_checkpoint_state(state) == 8
    assert resumed.env_steps == 8 and resumed.updates == 1 and resumed.episode_returns == task.episode_returns
    assert resumed.evaluations == [[(8, 1.0, 0.0)], [(8, 2.0, 0.5)]] and resumed.time_to_threshold_s == [None, 1.5]
    assert resumed.recent == task.recent and resumed.last_log_step == 8
    assert resumed._elapsed_before == pytest.approx(state["elapsed_s"]) and resumed.time_breakdown_s == state["time_breakdown_s"]
    assert same(weights(resumed, 1), weights(task, 1))
    if hp:
        assert same(resumed.obs_stats.state_dict(), task.obs_stats.state_dict())
        assert same(resumed.reward_scaler.state_dict(), task.reward_scaler.state_dict())
    start(resumed)
    assert resumed._resume is None and torch.equal(resumed.obs, task.obs)
    assert torch.equal(resumed.episode_return, task.episode_return)
    if hp:  # the reset did not add to the restored statistics
        assert same(resumed.obs_stats.state_dict(), task.obs_stats.state_dict())
    # both go on from here identically: the same noise, shuffles, Adam moments, env states, statistics
    for run in (task, resumed):
        torch.manual_seed(9)
        run.learn(run.rollout())
    assert same(weights(resumed, 0), weights(task, 0)) and same(weights(resumed, 1), weights(task, 1))
    assert resumed.episode_returns == task.episode_returns and torch.equal(resumed.obs, task.obs)


def test_a_resume_restores_the_global_rng_and_generators():
    task = make(seed=2)
    start(task)
    torch.manual_seed(5)
    state = task.checkpoint_state()
    expected = torch.rand(3)
    g_expected = torch.randperm(8, generator=task.generators[0])
    resumed = make(seed=2)
    resumed.load_checkpoint_state(state)
    torch.manual_seed(99)
    start(resumed)
    assert torch.equal(torch.rand(3), expected)
    assert torch.equal(torch.randperm(8, generator=resumed.generators[0]), g_expected)


def test_bad_checkpoints_are_refused_in_one_line():
    task = make(k=2)
    start(task)
    state = task.checkpoint_state()
    with pytest.raises(ValueError, match=r"^checkpoint format 'x' is not 'pipeline.ppo/3'"):
        make(k=2).load_checkpoint_state({**state, "format": "x"})
    with pytest.raises(ValueError, match=r"^checkpoint weights do not fit this model \(changed model.\* since\?\): Error"):
        make(k=2, hidden=(4,)).load_checkpoint_state(state)
    with pytest.raises(ValueError, match="seeds"):
        make(k=2, seed=1).load_checkpoint_state(state)
    old = {k: v for k, v in state.items() if k != "time_breakdown_s"}
    fresh = make(k=2)
    fresh.load_checkpoint_state(old)
    assert fresh.time_breakdown_s == {}


# ---- more edges ------------------------------------------------------------------------------------


def test_missing_parts_and_wrong_networks_are_refused_in_one_line():
    opt = functools.partial(torch.optim.Adam, lr=LR)
    net = functools.partial(ActorCritic, hidden=(8,))
    with pytest.raises(ValueError, match=r"^task=ppo needs net: choose the network with model=actor_critic$"):
        PPOTask.create(optimizer=opt, env=CART)
    with pytest.raises(ValueError, match=r"^task=ppo needs optimizer: choose one with optimizer=adam\|sgd\|\.\.\.$"):
        PPOTask.create(net=net, env=CART)
    with pytest.raises(ValueError, match=r"^task=ppo needs env: choose an environment with env=cartpole\|pendulum\|\.\.\.$"):
        PPOTask.create(net=net, optimizer=opt)
    from pipeline.nets.mlp import MLP

    with pytest.raises(ValueError, match=r"^task=ppo needs model=actor_critic or .*; building <class 'pipeline.nets.mlp.MLP'> failed: .*'continuous'$"):
        PPOTask.create(net=functools.partial(MLP, hidden=(8,)), optimizer=opt, env=CART)

    def factory(in_features, out_features):
        return ActorCritic(in_features, out_features)

    with pytest.raises(ValueError, match=r"^task=ppo needs model=actor_critic or .*; building <function .*factory at 0x[0-9a-f]+> failed: .*'continuous'$"):
        PPOTask.create(net=factory, optimizer=opt, env=CART)
    # a partial of something else: its function is named
    with pytest.raises(ValueError, match=r"^task=ppo needs model=actor_critic .*; building <function .*factory at 0x[0-9a-f]+> failed: .*'continuous'$"):
        PPOTask.create(net=functools.partial(factory), optimizer=opt, env=CART)


def unbounded_pendulum(**kwargs):
    env = ppo.gym.make("Pendulum-v1", **kwargs)
    env.action_space = ppo.gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    return env


ppo.gym.register("PPOUnitsUnboundedPendulum-v0", entry_point=unbounded_pendulum, max_episode_steps=200)


def test_an_unbounded_action_space_is_named_in_the_refusal():
    with pytest.raises(ValueError, match=r"^task=ppo clips Gaussian actions to the action bounds, and PPOUnitsUnboundedPendulum-v0's are"):
        make(env={"id": "PPOUnitsUnboundedPendulum-v0"})


def test_the_time_breakdown_fits_in_the_wall_time_and_names_each_phase(monkeypatch):
    monkeypatch.setattr(PPOTask, "_log_shared", lambda self, metrics, step=None: None)
    t0 = time.perf_counter()
    task = make(k=2, total_steps=16, log_every=8, eval_every=8)
    task.curves = [Rows(), Rows()]
    task.fit_and_evaluate(trainer(), None, None)
    wall = time.perf_counter() - t0
    phases = task.time_breakdown_s
    assert set(phases) == {"act", "env", "learn", "log", "eval", "final_eval"}
    assert all(0 < v <= wall for v in phases.values()) and sum(phases.values()) <= wall
    assert 0 < task._train_seconds <= wall
    rec = task.agent_record(0)
    assert rec["env_steps_per_s"] == round(16 / task._train_seconds, 1)
    assert rec["metric_bounds"] == {"eval/return_mean": [0.0, 500.0], "train/episodic_return": [0.0, 500.0]}
    assert task.return_bounds == (0.0, 500.0)
    task._train_seconds = 3.0
    assert task.agent_record(0)["batch_env_steps_per_s"] == 10.7  # 2 * 16 / 3, one decimal
    assert task.episode_return.dtype == torch.float64


def test_one_agent_logs_no_batch_rows_and_the_fit_runs_only_when_iterations_are_left(monkeypatch):
    task = make(total_steps=16, log_every=8, eval_every=8)
    task.curves = [Rows()]
    shared, own = [], Rows()
    monkeypatch.setattr(PPOTask, "_log_shared", lambda self, metrics, step=None: shared.append(dict(metrics)))
    task.agent_loggers = [[SimpleNamespace(log_metrics=lambda metrics, step: own.log(step, metrics))]]  # the lifecycle's
    task.fit_and_evaluate(trainer(), None, None)
    # one agent: no batch rows; its rows (progress, evaluations, final) reach its loggers (the trainer's) as its curve
    assert shared == [] and len(own.rows) == len(task.curves[0].rows) >= 3
    assert own.rows == [(step, {"env_step": step, **row}) for step, row in task.curves[0].rows]
    assert {"final_eval/return_mean", "eval/return_mean"} <= {k for _, row in own.rows for k in row}
    fits = []

    class Closing:
        closed = 0

        def close(self):
            Closing.closed += 1

    done = SimpleNamespace(precision="32", fit=fits.append)
    task.env = Closing()
    task.fit_and_evaluate(done, None, None)  # updates == n_updates: no fit, only the final evaluation
    assert fits == [] and Closing.closed == 1
    fresh = make(total_steps=16)
    fresh.fit_and_evaluate(done, None, None)
    assert fits == [fresh] and not hasattr(fresh, "env")


@pytest.mark.parametrize("normalize_obs", [False, True])
def test_evaluations_note_the_time_to_threshold_and_hand_videos_each_agents_weights(monkeypatch, normalize_obs):
    task = make(k=2, threshold=5.0, video_every=1, normalize_obs=normalize_obs, obs_clip=7.0)
    start(task)
    monkeypatch.setattr(rl_task, "evaluate_agents", lambda *a, **kw: torch.tensor([[1.0, 3.0], [5.0, 7.0]]))
    videos = []
    task.video_hook = lambda agent, step, state, files: videos.append((agent, step, state, files))
    task._elapsed_before = 4.0
    task.evaluate_now()
    assert task.time_to_threshold_s[0] is None and task.time_to_threshold_s[1] >= 4.0
    assert [(a, s) for a, s, _, _ in videos] == [(0, 0), (1, 0)]
    assert same(videos[1][2], weights(task, 1))
    # With normalize_obs each agent's video plays through its own observation statistics (what model.pt's policy saw).
    for agent, _, _, files in videos:
        if not normalize_obs:
            assert files == {}
            continue
        stats = files["obs_norm.pt"]
        assert torch.equal(stats["mean"], task.obs_stats.mean[agent]) and torch.equal(stats["var"], task.obs_stats.var[agent])
        assert float(stats["clip"]) == 7.0 and float(stats["eps"]) == 1e-8
    if normalize_obs:
        assert not torch.equal(videos[0][3]["obs_norm.pt"]["mean"], videos[1][3]["obs_norm.pt"]["mean"])


def float64_torque_pendulum(**kwargs):
    env = ppo.gym.make("Pendulum-v1", **kwargs)
    env.action_space = ppo.gym.spaces.Box(-2.0, 2.0, (1,), np.float64)
    return env


ppo.gym.register("PPOUnitsFloat64Pendulum-v0", entry_point=float64_torque_pendulum, max_episode_steps=200)


def test_the_action_bounds_are_float32_whatever_the_spaces_dtype():
    """The env is sent float32 actions, as the policy makes them, even where the Box's bounds are float64."""
    task = make(env={"id": "PPOUnitsFloat64Pendulum-v0"})
    assert task.action_low.dtype == torch.float32 and task.action_high.dtype == torch.float32
    sent = task.evaluation_policy(lambda x: (torch.tensor([[[3.0], [-0.5], [-9.0]]]), None), None)(torch.zeros(1, 3, 3))
    assert sent.dtype == torch.float32 and sent.tolist() == [[[2.0], [-0.5], [-2.0]]]


# ---- agents that stop early ------------------------------------------------------------------------


def scripted_evaluations(monkeypatch, by_seed):
    """evaluate_agents replaced: each seed's episodes return by_seed[seed]; the calls are kept (seeds, offset)."""
    calls = []

    def evaluate(policy, env, seeds, n, offset, device):
        calls.append((list(seeds), offset))
        return torch.tensor([[float(by_seed[s])] * n for s in seeds])

    monkeypatch.setattr(rl_task, "evaluate_agents", evaluate)
    return calls


def test_an_agent_that_reaches_stop_at_return_leaves_the_batch_and_the_others_carry_on(monkeypatch):
    task = make(k=3, seed=4, total_steps=48, eval_every=16, stop_at_return=100.0, normalize_obs=True, normalize_reward=True)
    start(task)
    calls = scripted_evaluations(monkeypatch, {4: 10.0, 5: 100.0, 6: 99.9})
    task.checkpoint_hook = None
    task.training_step(None, 0)
    assert task.slots == [0, 1, 2] and calls == []
    opt = task.optimizers().optimizer
    stopped_weights, kept_weights = weights(task, 1), [weights(task, 0), weights(task, 2)]
    generators = [task.generators[0], task.generators[2]]
    stats = task.obs_stats.state_dict()
    before_stop = {}
    stop_agents = task.stop_agents

    def snapshot_then_stop(reasons):
        before_stop.update(obs=task.obs.clone(), scaler=task.reward_scaler.returns.clone(),
                           moments={name: opt.state[p]["exp_avg"].clone() for name, p in task.net.named_parameters()})
        stop_agents(reasons)

    task.stop_agents = snapshot_then_stop
    task.training_step(None, 1)  # 16 env steps: the first evaluation, where seed 5 reaches 100, then its confirmation
    assert calls == [([4, 5, 6], 10_000), ([5], 30_000 + 30)]  # the first evaluation's 30 fresh episodes
    assert task.slots == [0, 2] and task.net.n_members == 2
    assert task.early_stop == [None, {"env_step": 16, "reason": "deterministic evaluation mean 100.0 >= stop_at_return 100.0, "
                                      "confirmed on 30 fresh episodes (mean 100.0)"}, None]
    assert task.confirmations == [[], [(16, 100.0)], []]
    assert task.stop_step == [None, 16, None] and task.stop_time_s[1] > 0
    # the stopped agent's weights are the record's; everything of the others is only re-indexed
    assert same(task.agent_state_dict(1), {k: v for k, v in task.agents_net.member_state_dict(1).items()})
    assert not same(task.agent_state_dict(1), stopped_weights)  # (it had learned in the second iteration)
    after_second = task.agent_state_dict(1)
    assert same(weights(task, 0), task.agent_state_dict(0)) and same(weights(task, 1), task.agent_state_dict(2))
    for name, p in task.net.named_parameters():
        assert torch.equal(opt.state[p]["exp_avg"], before_stop["moments"][name][[0, 2]])
        assert any(q is p for q in opt.param_groups[0]["params"])
    assert task.generators == generators and task.episode_return.shape == (4,)
    assert torch.equal(task.obs, before_stop["obs"][[0, 1, 4, 5]]) and task.env.num_envs == 4
    assert torch.equal(task.reward_scaler.returns, before_stop["scaler"][[0, 2]])
    assert all(len(v) == 2 for v in task.recent.values())
    frozen = {k: v[1].clone() for k, v in task.obs_stats.state_dict().items()}
    task.training_step(None, 2)
    assert task.env_steps == 24 and task.total_env_steps() == 24 + 16 + 24
    # agent 1 no longer learns, acts or updates its statistics; the others do
    assert same(task.agent_state_dict(1), after_second)
    assert all(torch.equal(task.obs_stats.state_dict()[k][1], frozen[k]) for k in frozen)
    assert not torch.equal(task.obs_stats.state_dict()["mean"][0], stats["mean"][0])
    assert not same(task.agent_state_dict(0), kept_weights[0])
    # the evaluations that follow are of the learning agents only; the record says when agent 1 stopped
    task.training_step(None, 3)
    assert calls[-1] == ([4, 6], rl_task.EVAL_SEED_OFFSET) and [len(e) for e in task.evaluations] == [2, 1, 2]
    assert task.progress().shown["eval"] == pytest.approx((10.0 + 99.9) / 2)
    task.on_train_end()
    final = scripted_evaluations(monkeypatch, {4: 1.0, 5: 2.0, 6: 3.0})
    task.n_updates = task.updates  # the budget spent: the final evaluation only
    metrics = task.fit_and_evaluate(trainer(), None, None)
    assert final == [([4, 5, 6], rl_task.FINAL_EVAL_SEED_OFFSET)]
    assert [m["eval/return_mean"] for m in metrics] == [1.0, 2.0, 3.0]
    assert [m["train/updates"] for m in metrics] == [4.0, 2.0, 4.0]
    record = task.agent_record(1)
    assert record["env_steps"] == 16 and record["early_stop"]["env_step"] == 16 and task.agent_record(0)["early_stop"] is None
    assert record["env_steps_per_s"] == round(16 / task.stop_time_s[1], 1) and task.stop_time_s[1] < task._train_seconds
    assert task.agent_record(0)["env_steps_per_s"] == round(32 / task._train_seconds, 1)
    assert task.curves[1].rows[-1][0] == 16 and task.curves[0].rows[-1][0] == 32  # the final row at each one's last step


def test_an_agent_stops_only_when_fresh_episodes_confirm_its_evaluation(monkeypatch):
    """The stop rule: seeds 1 and 2 screen at the bar (10 episodes of 100); seed 1's 4 fresh confirmation episodes
    average 99 and it learns on, seed 2's average 100 and it stops. Each later confirmation plays other episodes."""
    task = make(k=3, total_steps=48, eval_every=8, stop_at_return=100.0, stop_confirm_episodes=4, eval_episodes=10)
    start(task)
    calls = []

    def evaluate(policy, env, seeds, n, offset, device):
        calls.append((list(seeds), n, offset))
        confirming = offset != rl_task.EVAL_SEED_OFFSET
        by_seed = {0: 0.0, 1: 99.0 if confirming else 100.0, 2: 100.0}
        return torch.tensor([[by_seed[s]] * n for s in seeds])

    monkeypatch.setattr(rl_task, "evaluate_agents", evaluate)
    task.checkpoint_hook = None
    task.training_step(None, 0)
    assert calls == [([0, 1, 2], 10, 10_000), ([1, 2], 4, 30_000 + 4)]
    assert task.slots == [0, 1] and task.stop_step == [None, None, 8]
    assert task.confirmations == [[], [(8, 99.0)], [(8, 100.0)]]
    assert task.early_stop[2]["reason"] == ("deterministic evaluation mean 100.0 >= stop_at_return 100.0, confirmed on 4 fresh "
                                            "episodes (mean 100.0)")
    assert (8, {"eval/confirm_return_mean": 99.0}) in task.curves[1].rows
    task.training_step(None, 1)  # seed 1 screens at the bar again: its confirmation plays episodes it never played
    assert calls[-1] == ([1], 4, 30_000 + 2 * 4) and task.slots == [0, 1] and task.confirmations[1] == [(8, 99.0), (16, 99.0)]
    # the confirmed agent is the one the record holds; the screening alone decides with stop_confirm_episodes=0
    quick = make(k=3, total_steps=48, eval_every=8, stop_at_return=100.0, stop_confirm_episodes=0)
    start(quick)
    calls.clear()
    quick.checkpoint_hook = None
    quick.training_step(None, 0)
    assert calls == [([0, 1, 2], 1, 10_000)] and quick.slots == [0] and quick.confirmations == [[], [], []]
    assert quick.early_stop[1]["reason"] == "deterministic evaluation mean 100.0 >= stop_at_return 100.0"


def test_stopped_agents_are_scored_with_their_own_frozen_statistics(monkeypatch):
    task = make(k=2, total_steps=32, eval_every=8, stop_at_return=50.0, normalize_obs=True)
    start(task)
    scripted_evaluations(monkeypatch, {0: 60.0, 1: 0.0})
    task.checkpoint_hook = None
    task.training_step(None, 0)
    assert task.slots == [1]
    task.training_step(None, 1)
    seen = []
    monkeypatch.setattr(rl_task, "evaluate_agents", lambda policy, env, seeds, n, offset, device: seen.append(policy) or torch.zeros(len(seeds), n))
    task.evaluation_returns(1, rl_task.FINAL_EVAL_SEED_OFFSET)
    stats = task.obs_stats
    assert stats.count[0] < stats.count[1]  # agent 0 stopped folding in observations
    task.evaluation_returns(1, rl_task.EVAL_SEED_OFFSET, range(len(task.slots)))  # agent 1 alone, with its own statistics
    obs = 3.0 * torch.randn(2, 50, 4, generator=torch.Generator().manual_seed(0))
    everyone, learning = seen[0](obs), seen[1](obs[1:])
    for i in range(2):
        net = ActorCritic(4, 2, hidden=(8,))
        net.load_state_dict(task.agent_state_dict(i))
        x = ((obs[i].double() - stats.mean[i]) / torch.sqrt(stats.var[i] + 1e-8)).clamp(-10, 10).float()
        with torch.no_grad():
            assert_greedy(everyone[i], net(x)[0])  # the argmax up to the batched net's rounding
            if i == 1:
                assert_greedy(learning[0], net(x)[0])


def test_a_run_resumed_after_an_agent_stopped_continues_exactly(monkeypatch):
    hp = dict(k=3, seed=1, total_steps=64, eval_every=16, stop_at_return=5.0, normalize_obs=True, normalize_reward=True)
    task = make(**hp)
    start(task)
    scripted_evaluations(monkeypatch, {1: 0.0, 2: 0.0, 3: 5.0})
    task.checkpoint_hook = None
    for i in range(2):
        task.training_step(None, i)
    assert task.slots == [0, 1]
    state = saved_and_loaded(task.checkpoint_state())
    assert state["slots"] == [0, 1] and state["progress"]["stop_step"] == [None, None, 16]
    resumed = make(**hp)
    resumed.load_checkpoint_state(state)
    assert resumed.slots == [0, 1] and resumed.net.n_members == 2 and resumed.early_stop == task.early_stop
    assert resumed.stop_time_s == task.stop_time_s
    start(resumed)
    assert [g.get_state().tolist() for g in resumed.generators] == [g.get_state().tolist() for g in task.generators]
    for run in (task, resumed):
        torch.manual_seed(3)
        run.learn(run.rollout())
    for i in range(3):
        assert same(resumed.agent_state_dict(i), task.agent_state_dict(i))
    assert same(resumed.obs_stats.state_dict(), task.obs_stats.state_dict())
    assert same(resumed.reward_scaler.state_dict(), task.reward_scaler.state_dict())


def test_when_every_agent_has_stopped_the_fit_ends_and_a_resume_only_scores(monkeypatch):
    hp = dict(k=3, total_steps=64, eval_every=8, stop_at_return=0.0)
    task = make(**hp)
    start(task)
    scripted_evaluations(monkeypatch, {0: 1.0, 1: -1.0, 2: -1.0})
    task.checkpoint_hook = None
    stopped = SimpleNamespace(should_stop=False)
    monkeypatch.setattr(PPOTask, "trainer", property(lambda self: stopped))
    task.training_step(None, 0)
    assert task.slots == [1, 2] and not stopped.should_stop
    scripted_evaluations(monkeypatch, {0: 1.0, 1: 0.0, 2: 0.0})
    task.training_step(None, 1)
    assert task.slots == [] and stopped.should_stop and task.stop_step == [8, 16, 16]
    state = saved_and_loaded(task.checkpoint_state())
    resumed = make(**hp)
    resumed.load_checkpoint_state(state)  # the learning net (2 members when the last ones stopped) is not needed
    assert resumed.slots == [] and all(same(resumed.agents_net.member_state_dict(i), task.agents_net.member_state_dict(i)) for i in range(3))
    resumed.curves = [Rows(), Rows(), Rows()]
    fit = []
    fake = SimpleNamespace(precision="32-true", fit=lambda module: fit.append(module))
    resumed.fit_and_evaluate(fake, None, None)
    assert fit == [] and [r["env_steps"] for r in map(resumed.agent_record, range(3))] == [8, 16, 16]


def test_an_algorithm_state_that_reuses_the_checkpoints_keys_is_refused(monkeypatch):
    task = make(normalize_obs=True)
    start(task)
    state = task.checkpoint_state()
    assert torch.equal(state["obs_stats"]["mean"], task.obs_stats.state_dict()["mean"])  # beside the skeleton's keys
    monkeypatch.setattr(PPOTask, "algorithm_state", lambda self: {"slots": [], "extra": 1})
    with pytest.raises(TypeError, match=r"^PPOTask.algorithm_state\(\) uses the checkpoint's own keys \['slots'\]: rename them$"):
        task.checkpoint_state()


def test_a_stop_keeps_each_remaining_agents_own_train_metrics():
    """After agent 1 of 3 stops, the train rows logged before the next update still carry each remaining agent's own
    losses (agent 2 now sits at slot 1): the algorithm's per-slot state is remapped by the slots kept."""
    task = make(k=3, hidden=(8,))
    start(task)
    task.iterate()
    before = {agent: task.train_metrics(slot, agent) for slot, agent in enumerate(task.slots)}
    assert before[0] != before[2]  # agents that differ, so a wrong mapping shows
    task.stop_agents({1: "test"})
    assert task.slots == [0, 2]
    task.log_progress()
    for agent in (0, 2):
        step, row = task.curves[agent].rows[-1]
        assert {k: row[k] for k in before[agent]} == before[agent]
    assert not task.curves[1].rows  # a stopped agent gets no train row

"""PPO's pieces against hand-computed cases and numpy/gymnasium references: GAE with a truncation and a
termination inside the rollout, the clipped objective at and beyond the clip edges for both signs of the
advantage, the value loss, minibatch shuffles, the learning-rate schedule, running normalisation."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.wrappers.utils import RunningMeanStd as GymRunningMeanStd

from pipeline.rl.ppo import (
    RewardScaler,
    RunningMeanStd,
    annealed_lr,
    bootstrap_values,
    clipped_surrogate_loss,
    gae,
    minibatch_indices,
    normalize_advantages,
    normalize_observation,
    ppo_loss,
    ratio_diagnostics,
    value_loss,
)

T = torch.tensor


def f64(*values):
    return torch.tensor(values, dtype=torch.float64)


# A 5-step rollout of one env: step 1 is truncated (the time limit; its final observation is worth 10),
# step 3 terminates. gamma = lam = 0.5, so gamma * lam = 0.25.
REWARDS = f64(1, 2, 3, 4, 5)
VALUES = f64(1, 2, 3, 4, 5)  # V(obs_t)
LAST_VALUE = torch.tensor(6.0, dtype=torch.float64)  # V(obs_5), after the rollout
FINAL_VALUES = f64(-7, 10, -7, -7, -7)  # V(final_obs_t); only step 1's may be read
TRUNCATED = T([False, True, False, False, False])
TERMINATED = T([False, False, False, True, False])


def test_the_bootstrap_is_the_next_value_the_final_observations_after_a_truncation_and_the_last_value_at_the_end():
    assert bootstrap_values(VALUES, LAST_VALUE, TRUNCATED, FINAL_VALUES).tolist() == [2, 10, 4, 5, 6]


def test_gae_by_hand_with_a_truncation_and_a_termination_inside_the_rollout():
    next_values = bootstrap_values(VALUES, LAST_VALUE, TRUNCATED, FINAL_VALUES)
    advantages, returns = gae(REWARDS, VALUES, next_values, TERMINATED, TERMINATED | TRUNCATED, gamma=0.5, lam=0.5)
    # deltas: 1 + .5*2 - 1 = 1;  2 + .5*10 - 2 = 5 (bootstrapped from the final obs);  3 + .5*4 - 3 = 2;
    #         4 + 0 - 4 = 0 (terminated: no bootstrap);  5 + .5*6 - 5 = 3.
    # A_4 = 3; A_3 = 0 (the episode ends: A_4 not carried); A_2 = 2 + .25*0 = 2; A_1 = 5 (ends); A_0 = 1 + .25*5 = 2.25.
    assert advantages.tolist() == [2.25, 5, 2, 0, 3]
    assert returns.tolist() == [3.25, 7, 5, 4, 8]


def test_gae_with_lambda_one_is_the_discounted_return_and_with_lambda_zero_the_td_error():
    rewards, values = f64(1, -2, 0.5, 3), f64(0.3, 0.1, -0.4, 0.2)
    last, no = torch.tensor(1.5, dtype=torch.float64), torch.zeros(4, dtype=torch.bool)
    next_values = bootstrap_values(values, last, no, values)
    _, mc = gae(rewards, values, next_values, no, no, gamma=0.9, lam=1.0)
    # Monte Carlo with a bootstrap at the end: G_3 = 3 + .9*1.5 = 4.35, G_2 = .5 + .9 G_3 = 4.415,
    # G_1 = -2 + .9 G_2 = 1.9735, G_0 = 1 + .9 G_1 = 2.77615.
    assert mc.tolist() == pytest.approx([2.77615, 1.9735, 4.415, 4.35], abs=1e-12)
    td, _ = gae(rewards, values, next_values, no, no, gamma=0.9, lam=0.0)
    assert td.tolist() == pytest.approx([1 + .9 * .1 - .3, -2 + .9 * -.4 - .1, .5 + .9 * .2 + .4, 3 + .9 * 1.5 - .2], abs=1e-12)


def test_gae_of_a_one_step_rollout_is_the_td_error():
    advantages, returns = gae(f64(1.0), f64(0.5), f64(2.0), T([False]), T([False]), gamma=0.9, lam=0.95)
    assert advantages.tolist() == pytest.approx([1.0 + 0.9 * 2.0 - 0.5]) and returns.tolist() == pytest.approx([2.8])


def test_gae_runs_each_agent_and_env_on_its_own():
    """[T, K, E] at once equals each column alone (here: the hand case shifted per column)."""
    K, E = 3, 2
    shift = torch.arange(K * E, dtype=torch.float64).view(1, K, E)
    rewards, values = REWARDS.view(5, 1, 1) + shift, VALUES.view(5, 1, 1) - shift
    terminated = torch.zeros(5, K, E, dtype=torch.bool)
    terminated[3, 1, 0] = terminated[0, 2, 1] = True
    done = terminated | TRUNCATED.view(5, 1, 1)
    next_values = bootstrap_values(values, LAST_VALUE + shift[0], TRUNCATED.view(5, 1, 1).expand(5, K, E), FINAL_VALUES.view(5, 1, 1).expand(5, K, E))
    advantages, returns = gae(rewards, values, next_values, terminated, done, 0.5, 0.5)
    for k in range(K):
        for e in range(E):
            a, r = gae(rewards[:, k, e], values[:, k, e], next_values[:, k, e], terminated[:, k, e], done[:, k, e], 0.5, 0.5)
            assert torch.equal(advantages[:, k, e], a) and torch.equal(returns[:, k, e], r)
    assert advantages[3, 1, 0] == rewards[3, 1, 0] - values[3, 1, 0]  # the terminated step: r - V


@pytest.mark.parametrize("advantage", [2.0, -2.0])
def test_the_clipped_objective_at_and_beyond_both_clip_edges(advantage):
    """clip = 0.2. Per sample the loss is max(-A r, -A clip(r, 0.8, 1.2)): pessimistic, so the clip binds
    only where it lowers the objective (r > 1.2 for A > 0, r < 0.8 for A < 0), and there the gradient is 0."""
    ratios = f64(0.5, 0.8, 1.0, 1.2, 1.5)
    old = torch.full((5,), -0.7, dtype=torch.float64)  # log-probabilities of the old policy
    new = (torch.log(ratios) + old).requires_grad_()
    adv = torch.full((5,), advantage, dtype=torch.float64)
    per_sample = [clipped_surrogate_loss(new[i : i + 1], old[i : i + 1], adv[i : i + 1], 0.2).item() for i in range(5)]
    if advantage > 0:  # -A r below the upper edge, -A * 1.2 above it
        expected = [-1.0, -1.6, -2.0, -2.4, -2.4]
    else:  # -A * 0.8 below the lower edge, -A r above it
        expected = [1.6, 1.6, 2.0, 2.4, 3.0]
    assert per_sample == pytest.approx(expected, abs=1e-12)
    loss = clipped_surrogate_loss(new.unsqueeze(0), old.unsqueeze(0), adv.unsqueeze(0), 0.2)
    assert loss.shape == (1,) and loss.item() == pytest.approx(sum(expected) / 5, abs=1e-12)
    loss.sum().backward()
    grad = new.grad.tolist()
    # d(-A r)/d log r = -A r, over the 5 samples of the mean.
    if advantage > 0:
        assert grad[4] == 0.0 and grad[0] == pytest.approx(-2.0 * 0.5 / 5) and grad[2] == pytest.approx(-2.0 / 5)
    else:
        assert grad[0] == 0.0 and grad[4] == pytest.approx(2.0 * 1.5 / 5) and grad[2] == pytest.approx(2.0 / 5)


def test_the_clipped_objective_is_a_mean_per_agent():
    new = f64(0.1, -0.3, 0.2, 0.0).view(2, 2)
    old = torch.zeros(2, 2, dtype=torch.float64)
    adv = f64(1.0, -1.0, 0.5, 2.0).view(2, 2)
    loss = clipped_surrogate_loss(new, old, adv, 0.1)
    r = np.exp([0.1, -0.3, 0.2, 0.0])
    # Agent 0: A=1, r=1.105 (> 1.1: clipped to -1.1); A=-1, r=0.741 (< 0.9: clipped to 0.9). Agent 1: -0.5*1.1, -2*1.
    assert r[0] > 1.1 and r[1] < 0.9 and r[2] > 1.1
    assert loss.tolist() == pytest.approx([(-1.1 + 0.9) / 2, (-0.55 - 2.0) / 2], abs=1e-12)


def test_value_loss_with_and_without_clipping():
    new, old, returns = f64(1.0, 3.0, 2.1).view(1, 3), f64(2.0, 2.0, 2.0).view(1, 3), f64(0.0, 0.0, 2.0).view(1, 3)
    # Unclipped errors: 1, 9, 0.01. Moved by at most 0.5 from old: 1.5, 2.5, 2.1 -> errors 2.25, 6.25, 0.01.
    assert value_loss(new, old, returns, None).item() == pytest.approx(0.5 * (1 + 9 + 0.01) / 3, abs=1e-12)
    assert value_loss(new, old, returns, 0.5).item() == pytest.approx(0.5 * (2.25 + 9 + 0.01) / 3, abs=1e-12)
    # Moving up by more than the clip: from 2 to 3 towards a return of 5, the clipped value 2.5 errs more (6.25 > 4).
    assert value_loss(f64(3.0).view(1, 1), f64(2.0).view(1, 1), f64(5.0).view(1, 1), 0.5).item() == pytest.approx(0.5 * 6.25)


def test_the_total_loss_adds_the_value_loss_and_subtracts_the_entropy_bonus():
    total = ppo_loss(f64(1.0, -1.0), f64(4.0, 2.0), f64(0.5, 1.5), vf_coef=0.5, ent_coef=0.1)
    assert total.tolist() == pytest.approx([1 - 0.05 + 2, -1 - 0.15 + 1], abs=1e-12)


def test_ratio_diagnostics_are_the_k3_kl_and_the_clip_fraction_without_gradients():
    new = torch.log(f64(0.5, 1.0, 1.1, 1.3)).view(1, 4).requires_grad_()
    old = torch.full((1, 4), -1.3, dtype=torch.float64)
    kl, clipped = ratio_diagnostics(new + old, old, 0.2)
    r = np.array([0.5, 1.0, 1.1, 1.3])
    assert kl.item() == pytest.approx(np.mean((r - 1) - np.log(r)), abs=1e-12)
    assert clipped.item() == 0.5 and not kl.requires_grad and not clipped.requires_grad


def test_advantage_normalisation_adds_1e_8_to_the_std():
    """A near-constant minibatch: std 7.07e-9, so the 1e-8 matters: +-5e-9 / (7.07e-9 + 1e-8) = +-0.293."""
    got = normalize_advantages(f64(0.0, 1e-8).view(1, 2))
    std = np.std([0.0, 1e-8], ddof=1)
    assert got[0].tolist() == pytest.approx([-5e-9 / (std + 1e-8), 5e-9 / (std + 1e-8)], rel=1e-9)


def test_advantages_are_normalised_per_agent_as_numpy_does_it():
    x = torch.randn(3, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 5 + 2
    got = normalize_advantages(x).numpy()
    a = x.numpy()
    expected = (a - a.mean(1, keepdims=True)) / (a.std(1, ddof=1, keepdims=True) + 1e-8)
    assert np.allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_minibatches_are_a_permutation_per_agent_drawn_from_its_own_generator():
    gens = [torch.Generator().manual_seed(s) for s in (3, 4)]
    idx = minibatch_indices(gens, 12, 4)
    assert idx.shape == (4, 2, 3)
    for k, seed in enumerate((3, 4)):
        alone = minibatch_indices([torch.Generator().manual_seed(seed)], 12, 4)[:, 0]
        assert torch.equal(idx[:, k], alone)
        assert sorted(idx[:, k].reshape(-1).tolist()) == list(range(12))
    assert not torch.equal(idx[:, 0], idx[:, 1])
    with pytest.raises(ValueError, match="a batch of 12 samples does not split into 5 equal minibatches"):
        minibatch_indices(gens, 12, 5)
    with pytest.raises(ValueError, match="into 0 equal"):
        minibatch_indices(gens, 12, 0)
    whole = minibatch_indices(gens, 12, 1)  # one minibatch: the whole rollout, shuffled
    assert whole.shape == (1, 2, 12) and sorted(whole[0, 0].tolist()) == list(range(12))


def test_the_learning_rate_falls_linearly_to_one_nth_as_in_cleanrl():
    assert [annealed_lr(3e-4, u, 4) for u in range(4)] == pytest.approx([3e-4, 2.25e-4, 1.5e-4, 0.75e-4], abs=1e-18)


def test_running_statistics_follow_gymnasiums_per_agent():
    rng = np.random.default_rng(1)
    stats = RunningMeanStd(2, shape=(3,))
    refs = [GymRunningMeanStd(shape=(3,)) for _ in range(2)]
    for n in (1, 5, 17, 2):
        batch = rng.normal(loc=[[1.0, -2.0, 0.0]], scale=[[0.5, 3.0, 10.0]], size=(2, n, 3))
        stats.update(torch.from_numpy(batch).float())
        for k in range(2):
            refs[k].update(batch[k].astype(np.float32))
    for k in range(2):
        assert np.allclose(stats.mean[k].numpy(), refs[k].mean, rtol=1e-6, atol=1e-6)
        assert np.allclose(stats.var[k].numpy(), refs[k].var, rtol=1e-6, atol=1e-6)
        assert stats.count[k].item() == pytest.approx(refs[k].count)
    obs = torch.from_numpy(rng.normal(size=(2, 4, 3)) * 40).float()
    out = stats.normalize(obs, clip=10.0)
    expected = np.clip((obs.numpy() - refs[0].mean) / np.sqrt(refs[0].var + 1e-8), -10, 10)
    assert out.dtype == torch.float32 and np.allclose(out[0].numpy(), expected[0], rtol=1e-5, atol=1e-5)
    assert out.abs().max() == 10.0


def test_running_statistics_are_float64_whatever_the_batch_and_start_as_gymnasiums():
    stats = RunningMeanStd(2, (3,))
    assert all(t.dtype == torch.float64 for t in (stats.mean, stats.var, stats.count))
    assert stats.mean.abs().sum() == 0 and torch.equal(stats.var, torch.ones(2, 3)) and stats.count.tolist() == [1e-4, 1e-4]
    # float32 numbers far from zero: averaged in float32 they would be off by ~1e-3; in float64 to 1e-9.
    batch = (1e4 + torch.randn(2, 4096, 3, generator=torch.Generator().manual_seed(5))).float()
    stats.update(batch)
    x = batch.double().numpy()
    n = 4096
    expected_mean = x.mean(1) * n / (n + 1e-4)
    assert np.allclose(stats.mean.numpy(), expected_mean, rtol=1e-12, atol=1e-9)
    copy = RunningMeanStd(2, (3,))
    copy.load_state_dict({k: v.float() for k, v in stats.state_dict().items()})
    assert all(t.dtype == torch.float64 for t in (copy.mean, copy.var, copy.count))
    scaler = RewardScaler(2, 3, 0.99)
    assert scaler.returns.dtype == torch.float64 and scaler.stats.mean.shape == (2,)
    scaler.load_state_dict({k: v.float() for k, v in scaler.state_dict().items()})
    assert scaler.returns.dtype == torch.float64 and scaler.stats.var.dtype == torch.float64


@pytest.mark.parametrize("clip", [None, 0.75])
def test_one_agents_statistics_normalise_its_observations_as_in_training(clip):
    """`agent_state(i)` and `normalize_observation` (a replay's) give what `normalize` gave agent i in training."""
    g = torch.Generator().manual_seed(2)
    stats = RunningMeanStd(3, (4,))
    stats.update(torch.randn(3, 50, 4, generator=g) * torch.tensor([1.0, 3.0, 0.1, 10.0]) + torch.tensor([0.0, 5.0, -1.0, 2.0]))
    obs = torch.randn(3, 6, 4, generator=g) * 4
    trained = stats.normalize(obs, clip)
    for i in range(3):
        state = stats.agent_state(i, clip)
        assert set(state) == {"mean", "var", "count", "eps"} | ({"clip"} if clip is not None else set())
        assert all(t.dtype == torch.float64 and t.device.type == "cpu" for t in state.values())
        state["mean"] += 0  # a copy: the run's statistics go on moving
        assert state["mean"].data_ptr() != stats.mean.data_ptr()
        replayed = normalize_observation(obs[i], state)
        assert replayed.dtype == torch.float32 and torch.equal(replayed, trained[i])
    if clip is not None:
        assert trained.abs().max() == clip
    # By hand, one value: (x - mean) / sqrt(var + 1e-8).
    x = obs[1, 0, 2].double()
    by_hand = (x - stats.mean[1, 2]) / torch.sqrt(stats.var[1, 2] + 1e-8)
    by_hand = by_hand if clip is None else by_hand.clamp(-clip, clip)
    assert normalize_observation(obs[1], stats.agent_state(1, clip))[0, 2].item() == pytest.approx(by_hand.item(), rel=1e-6)


def test_reward_scaling_clips_at_10_and_adds_1e_8_by_default():
    scaler = RewardScaler(1, 1, 0.0)  # gamma 0: the "return" is the reward itself
    first = scaler(torch.tensor([[1e4]]), torch.zeros(1, 1, dtype=torch.bool))
    # count 1e-4 + 1, var = (1e-4 * 1 + 1e8 * 1e-4 / 1.0001) / 1.0001: 1e4 / sqrt(var + 1e-8) is ~100, clipped to 10.
    assert first.item() == 10.0
    tiny = RewardScaler(1, 1, 0.0, clip=None)
    tiny.stats.var.fill_(0.0)  # as after many identical returns: only epsilon is left under the root
    tiny.stats.count.fill_(1e12)
    out = tiny(torch.tensor([[1e-6]]), torch.zeros(1, 1, dtype=torch.bool))
    assert out.item() == pytest.approx(1e-6 / np.sqrt(1e-8 + tiny.stats.var.item()), rel=1e-5)


def test_observation_normalisation_is_gymnasiums_normalize_observation_on_one_env():
    """The wrapper keeps its statistics in the observations' float32; ours are float64. Early on, x - mean is
    ~1e-4 x and float32 cancellation costs ~ulp(1) / std ~ 6e-8 / 0.013 = 5e-6 there: hence atol 1e-5."""
    env = gym.wrappers.NormalizeObservation(gym.make("Pendulum-v1"))
    raw = gym.make("Pendulum-v1")
    obs, _ = env.reset(seed=3)
    raw_obs, _ = raw.reset(seed=3)
    stats = RunningMeanStd(1, shape=(3,))
    rng = np.random.default_rng(0)
    for _ in range(50):
        stats.update(torch.from_numpy(raw_obs).view(1, 1, 3))
        ours = stats.normalize(torch.from_numpy(raw_obs).view(1, 1, 3))
        assert np.allclose(ours.numpy().reshape(3), obs, rtol=1e-5, atol=1e-5)
        action = rng.uniform(-2, 2, 1).astype(np.float32)
        obs, *_ = env.step(action)
        raw_obs, *_ = raw.step(action)


def test_reward_scaling_against_a_numpy_loop():
    """VecNormalize's rule: return = gamma * return + r, statistics updated with it, r / sqrt(var + eps),
    clipped, the return zeroed once an episode ends. Two agents of three envs, with done flags."""
    rng = np.random.default_rng(2)
    K, E, gamma = 2, 3, 0.9
    scaler = RewardScaler(K, E, gamma, clip=5.0)
    refs = [GymRunningMeanStd(shape=()) for _ in range(K)]
    returns = np.zeros((K, E))
    for t in range(40):
        rewards = rng.normal(0, [[1.0], [100.0]], size=(K, E))
        done = rng.random((K, E)) < 0.15
        got = scaler(torch.from_numpy(rewards).float(), torch.from_numpy(done))
        returns = returns * gamma + rewards.astype(np.float32)
        expected = np.empty((K, E))
        for k in range(K):
            refs[k].update(returns[k])
            expected[k] = np.clip(rewards[k].astype(np.float32) / np.sqrt(refs[k].var + 1e-8), -5, 5)
        returns[done] = 0.0
        assert got.dtype == torch.float32 and np.allclose(got.numpy(), expected, rtol=1e-5, atol=1e-6), t
    assert (got[1].abs() < 5).all() and scaler.stats.var[1] > 100 * scaler.stats.var[0]


def test_normalisers_round_trip_through_their_state_dicts_and_refuse_other_shapes():
    rng = torch.Generator().manual_seed(0)
    stats, scaler = RunningMeanStd(2, (3,)), RewardScaler(2, 4, 0.99)
    stats.update(torch.randn(2, 8, 3, generator=rng))
    scaler(torch.randn(2, 4, generator=rng), torch.zeros(2, 4, dtype=torch.bool))
    stats2, scaler2 = RunningMeanStd(2, (3,)), RewardScaler(2, 4, 0.99)
    stats2.load_state_dict(stats.state_dict())
    scaler2.load_state_dict(scaler.state_dict())
    rewards, obs = torch.randn(2, 4, generator=rng), torch.randn(2, 5, 3, generator=rng)
    assert torch.equal(stats2.normalize(obs), stats.normalize(obs))
    done = torch.zeros(2, 4, dtype=torch.bool)
    assert torch.equal(scaler2(rewards, done), scaler(rewards, done))
    with pytest.raises(ValueError, match=r"running statistics of shape \(3, 3\) cannot load into \(2, 3\)"):
        stats.load_state_dict(RunningMeanStd(3, (3,)).state_dict())
    with pytest.raises(ValueError, match=r"return accumulators of shape \(2, 1\) cannot load into \(2, 4\)"):
        scaler.load_state_dict(RewardScaler(2, 1, 0.99).state_dict())


def test_statistics_of_some_agents_follow_gymnasiums_and_leave_the_others_alone():
    """update/normalize with `agents`: the batch's rows are those agents' (agents that stopped learning keep theirs)."""
    rng = np.random.default_rng(3)
    stats = RunningMeanStd(3, shape=(2,))
    refs = [GymRunningMeanStd(shape=(2,)) for _ in range(3)]
    for agents, n in (([0, 1, 2], 4), ([2, 0], 7), ([1], 3), ([0, 2], 5)):
        batch = rng.normal(loc=[[3.0, -1.0]], scale=[[2.0, 0.5]], size=(len(agents), n, 2))
        stats.update(torch.from_numpy(batch), torch.tensor(agents))
        for row, k in enumerate(agents):
            refs[k].update(batch[row])
    for k in range(3):
        assert np.allclose(stats.mean[k].numpy(), refs[k].mean, rtol=1e-12, atol=1e-12)
        assert np.allclose(stats.var[k].numpy(), refs[k].var, rtol=1e-12, atol=1e-12)
        assert stats.count[k].item() == pytest.approx(refs[k].count, rel=1e-12)
    obs = torch.from_numpy(rng.normal(size=(2, 4, 2)))
    out = stats.normalize(obs, agents=torch.tensor([2, 1]))
    for row, k in enumerate((2, 1)):
        assert np.allclose(out[row].numpy(), (obs[row].numpy() - refs[k].mean) / np.sqrt(refs[k].var + 1e-8), rtol=1e-12)


def test_normalisers_shrink_to_the_agents_kept_in_that_order():
    rng = torch.Generator().manual_seed(1)
    stats, scaler = RunningMeanStd(3, (2,)), RewardScaler(3, 2, 0.9)
    stats.update(torch.randn(3, 6, 2, generator=rng))
    for _ in range(3):
        scaler(torch.randn(3, 2, generator=rng), torch.zeros(3, 2, dtype=torch.bool))
    before, scaler_before = stats.state_dict(), scaler.state_dict()
    keep = torch.tensor([2, 0])
    stats.keep_agents_(keep)
    scaler.keep_agents_(keep)
    assert all(torch.equal(stats.state_dict()[k], before[k][[2, 0]]) for k in before)
    assert all(torch.equal(scaler.state_dict()[k], scaler_before[k][[2, 0]]) for k in scaler_before)

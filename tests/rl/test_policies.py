"""The policies of pipeline.rl.policies on networks set by hand: each deterministic act is what its network says
(read here from the network's own layers), each sample follows the distribution it names (frequencies and moments
within 5 standard errors of N draws), draws repeat with the caller's generator, and a policy over K members with
their files stacked acts as each member does alone."""

from __future__ import annotations

import functools
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from pipeline.nets.actor_critic import ActorCritic, LogStd
from pipeline.nets.continuous_control import DeterministicActor, SquashedGaussianActor
from pipeline.nets.ensemble import make_ensemble
from pipeline.nets.mlp import MLP
from pipeline.rl.policies import (
    OBS_NORM,
    ActorCriticPolicy,
    CategoricalPolicy,
    DeterministicActorPolicy,
    QValuePolicy,
    SquashedGaussianPolicy,
    member_files,
)

N = 20_000  # draws per distribution check
BOX = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
OBS3 = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)


def within(p_hat: float, p: float, n: int = N, sds: float = 5.0) -> bool:
    """A frequency within `sds` standard errors of its probability."""
    return abs(p_hat - p) <= sds * math.sqrt(p * (1 - p) / n)


def fixed(outputs):
    """A network that outputs `outputs` (broadcast over the batch) for every observation."""
    out = torch.as_tensor(outputs, dtype=torch.float32)
    return lambda obs: out.expand(*obs.shape[:-1], *out.shape)


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def obs_batch(n: int = N, features: int = 3) -> torch.Tensor:
    return torch.zeros(n, features)


# ---- deterministic acts -----------------------------------------------------------------------------------
def test_q_values_and_logits_play_their_highest_output():
    torch.manual_seed(0)
    net = MLP(4, 3, hidden=(8,))
    x = torch.randn(500, 4)
    with torch.no_grad():
        expected = net(x).argmax(1)
        for cls in (QValuePolicy, CategoricalPolicy):
            policy = cls(net, gym.spaces.Discrete(3))
            assert torch.equal(policy(x), expected) and torch.equal(policy.outputs(x), net(x))
    assert len(set(expected.tolist())) == 3  # every action is someone's best: the argmax is exercised


def test_an_actor_critic_plays_its_normalised_mode_or_its_mean_clipped():
    torch.manual_seed(1)
    stats = {"mean": torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64), "var": torch.tensor([4.0, 0.25, 9.0], dtype=torch.float64),
             "count": torch.tensor(7.0, dtype=torch.float64), "eps": torch.tensor(1e-8, dtype=torch.float64),
             "clip": torch.tensor(1.5, dtype=torch.float64)}
    x = torch.randn(400, 3) * 3
    seen = ((x.double() - stats["mean"]) / torch.sqrt(stats["var"] + 1e-8)).clamp(-1.5, 1.5).float()
    discrete = ActorCritic(3, 4, hidden=(8,))
    gaussian = ActorCritic(3, 1, continuous=True, hidden=(8,))
    with torch.no_grad():
        gaussian.actor[-1].weight.mul_(300.0)  # means on both sides of the bounds [-2, 2]
        policy = ActorCriticPolicy(discrete, gym.spaces.Discrete(4), {OBS_NORM: stats}, {"normalize_obs": True})
        assert torch.equal(policy(x), discrete(seen)[0].argmax(1))
        mean = gaussian(x)[0]
        clipped = ActorCriticPolicy(gaussian, BOX)(x)
    assert torch.equal(clipped, mean.clamp(-2.0, 2.0))
    assert (mean.abs() > 2).sum() > 40 and (mean.abs() < 2).sum() > 40


def test_sac_and_td3_actors_play_their_deterministic_action_in_the_env_s_units():
    torch.manual_seed(2)
    sac = SquashedGaussianActor(3, 1, hidden=(8,), action_low=[-2.0], action_high=[2.0])
    td3 = DeterministicActor(3, 1, hidden=(8,), action_low=[-2.0], action_high=[2.0])
    x = torch.randn(300, 3)
    with torch.no_grad():
        expected_sac = 2.0 * torch.tanh(sac.mean(sac.trunk(x)))  # scale 2, bias 0
        expected_td3 = 2.0 * torch.tanh(td3.net(x))
        assert torch.allclose(SquashedGaussianPolicy(sac, BOX)(x), expected_sac, atol=1e-6)
        assert torch.allclose(DeterministicActorPolicy(td3, BOX)(x), expected_td3, atol=1e-6)


# ---- stochastic acts --------------------------------------------------------------------------------------
def test_dqn_samples_epsilon_greedily_with_the_run_s_final_epsilon():
    """Q = [0, 2, 1], eps_end 0.3: the greedy action 1 with probability 0.7 + 0.3 / 3 = 0.8, each other 0.1."""
    policy = QValuePolicy(fixed([0.0, 2.0, 1.0]), gym.spaces.Discrete(3), settings={"eps_end": 0.3})
    got = policy.act(obs_batch(), deterministic=False, generator=generator(0))
    counts = torch.bincount(got, minlength=3).double() / N
    assert all(within(float(c), p) for c, p in zip(counts, (0.1, 0.8, 0.1)))
    assert torch.equal(policy.act(obs_batch()), torch.ones(N, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"^QValuePolicy samples epsilon-greedily with the task's eps_end, which this run has not$"):
        QValuePolicy(fixed([0.0, 1.0]), gym.spaces.Discrete(2)).sample(obs_batch(2))


def test_a_noisy_q_network_refuses_to_sample_in_one_line():
    noisy = MLP(3, 2, hidden=(4,))
    noisy.reset_noise = lambda generator=None: None
    with pytest.raises(ValueError, match=r"^a NoisyNet DQN explores through weight noise, .*use act\(obs, deterministic=True\)$"):
        QValuePolicy(noisy, gym.spaces.Discrete(2), settings={"eps_end": 0.1}).act(obs_batch(2), deterministic=False)


@pytest.mark.parametrize("policy", [
    lambda: CategoricalPolicy(fixed(np.log([1.0, 2.0, 5.0])), gym.spaces.Discrete(3)),
    lambda: ActorCriticPolicy(lambda obs: (fixed(np.log([1.0, 2.0, 5.0]))(obs), obs[..., 0]), gym.spaces.Discrete(3)),
], ids=["cem", "ppo"])
def test_logits_sample_their_softmax(policy):
    got = policy().act(obs_batch(), deterministic=False, generator=generator(1))
    counts = torch.bincount(got, minlength=3).double() / N
    assert all(within(float(c), p) for c, p in zip(counts, (1 / 8, 2 / 8, 5 / 8)))


class GaussianHead(nn.Module):
    """A continuous actor-critic whose mean is `mean` everywhere, with log-std log(`std`)."""

    def __init__(self, mean: float, std: float):
        super().__init__()
        self.mean = nn.Parameter(torch.tensor([mean]))
        self.log_std = LogStd(1, math.log(std))

    def forward(self, obs):
        return self.mean.expand(*obs.shape[:-1], 1), obs[..., 0]


def test_a_gaussian_actor_critic_samples_its_gaussian_clipped_to_the_bounds():
    """N(1.5, 0.4^2) in [-2, 2]: P(a = 2) = P(z > 1.25) = 0.10565, below the mean half the draws, none below -2."""
    got = ActorCriticPolicy(GaussianHead(1.5, 0.4), BOX).act(obs_batch(), deterministic=False, generator=generator(2))[:, 0]
    assert got.min() >= -2.0 and got.max() <= 2.0
    assert within(float((got == 2.0).double().mean()), 0.10565) and within(float((got < 1.5).double().mean()), 0.5)
    inside = got[got < 2.0].double()
    assert float(inside.min()) > -2.0  # -2 is 8.75 sd below the mean


def set_bias(layer: nn.Linear, value: float) -> None:
    with torch.no_grad():
        layer.weight.zero_()
        layer.bias.fill_(value)


def test_sac_samples_its_squashed_gaussian_in_the_env_s_units():
    """u ~ N(0.3, 0.5^2), a = 2 tanh(u): atanh(a / 2) has the Gaussian's moments; E[a] = 2 E[tanh(u)] (Gauss-Hermite
    quadrature, exact to 1e-12), not 2 tanh(0.3) (Jensen: |E tanh(u)| < |tanh E u|), within 5 SE of N draws."""
    m, s = 0.3, 0.5
    actor = SquashedGaussianActor(3, 1, hidden=(), action_low=[-2.0], action_high=[2.0])
    set_bias(actor.mean, m)
    set_bias(actor.log_std, math.atanh(2 * (math.log(s) + 5.0) / 7.0 - 1))  # bounded_log_std: -5 + 3.5 (tanh(raw) + 1)
    policy = SquashedGaussianPolicy(actor, BOX)
    got = policy.act(obs_batch(), deterministic=False, generator=generator(3))[:, 0].double()
    u = torch.atanh(got / 2)
    assert abs(float(u.mean()) - m) <= 5 * s / math.sqrt(N)
    assert abs(float(u.std()) / s - 1) <= 5 / math.sqrt(2 * N)
    z, w = np.polynomial.hermite_e.hermegauss(80)
    expected = 2 * float(np.sum(w * np.tanh(m + s * z)) / math.sqrt(2 * math.pi))
    assert abs(float(got.mean()) - expected) <= 5 * float(got.std()) / math.sqrt(N)
    assert abs(expected - 2 * math.tanh(m)) > 10 * float(got.std()) / math.sqrt(N)  # the check can tell them apart
    assert torch.allclose(policy.act(obs_batch(1)), torch.tensor([[2 * math.tanh(m)]]), atol=1e-6)


def test_td3_samples_its_exploration_noise_in_the_env_s_units():
    """unit = tanh(b) = 0.2, exploration_noise 0.1: a / 2 - 0.2 ~ N(0, 0.1^2) (the clip to [-1, 1] is 8 sd away)."""
    actor = DeterministicActor(3, 1, hidden=(), action_low=[-2.0], action_high=[2.0])
    set_bias(actor.net[-1], math.atanh(0.2))
    policy = DeterministicActorPolicy(actor, BOX, settings={"exploration_noise": 0.1})
    noise = policy.act(obs_batch(), deterministic=False, generator=generator(4))[:, 0].double() / 2 - 0.2
    assert abs(float(noise.mean())) <= 5 * 0.1 / math.sqrt(N)
    assert abs(float(noise.std()) / 0.1 - 1) <= 5 / math.sqrt(2 * N)
    assert torch.allclose(policy.act(obs_batch(1)), torch.tensor([[0.4]]), atol=1e-6)
    with pytest.raises(ValueError, match=r"^DeterministicActorPolicy samples with the task's exploration_noise, which this run has not$"):
        DeterministicActorPolicy(actor, BOX).sample(obs_batch(2))


def every_policy():
    torch.manual_seed(5)
    sac = SquashedGaussianActor(3, 1, hidden=(4,), action_low=[-2.0], action_high=[2.0])
    td3 = DeterministicActor(3, 1, hidden=(4,), action_low=[-2.0], action_high=[2.0])
    return [QValuePolicy(MLP(3, 4, hidden=(4,)), gym.spaces.Discrete(4), settings={"eps_end": 0.5}),
            CategoricalPolicy(MLP(3, 4, hidden=(4,)), gym.spaces.Discrete(4)),
            ActorCriticPolicy(ActorCritic(3, 4, hidden=(4,)), gym.spaces.Discrete(4)),
            ActorCriticPolicy(ActorCritic(3, 1, continuous=True, hidden=(4,)), BOX),
            SquashedGaussianPolicy(sac, BOX), DeterministicActorPolicy(td3, BOX, settings={"exploration_noise": 0.5})]


def test_draws_repeat_with_the_caller_s_generator_and_differ_with_another():
    x = torch.randn(64, 3)
    for policy in every_policy():
        first, again, other = (policy.act(x, deterministic=False, generator=generator(s)) for s in (7, 7, 8))
        assert torch.equal(first, again) and not torch.equal(first, other), type(policy).__name__
        torch.manual_seed(9)
        global_first = policy.act(x, deterministic=False)
        torch.manual_seed(9)
        assert torch.equal(policy.act(x, deterministic=False), global_first)  # None: torch's global stream


# ---- networks, files, members -----------------------------------------------------------------------------
def test_each_family_builds_the_plain_network_its_task_trains():
    actor_critic = ActorCriticPolicy.network(functools.partial(ActorCritic, hidden=(4,)), OBS3, BOX)
    assert actor_critic.continuous and actor_critic.log_std.value.shape == (1,)
    assert not ActorCriticPolicy.network(functools.partial(ActorCritic, hidden=(4,)), OBS3, gym.spaces.Discrete(2)).continuous
    bounded = gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([3.0, 1.0], np.float32))
    for cls, actor in ((SquashedGaussianPolicy, SquashedGaussianActor), (DeterministicActorPolicy, DeterministicActor)):
        net = cls.network(functools.partial(actor, hidden=(4,)), OBS3, bounded)
        assert net.bounds.scale.tolist() == [2.0, 0.5] and net.bounds.bias.tolist() == [1.0, 0.5]
    q = QValuePolicy.network(functools.partial(MLP, hidden=(4,)), gym.spaces.Box(0, 1, (2, 3)), gym.spaces.Discrete(5))
    assert q(torch.zeros(1, 6)).shape == (1, 5)


def test_the_files_a_policy_acts_with_are_required_and_other_spaces_refused():
    assert ActorCriticPolicy.files_needed({"normalize_obs": False}) == {}
    with pytest.raises(ValueError, match=r"^ActorCriticPolicy acts with obs_norm\.pt \(this run normalised its observations "):
        ActorCriticPolicy(ActorCritic(3, 2, hidden=(4,)), gym.spaces.Discrete(2), settings={"normalize_obs": True})
    with pytest.raises(ValueError, match=r"^CategoricalPolicy acts in Discrete or Box action spaces; got MultiDiscrete"):
        CategoricalPolicy(MLP(3, 2), gym.spaces.MultiDiscrete([2, 2]))


def test_a_policy_over_k_members_with_their_files_stacked_acts_as_each_member_alone():
    """What a training evaluation plays (an ensemble, the members' obs_norm.pt stacked) is, member for member, what
    the member's own network and file play."""
    seeds, x = [3, 4, 5], torch.randn(3, 50, 3) * 2
    factory = functools.partial(ActorCritic, hidden=(8,), continuous=True)
    ensemble = make_ensemble(factory, seeds, (3,), 1)
    files = [{OBS_NORM: {"mean": torch.randn(3, dtype=torch.float64), "var": torch.rand(3, dtype=torch.float64) + 0.5,
                         "count": torch.tensor(float(i), dtype=torch.float64), "eps": torch.tensor(1e-8, dtype=torch.float64),
                         "clip": torch.tensor(2.0, dtype=torch.float64)}} for i in range(3)]
    stacked = member_files(files)
    assert stacked[OBS_NORM]["mean"].shape == (3, 1, 3) and stacked[OBS_NORM]["eps"].shape == ()  # shared: kept once
    settings = {"normalize_obs": True}
    with torch.no_grad():
        together = ActorCriticPolicy(ensemble, BOX, stacked, settings)(x)
        for i, seed in enumerate(seeds):
            torch.manual_seed(seed)
            alone = ActorCriticPolicy(factory(in_features=3, out_features=1), BOX, files[i], settings)
            alone.net.load_state_dict(ensemble.member_state_dict(i))
            assert torch.allclose(together[i], alone(x[i]), atol=1e-6)
    assert member_files([]) == {}
    with pytest.raises(ValueError, match=r"^f: k differs between agents and is not a tensor; it cannot be stacked$"):
        member_files([{"f": {"k": 1}}, {"f": {"k": 2}}])

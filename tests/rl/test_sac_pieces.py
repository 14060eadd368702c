"""SAC's and TD3's pieces (rl/squashed_gaussian.py, rl/offpolicy.py) against references and hand-computed values."""

import math

import pytest
import torch
from torch.distributions import Normal, TransformedDistribution
from torch.distributions.transforms import TanhTransform

from pipeline.rl.offpolicy import (
    exploration_actions,
    sac_actor_loss,
    scale_to_bounds,
    smoothed_target_actions,
    temperature_loss,
    twin_q_loss,
    twin_q_target,
)
from pipeline.rl.squashed_gaussian import (
    per_agent_normal,
    squashed_gaussian_log_prob,
    squashed_gaussian_sample,
    tanh_log_det,
)


def test_log_prob_matches_torch_transformed_distribution():
    g = torch.Generator().manual_seed(0)
    mean = torch.randn(3, 50, 4, generator=g, dtype=torch.float64)
    log_std = torch.randn(3, 50, 4, generator=g, dtype=torch.float64).clamp(-3, 1)
    u = mean + log_std.exp() * torch.randn(3, 50, 4, generator=g, dtype=torch.float64)
    reference = TransformedDistribution(Normal(mean, log_std.exp()), [TanhTransform()])
    expected = reference.log_prob(torch.tanh(u)).sum(-1)
    ours = squashed_gaussian_log_prob(mean, log_std, u)
    # Both are exact in float64 except where tanh(u) rounds toward +-1 and the reference's atanh loses digits.
    keep = torch.tanh(u).abs().amax(-1) < 0.999
    assert keep.sum() > 75
    assert torch.allclose(ours[keep], expected[keep], atol=1e-8, rtol=1e-10)


def test_the_correction_is_what_the_squashing_changes():
    # Without the log-det, the density would be the Gaussian's: the difference is the correction, exactly.
    u = torch.tensor([[0.0, 0.5, -3.0]], dtype=torch.float64)
    mean, log_std = torch.zeros_like(u), torch.zeros_like(u)
    gaussian = Normal(mean, 1.0).log_prob(u).sum(-1)
    expected = gaussian - torch.log(1 - torch.tanh(u) ** 2).sum(-1)
    assert torch.allclose(squashed_gaussian_log_prob(mean, log_std, u), expected, atol=1e-12)
    # At u = 0 the squashing is the identity to first order: no correction.
    assert tanh_log_det(torch.zeros(1, dtype=torch.float64)).item() == pytest.approx(0.0, abs=1e-15)


def test_tanh_log_det_stays_finite_where_the_naive_form_breaks():
    u = torch.tensor([10.0, 20.0, -30.0])  # float32: tanh(u) rounds to +-1 and log(1 - a^2) is -inf
    assert torch.isinf(torch.log(1 - torch.tanh(u) ** 2)).all()
    # log(1 - tanh(u)^2) = log(4) - 2|u| - 2 log(1 + exp(-2|u|)) ~ log 4 - 2|u| for large |u|.
    assert torch.allclose(tanh_log_det(u), math.log(4.0) - 2 * u.abs(), atol=1e-5)


def test_sample_is_in_bounds_reparameterised_and_per_agent():
    mean = torch.zeros(2, 5, 3, requires_grad=True)
    log_std = torch.zeros(2, 5, 3, requires_grad=True)
    gens = [torch.Generator().manual_seed(7), torch.Generator().manual_seed(8)]
    actions, log_prob = squashed_gaussian_sample(mean, log_std, gens)
    assert actions.shape == (2, 5, 3) and log_prob.shape == (2, 5)
    assert actions.abs().max() < 1
    (actions.sum() + log_prob.sum()).backward()
    assert mean.grad.abs().sum() > 0 and log_std.grad.abs().sum() > 0
    # Agent 1 of a batch draws what the single run of its seed draws: the same noise (one randn of the same shape from
    # the same generator state, equal by construction), squashed to the same actions up to tanh's rounding, which may
    # differ between a vectorised kernel over 30 values and a scalar tail over 15: a few float32 ulps below 1.
    alone, _ = squashed_gaussian_sample(torch.zeros(1, 5, 3), torch.zeros(1, 5, 3), [torch.Generator().manual_seed(8)])
    noise = per_agent_normal((2, 5, 3), [torch.Generator().manual_seed(7), torch.Generator().manual_seed(8)], "cpu")
    assert torch.equal(noise[1], torch.randn(5, 3, generator=torch.Generator().manual_seed(8)))
    assert torch.allclose(alone[0], actions[1].detach(), rtol=0, atol=8 * torch.finfo(torch.float32).eps)
    assert torch.allclose(actions.detach(), torch.tanh(noise), rtol=0, atol=8 * torch.finfo(torch.float32).eps)
    # And the log-probability returned is the one of the action returned.
    u = torch.atanh(actions.detach().double())
    assert torch.allclose(log_prob.detach().double(), squashed_gaussian_log_prob(mean.detach().double(), log_std.detach().double(), u), atol=1e-4)


def test_per_agent_normal_checks_the_generators():
    with pytest.raises(ValueError, match="one generator per agent"):
        per_agent_normal((3, 2), [torch.Generator()], "cpu")


def test_soft_target_by_hand():
    # r + gamma (1 - d) (min(q1', q2') - alpha log pi'): agent 0 with alpha 0.5, agent 1 with alpha 2.
    rewards = torch.tensor([[1.0, 1.0], [0.0, 2.0]])
    terminated = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    q1 = torch.tensor([[3.0, 5.0], [4.0, -1.0]])
    q2 = torch.tensor([[4.0, 2.0], [1.0, 0.0]])
    log_prob = torch.tensor([[-2.0, -2.0], [1.0, -0.5]])
    alpha = torch.tensor([0.5, 2.0])
    target = twin_q_target(rewards, terminated, q1, q2, 0.9, log_prob, alpha)
    expected = torch.tensor([[1 + 0.9 * (3 + 1.0), 1.0], [0.9 * (1 - 2.0), 2 + 0.9 * (-1 + 1.0)]])
    assert torch.allclose(target, expected)
    # TD3's: no entropy term.
    assert torch.allclose(twin_q_target(rewards, terminated, q1, q2, 0.9), torch.tensor([[1 + 2.7, 1.0], [0.9, 2 - 0.9]]))
    with pytest.raises(ValueError, match="both next_log_prob and alpha"):
        twin_q_target(rewards, terminated, q1, q2, 0.9, log_prob)


def test_twin_q_loss_sums_both_critics_per_agent_and_stops_the_target_gradient():
    q1 = torch.tensor([[1.0, 2.0], [0.0, 0.0]], requires_grad=True)
    q2 = torch.tensor([[0.0, 2.0], [1.0, 1.0]], requires_grad=True)
    target = torch.tensor([[1.0, 1.0], [2.0, 0.0]], requires_grad=True)
    loss = twin_q_loss(q1, q2, target)
    assert torch.allclose(loss, torch.tensor([(0 + 1) / 2 + (1 + 1) / 2, (4 + 0) / 2 + (1 + 1) / 2]))
    loss.sum().backward()
    assert target.grad is None


def test_actor_loss_holds_alpha_fixed():
    q1 = torch.tensor([[1.0, 3.0]])
    q2 = torch.tensor([[2.0, 0.0]])
    log_prob = torch.tensor([[-1.0, 1.0]])
    alpha = torch.tensor([0.5], requires_grad=True)
    loss = sac_actor_loss(q1, q2, log_prob, alpha)
    assert torch.allclose(loss, torch.tensor([((-0.5 - 1.0) + (0.5 - 0.0)) / 2]))
    assert not loss.requires_grad  # nothing here reaches alpha


def test_temperature_loss_value_and_direction():
    log_alpha = torch.zeros(2, requires_grad=True)
    # Agent 0's entropy (-mean log pi = 3) is above the target (-1 -> target entropy 1): alpha must fall.
    # Agent 1's entropy (-1) is below it: alpha must rise.
    log_prob = torch.tensor([[-3.0, -3.0], [1.0, 1.0]], requires_grad=True)
    loss = temperature_loss(log_alpha, log_prob, target_entropy=1.0)
    assert torch.allclose(loss, torch.tensor([0.0, 0.0]))  # log alpha = 0
    loss.sum().backward()
    assert torch.allclose(log_alpha.grad, torch.tensor([2.0, -2.0]))  # gradient descent: agent 0 down, agent 1 up
    assert log_prob.grad is None
    at = temperature_loss(torch.tensor([math.log(2.0)]), torch.tensor([[-0.5]]), 2.0)
    assert at.item() == pytest.approx(-math.log(2.0) * 1.5)


def test_smoothing_noise_is_clipped_and_actions_stay_in_bounds():
    actions = torch.zeros(2, 4000, 1)
    smoothed = smoothed_target_actions(actions, noise_std=0.2, noise_clip=0.5, generators=[torch.Generator().manual_seed(i) for i in range(2)])
    assert smoothed.abs().max() <= 0.5 and smoothed.abs().max() > 0.45  # N(0, 0.2) passes 0.5 in ~1.2% of 8000 draws
    assert (smoothed.abs() == 0.5).float().mean() == pytest.approx(0.0124, abs=0.006)
    near_edge = smoothed_target_actions(torch.full((1, 1000, 1), 0.9), 0.2, 0.5, [torch.Generator().manual_seed(3)])
    assert near_edge.max() == 1.0 and near_edge.min() >= 0.4 - 1e-6
    unclipped = smoothed_target_actions(actions, noise_std=0.2, noise_clip=10.0, generators=[torch.Generator().manual_seed(i) for i in range(2)])
    assert unclipped.std().item() == pytest.approx(0.2, rel=0.05)
    with pytest.raises(ValueError, match="noise_std and noise_clip"):
        smoothed_target_actions(actions, 0.2, -0.1)


def test_exploration_noise_and_scaling():
    noisy = exploration_actions(torch.full((1, 2000, 2), 0.95), 0.1, [torch.Generator().manual_seed(0)])
    assert noisy.max() == 1.0 and noisy.min() > 0.5
    low, high = torch.tensor([-2.0, 0.0]), torch.tensor([2.0, 10.0])
    assert torch.equal(scale_to_bounds(torch.tensor([[-1.0, 1.0], [0.0, 0.0]]), low, high), torch.tensor([[-2.0, 10.0], [0.0, 5.0]]))


def test_per_agent_normal_keeps_shape_dtype_and_device_on_both_paths():
    torch.manual_seed(11)
    expected = torch.randn(2, 3, dtype=torch.float64)
    torch.manual_seed(11)
    shared = per_agent_normal((2, 3), None, "cpu", torch.float64)
    assert shared.dtype == torch.float64 and torch.equal(shared, expected)
    own = per_agent_normal((2, 3), [torch.Generator().manual_seed(i) for i in (4, 5)], "cpu", torch.float64)
    assert own.dtype == torch.float64
    assert torch.equal(own[1], torch.randn(3, generator=torch.Generator().manual_seed(5), dtype=torch.float64))
    # The meta device (shapes only) stands in for an accelerator: the noise lands where it is asked for.
    assert per_agent_normal((2, 3), None, "meta").device.type == "meta"
    assert per_agent_normal((2, 3), [torch.Generator(), torch.Generator()], "meta").device.type == "meta"
    with pytest.raises(ValueError, match=r"one generator per agent \(3\), got 1"):
        per_agent_normal((3, 2), [torch.Generator()], "cpu")


def test_sample_draws_noise_in_the_mean_dtype_and_device():
    mean, log_std = torch.zeros(1, 4, 2, dtype=torch.float64), torch.zeros(1, 4, 2, dtype=torch.float64)
    actions, _ = squashed_gaussian_sample(mean, log_std, [torch.Generator().manual_seed(2)])
    expected = torch.tanh(torch.randn(4, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64))
    assert torch.allclose(actions[0], expected, rtol=0, atol=1e-15)
    on_meta, _ = squashed_gaussian_sample(mean.to("meta"), log_std.to("meta"))
    assert on_meta.device.type == "meta"


def _noise(seed, shape, std):
    return std * torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_exploration_actions_by_hand_on_both_edges():
    actions = torch.tensor([[[-0.95, 0.0, 0.95]] * 200], dtype=torch.float64)  # [1, 200, 3]
    noisy = exploration_actions(actions, 0.3, [torch.Generator().manual_seed(6)])
    expected = torch.clamp(actions[0] + _noise(6, (200, 3), 0.3), -1.0, 1.0)
    assert noisy.dtype == torch.float64 and torch.allclose(noisy[0], expected, rtol=0, atol=1e-15)
    assert noisy.min() == -1.0 and noisy.max() == 1.0
    assert exploration_actions(actions.to("meta"), 0.3).device.type == "meta"


def test_smoothed_target_actions_by_hand_on_both_edges_and_zero_noise():
    actions = torch.tensor([[[-0.95, 0.0, 0.95]] * 200], dtype=torch.float64)
    smoothed = smoothed_target_actions(actions, 0.3, 0.4, [torch.Generator().manual_seed(9)])
    expected = torch.clamp(actions[0] + _noise(9, (200, 3), 0.3).clamp(-0.4, 0.4), -1.0, 1.0)
    assert smoothed.dtype == torch.float64 and torch.allclose(smoothed[0], expected, rtol=0, atol=1e-15)
    assert smoothed.min() == -1.0 and smoothed.max() == 1.0
    assert smoothed_target_actions(actions.to("meta"), 0.3, 0.4).device.type == "meta"
    # Zero noise or a zero clip are valid settings (no smoothing): the actions come back unchanged.
    assert torch.equal(smoothed_target_actions(actions, 0.0, 0.4), actions)
    assert torch.equal(smoothed_target_actions(actions, 0.3, 0.0), actions)


def test_losses_reduce_over_the_batch_per_agent_with_k_not_b():
    # K = 2 agents, B = 3 samples: a reduction over the wrong axis or a mis-shaped alpha cannot line up.
    q1 = torch.tensor([[1.0, 4.0, 0.0], [2.0, -1.0, 3.0]])
    q2 = torch.tensor([[2.0, 1.0, 1.0], [0.0, 1.0, 5.0]])
    target = torch.tensor([[0.0, 2.0, 1.0], [1.0, 1.0, 1.0]])
    # Agent 0: q1 errors 1, 4, 1; q2 errors 4, 1, 0. Agent 1: q1 errors 1, 4, 4; q2 errors 1, 0, 16.
    assert torch.allclose(twin_q_loss(q1, q2, target), torch.tensor([6 / 3 + 5 / 3, 9 / 3 + 17 / 3]))
    log_prob = torch.tensor([[-1.0, 2.0, 0.5], [1.0, -2.0, 4.0]])
    alpha = torch.tensor([0.5, 2.0])
    # min(q1, q2): [1, 1, 0] and [0, -1, 3].
    expected = torch.tensor([(-0.5 - 1 + 1.0 - 1 + 0.25 - 0) / 3, (2.0 - 0 - 4.0 + 1 + 8.0 - 3) / 3])
    assert torch.allclose(sac_actor_loss(q1, q2, log_prob, alpha), expected)


def test_twin_q_target_takes_boolean_terminations_and_names_both_modes():
    rewards = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    terminated = torch.tensor([[False, True]])
    target = twin_q_target(rewards, terminated, torch.tensor([[3.0, 3.0]]), torch.tensor([[5.0, 1.0]]), 0.5)
    assert torch.allclose(target, torch.tensor([[1.0 + 0.5 * 3.0, 2.0]], dtype=torch.float64))
    with pytest.raises(ValueError, match=r"^twin_q_target takes both next_log_prob and alpha \(SAC\) or neither \(TD3\)$"):
        twin_q_target(rewards, terminated, rewards, rewards, 0.9, alpha=torch.ones(1))

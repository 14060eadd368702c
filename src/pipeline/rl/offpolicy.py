"""The pieces of off-policy actor-critic learning (SAC, TD3), as small functions over a leading agent axis.

Every tensor is [K, B, ...]: K agents, B samples each. Each loss comes back per agent, [K], so the
caller sums over agents before `backward()` and agent k gets exactly the gradient it would get alone.

- `twin_q_target`: the clipped double-Q target r + gamma (1 - terminated) (min(Q1', Q2') - alpha log pi'),
  SAC's soft target when alpha and the next log-probabilities are given, TD3's plain one otherwise;
- `twin_q_loss`: each critic's mean squared error to the target, summed over the two critics;
- `sac_actor_loss`: E[alpha log pi(a|s) - min(Q1, Q2)(s, a)] over fresh reparameterised actions;
- `temperature_loss`: the entropy temperature's loss, which raises alpha while the policy's entropy is below the
  target and lowers it above: -log(alpha) (log pi + target entropy) (SB3's form) or, `scaled`,
  -alpha (log pi + target entropy) (CleanRL's: its steps shrink with alpha);
- `smoothed_target_actions`: TD3's target policy smoothing, Gaussian noise clipped to +-noise_clip;
- `exploration_actions`: TD3's Gaussian exploration noise, clipped to the action bounds;
- `scale_to_bounds`: actions in [-1, 1] to an env's [low, high].
Polyak averaging of the target networks is `pipeline.rl.targets.soft_update`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pipeline.rl.squashed_gaussian import per_agent_normal


def twin_q_target(
    rewards: torch.Tensor,
    terminated: torch.Tensor,
    next_q1: torch.Tensor,
    next_q2: torch.Tensor,
    gamma: float,
    next_log_prob: torch.Tensor | None = None,
    alpha: torch.Tensor | None = None,
) -> torch.Tensor:
    """[K, B] targets of both critics; `alpha` [K] (one temperature per agent) with `next_log_prob` [K, B] for SAC."""
    next_v = torch.minimum(next_q1, next_q2)
    if (next_log_prob is None) != (alpha is None):
        raise ValueError("twin_q_target takes both next_log_prob and alpha (SAC) or neither (TD3)")
    if alpha is not None:
        next_v = next_v - alpha.view(-1, *([1] * (next_v.dim() - 1))) * next_log_prob
    return rewards + gamma * (1.0 - terminated.to(rewards.dtype)) * next_v


def twin_q_loss(q1: torch.Tensor, q2: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """[K]: each agent's MSE(Q1, target) + MSE(Q2, target) over its batch (the target carries no gradient)."""
    target = target.detach()
    return ((q1 - target) ** 2).mean(-1) + ((q2 - target) ** 2).mean(-1)


def sac_actor_loss(q1: torch.Tensor, q2: torch.Tensor, log_prob: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """[K]: mean over the batch of alpha log pi - min(Q1, Q2), alpha [K] held fixed."""
    alpha = alpha.detach().view(-1, *([1] * (log_prob.dim() - 1)))
    return (alpha * log_prob - torch.minimum(q1, q2)).mean(-1)


def temperature_loss(log_alpha: torch.Tensor, log_prob: torch.Tensor, target_entropy: float, scaled: bool = False) -> torch.Tensor:
    """[K]: -log_alpha[k] * mean(log pi + target_entropy), or with `scaled` -exp(log_alpha[k]) * mean(...) (CleanRL's
    form: the gradient in log_alpha is alpha times the unscaled one); either pushes the entropy toward the target."""
    coefficient = log_alpha.exp() if scaled else log_alpha
    return -(coefficient * (log_prob.detach() + target_entropy).mean(-1))


def scale_to_bounds(actions: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Actions in [-1, 1] mapped affinely onto [low, high] (per dimension)."""
    return low + (actions + 1.0) * (0.5 * (high - low))


def smoothed_target_actions(
    actions: torch.Tensor,
    noise_std: float,
    noise_clip: float,
    generators: Sequence[torch.Generator] | None = None,
) -> torch.Tensor:
    """TD3's target policy smoothing on actions in [-1, 1]: a + clip(N(0, noise_std), -noise_clip, noise_clip), back into [-1, 1].

    Working in [-1, 1] is CleanRL's noise times the action scale, in the env's units. Agent k's noise
    comes from generators[k].
    """
    if noise_std < 0 or noise_clip < 0:
        raise ValueError(f"smoothing noise_std and noise_clip must be >= 0, got {noise_std} and {noise_clip}")
    noise = per_agent_normal(actions.shape, generators, actions.device, actions.dtype) * noise_std
    return (actions + noise.clamp(-noise_clip, noise_clip)).clamp(-1.0, 1.0)


def exploration_actions(actions: torch.Tensor, noise_std: float, generators: Sequence[torch.Generator] | None = None) -> torch.Tensor:
    """TD3's behaviour policy on actions in [-1, 1]: a + N(0, noise_std), clipped back into [-1, 1]."""
    noise = per_agent_normal(actions.shape, generators, actions.device, actions.dtype) * noise_std
    return (actions + noise).clamp(-1.0, 1.0)

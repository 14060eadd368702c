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

One gradient step's losses as functions of the networks and of noise drawn beforehand (`sac_critic_losses`,
`sac_actor_losses`, `td3_critic_losses`, `td3_actor_losses`): the eager step and `device.compile=true` call the
same function (through `pipeline.nets.ensemble.compile_over_members`), the draws made eagerly in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pipeline.rl.squashed_gaussian import per_agent_normal, squashed_gaussian_from_noise


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
    return smoothed_from_noise(actions, noise, noise_clip)


def smoothed_from_noise(actions: torch.Tensor, noise: torch.Tensor, noise_clip: float) -> torch.Tensor:
    """TD3's smoothing on noise drawn beforehand (already scaled by its std): a + clip(noise), back into [-1, 1]."""
    return (actions + noise.clamp(-noise_clip, noise_clip)).clamp(-1.0, 1.0)


def exploration_actions(actions: torch.Tensor, noise_std: float, generators: Sequence[torch.Generator] | None = None) -> torch.Tensor:
    """TD3's behaviour policy on actions in [-1, 1]: a + N(0, noise_std), clipped back into [-1, 1]."""
    noise = per_agent_normal(actions.shape, generators, actions.device, actions.dtype) * noise_std
    return (actions + noise).clamp(-1.0, 1.0)


def sac_critic_losses(actor, critic, critic_target, obs, actions, rewards, next_obs, terminated, next_noise,
                      alpha: torch.Tensor, gamma: float, log_det_epsilon: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """SAC's critic step: (each agent's twin-Q loss [K], its Q1 mean [K]). The soft target's next actions come from
    the actor at the NEXT observations with the draws `next_noise` [K, B, D]; no gradient reaches the target."""
    with torch.no_grad():
        next_actions, next_log_prob = squashed_gaussian_from_noise(*actor.distribution(next_obs), next_noise, log_det_epsilon)
        target = twin_q_target(rewards, terminated, *critic_target(next_obs, next_actions), gamma, next_log_prob, alpha)
    q1, q2 = critic(obs, actions)
    return twin_q_loss(q1, q2, target), q1.detach().mean(-1)


def sac_actor_losses(actor, critic, obs, noise, alpha: torch.Tensor, log_det_epsilon: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """SAC's actor step: (each agent's loss [K], the log-probabilities of its reparameterised actions [K, B])."""
    actions, log_prob = squashed_gaussian_from_noise(*actor.distribution(obs), noise, log_det_epsilon)
    return sac_actor_loss(*critic(obs, actions), log_prob, alpha), log_prob.detach()


def td3_critic_losses(actor_target, critic, critic_target, obs, actions, rewards, next_obs, terminated, smoothing_noise,
                      noise_clip: float, gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """TD3's critic step: (each agent's twin-Q loss [K], its Q1 mean [K]); the target actor's next actions smoothed by
    `smoothing_noise` [K, B, D] (already scaled by policy_noise), clipped to +-noise_clip."""
    with torch.no_grad():
        next_actions = smoothed_from_noise(actor_target.unit(next_obs), smoothing_noise, noise_clip)
        target = twin_q_target(rewards, terminated, *critic_target(next_obs, next_actions), gamma)
    q1, q2 = critic(obs, actions)
    return twin_q_loss(q1, q2, target), q1.detach().mean(-1)


def td3_actor_losses(actor, critic, obs) -> torch.Tensor:
    """TD3's actor step: each agent's -mean Q1(s, actor(s)) [K]."""
    return -critic(obs, actor.unit(obs))[0].mean(-1)

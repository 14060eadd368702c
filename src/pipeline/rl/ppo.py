"""The pieces of PPO (Schulman et al. 2017) as small pure functions over a leading agent axis K.

Rollouts are time-major, [T, K, E] (steps, agents, envs per agent); a minibatch is [K, M], one row of
M samples per agent. Every loss comes back per agent ([K]): summed over agents it gives member i
exactly the gradient it would get alone (see pipeline.nets.ensemble), so K agents train as K
independent runs.

Termination and truncation are told apart where the value bootstrap is formed (Pardo et al. 2018,
"Time limits in reinforcement learning"): a terminated step's next value is 0; a truncated step's
is the value of the observation the step really reached (`TensorStep.final_obs`), not of the next
episode's first observation. Both cut the GAE recursion, since the next step belongs to another
episode. (CleanRL's ppo.py treats a truncation as a termination.)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def bootstrap_values(values: torch.Tensor, last_values: torch.Tensor, truncated: torch.Tensor, final_values: torch.Tensor) -> torch.Tensor:
    """V of where each step led, [T, ...]: the next step's value, V(obs after the rollout) for the last
    step, and V(final observation) where the step was truncated.

    values [T, ...]: V(obs_t); last_values [...]: V(obs_T); truncated [T, ...]; final_values [T, ...]:
    V(final_obs_t) (only read where truncated). A terminated step's entry is whatever it is: `gae` zeroes it.
    """
    following = torch.cat((values[1:], last_values.unsqueeze(0)))
    return torch.where(truncated, final_values, following)


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    done: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimates and the value targets (returns), both [T, ...] like `rewards`.

    delta_t = r_t + gamma * (1 - terminated_t) * next_values_t - values_t
    A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1},   A_T = 0
    returns = A + values (the TD(lambda) targets)

    `next_values` comes from `bootstrap_values`; `done` = terminated | truncated ends the recursion.
    """
    keep_value = 1.0 - terminated.to(rewards.dtype)
    carry = gamma * lam * (1.0 - done.to(rewards.dtype))
    deltas = rewards + gamma * keep_value * next_values - values
    advantages = torch.empty_like(deltas)
    running = torch.zeros_like(deltas[0])
    for t in range(deltas.shape[0] - 1, -1, -1):
        running = deltas[t] + carry[t] * running
        advantages[t] = running
    return advantages, advantages + values


def normalize_advantages(advantages: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(A - mean) / (std + eps) over the last axis (one agent's minibatch), std with Bessel's correction as CleanRL's."""
    mean = advantages.mean(-1, keepdim=True)
    std = advantages.std(-1, keepdim=True)
    return (advantages - mean) / (std + eps)


def clipped_surrogate_loss(new_log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor, clip: float) -> torch.Tensor:
    """The clipped policy loss per agent, [K]: mean over the last axis of
    max(-ratio * A, -clip(ratio, 1 - clip, 1 + clip) * A), ratio = exp(new - old)
    (the negative of the paper's L^CLIP, to be minimised)."""
    ratio = torch.exp(new_log_prob - old_log_prob)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip, 1.0 + clip)
    return torch.maximum(unclipped, clipped).mean(-1)


def value_loss(new_values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float | None) -> torch.Tensor:
    """0.5 * squared error to the returns per agent, [K]. With `clip`, the larger of the errors of the new
    value and of the old value moved by at most `clip` towards it (PPO2's / CleanRL's clipped value loss)."""
    error = (new_values - returns) ** 2
    if clip is not None:
        moved = old_values + torch.clamp(new_values - old_values, -clip, clip)
        error = torch.maximum(error, (moved - returns) ** 2)
    return 0.5 * error.mean(-1)


def ppo_loss(policy_loss: torch.Tensor, value_loss: torch.Tensor, entropy: torch.Tensor, vf_coef: float, ent_coef: float) -> torch.Tensor:
    """policy_loss - ent_coef * entropy + vf_coef * value_loss, per agent (each [K]); entropy is the minibatch's mean."""
    return policy_loss - ent_coef * entropy + vf_coef * value_loss


def ratio_diagnostics(new_log_prob: torch.Tensor, old_log_prob: torch.Tensor, clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(approximate KL, clip fraction) per agent, [K] each, without gradients: the k3 estimator
    mean((ratio - 1) - log ratio) (Schulman's "Approximating KL divergence", CleanRL's approx_kl) and the
    share of samples with |ratio - 1| > clip."""
    # `with`, not a decorator: mutmut skips decorated functions.
    with torch.no_grad():
        log_ratio = new_log_prob - old_log_prob
        ratio = torch.exp(log_ratio)
        return ((ratio - 1.0) - log_ratio).mean(-1), ((ratio - 1.0).abs() > clip).to(ratio.dtype).mean(-1)


def minibatch_indices(generators: Sequence[torch.Generator], batch_size: int, n_minibatches: int) -> torch.Tensor:
    """[n_minibatches, K, batch_size // n_minibatches] sample indices: a fresh permutation of the batch for
    each agent, drawn from its own generator (so agent i shuffles as the single run of its seed does)."""
    if n_minibatches <= 0 or batch_size % n_minibatches:
        raise ValueError(f"a batch of {batch_size} samples does not split into {n_minibatches} equal minibatches")
    perms = torch.stack([torch.randperm(batch_size, generator=g, device=g.device) for g in generators])
    return perms.view(len(generators), n_minibatches, -1).transpose(0, 1)


def annealed_lr(base_lr: float, update: int, n_updates: int) -> float:
    """The learning rate of update `update` (0-based) of `n_updates`: linear from base_lr down to base_lr / n_updates."""
    return base_lr * (1.0 - update / n_updates)


class RunningMeanStd:
    """Per-agent running mean and variance of [K, N, *shape] batches: gymnasium's RunningMeanStd
    (count starting at `epsilon`, variance at 1, Chan et al.'s parallel update), one per agent, in float64."""

    def __init__(self, n_agents: int, shape: Sequence[int] = (), epsilon: float = 1e-4, device: str | torch.device = "cpu"):
        self.mean = torch.zeros(n_agents, *shape, dtype=torch.float64, device=device)
        self.var = torch.ones(n_agents, *shape, dtype=torch.float64, device=device)
        self.count = torch.full((n_agents,), float(epsilon), dtype=torch.float64, device=device)

    def update(self, batch: torch.Tensor, agents: torch.Tensor | None = None) -> None:
        """Fold in a batch [K, N, *shape] (N samples per agent); with `agents` (indices), the batch's rows are those agents'."""
        x = batch.to(torch.float64)
        n = x.shape[1]
        mean, var, count = self._rows(agents)
        batch_mean, batch_var = x.mean(1), x.var(1, unbiased=False)
        count_b = count.view(-1, *([1] * (mean.dim() - 1)))
        total = count_b + n
        delta = batch_mean - mean
        new_mean = mean + delta * n / total
        new_var = (var * count_b + batch_var * n + delta**2 * count_b * n / total) / total
        if agents is None:
            self.mean, self.var, self.count = new_mean, new_var, count + n
        else:
            self.mean = self.mean.index_copy(0, agents, new_mean)
            self.var = self.var.index_copy(0, agents, new_var)
            self.count = self.count.index_copy(0, agents, count + n)

    def _rows(self, agents: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if agents is None:
            return self.mean, self.var, self.count
        return self.mean.index_select(0, agents), self.var.index_select(0, agents), self.count.index_select(0, agents)

    def normalize(self, batch: torch.Tensor, clip: float | None = None, eps: float = 1e-8, agents: torch.Tensor | None = None) -> torch.Tensor:
        """(batch - mean) / sqrt(var + eps) per agent, optionally clipped to [-clip, clip], in batch's dtype
        (with `agents`, the batch's rows are those agents')."""
        mean, var, _ = self._rows(agents)
        out = (batch - mean.unsqueeze(1)) / torch.sqrt(var.unsqueeze(1) + eps)
        out = out if clip is None else out.clamp(-clip, clip)
        return out.to(batch.dtype)

    def keep_agents_(self, agents: torch.Tensor) -> None:
        """Keep only `agents` (indices, in that order): the others left the batch."""
        self.mean, self.var, self.count = self._rows(agents)

    def agent_state(self, i: int, clip: float | None = None, eps: float = 1e-8) -> dict[str, torch.Tensor]:
        """Agent i's statistics as `normalize` applies them (with `clip` and `eps`), CPU tensors: what a replay of
        its policy needs (`normalize_observation`)."""
        state = {"mean": self.mean[i].cpu().clone(), "var": self.var[i].cpu().clone(), "count": self.count[i].cpu().clone(),
                 "eps": torch.tensor(float(eps), dtype=torch.float64)}
        if clip is not None:
            state["clip"] = torch.tensor(float(clip), dtype=torch.float64)
        return state

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"mean": self.mean.clone(), "var": self.var.clone(), "count": self.count.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if state["mean"].shape != self.mean.shape:
            raise ValueError(f"running statistics of shape {tuple(state['mean'].shape)} cannot load into {tuple(self.mean.shape)}")
        device = self.mean.device
        self.mean, self.var, self.count = (state[k].to(device, torch.float64) for k in ("mean", "var", "count"))


def normalize_observation(obs: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor:
    """One agent's observations [..., *shape] normalised as `RunningMeanStd.normalize` did in training, from its
    `agent_state`: (obs - mean) / sqrt(var + eps), clipped when the state has a clip, in obs's dtype."""
    mean, var = state["mean"].to(obs.device), state["var"].to(obs.device)
    out = (obs - mean) / torch.sqrt(var + float(state["eps"]))
    if "clip" in state:
        out = out.clamp(-float(state["clip"]), float(state["clip"]))
    return out.to(obs.dtype)


class RewardScaler:
    """Rewards divided by the running std of each agent's discounted return (SB3's VecNormalize, gymnasium's
    NormalizeReward): the return accumulator [K, E] restarts after every finished episode (terminated or
    truncated, as VecNormalize does), the reward is not centred, and it is clipped to [-clip, clip]."""

    def __init__(self, n_agents: int, envs_per_agent: int, gamma: float, clip: float | None = 10.0, epsilon: float = 1e-8,
                 device: str | torch.device = "cpu"):
        self.gamma, self.clip, self.epsilon = float(gamma), clip, float(epsilon)
        self.returns = torch.zeros(n_agents, envs_per_agent, dtype=torch.float64, device=device)
        self.stats = RunningMeanStd(n_agents, device=device)

    def __call__(self, rewards: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """Scale one step's rewards [K, E] (updating the statistics with it); `done` [K, E] ends episodes after it."""
        self.returns = self.returns * self.gamma + rewards.to(torch.float64)
        self.stats.update(self.returns)
        scaled = rewards / torch.sqrt(self.stats.var.unsqueeze(1) + self.epsilon)
        self.returns = self.returns.masked_fill(done, 0.0)
        scaled = scaled if self.clip is None else scaled.clamp(-self.clip, self.clip)
        return scaled.to(rewards.dtype)

    def keep_agents_(self, agents: torch.Tensor) -> None:
        """Keep only `agents` (indices, in that order): the others left the batch."""
        self.returns = self.returns.index_select(0, agents)
        self.stats.keep_agents_(agents)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"returns": self.returns.clone(), **{f"stats.{k}": v for k, v in self.stats.state_dict().items()}}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if state["returns"].shape != self.returns.shape:
            raise ValueError(f"return accumulators of shape {tuple(state['returns'].shape)} cannot load into {tuple(self.returns.shape)}")
        self.returns = state["returns"].to(self.returns.device, torch.float64)
        self.stats.load_state_dict({k[len("stats."):]: v for k, v in state.items() if k.startswith("stats.")})

"""SAC's and TD3's real training loop (`iterate()` under Lightning, the sac_hopper / td3_hopper presets as the CLI
composes them, their defaults untouched) for 3 agents with 2 envs each, on Hopper with a 19-step time limit so that
episodes end by falling and by the clock inside the window:

- every agent's replay rows are the steps its own envs took with the actions it stored (a hand-stepped gymnasium
  Hopper: `iterate_testing.play`), a time-limit truncation stored as not terminal;
- learning starts after `learning_starts` env steps of each agent, and the critics, actors (every policy_frequency-th
  critic step, policy_frequency of them for SAC) and temperature step as often as the presets say;
- the update does what the presets' defaults say, checked against a hand computation from what the networks were
  called with (forward hooks): the last critic loss is the clipped double-Q TD error with gamma 0.99 toward the target
  critics at the replay rows' next observations (SAC: minus alpha log pi of next actions drawn at those next
  observations), the targets move by tau 0.005 when they should, TD3's smoothing noise has std 0.2 clipped at 0.5
  and its exploration noise std 0.1;
- SAC's temperature steps by q_lr alpha (log pi + target entropy) (CleanRL's loss, from alpha_start 1.0), the
  default target entropy being -dim(action) (-3 on Hopper).
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from hydra import compose, initialize_config_module
from iterate_testing import adam_steps, check_replay_rows, endings, env_actions, fit, play, row_seed
from omegaconf import OmegaConf

from pipeline.runtime.run import build_task
from pipeline.runtime.seeding import seed_everything

pytest.importorskip("mujoco", reason="Hopper needs the mujoco extra: pip install -e '.[mujoco]'")

K, E, LIMIT, SEED = 3, 2, 19, 3  # random Hopper episodes: median 19 steps
LEARNING_STARTS, TOTAL_STEPS = 160, 222  # 111 steps of each env; steps 81..111 of each agent learn (2 t > 160): 31 updates
UPDATES = 31
GAMMA, TAU = 0.99, 0.005  # CleanRL's defaults, which the presets keep


@functools.cache
def composed(preset: str, *overrides: str):
    with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
        return compose(config_name="config", overrides=[
            f"experiment={preset}", f"seed={SEED}", f"+env.kwargs.max_episode_steps={LIMIT}", "model.hidden=[16,16]",
            "task.critic_hidden=[16,16]", f"task.envs_per_agent={E}", "task.batch_size=64", "task.buffer_size=1000",
            "task.eval_every=100000", "task.log_every=100000", *overrides,
        ])


def build(preset: str, *overrides: str, n_agents: int = K, **task_values):
    """The preset as the CLI composes it (with `overrides`), `task_values` set on its task node, built for `n_agents`."""
    cfg = copy.deepcopy(composed(preset, *overrides))
    for key, value in task_values.items():
        OmegaConf.update(cfg, f"task.{key}", value)
    seed_everything(SEED)  # as the lifecycle does
    return build_task(cfg, None, n_agents)


class Calls:
    """What the critics were called with during a fit, and the networks' weights at each target-critic call."""

    def __init__(self, task):
        self.task, self.critic, self.target = task, [], []
        task.critic.register_forward_hook(lambda m, args, out: self.critic.append((*(a.detach().clone() for a in args), *(o.detach().clone() for o in out))))
        task.critic_target.register_forward_hook(self.on_target)
        self.acting = []  # TD3: (obs, the actor's pre-tanh output) of each acting call
        if task.algorithm == "td3":
            task.net.net.register_forward_hook(lambda m, args, out: self.acting.append((args[0].clone(), out.clone()))
                                               if args[0].shape[1] == E else None)

    @torch.no_grad()
    def on_target(self, module, args, out):
        task = self.task
        next_obs, next_actions = (a.detach().clone() for a in args)
        call = {"next_obs": next_obs, "next_actions": next_actions, "q1": out[0].clone(), "q2": out[1].clone(),
                "weights": {name: copy.deepcopy(getattr(task, name).state_dict()) for name in ("net", "critic", "critic_target")},
                "critic_calls": len(self.critic)}
        if task.algorithm == "sac":
            call["alpha"] = task.log_alpha.detach().exp().clone()
            call["mean"], call["log_std"] = (x.clone() for x in task.net.distribution(next_obs))
        else:
            call["weights"]["actor_target"] = copy.deepcopy(task.actor_target.state_dict())
            call["target_actions"] = task.actor_target.unit(next_obs).clone()
        self.target.append(call)


@pytest.fixture(scope="module", params=["sac", "td3"])
def trained(request):
    task = build(f"{request.param}_hopper", total_steps=TOTAL_STEPS, learning_starts=LEARNING_STARTS)
    calls = Calls(task)
    fit(task)
    return task, calls


def test_each_agents_replay_rows_are_its_own_envs_steps_with_time_limits_not_terminal(trained):
    task, _ = trained
    replay = task.buffer.state_dict()
    steps_per_env = TOTAL_STEPS // E
    assert replay["size"] == TOTAL_STEPS and replay["actions"].shape == (K, TOTAL_STEPS, 3)
    low, high = task.action_space.low, task.action_space.high
    for agent in range(K):
        played = [play("Hopper-v5", {"max_episode_steps": LIMIT}, row_seed(SEED + agent, e),
                       env_actions(replay["actions"][agent, e::E].numpy(), low, high)) for e in range(E)]
        assert all(len(p.reward) == steps_per_env for p in played)
        check_replay_rows(replay, agent, E, played)
        # Both endings already while it acts at random (so no slip in learning can take them away).
        ended, cut = endings([p.head(LEARNING_STARTS // E) for p in played])
        assert ended and cut, f"agent {agent}: the window must hold both endings (terminated {ended}, truncated {cut})"


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_on_pendulum_the_env_gets_the_stored_actions_scaled_to_its_bounds(algo):
    """Pendulum's torque is in [-2, 2]: the replay keeps actions in [-1, 1] and the env must get them scaled (Hopper's
    bounds are [-1, 1], where a missing scale changes nothing). Its episodes end by the clock only."""
    task = build(f"{algo}_hopper", "env=pendulum", total_steps=80, learning_starts=40)
    fit(task)
    replay = task.buffer.state_dict()
    low, high = task.action_space.low, task.action_space.high
    assert (low, high) == (-2.0, 2.0) and task.updates == [20] * K
    for agent in range(K):
        played = [play("Pendulum-v1", {"max_episode_steps": LIMIT}, row_seed(SEED + agent, e),
                       env_actions(replay["actions"][agent, e::E].numpy(), low, high)) for e in range(E)]
        check_replay_rows(replay, agent, E, played)
        assert endings(played) == (0, 2 * (80 // E // LIMIT))


def test_learning_starts_after_learning_starts_steps_of_each_agent_and_each_network_steps_as_often_as_the_preset_says(trained):
    task, _ = trained
    assert task.env_steps == TOTAL_STEPS and task.updates == [UPDATES] * K
    assert adam_steps(task.critic_opt) == UPDATES
    if task.algorithm == "sac":
        # policy_frequency 2: after every 2nd critic step, 2 actor steps and 2 temperature steps (30 of each).
        assert adam_steps(task.actor_opt) == adam_steps(task.alpha_opt) == 30
    else:
        assert adam_steps(task.actor_opt) == 15  # policy_frequency 2: one actor step every 2nd critic step


def squashed_log_prob(actions: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """log pi(a) of a = tanh(u), u ~ N(mean, exp(log_std)^2), per row: the Gaussian's density of atanh(a) over |da/du|."""
    a, mean, std = actions.double(), mean.double(), log_std.double().exp()
    u = torch.atanh(a)
    return (torch.distributions.Normal(mean, std).log_prob(u) - torch.log1p(-a * a)).sum(-1)


def test_the_last_critic_loss_is_the_td_error_toward_the_targets_at_the_replay_rows_next_observations(trained):
    task, calls = trained
    assert len(calls.target) == UPDATES
    last = calls.target[-1]
    obs, actions, q1, q2 = calls.critic[last["critic_calls"]]  # the critic step's own call, right after the target's
    replay = task.buffer.state_dict()
    for agent in range(K):
        # Each sample is a replay row of this agent: its reward and terminal flag, and the target saw its next observation.
        rows = [int(((replay["obs"][agent] == o).all(-1) & (replay["actions"][agent] == a).all(-1)).nonzero()[0])
                for o, a in zip(obs[agent], actions[agent])]
        torch.testing.assert_close(last["next_obs"][agent], replay["next_obs"][agent, rows], rtol=0, atol=0)
        reward, done = replay["rewards"][agent, rows].double(), replay["dones"][agent, rows].double()
        next_v = torch.minimum(last["q1"][agent], last["q2"][agent]).double()
        if task.algorithm == "sac":
            log_pi = squashed_log_prob(last["next_actions"][agent], last["mean"][agent], last["log_std"][agent])
            next_v = next_v - last["alpha"][agent].double() * log_pi
        target = reward + GAMMA * (1 - done) * next_v
        hand = 0.5 * (((q1[agent].double() - target) ** 2).mean() + ((q2[agent].double() - target) ** 2).mean())
        logged = task.train_metrics(agent, agent)["train/q_loss"]
        assert logged == pytest.approx(float(hand), rel=1e-4), agent
    assert int(replay["dones"].sum()) > 0  # terminal rows took part in the sampling pool


def mix(old: dict, new: dict) -> dict:
    return {k: (1 - TAU) * old[k] + TAU * new[k] for k in old}


def assert_weights(actual: dict, expected: dict) -> None:
    for k, v in expected.items():
        torch.testing.assert_close(actual[k], v.to(actual[k].dtype), rtol=1e-5, atol=1e-7, msg=k)


def test_the_targets_move_by_tau_when_the_preset_says(trained):
    task, calls = trained
    before, after = calls.target[-2]["weights"], calls.target[-1]["weights"]
    if task.algorithm == "sac":
        # target_network_frequency 1: after every critic step, target <- (1 - tau) target + tau critic.
        assert_weights(after["critic_target"], mix(before["critic_target"], after["critic"]))
        assert_weights(task.critic_target.state_dict(), mix(after["critic_target"], task.critic.state_dict()))
    else:
        # Update 30 stepped the actor and moved both targets by tau; update 31 (odd) moved nothing.
        assert_weights(after["critic_target"], mix(before["critic_target"], after["critic"]))
        assert_weights(after["actor_target"], mix(before["actor_target"], after["net"]))
        assert_weights(task.critic_target.state_dict(), after["critic_target"])
        assert_weights(task.actor_target.state_dict(), after["actor_target"])


@pytest.mark.parametrize("trained", ["td3"], indirect=True)
def test_td3_smooths_its_target_actions_with_noise_of_std_0_2_clipped_at_0_5_and_explores_with_std_0_1(trained):
    task, calls = trained
    noise = torch.cat([(c["next_actions"] - c["target_actions"]).flatten() for c in calls.target])
    inside = torch.cat([c["next_actions"].flatten().abs() < 1 for c in calls.target])
    noise = noise[inside].double()  # where the action bounds clipped nothing
    # clip(N(0, 0.2^2), -0.5, 0.5): std sqrt(0.04 (P(|z| < 2.5) - 5 phi(2.5)) + 0.25 P(|z| > 2.5)) = 0.1977; 1.24% at +-0.5.
    assert noise.numel() > 10_000
    assert float(noise.abs().max()) <= 0.5 + 1e-6
    at_clip = float(((noise.abs() - 0.5).abs() < 1e-5).double().mean())
    assert 0.006 < at_clip < 0.02, at_clip
    assert float(noise.std()) == pytest.approx(0.1977, rel=0.03)
    # Exploration: the stored action is tanh(actor output) + N(0, 0.1^2), clipped to [-1, 1].
    replay = task.buffer.state_dict()
    steps = []
    for obs, out in calls.acting:
        for agent in range(K):
            for e in range(E):
                row = int((replay["obs"][agent] == obs[agent, e]).all(-1).nonzero()[0])
                steps.append(replay["actions"][agent, row] - torch.tanh(out[agent, e]))
    explore = torch.stack(steps).flatten().double()
    inside = explore.abs() < 1 - 1e-3  # a crude filter for rows the bounds clipped (|a| + noise > 1 is rare here)
    assert len(calls.acting) == TOTAL_STEPS // E - LEARNING_STARTS // E
    assert float(explore[inside].std()) == pytest.approx(0.1, rel=0.1)
    assert float(explore[inside].mean()) == pytest.approx(0.0, abs=0.02)


def temperature_step(target: float | None, **task_values) -> tuple[torch.Tensor, torch.Tensor]:
    """log alpha [2 agents] before and after one SAC update (policy_frequency 1, SGD: a step is q_lr times the gradient)."""
    task = build("sac_hopper", "task.total_steps=12", "task.learning_starts=10", "task.policy_frequency=1", "optimizer=sgd",
                 "optimizer.lr=null", n_agents=2, **task_values, **({} if target is None else {"target_entropy": target}))
    before = task.log_alpha.detach().clone()
    fit(task)
    assert task.updates == [1, 1]
    return before, task.log_alpha.detach().clone()


def test_sac_temperature_steps_by_q_lr_alpha_log_pi_plus_the_target_entropy_minus_dim_action_by_default():
    """The same update with target entropies t1 and t2 moves log alpha by amounts that differ by q_lr alpha (t1 - t2)
    (CleanRL's loss -alpha (log pi + t); SB3's -log alpha (log pi + t): q_lr (t1 - t2)); the default target is -3."""
    q_lr = 1e-3  # the preset's (CleanRL's)

    def steps(**task_values) -> dict:
        runs = {t: temperature_step(t, **task_values) for t in (-3.0, 3.0)}
        return {t: (after - before).double() for t, (before, after) in runs.items()} | {"start": runs[3.0][0].exp()}

    def differ_by(moved: dict, alpha: float) -> None:
        torch.testing.assert_close(moved[-3.0] - moved[3.0], torch.full((2,), q_lr * alpha * -6.0, dtype=torch.float64),
                                   rtol=1e-4, atol=1e-9)

    default = steps()
    torch.testing.assert_close(default["start"], torch.ones(2))  # alpha_start 1.0
    differ_by(default, 1.0)
    before, after = temperature_step(None)
    torch.testing.assert_close((after - before).double(), default[-3.0], rtol=0, atol=0)  # target entropy -dim(action)
    start = steps(alpha_start=0.25)
    torch.testing.assert_close(start["start"], torch.full((2,), 0.25))
    differ_by(start, 0.25)  # the default loss is CleanRL's (SB3's would not scale by alpha)
    differ_by(steps(alpha_start=0.25, temperature_loss="log_alpha"), 1.0)

"""One policy per algorithm, everywhere: what a run's task declares (`RLTask.policy`) is what its training
evaluations, `python -m pipeline.eval`, `pipeline.load(...).act` and `python -m pipeline.export` play.

Hand-made run dirs (fast): a policy planted in the declaration (the record's, or the task class's) is what load,
eval and export all play, and a network whose output is not [N, A] (a distributional Q-network, [N, A, atoms])
acts through its own policy. Trained runs (slow, K = 2 each of DQN, CEM, PPO discrete and Gaussian with
observation statistics, SAC, TD3): the loaded agent plays what the training evaluation's policy plays on the same
observations, the exported file what the loaded agent plays, the replay what the loaded agent plays, and its
samples repeat with a generator and follow the distribution the network's own outputs give."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf
from torch import nn

import pipeline
from pipeline.eval import evaluate_run
from pipeline.export import compare, export
from pipeline.nets.mlp import MLP
from pipeline.rl.policies import QValuePolicy
from pipeline.runtime.replay import REPLAY_SEED_OFFSET, Options, find_config, run_env
from pipeline.store.checkpoint import save_atomic
from pipeline.store.record import RunRecord
from pipeline.tasks.dqn import DQNTask

N_DRAWS = 4000


class Mirrored(QValuePolicy):
    """A planted wrong declaration: the lowest-valued action."""

    def outputs(self, obs):
        return -super().outputs(obs)


class AtomsNet(nn.Module):
    """A distributional Q-network: observations [N, F] -> logits [N, A, atoms] of each action's return distribution."""

    def __init__(self, in_features: int, out_features: int, atoms: int = 5):
        super().__init__()
        self.out_features, self.atoms = out_features, atoms
        self.layer = nn.Linear(in_features, out_features * atoms)

    def forward(self, x):
        return self.layer(x).view(*x.shape[:-1], self.out_features, self.atoms)


class ExpectedQPolicy(QValuePolicy):
    """A distributional network's policy: each action's expected return over the atoms' support [-1, 1]."""

    def outputs(self, obs):
        probs = self.net(self.observations(obs)).softmax(-1)
        return (probs * torch.linspace(-1.0, 1.0, probs.shape[-1], device=probs.device)).sum(-1)


def hand_made_run(make_cfg, run_dir, net, *overrides, policy: str | None = None):
    """A DQN CartPole run dir as the pipeline leaves it, without training: config, model.pt, and (`policy`) a record
    naming its policy."""
    cfg = make_cfg("experiment=dqn_cartpole", *overrides)
    (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    save_atomic(net.state_dict(), run_dir / "model.pt")
    if policy is not None:
        RunRecord(experiment="dqn_cartpole", group="g", task="DQNTask", seed=int(cfg.seed), run_dir=str(run_dir),
                  status="ok", error=None, extras={"policy": policy}).write()
    return run_dir


def played_by_hand(run_dir, act, episodes: int = 3) -> list[float]:
    """The returns of the replay's episodes (seeds seed + 30,000 + i) with `act(obs)` chosen here."""
    cfg, seed = find_config(run_dir)
    env, returns = run_env(cfg), []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + REPLAY_SEED_OFFSET + i)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    env.close()
    return returns


def load_eval_export(run_dir, obs) -> tuple[np.ndarray, list[float], np.ndarray]:
    """What `pipeline.load(...).act`, `python -m pipeline.eval` (its replay's returns) and the exported TorchScript
    file play."""
    loaded = pipeline.load(run_dir).act(obs)
    replayed = evaluate_run(Options(run_dir=run_dir, episodes=3))["returns"]
    exported = torch.jit.load(export(run_dir)["path"])(torch.as_tensor(obs)).numpy()
    return loaded, replayed, exported


def cartpole_obs(n=300, seed=0):
    return (np.random.default_rng(seed).standard_normal((n, 4)) * [1.0, 1.0, 0.1, 1.0]).astype(np.float32)


def with_clear_choice(net_outputs, obs, margin=1e-4):
    """Observations whose best and second-best outputs differ by more than `margin` (rounding cannot swap them)."""
    top = torch.as_tensor(net_outputs).topk(2, dim=1).values
    return obs[((top[:, 0] - top[:, 1]) > margin).numpy()]


@pytest.mark.parametrize("planted_in", ["record", "task class"])
def test_a_policy_planted_in_the_declaration_is_what_load_eval_and_export_play(make_cfg, tmp_path, monkeypatch, planted_in):
    """Mirrored plays the lowest-valued action: load, the replay and the exported file all play it (computed here from
    the network by hand), so none of them reads the network any other way. The declaration is the record's `policy`
    (what a run writes), or the task class's `policy` for a record without one."""
    torch.manual_seed(0)
    net = MLP(4, 2, hidden=(16,))
    if planted_in == "record":
        run = hand_made_run(make_cfg, tmp_path, net, "model.hidden=[16]", policy=f"{__name__}.Mirrored")
    else:
        monkeypatch.setattr(DQNTask, "policy", Mirrored)
        run = hand_made_run(make_cfg, tmp_path, net, "model.hidden=[16]")

    def lowest(obs):
        with torch.no_grad():
            return net(torch.as_tensor(np.asarray(obs, dtype=np.float32))).argmin(-1).numpy()

    with torch.no_grad():
        obs = with_clear_choice(-net(torch.as_tensor(cartpole_obs())), cartpole_obs())
    loaded, replayed, exported = load_eval_export(run, obs)
    assert len(obs) > 250 and np.array_equal(loaded, lowest(obs)) and np.array_equal(exported, lowest(obs))
    assert replayed == played_by_hand(run, lambda o: int(lowest(o[None])[0]))
    assert replayed != played_by_hand(run, lambda o: 1 - int(lowest(o[None])[0]))  # the action taken matters


def test_a_distributional_network_acts_through_its_own_policy(make_cfg, tmp_path):
    """A network of [N, A, atoms] outputs (no argmax over dim 1 could act for it): its declared policy's expected
    Q-values decide, in load, the replay and the export alike."""
    torch.manual_seed(1)
    net = AtomsNet(4, 2)
    run = hand_made_run(make_cfg, tmp_path, net, f"model._target_={__name__}.AtomsNet", "~model.hidden", "~model.act",
                        "~model.dropout", policy=f"{__name__}.ExpectedQPolicy")

    def best(obs):
        with torch.no_grad():
            probs = net(torch.as_tensor(np.asarray(obs, dtype=np.float32))).softmax(-1)
            return (probs * torch.tensor([-1.0, -0.5, 0.0, 0.5, 1.0])).sum(-1).argmax(-1).numpy()

    obs = cartpole_obs()
    loaded, replayed, exported = load_eval_export(run, obs)
    assert np.array_equal(loaded, best(obs)) and np.array_equal(exported, best(obs)) and len(set(best(obs).tolist())) == 2
    assert replayed == played_by_hand(run, lambda o: int(best(o[None])[0]))


def test_best_weights_of_a_policy_that_acts_with_files_are_refused_in_one_line(make_cfg, tmp_path):
    from pipeline.nets.actor_critic import ActorCritic
    from pipeline.runtime.replay import EvalError

    cfg = make_cfg("experiment=ppo_pendulum", "task.normalize_obs=true")
    (tmp_path / ".hydra").mkdir()
    OmegaConf.save(cfg, tmp_path / ".hydra" / "config.yaml")
    for name in ("model.pt", "best.pt"):
        save_atomic(ActorCritic(3, 1, continuous=True).state_dict(), tmp_path / name)
    with pytest.raises(EvalError) as err:
        pipeline.load(tmp_path, weights="best")
    assert str(err.value) == (f"{tmp_path / 'best.pt'}: this run's policy acts with obs_norm.pt beside its weights, and best.pt "
                              "has none of the evaluation it was kept at (obs_norm.pt holds the final ones); load weights='model'")


# ---- trained runs ---------------------------------------------------------------------------------------------
# experiment and overrides of each tiny run (trainer=debug: a few hundred env steps, two evaluations), K = 2
RUNS = {
    "dqn": ("dqn_cartpole", ()),
    "cem": ("cem_cartpole", ()),
    "ppo_discrete": ("ppo_cartpole", ("task.normalize_obs=true",)),
    "ppo_gaussian": ("ppo_pendulum", ("task.normalize_obs=true",)),
    "sac": ("sac_pendulum", ()),
    "td3": ("td3_halfcheetah", ("env=pendulum", "model.hidden=[64,64]", "task.critic_hidden=[64,64]")),
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("trained")
    for name, (experiment, overrides) in RUNS.items():
        records = pipeline.run(experiment=experiment, overrides=["trainer=debug", "seeds_per_process=2",
                                                                 f"hydra.run.dir={root / name}", *overrides])
        assert [r["status"] for r in records] == ["ok", "ok"], records
    return root


def training_task(run_dir):
    """The run's task as its training built it (its config's groups and K), from its last checkpoint: its weights,
    statistics and agents as the final evaluation had them."""
    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    cls = get_class(cfg.task._target_)
    parts = {part: instantiate(cfg[group]) for part, group in (("net", "model"), ("loss", "loss"), ("optimizer", "optimizer"),
                                                                ("scheduler", "scheduler")) if cfg.get(group) is not None}
    settings = {k: v for k, v in OmegaConf.to_container(cfg.task, resolve=True).items() if k != "_target_"}
    task = cls.create(**parts, env=OmegaConf.to_container(cfg.env, resolve=True), n_agents=int(cfg.seeds_per_process),
                      seed=int(cfg.seed), **settings)
    task.load_checkpoint_state(torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True))
    return task


def observations(agent, n=96):
    """Observations the env gives (random play from a seed) and as many drawn around them."""
    env = run_env(agent.config)
    obs, _ = env.reset(seed=123)
    env.action_space.seed(123)
    seen = []
    while len(seen) < n // 2:
        seen.append(obs)
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()
    seen = np.stack(seen).astype(np.float32)
    return np.concatenate([seen, seen + np.random.default_rng(0).normal(scale=0.3, size=seen.shape).astype(np.float32)])


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNS)
def test_load_export_and_replay_play_what_the_training_evaluation_played(trained, name):
    run = trained / name
    task = training_task(run)
    for i in range(2):
        agent = pipeline.load(run / f"seed{i}")
        assert json.loads((run / f"seed{i}" / "result.json").read_text())["policy"] == \
            f"{type(task).policy.__module__}.{type(task).policy.__qualname__}"
        obs = observations(agent)
        x = torch.as_tensor(obs)
        with torch.inference_mode():
            trained_play = task.evaluation_policy(task.agents_net, None)(x.expand(2, *x.shape))[i]
        loaded = torch.as_tensor(agent.act(obs))
        # Equal within float32 rounding of the two evaluations (the ensemble's batched matmuls, the plain net's).
        compare(run, trained_play, loaded, agent.policy, agent.policy.outputs, x)
        exported = torch.jit.load(export(run / f"seed{i}", out=run / f"seed{i}.torchscript.pt")["path"])
        with torch.no_grad():
            compare(run, exported(x), loaded, agent.policy, agent.policy.outputs, x)
        replayed = evaluate_run(Options(run_dir=run / f"seed{i}", episodes=2))["returns"]
        assert replayed == played_by_hand(run / f"seed{i}", agent.act, episodes=2)
    assert not (run / "seed0" / "policy.torchscript.pt").exists()  # out= was honoured


def by_hand_distribution(name, agent, obs):
    """What the loaded network itself says of one observation's stochastic action, for `samples_follow`."""
    x = torch.as_tensor(obs[None])
    files = agent.policy.files
    if "obs_norm.pt" in files:
        s = files["obs_norm.pt"]
        x = ((x.double() - s["mean"]) / torch.sqrt(s["var"] + float(s["eps"]))).clamp(-float(s["clip"]), float(s["clip"])).float()
    with torch.no_grad():
        if name == "dqn":
            q = agent.model(x)[0]
            eps, n = float(agent.config.task.eps_end), len(q)
            return torch.full((n,), eps / n).index_add(0, q.argmax().view(1), torch.tensor([1.0 - eps]))
        if name in ("cem", "ppo_discrete"):
            out = agent.model(x)
            return (out[0] if isinstance(out, tuple) else out)[0].softmax(-1)
        if name == "ppo_gaussian":
            return agent.model(x)[0][0], agent.model.log_std.value.exp()
        if name == "sac":
            mean, log_std = agent.model.distribution(x)
            return mean[0], log_std[0].exp()
        return agent.model.unit(x)[0], torch.tensor([float(agent.config.task.exploration_noise)])


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNS)
def test_samples_repeat_with_a_generator_and_follow_the_network_s_distribution(trained, name):
    agent = pipeline.load(trained / name / "seed1")
    obs = observations(agent)[7]
    many = np.repeat(obs[None], N_DRAWS, axis=0)
    first, again, other = (agent.act(many, deterministic=False, generator=torch.Generator().manual_seed(s)) for s in (1, 1, 2))
    assert np.array_equal(first, again) and not np.array_equal(first, other)
    expected = by_hand_distribution(name, agent, obs)
    if name in ("dqn", "cem", "ppo_discrete"):
        freq = np.bincount(first, minlength=len(expected)) / N_DRAWS
        se = np.sqrt(expected.numpy() * (1 - expected.numpy()) / N_DRAWS)
        assert (np.abs(freq - expected.numpy()) <= 5 * se + 1e-12).all(), (freq, expected)
        return
    low, high = agent.action_space.low, agent.action_space.high
    scale, bias = (high - low) / 2, (high + low) / 2
    center, spread = (t.double().numpy() for t in expected)
    if name == "ppo_gaussian":  # N(mean, std^2) clipped to the bounds: P(a = high) and the share below the mean
        z = (high - center) / spread
        assert abs((first[:, 0] >= high[0]).mean() - 0.5 * math.erfc(z[0] / math.sqrt(2))) <= 5 * math.sqrt(0.25 / N_DRAWS)
        if low[0] < center[0] < high[0]:
            assert abs((first[:, 0] < center[0]).mean() - 0.5) <= 5 * math.sqrt(0.25 / N_DRAWS)
        return
    unit = np.clip((first - bias) / scale, -1 + 1e-6, 1 - 1e-6)
    # SAC: atanh of the unit action is N(mean, std^2); TD3: the unit action is its actor's plus N(0, noise^2).
    pre = np.arctanh(unit) if name == "sac" else unit
    assert (np.abs(pre.mean(0) - center) <= 5 * spread / math.sqrt(N_DRAWS)).all(), (pre.mean(0), center)
    assert (np.abs(pre.std(0) / spread - 1) <= 5 / math.sqrt(2 * N_DRAWS)).all(), (pre.std(0), spread)

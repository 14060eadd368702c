"""The Python API (`pipeline.load`, `pipeline.run`) and `python -m pipeline.export`: a loaded agent acts as its
network and statistics say, a loaded model is the run's network, a run from Python is a CLI run, an export
computes what the agent computes."""

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import pipeline
from pipeline.config.checks import ConfigError
from pipeline.export import export
from pipeline.export import main as export_main
from pipeline.nets.actor_critic import ActorCritic
from pipeline.nets.gan import MLPGAN
from pipeline.nets.mlp import MLP
from pipeline.runtime.preflight import RunRefused
from pipeline.runtime.replay import EvalError
from pipeline.store.checkpoint import save_atomic  # as the pipeline writes it: with its digest


def save_run(make_cfg, run_dir, net, *overrides, files=None):
    """A run dir as the pipeline leaves it, without training: the composed config, `net`'s weights as model.pt."""
    cfg = make_cfg(*overrides)
    (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    save_atomic(net.state_dict(), run_dir / "model.pt")
    for name, state in (files or {}).items():
        save_atomic(state, run_dir / name)
    return run_dir


def fixed_output(net, bias, weight_scale=0.0):
    """`net`'s last layer outputs `bias` for every observation (weights scaled to `weight_scale`)."""
    last = [m for m in net.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        last.weight.mul_(weight_scale)
        last.bias.copy_(torch.tensor(bias))
    return net


def cartpole_obs(n, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, 4)) * [1.0, 1.0, 0.1, 1.0]).astype(np.float32)


def test_import_pipeline_loads_neither_torch_nor_lightning():
    code = ("import sys, pipeline; pipeline.load; pipeline.run; "
            "print(sorted(m for m in ('torch', 'lightning', 'gymnasium') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("experiment", ["dqn_cartpole", "cem_cartpole", "ppo_cartpole"])
def test_act_is_the_action_the_network_ranks_first(make_cfg, tmp_path, experiment):
    torch.manual_seed(1)
    net = ActorCritic(4, 2, hidden=[16]) if experiment.startswith("ppo") else MLP(4, 2, hidden=[16])
    save_run(make_cfg, tmp_path, net, f"experiment={experiment}", "model.hidden=[16]")
    agent = pipeline.load(tmp_path)
    obs = cartpole_obs(200)
    with torch.no_grad():
        out = net(torch.as_tensor(obs))
    scores = out[0] if isinstance(out, tuple) else out
    clear = (scores[:, 0] - scores[:, 1]).abs() > 1e-5  # rows where rounding cannot decide the argmax
    actions = agent.act(obs)
    assert actions.shape == (200,) and clear.sum() > 150
    assert np.array_equal(actions[clear.numpy()], scores.argmax(1)[clear].numpy())
    single = agent.act(obs[np.flatnonzero(clear.numpy())[0]])
    assert isinstance(single, int) and single == int(scores[clear][0].argmax())


def test_a_normalising_ppo_agent_acts_through_obs_norm_pt_and_clips_to_the_bounds(make_cfg, tmp_path):
    torch.manual_seed(2)
    net = ActorCritic(3, 1, continuous=True, hidden=[16])
    with torch.no_grad():  # means well past the bounds [-2, 2] for some observations
        [m for m in net.actor.modules() if isinstance(m, torch.nn.Linear)][-1].weight.mul_(400.0)
    stats = {"mean": torch.tensor([0.5, -0.2, 1.0], dtype=torch.float64), "var": torch.tensor([0.25, 4.0, 9.0], dtype=torch.float64),
             "count": torch.tensor(10.0, dtype=torch.float64), "eps": torch.tensor(1e-8, dtype=torch.float64),
             "clip": torch.tensor(1.5, dtype=torch.float64)}
    save_run(make_cfg, tmp_path, net, "experiment=ppo_pendulum", "model.hidden=[16]", "task.normalize_obs=true",
             files={"obs_norm.pt": stats})
    agent = pipeline.load(tmp_path)
    obs = np.random.default_rng(3).uniform(-3, 3, size=(300, 3)).astype(np.float32)
    # By hand: (obs - mean) / sqrt(var + eps), clipped to [-1.5, 1.5]; the actor's mean, clipped to [-2, 2].
    normalised = np.clip((obs - stats["mean"].numpy()) / np.sqrt(stats["var"].numpy() + 1e-8), -1.5, 1.5)
    with torch.no_grad():
        mean = net(torch.as_tensor(normalised, dtype=torch.float32))[0].numpy()
    expected = np.clip(mean, -2.0, 2.0)
    got = agent.act(obs)
    assert got.shape == (300, 1)
    assert (np.abs(mean) > 2).sum() > 20 and (np.abs(mean) < 2).sum() > 20  # both sides of the clip are exercised
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5 * max(1.0, float(np.abs(mean).max())))
    one = agent.act(obs[0])
    assert one.shape == (1,)
    exported = torch.jit.load(export(tmp_path)["path"])  # the export plays the same policy, statistics included
    with torch.no_grad():
        np.testing.assert_allclose(exported(torch.as_tensor(obs)).numpy(), expected, rtol=0,
                                   atol=1e-5 * max(1.0, float(np.abs(mean).max())))
    (tmp_path / "obs_norm.pt").unlink()
    with pytest.raises(EvalError, match="obs_norm.pt: no such file"):
        pipeline.load(tmp_path)


N_DRAWS = 4000


def draws_within(p_hat, p, n=N_DRAWS, sds=5.0):
    return abs(p_hat - p) <= sds * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("experiment, expected_p1", [("ppo_cartpole", 0.75), ("cem_cartpole", 0.75), ("dqn_cartpole", 0.75)])
def test_stochastic_actions_follow_the_run_s_policy(make_cfg, tmp_path, experiment, expected_p1):
    """Logits [0, log 3]: action 1 with probability 3/4 (PPO, CEM). A Q-network ranking action 1 first, with the
    run's final epsilon 0.5: action 1 with probability 1 - 0.5 / 2 = 3/4 (SB3's DQN.predict explores the same way)."""
    torch.manual_seed(0)
    if experiment.startswith("ppo"):
        net = ActorCritic(4, 2, hidden=[8])
        fixed_output(net.actor, [0.0, math.log(3.0)])
    else:
        net = fixed_output(MLP(4, 2, hidden=[8]), [0.0, math.log(3.0)])
    save_run(make_cfg, tmp_path, net, f"experiment={experiment}", "model.hidden=[8]", "task.eps_end=0.5"
             if experiment.startswith("dqn") else "seed=0")
    agent = pipeline.load(tmp_path)
    obs = np.repeat(cartpole_obs(1), N_DRAWS, axis=0)
    assert set(agent.act(obs).tolist()) == {1}
    torch.manual_seed(5)
    p1 = float(agent.act(obs, deterministic=False).mean())
    assert draws_within(p1, expected_p1)


def test_stochastic_continuous_actions_are_the_gaussian_within_the_bounds(make_cfg, tmp_path):
    torch.manual_seed(0)
    net = ActorCritic(3, 1, continuous=True, hidden=[8], log_std_init=math.log(0.5))
    fixed_output(net.actor, [1.5])
    save_run(make_cfg, tmp_path, net, "experiment=ppo_pendulum", "model.hidden=[8]")
    agent = pipeline.load(tmp_path)
    torch.manual_seed(6)
    got = agent.act(np.zeros((N_DRAWS, 3), dtype=np.float32), deterministic=False)[:, 0]
    assert got.min() >= -2.0 and got.max() <= 2.0
    # N(1.5, 0.5^2) clipped at 2: P(a = 2) = P(z > 1) = 0.1587; below 2 it is the Gaussian's.
    assert draws_within(float((got == 2.0).mean()), 0.1587)
    assert draws_within(float((got < 1.5).mean()), 0.5)


def test_load_errors_are_one_line(make_cfg, tmp_path):
    net = MLP(4, 2, hidden=[16])
    for seed in (3, 4):
        save_run(make_cfg, tmp_path / f"seed{seed}", net, "experiment=dqn_cartpole", "model.hidden=[16]")
    with pytest.raises(EvalError, match=r"it holds seeds seed3, seed4: pass one"):
        pipeline.load(tmp_path)
    agent = pipeline.load(tmp_path / "seed4")
    assert agent.seed == 4
    with pytest.raises(ValueError, match=r"an observation of shape \(3,\): this agent takes \(4,\)"):
        agent.act(np.zeros(3))
    save_run(make_cfg, tmp_path / "wide", MLP(4, 2, hidden=[32]), "experiment=dqn_cartpole", "model.hidden=[16]")
    with pytest.raises(EvalError, match="does not fit the run's model config"):
        pipeline.load(tmp_path / "wide")


def test_weights_best_loads_best_pt_and_exports_it(make_cfg, tmp_path):
    # model.pt always pushes left (action 0), best.pt always right (action 1): a hand-made best.pt, as
    # task.keep_best leaves one beside model.pt.
    final = fixed_output(MLP(4, 2, hidden=[16]), [1.0, -1.0])
    best = fixed_output(MLP(4, 2, hidden=[16]), [-1.0, 1.0])
    save_run(make_cfg, tmp_path, final, "experiment=dqn_cartpole", "model.hidden=[16]", "task.keep_best=true")
    save_atomic(best.state_dict(), tmp_path / "best.pt")
    obs = cartpole_obs(20)
    assert pipeline.load(tmp_path).act(obs).tolist() == [0] * 20
    assert pipeline.load(tmp_path, weights="best").act(obs).tolist() == [1] * 20
    result = export(tmp_path, n=8, weights="best")
    assert result["path"] == str(tmp_path / "policy.best.torchscript.pt") and result["weights"] == "best"
    assert torch.jit.load(result["path"])(torch.as_tensor(obs)).tolist() == [1] * 20


def test_weights_best_is_refused_in_one_line_when_the_run_kept_none(make_cfg, tmp_path):
    net = MLP(4, 2, hidden=[16])
    save_run(make_cfg, tmp_path / "off", net, "experiment=dqn_cartpole", "model.hidden=[16]")
    with pytest.raises(EvalError, match=r"best.pt: no such file: this run kept no best-evaluated weights "
                                        r"\(it ran without task.keep_best=true\); load weights='model'"):
        pipeline.load(tmp_path / "off", weights="best")
    save_run(make_cfg, tmp_path / "digits", MLP(64, 10, hidden=[16]), "experiment=supervised_digits", "model.hidden=[16]")
    with pytest.raises(EvalError, match=r"\(only RL runs keep their best-evaluated weights\)"):
        pipeline.load(tmp_path / "digits", weights="best")
    with pytest.raises(EvalError, match="weights='last': choose 'model'"):
        pipeline.load(tmp_path / "off", weights="last")
    assert export_main([str(tmp_path / "off"), "weights=best"]) == 2
    assert not (tmp_path / "off" / "policy.best.torchscript.pt").exists()


def test_a_supervised_run_loads_as_its_plain_network(make_cfg, tmp_path):
    torch.manual_seed(0)
    net = MLP(64, 10, hidden=[16]).eval()
    save_run(make_cfg, tmp_path, net, "experiment=supervised_digits", "model.hidden=[16]", "model.dropout=0.0")
    loaded = pipeline.load(tmp_path)
    x = torch.randn(5, 64)
    assert loaded.task == "SupervisedTask" and not loaded.model.training
    torch.testing.assert_close(loaded.model(x), net(x), rtol=0, atol=0)


def test_a_gan_run_loads_its_generator_and_discriminator(make_cfg, tmp_path):
    torch.manual_seed(0)
    gan = MLPGAN(image_shape=(1, 8, 8), latent_dim=8, generator_hidden=[16], discriminator_hidden=[16]).eval()
    save_run(make_cfg, tmp_path, gan, "experiment=gan_digits", "model=gan_mlp", "model.latent_dim=8",
             "model.generator_hidden=[16]", "model.discriminator_hidden=[16]")
    loaded = pipeline.load(tmp_path)
    z = torch.randn(4, 8)
    images = loaded.model.generator(z)
    assert images.shape == (4, 1, 8, 8)
    torch.testing.assert_close(images, gan.generator(z), rtol=0, atol=0)


@pytest.mark.parametrize("experiment", ["dqn_cartpole", "ppo_pendulum"])
def test_the_exported_policy_acts_as_the_loaded_agent(make_cfg, tmp_path, experiment):
    torch.manual_seed(3)
    continuous = experiment == "ppo_pendulum"
    net = ActorCritic(3, 1, continuous=True, hidden=[16]) if continuous else MLP(4, 2, hidden=[16])
    stats = {"mean": torch.full((3,), 0.3, dtype=torch.float64), "var": torch.full((3,), 2.0, dtype=torch.float64),
             "eps": torch.tensor(1e-8, dtype=torch.float64), "clip": torch.tensor(5.0, dtype=torch.float64)}
    save_run(make_cfg, tmp_path, net, f"experiment={experiment}", "model.hidden=[16]",
             f"task.normalize_obs={str(continuous).lower()}" if continuous else "seed=0",
             files={"obs_norm.pt": stats} if continuous else None)
    result = export(tmp_path, n=32)
    assert result["path"] == str(tmp_path / "policy.torchscript.pt")
    policy = torch.jit.load(result["path"])
    agent = pipeline.load(tmp_path)
    obs = (np.random.default_rng(9).uniform(-2, 2, size=(100, 3)).astype(np.float32) if continuous else cartpole_obs(100, seed=9))
    with torch.no_grad():
        got = policy(torch.as_tensor(obs)).numpy()
    if continuous:
        np.testing.assert_allclose(got, agent.act(obs), rtol=0, atol=1e-5)
    else:
        with torch.no_grad():
            q = net(torch.as_tensor(obs))
        clear = ((q[:, 0] - q[:, 1]).abs() > 1e-5).numpy()
        assert clear.sum() > 80 and np.array_equal(got[clear], agent.act(obs)[clear])


def test_export_command_line(make_cfg, tmp_path, capsys):
    save_run(make_cfg, tmp_path / "run", MLP(64, 10, hidden=[16]), "experiment=supervised_digits", "model.hidden=[16]", "model.dropout=0.0")
    assert export_main([str(tmp_path / "run"), f"out={tmp_path / 'm.pt'}", "n=8"]) == 0
    out = capsys.readouterr().out
    assert "TorchScript model: [N, 64] -> [N, 10]" in out and "max |difference| 0 on 8 inputs" in out
    assert (tmp_path / "m.pt").is_file()
    assert export_main([str(tmp_path / "run"), "n=0"]) == 2
    assert export_main([str(tmp_path / "nope")]) == 2
    assert "no such run dir" in capsys.readouterr().err


def test_run_refuses_a_bad_value_before_making_its_dir(tmp_path):
    for overrides, message in ((["task.gamma=1.5"], r"task.gamma=1.5: .*\[0, 1\]"),
                               (["task.gama=0.5"], "did you mean task.gamma?"),
                               (["-m"], "sweeps")):
        with pytest.raises(ConfigError, match=message):
            pipeline.run(experiment="ppo_cartpole", overrides=[*overrides, f"hydra.run.dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match="unknown option 'ppo_cartpol'"):
        pipeline.run(experiment="ppo_cartpol", overrides=[f"hydra.run.dir={tmp_path / 'run'}"])
    assert not (tmp_path / "run").exists()
    # A folder of the user's is refused as the CLI refuses it (exit 1 there), and left as it was.
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(RunRefused, match="notes.txt"):
        pipeline.run(experiment="ppo_cartpole", overrides=[f"hydra.run.dir={tmp_path / 'mine'}"])
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]


@pytest.mark.slow
def test_a_run_from_python_is_a_cli_run_and_load_gives_its_record_s_numbers(tmp_path):
    """Trained from Python: ok records, a run dir the CLI would leave; the loaded network scores the record's test/acc,
    the loaded agent replays what `python -m pipeline.eval` replays (observation statistics included)."""
    from hydra.utils import instantiate

    from pipeline.eval import evaluate_run
    from pipeline.rl.envs import make_env
    from pipeline.runtime.replay import Options

    [record] = pipeline.run(experiment="supervised_digits", overrides=["trainer=debug", f"hydra.run.dir={tmp_path / 'sup'}"])
    assert record["status"] == "ok" and (tmp_path / "sup" / ".hydra" / "config.yaml").is_file()
    loaded = pipeline.load(record["run_dir"])
    data = instantiate(loaded.config.data)
    data.setup("test")
    x, y = (torch.cat(t) for t in zip(*data.test_dataloader()))
    with torch.no_grad():
        acc = float((loaded.model(x).argmax(1) == y).float().mean())
    assert acc == pytest.approx(record["metrics"]["test/acc"], abs=0.5 / len(y))

    records = pipeline.run(experiment="ppo_pendulum", overrides=[
        "trainer=debug", "seeds_per_process=2", "task.normalize_obs=true", f"hydra.run.dir={tmp_path / 'ppo'}"])
    assert [r["status"] for r in records] == ["ok", "ok"]
    seed_dir = tmp_path / "ppo" / "seed1"
    replay = evaluate_run(Options(run_dir=seed_dir, episodes=2))
    agent = pipeline.load(seed_dir)
    env = make_env(replay["env_id"])
    returns = []
    for seed in replay["seeds"]:
        obs, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(agent.act(obs))
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    np.testing.assert_allclose(returns, replay["returns"], rtol=1e-9)

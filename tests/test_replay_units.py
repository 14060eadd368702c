"""The replay engine by hand, on run dirs written here (no training): where the config and seed come from, the
policy it loads, the episodes it plays (checked against gymnasium played by hand), its videos and loggers."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import imageio.v2 as imageio
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from pipeline.eval import evaluate_run  # the replay-or-score dispatch lives at the entry point
from pipeline.nets.actor_critic import ActorCritic
from pipeline.nets.mlp import MLP
from pipeline.rl.policies import ActorCriticPolicy, QValuePolicy
from pipeline.runtime import replay
from pipeline.runtime.replay import (
    EvalError,
    Mp4Writer,
    Options,
    env_of,
    find_config,
    has_env,
    load_policy,
    play,
    training_video_hook,
    video_as_gif,
)
from pipeline.store.checkpoint import save_atomic  # as the pipeline writes it: with its digest
from pipeline.store.record import RunRecord

MLP_CFG = {"_target_": "pipeline.nets.mlp.MLP", "_partial_": True, "hidden": [8]}
PPO = "pipeline.tasks.ppo.PPOTask"
CARTPOLE_SPACES = (gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2))


def _cfg(**extra):
    base = {"seed": 5, "name": "r", "task": {"_target_": "pipeline.tasks.dqn.DQNTask"},
            "env": {"id": "CartPole-v1", "kwargs": {"max_episode_steps": 40}}, "model": MLP_CFG}
    return OmegaConf.create({**base, **extra})


def _always(action: int) -> dict:
    """An MLP(4 -> 8 -> 2) state_dict whose greedy action is always `action`."""
    net = MLP(4, 2, hidden=(8,))
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
        list(net.parameters())[-1][action] = 1.0
    return net.state_dict()


def _steering() -> dict:
    """An MLP(4 -> 8 -> 2) state_dict that pushes right while the cart moves left and left otherwise (by hand: two
    ReLU units read the cart's velocity): episodes whose length depends on the start state."""
    net = MLP(4, 2, hidden=(8,))
    w1, b1, w2, b2 = net.parameters()
    with torch.no_grad():
        for p in (w1, b1, w2, b2):
            p.zero_()
        w1[0, 1], w1[1, 1] = -100.0, 100.0  # h0 = relu(-100 v), h1 = relu(100 v)
        w2[1, 0], w2[0, 1] = 1.0, 1.0  # action 1 scores h0, action 0 scores h1
    return net.state_dict()


def steer(obs) -> int:
    return int(obs[1] < 0)


def _run_dir(path: Path, cfg=None, action: int = 1, config_dir: str = ".hydra") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / config_dir).mkdir(exist_ok=True)
    OmegaConf.save(cfg if cfg is not None else _cfg(), path / config_dir / "config.yaml")
    save_atomic(_always(action), path / "model.pt")
    return path


def _by_hand(seed: int, action, max_steps: int = 40, env_id: str = "CartPole-v1") -> tuple[float, int]:
    """One episode in gymnasium itself, of a constant action or a policy of the observation: its return and length."""
    env = gym.make(env_id, max_episode_steps=max_steps)
    obs, _ = env.reset(seed=seed)
    total, steps, done = 0.0, 0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(action(obs) if callable(action) else action)
        total, steps, done = total + float(reward), steps + 1, terminated or truncated
    return total, steps


# ---- find_config and the run's seed -----------------------------------------------------------------------
def test_find_config_refuses_what_is_not_a_finished_run(tmp_path):
    with pytest.raises(EvalError) as err:
        find_config(tmp_path / "missing")
    assert str(err.value) == f"{tmp_path / 'missing'}: no such run dir"
    with pytest.raises(EvalError) as err:
        find_config(tmp_path)
    assert str(err.value) == f"{tmp_path}: no model.pt; did the run finish?"
    _run_dir(tmp_path / "seed11")
    _run_dir(tmp_path / "seed2")
    with pytest.raises(EvalError) as err:
        find_config(tmp_path)
    assert str(err.value) == f"{tmp_path}: no model.pt; it holds seeds seed2, seed11: pass one, e.g. {tmp_path / 'seed2'}"


def test_a_run_without_a_saved_config_is_refused_naming_where_it_looked(tmp_path):
    (tmp_path / "model.pt").write_bytes(b"")
    with pytest.raises(EvalError) as err:
        find_config(tmp_path)
    assert str(err.value) == f"{tmp_path}: no .hydra/config.yaml here; was it made by python -m pipeline?"
    run = tmp_path / "run"
    run.mkdir()
    (run / "model.pt").write_bytes(b"")
    with pytest.raises(EvalError, match=r": no \.hydra/config\.yaml here; "):
        find_config(run)
    (tmp_path / ".hydra").mkdir()
    OmegaConf.save(_cfg(), tmp_path / ".hydra" / "config.yaml")
    with pytest.raises(EvalError, match=r": no \.hydra/config\.yaml here; "):
        find_config(run)  # ...even when the dir above has one: only a seed<n> dir reads its batch's
    (tmp_path / ".hydra" / "config.yaml").unlink()
    (tmp_path / "seed3").mkdir()
    (tmp_path / "seed3" / "model.pt").write_bytes(b"")
    with pytest.raises(EvalError) as err:
        find_config(tmp_path / "seed3")
    assert str(err.value) == f"{tmp_path / 'seed3'}: no .hydra/config.yaml here or in its batch dir; was it made by python -m pipeline?"


def test_a_run_s_own_config_and_seed(tmp_path):
    _run_dir(tmp_path, _cfg(seed=9))
    cfg, seed = find_config(tmp_path)
    assert cfg.env.id == "CartPole-v1" and seed == 9
    OmegaConf.save(OmegaConf.create({"env": {"id": "X"}}), tmp_path / ".hydra" / "config.yaml")
    assert find_config(tmp_path)[1] == 0  # no seed in the config: 0


def test_a_seed_dir_of_a_batch_reads_the_batch_config_and_its_own_seed(tmp_path):
    OmegaConf.save(_cfg(seed=0), tmp_path / "config.yaml")
    (tmp_path / ".pipeline").mkdir()
    OmegaConf.save(_cfg(seed=0, name="batch"), tmp_path / ".pipeline" / "config.yaml")
    seed_dir = tmp_path / "seed7"
    seed_dir.mkdir()
    save_atomic(_always(0), seed_dir / "model.pt")
    cfg, seed = find_config(seed_dir)
    assert cfg.name == "batch" and seed == 7
    # Its own config comes first.
    _run_dir(seed_dir, _cfg(name="own", seed=1))
    cfg, seed = find_config(seed_dir)
    assert cfg.name == "own" and seed == 7
    # A dir named like a seed dir only in part is not one: its seed is its config's.
    other = _run_dir(tmp_path / "seed7x", _cfg(seed=4))
    assert find_config(other)[1] == 4


def test_the_record_s_seed_wins_over_the_dir_and_the_config(tmp_path):
    seed_dir = _run_dir(tmp_path / "seed7", _cfg(seed=1))
    RunRecord(experiment="e", group="g", task="DQNTask", seed=12, run_dir=str(seed_dir)).write()
    assert find_config(seed_dir)[1] == 12


# ---- env_of, has_env -------------------------------------------------------------------------------------
def test_env_of_gives_the_id_and_resolved_kwargs():
    cfg = OmegaConf.create({"steps": 9, "env": {"id": "CartPole-v1", "kwargs": {"max_episode_steps": "${steps}"}}})
    env_id, kwargs = env_of(cfg)
    assert (env_id, kwargs) == ("CartPole-v1", {"max_episode_steps": 9}) and type(kwargs) is dict
    assert env_of(OmegaConf.create({"env": {"id": "Acrobot-v1"}})) == ("Acrobot-v1", {})
    assert env_of(OmegaConf.create({"env": {"id": "Acrobot-v1", "kwargs": None}})) == ("Acrobot-v1", {})


def test_a_run_without_an_env_is_refused_naming_its_task():
    with pytest.raises(EvalError) as err:
        env_of(OmegaConf.create({"task": {"_target_": "pipeline.tasks.supervised.SupervisedTask"}}))
    assert str(err.value) == (
        "this run (pipeline.tasks.supervised.SupervisedTask) has no environment: pipeline.eval replays reinforcement-learning agents"
    )
    with pytest.raises(EvalError, match=r"^this run \(\?\) has no environment"):
        env_of(OmegaConf.create({}))


@pytest.mark.parametrize("cfg, expected", [({}, False), ({"env": None}, False), ({"env": {"kwargs": {}}}, False),
                                           ({"env": {"id": ""}}, False), ({"env": {"id": "CartPole-v1"}}, True)])
def test_has_env_needs_an_env_id(cfg, expected):
    assert has_env(OmegaConf.create(cfg)) is expected


# ---- load_policy -----------------------------------------------------------------------------------------
def test_load_policy_builds_the_config_s_net_with_the_run_s_weights_in_eval_mode(tmp_path):
    _run_dir(tmp_path, action=1)
    policy = load_policy(_cfg(), tmp_path, *CARTPOLE_SPACES)
    assert isinstance(policy, QValuePolicy) and isinstance(policy.net, MLP) and not policy.training and not policy.net.training
    assert all(torch.equal(a, b) for a, b in zip(policy.net.state_dict().values(), _always(1).values()))
    square = gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32)  # a [2, 2] observation is 4 inputs
    given = load_policy(_cfg(), tmp_path, square, gym.spaces.Discrete(2), state_dict=_always(0))
    assert given(torch.zeros(1, 2, 2)).tolist() == [0]


def test_a_continuous_actor_critic_is_built_continuous_as_its_task_declares(tmp_path):
    cfg = _cfg(task={"_target_": PPO}, model={"_target_": "pipeline.nets.actor_critic.ActorCritic", "_partial_": True, "hidden": [4]})
    state = ActorCritic(3, 1, continuous=True, hidden=(4,)).state_dict()
    pendulum = gym.make("Pendulum-v1")
    policy = load_policy(cfg, tmp_path, pendulum.observation_space, pendulum.action_space, state_dict=state)
    assert isinstance(policy, ActorCriticPolicy) and policy.net.continuous is True and policy.net.log_std is not None


def test_load_policy_errors_are_one_line(tmp_path):
    with pytest.raises(EvalError, match=r"^model .*model\.pt: no such file$"):
        load_policy(_cfg(), tmp_path, *CARTPOLE_SPACES)
    _run_dir(tmp_path)
    with pytest.raises(EvalError) as err:
        load_policy(_cfg(), tmp_path, CARTPOLE_SPACES[0], gym.spaces.Discrete(3))  # 3 actions: the last layer does not fit
    text = str(err.value)
    assert text.startswith(f"{tmp_path / 'model.pt'} does not fit the run's model config (pipeline.nets.mlp.MLP): Error(s) in loading")
    assert "\n" not in text and err.value.__suppress_context__
    normalising = _cfg(task={"_target_": PPO, "normalize_obs": True}, model={**MLP_CFG, "_target_": "pipeline.nets.actor_critic.ActorCritic"})
    save_atomic(ActorCritic(4, 2, hidden=(8,)).state_dict(), tmp_path / "model.pt")
    with pytest.raises(EvalError) as err:
        load_policy(normalising, tmp_path, *CARTPOLE_SPACES)
    assert str(err.value).startswith(f"{tmp_path / 'obs_norm.pt'}: no such file; this run normalised its observations "
                                     "(task.normalize_obs=true) and its policy needs their statistics beside model.pt")
    (tmp_path / "obs_norm.pt").write_bytes(b"")
    with pytest.raises(EvalError, match=r"^observation statistics .*obs_norm\.pt: the file is empty"):
        load_policy(normalising, tmp_path, *CARTPOLE_SPACES)
    normalising.task.normalize_obs = False
    assert load_policy(normalising, tmp_path, *CARTPOLE_SPACES) is not None
    with pytest.raises(EvalError) as err:
        load_policy(_cfg(task={"_target_": "pipeline.tasks.supervised.SupervisedTask"}), tmp_path, *CARTPOLE_SPACES)
    assert str(err.value) == ("pipeline.tasks.supervised.SupervisedTask.policy is not a pipeline.rl.policies.Policy class: "
                              "an RL task declares how its network acts as policy = <a Policy class>")
    with pytest.raises(EvalError) as err:
        load_policy(_cfg(task={"_target_": "no_such_module.Task"}), tmp_path, *CARTPOLE_SPACES)
    assert str(err.value).startswith("task._target_=no_such_module.Task does not import here (")
    assert str(err.value).endswith("); run from the folder that holds its module")


@pytest.mark.parametrize("clip", [None, 0.5])
def test_a_policy_that_normalised_its_observations_sees_them_normalised_again(tmp_path, clip):
    """obs_norm.pt (PPO with task.normalize_obs) is applied before the network: (x - mean) / sqrt(var + eps), clipped."""
    _run_dir(tmp_path)
    torch.manual_seed(0)
    weights = ActorCritic(4, 2, hidden=(8,)).state_dict()
    mean = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float64)
    var = torch.tensor([4.0, 0.25, 1.0, 9.0], dtype=torch.float64)
    stats = {"mean": mean, "var": var, "count": torch.tensor(100.0, dtype=torch.float64), "eps": torch.tensor(1e-8, dtype=torch.float64)}
    if clip is not None:
        stats["clip"] = torch.tensor(clip, dtype=torch.float64)
    save_atomic(stats, tmp_path / "obs_norm.pt")
    cfg = _cfg(task={"_target_": PPO, "normalize_obs": True}, model={**MLP_CFG, "_target_": "pipeline.nets.actor_critic.ActorCritic"})
    x = torch.tensor([[2.5, -0.5, 2.0, 3.0], [0.5, -1.0, 4.0, -6.0]])
    # By hand: [1.0, 1.0, 0.0, 1.0] and [0.0, 0.0, 2.0, -2.0] (up to eps), clipped to +-0.5 when asked.
    seen = torch.tensor([[1.0, 1.0, 0.0, 1.0], [0.0, 0.0, 2.0, -2.0]])
    if clip is not None:
        seen = seen.clamp(-clip, clip)
    plain = ActorCritic(4, 2, hidden=(8,))
    plain.load_state_dict(weights)
    for policy in (load_policy(cfg, tmp_path, *CARTPOLE_SPACES, state_dict=weights),  # model.pt's weights, obs_norm.pt's statistics
                   load_policy(cfg, tmp_path / "elsewhere", *CARTPOLE_SPACES, state_dict=weights, files={"obs_norm.pt": stats})):
        with torch.no_grad():
            assert torch.allclose(policy.outputs(x), plain(seen)[0], atol=1e-6)
            assert not torch.allclose(policy.outputs(x), plain(x)[0], atol=1e-3)


def test_the_record_s_policy_is_played_without_importing_the_task(tmp_path):
    """A record names its policy: a replay imports that (torch), not the task (Lightning); a name that does not import
    is one line naming the record."""
    run = _run_dir(tmp_path / "run", _cfg(task={"_target_": "no_such_module.Task"}))
    RunRecord(experiment="e", group="g", task="Task", seed=5, run_dir=str(run), extras={"policy": "pipeline.rl.policies.QValuePolicy"}).write()
    code = ("import sys; from pipeline.eval import main; main([sys.argv[1], 'episodes=1']); "
            "print(sorted(m for m in ('lightning', 'pipeline.tasks.rl_task') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]" and json.loads((run / "eval.json").read_text())["episodes"] == 1
    RunRecord(experiment="e", group="g", task="Task", seed=5, run_dir=str(run), extras={"policy": "pipeline.rl.policies.Gone"}).write()
    with pytest.raises(EvalError) as err:
        load_policy(_cfg(), run, *CARTPOLE_SPACES)
    assert str(err.value).startswith(f"{run / 'result.json'}: its policy pipeline.rl.policies.Gone does not import here (no such module or attribute); ")


# ---- play ---------------------------------------------------------------------------------------------------
def test_play_runs_greedy_episodes_from_seed_plus_30000_as_gymnasium_plays_them(tmp_path):
    _run_dir(tmp_path)
    result = play(Options(run_dir=tmp_path, episodes=3), _cfg(), run_seed=5, state_dict=_steering())
    seeds = [30_005, 30_006, 30_007]
    by_hand = [_by_hand(s, steer) for s in seeds]
    assert result == {
        "run_dir": str(tmp_path), "env_id": "CartPole-v1", "run_seed": 5, "episodes": 3, "seeds": seeds,
        "returns": [r for r, _ in by_hand], "lengths": [n for _, n in by_hand],
        "mean": float(np.mean([r for r, _ in by_hand])), "std": float(np.std([r for r, _ in by_hand])),
        "device": "cpu", "videos": [],
    }
    assert len(set(result["lengths"])) == 3  # the start states differ: the seeds matter
    assert result["returns"] != [r for r, _ in (_by_hand(s, lambda o: 1 - steer(o)) for s in seeds)]  # so does the action


def test_play_from_a_seed_given_and_with_weights_given(tmp_path):
    _run_dir(tmp_path, action=1)
    result = play(Options(run_dir=tmp_path, episodes=2, seed=100), _cfg(), run_seed=5, state_dict=_always(0))
    assert result["seeds"] == [100, 101]
    assert result["returns"] == [_by_hand(100, 0)[0], _by_hand(101, 0)[0]]


def test_a_continuous_policy_plays_its_mean_clipped_to_the_action_space(tmp_path):
    cfg = _cfg(env={"id": "Pendulum-v1", "kwargs": {"max_episode_steps": 3}}, task={"_target_": PPO},
               model={"_target_": "pipeline.nets.actor_critic.ActorCritic", "_partial_": True, "hidden": []})
    net = ActorCritic(3, 1, continuous=True, hidden=())
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
        net.actor[-1].bias.fill_(0.5)
    result = play(Options(run_dir=tmp_path, episodes=1, seed=0), cfg, run_seed=0, state_dict=net.state_dict())
    assert result["returns"] == [pytest.approx(_by_hand(0, np.array([0.5], dtype=np.float32), 3, "Pendulum-v1")[0])]
    assert result["lengths"] == [3]


def test_play_with_video_writes_one_mp4_per_episode_with_every_frame(tmp_path, monkeypatch):
    monkeypatch.delenv("SDL_VIDEODRIVER", raising=False)
    monkeypatch.delenv("SDL_AUDIODRIVER", raising=False)
    cfg = _cfg(env={"id": "CartPole-v1", "kwargs": {"max_episode_steps": 4}})
    _run_dir(tmp_path, cfg)
    result = play(Options(run_dir=tmp_path, episodes=2, seed=3, video=True), cfg, run_seed=0)
    paths = [str(tmp_path / "videos" / "replay-seed3.mp4"), str(tmp_path / "videos" / "replay-seed4.mp4")]
    assert result["videos"] == paths and result["lengths"] == [4, 4]
    reader = imageio.get_reader(paths[0])
    frames = [np.asarray(f) for f in reader]
    fps = reader.get_meta_data()["fps"]
    reader.close()
    assert len(frames) == 5 and frames[0].shape == (400, 600, 3)  # the start state and one per step
    assert fps == 50.0  # CartPole's render_fps
    import os

    assert os.environ["SDL_VIDEODRIVER"] == "dummy" and os.environ["SDL_AUDIODRIVER"] == "dummy"


# ---- Mp4Writer, video_as_gif ------------------------------------------------------------------------------------
def test_odd_frames_are_padded_to_even_sizes_with_their_edge(tmp_path):
    writer = Mp4Writer(tmp_path / "deep" / "v.mp4", fps=10)
    frame = np.zeros((5, 7, 3), dtype=np.uint8)
    frame[:, -1] = 255  # a white right edge, repeated into the padding
    for _ in range(3):
        writer.add(frame)
    writer.add(np.zeros((6, 8, 3), dtype=np.uint8))  # even: as it is
    writer.close()
    reader = imageio.get_reader(str(tmp_path / "deep" / "v.mp4"))
    frames = [np.asarray(f) for f in reader]
    assert reader.get_meta_data()["fps"] == 10.0
    reader.close()
    assert len(frames) == 4 and frames[0].shape == (6, 8, 3)
    assert frames[0][:, -1].mean() > 200 and frames[3].mean() < 20


def _mp4(path: Path, n: int, fps: float = 20, size=(8, 12)) -> Path:
    writer = Mp4Writer(path, fps=fps)
    for i in range(n):
        writer.add(np.full((*size, 3), (10 * i) % 256, dtype=np.uint8))
    writer.close()
    return path


def test_a_video_becomes_a_half_size_looping_gif(tmp_path):
    gif, height, width = video_as_gif(_mp4(tmp_path / "v.mp4", 4, fps=20))
    assert (height, width) == (4, 6)
    frames = imageio.mimread(gif, format="GIF")
    assert len(frames) == 4 and frames[0].shape[:2] == (4, 6)
    meta = imageio.get_reader(gif, format="GIF").get_meta_data()
    assert meta["duration"] == 50 and meta["loop"] == 0  # 1000 ms / 20 fps per frame


def test_a_long_video_keeps_every_kth_frame_at_most_150(tmp_path):
    gif, _, _ = video_as_gif(_mp4(tmp_path / "v.mp4", 301, fps=50, size=(2, 2)))
    frames = imageio.mimread(gif, format="GIF")
    assert len(frames) == 101  # stride ceil(301 / 150) = 3
    assert imageio.get_reader(gif, format="GIF").get_meta_data()["duration"] == 60  # 3 frames of 20 ms


# ---- training_video_hook ------------------------------------------------------------------------------------
class TensorBoardLogger:
    def __init__(self):
        self.summaries = []
        self.experiment = SimpleNamespace(file_writer=SimpleNamespace(add_summary=lambda s, step: self.summaries.append((s, step))),
                                          flush=lambda: None)


class WandbLogger:
    def __init__(self):
        self.videos = []

    def log_video(self, key, **kwargs):
        self.videos.append((key, kwargs))


def test_a_training_video_goes_to_the_agent_s_dir_and_to_tensorboard_and_wandb(tmp_path):
    cfg = _cfg(env={"id": "CartPole-v1", "kwargs": {"max_episode_steps": 3}})
    dirs = [tmp_path / "seed0", tmp_path / "seed1"]
    tb, wb, other = TensorBoardLogger(), WandbLogger(), TensorBoardLogger()
    hook = training_video_hook(cfg, dirs, [0, 1], "cpu", [[other], [tb, wb, object()]])  # one logger list per agent
    hook(1, 64, _always(1))
    assert other.summaries == []  # agent 0's loggers get nothing of agent 1's video
    path = str(dirs[1] / "videos" / f"train-step64-seed1-env-seed{1 + 30_000}.mp4")  # the agent's seed, the episode's
    assert Path(path).is_file() and not (dirs[0] / "videos").exists()
    ((summary, step),) = tb.summaries
    image = summary.value[0].image
    assert step == 64 and summary.value[0].tag == "video/train"
    assert (image.height, image.width, image.colorspace) == (200, 300, 3)  # half of CartPole's 400 x 600, RGB
    assert image.encoded_image_string.startswith(b"GIF8")
    assert wb.videos == [("video/train", {"videos": [path], "step": 64, "format": ["mp4"], "caption": ["env step 64: return 3.0"]})]


def test_a_failing_training_video_is_warned_about_once_and_training_goes_on(tmp_path, caplog):
    cfg = OmegaConf.create({"task": {"_target_": "T"}})  # no env: play raises
    hook = training_video_hook(cfg, [tmp_path], [0], "cpu", [])
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        hook(0, 1, {})
        assert len(caplog.records) == 1  # said at the first failure
        hook(0, 2, {})
    assert [r.getMessage() for r in caplog.records] == [
        "no training video: this run (T) has no environment: pipeline.eval replays reinforcement-learning agents"
    ]


def test_a_training_video_failure_without_a_message_is_named_by_its_type(tmp_path, caplog, monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError()

    monkeypatch.setattr(replay, "play", fail)
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        training_video_hook(_cfg(), [tmp_path], [0], "cpu", [])(0, 1, {})
    assert [r.getMessage() for r in caplog.records] == ["no training video: RuntimeError"]


# ---- log_to_run_loggers, evaluate_run ------------------------------------------------------------------------
RESULT = {"mean": 2.0, "std": 1.0, "returns": [1.0, 3.0], "videos": [], "run_seed": 4, "episodes": 2, "seeds": [8, 9]}


def test_no_run_loggers_no_logging(tmp_path):
    assert replay.log_to_run_loggers(OmegaConf.create({}), RESULT, tmp_path) == []
    assert replay.log_to_run_loggers(OmegaConf.create({"logger": None}), RESULT, tmp_path) == []
    assert list(tmp_path.iterdir()) == []


def test_the_replay_goes_to_the_run_s_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    video = str(_mp4(tmp_path / "v.mp4", 2))
    videos = [video, video]
    used = replay.log_to_run_loggers(OmegaConf.create({"logger": {"tensorboard": {}}}), {**RESULT, "videos": videos}, tmp_path)
    assert used == ["tensorboard"]
    events = EventAccumulator(str(tmp_path / "tensorboard" / "replay"), size_guidance={"images": 0, "tensors": 0})
    events.Reload()
    assert [(s.step, s.value) for s in events.Scalars("replay/return")] == [(0, 1.0), (1, 3.0)]
    assert [(s.step, s.value) for s in events.Scalars("replay/return_mean")] == [(0, 2.0)]
    assert [(s.step, s.value) for s in events.Scalars("replay/return_std")] == [(0, 1.0)]
    images = events.Images("replay/video")
    assert [(i.step, i.height, i.width) for i in images] == [(0, 4, 6), (0, 4, 6)]
    (text,) = events.Tensors("replay/videos/text_summary")
    assert text.step == 0 and text.tensor_proto.string_val == [f"{video}\n\n{video}".encode()]


class FakeWandb:
    """Stands in for the wandb module: what log_to_run_loggers asks of it."""

    def __init__(self):
        self.init_kwargs, self.logged, self.summary, self.finished = None, [], {}, False

    def init(self, **kwargs):
        self.init_kwargs = kwargs
        return SimpleNamespace(log=self.logged.append, summary=self.summary, finish=lambda: setattr(self, "finished", True))

    def Video(self, path, format):
        return ("video", path, format)

    def Settings(self, **kwargs):
        return kwargs


def test_the_replay_goes_to_the_run_s_wandb_group(tmp_path, monkeypatch):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    RunRecord(experiment="e", group="grp", task="DQNTask", seed=4, run_dir=str(tmp_path)).write()
    cfg = OmegaConf.create({"name": "cart", "logger": {"wandb": {"project": "p", "entity": "me"}}})
    used = replay.log_to_run_loggers(cfg, {**RESULT, "videos": ["a.mp4"]}, tmp_path)
    assert used == ["wandb"] and fake.finished
    assert fake.init_kwargs == {
        "project": "p", "entity": "me", "group": "grp", "job_type": "replay", "name": "cart-seed4-replay",
        "dir": str(tmp_path), "mode": "offline", "config": {"run_dir": str(tmp_path), "episodes": 2, "seeds": [8, 9]},
        "settings": {"silent": True, "console": "off"},
    }
    assert fake.logged == [{"replay/return_mean": 2.0, "replay/return_std": 1.0, "replay/video_0": ("video", "a.mp4", "mp4")}]
    assert fake.summary == {"replay/return_mean": 2.0, "replay/return_std": 1.0}


def test_wandb_defaults_without_a_record_or_options(tmp_path, monkeypatch):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    replay.log_to_run_loggers(OmegaConf.create({"logger": {"wandb": None}}), RESULT, tmp_path)
    kw = fake.init_kwargs
    assert (kw["project"], kw["entity"], kw["group"], kw["name"], kw["mode"]) == ("pipeline", None, None, "run-seed4-replay", "disabled")
    replay.log_to_run_loggers(OmegaConf.create({"logger": {"wandb": {"mode": "online"}}}), RESULT, tmp_path)
    assert fake.init_kwargs["mode"] == "online"


def test_evaluate_run_replays_an_rl_run_and_writes_eval_json(tmp_path):
    cfg = _cfg(env={"id": "CartPole-v1", "kwargs": {"max_episode_steps": 6}})
    _run_dir(tmp_path, cfg)
    result = evaluate_run(Options(run_dir=tmp_path, episodes=2))
    assert result["seeds"] == [30_005, 30_006] and result["logged_to"] == [] and result["lengths"] == [6, 6]
    assert result.pop("eval_file") == str(tmp_path / "eval.json")  # where it was written (out=<dir> moves it)
    assert json.loads((tmp_path / "eval.json").read_text()) == result
    cfg.logger = {"tensorboard": {}}
    OmegaConf.save(cfg, tmp_path / ".hydra" / "config.yaml")
    assert evaluate_run(Options(run_dir=tmp_path, episodes=1))["logged_to"] == ["tensorboard"]
    assert any((tmp_path / "tensorboard" / "replay").iterdir())  # in the run's own dir


@pytest.mark.parametrize("given, says", [({"split"}, "split= score"), ({"data"}, "data.<key>= score"),
                                         ({"data", "split", "episodes"}, "data.<key>= and split= score")])
def test_options_of_supervised_runs_are_refused_for_an_rl_run(tmp_path, given, says):
    _run_dir(tmp_path)
    with pytest.raises(EvalError) as err:
        evaluate_run(Options(run_dir=tmp_path, given=given))
    assert str(err.value) == (f"{says} supervised and GAN runs; an RL run is replayed in its env: episodes=, video=, seed=")
    assert not (tmp_path / "eval.json").exists()


def test_a_run_without_an_env_is_scored_by_model_eval(tmp_path, monkeypatch):
    from pipeline.runtime import model_eval

    calls = []
    monkeypatch.setattr(model_eval, "score_run", lambda options, cfg, seed: calls.append((options, cfg.task._target_, seed)) or {"test/acc": 0.5})
    _run_dir(tmp_path, OmegaConf.create({"seed": 2, "task": {"_target_": "S"}}))
    options = Options(run_dir=tmp_path, given={"split"})
    assert evaluate_run(options) == {"test/acc": 0.5, "eval_file": str(tmp_path / "eval.json")}
    assert calls == [(options, "S", 2)] and json.loads((tmp_path / "eval.json").read_text()) == {"test/acc": 0.5}


@pytest.mark.parametrize("size", [(5, 8), (8, 5), (9, 8), (8, 9)])
def test_a_frame_odd_in_either_side_is_padded(tmp_path, size):
    writer = Mp4Writer(tmp_path / "v.mp4", fps=10)
    writer.add(np.zeros((*size, 3), dtype=np.uint8))
    writer.close()
    (frame,) = imageio.mimread(str(tmp_path / "v.mp4"))
    assert frame.shape == (size[0] + size[0] % 2, size[1] + size[1] % 2, 3)


def test_a_one_frame_video_is_a_one_frame_gif(tmp_path):
    gif, height, width = video_as_gif(_mp4(tmp_path / "v.mp4", 1))
    assert (height, width) == (4, 6) and len(imageio.mimread(gif, format="GIF")) == 1


class Recording(gym.Wrapper):
    """Records the actions an env is given."""

    def __init__(self, env):
        super().__init__(env)
        self.actions = []

    def step(self, action):
        self.actions.append(np.array(action, copy=True))
        return self.env.step(action)


@pytest.mark.parametrize("bias, played", [(5.0, 2.0), (-5.0, -2.0)])
def test_a_continuous_action_outside_the_space_is_clipped_to_it(tmp_path, monkeypatch, bias, played):
    from pipeline.rl import envs

    made = []
    real = envs.make_env
    monkeypatch.setattr(envs, "make_env", lambda env_id, **kw: made.append(Recording(real(env_id, **kw))) or made[-1])
    cfg = _cfg(env={"id": "Pendulum-v1", "kwargs": {"max_episode_steps": 2}}, task={"_target_": PPO},
               model={"_target_": "pipeline.nets.actor_critic.ActorCritic", "_partial_": True, "hidden": []})
    net = ActorCritic(3, 1, continuous=True, hidden=())
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
        net.actor[-1].bias.fill_(bias)
    play(Options(run_dir=tmp_path, episodes=1, seed=0), cfg, run_seed=0, state_dict=net.state_dict())
    assert [a.tolist() for a in made[0].actions] == [[played], [played]]


def test_an_atari_game_is_played_whole_with_real_rewards_and_videos_at_its_frame_rate(tmp_path, monkeypatch):
    """Atari by a stand-in (CartPole under an ALE id): what play asks of make_env, and the video's frame rate."""
    from pipeline.rl import envs

    asked = []

    def make_env(env, **kwargs):  # the run's env group, and play's kwargs on top
        settings = envs.EnvSettings.of(env, **kwargs)
        asked.append((settings.id, settings.kwargs))
        return gym.make("CartPole-v1", render_mode=kwargs.get("render_mode"), max_episode_steps=2)

    monkeypatch.setattr(envs, "make_env", make_env)
    cfg = _cfg(env={"id": "ALE/Pong-v5", "kwargs": {"frame_skip": 5}})
    result = play(Options(run_dir=tmp_path, episodes=1, seed=0, video=True), cfg, run_seed=0, state_dict=_always(1))
    assert asked == [("ALE/Pong-v5", {"frame_skip": 5, "clip_rewards": False, "terminal_on_life_loss": False,
                                      "render_mode": "rgb_array"})]
    assert imageio.get_reader(result["videos"][0]).get_meta_data()["fps"] == 10.0  # 50 frames/s over 5 skipped
    asked.clear()
    play(Options(run_dir=tmp_path, episodes=1, seed=0, video=True), _cfg(env={"id": "ALE/Pong-v5"}), run_seed=0,
         state_dict=_always(1), video_name="noskip")
    assert imageio.get_reader(str(tmp_path / "videos" / "noskip-seed0.mp4")).get_meta_data()["fps"] == 50.0


def test_a_video_of_an_env_without_a_frame_rate_runs_at_30(tmp_path, monkeypatch):
    from pipeline.rl import envs

    def make_env(group, **kwargs):
        settings = envs.EnvSettings.of(group, **kwargs)
        env = gym.make(settings.id, **settings.kwargs)
        env.metadata = {**env.metadata, "render_fps": None}
        return env

    monkeypatch.setattr(envs, "make_env", make_env)
    cfg = _cfg(env={"id": "CartPole-v1", "kwargs": {"max_episode_steps": 2}})
    result = play(Options(run_dir=tmp_path, episodes=1, seed=0, video=True), cfg, run_seed=0, state_dict=_always(1))
    assert imageio.get_reader(result["videos"][0]).get_meta_data()["fps"] == 30.0


def test_only_an_atari_game_s_frame_skip_slows_its_video(tmp_path, monkeypatch):
    """A frame_skip given to another env (MuJoCo envs take one) is that env's business: the video keeps its rate."""
    from pipeline.rl import envs

    monkeypatch.setattr(envs, "make_env", lambda env_id, **kw: gym.make("CartPole-v1", render_mode=kw.get("render_mode"),
                                                                        max_episode_steps=2))
    cfg = _cfg(env={"id": "CartPole-v1", "kwargs": {"frame_skip": 5}})
    result = play(Options(run_dir=tmp_path, episodes=1, seed=0, video=True), cfg, run_seed=0, state_dict=_always(1))
    assert imageio.get_reader(result["videos"][0]).get_meta_data()["fps"] == 50.0

"""A user's own gymnasium env from the command line (tests/user_envs/: the package my_envs, copied into a folder of
the user's, the CLI run from there): `env.id=my_envs:Corridor-v0` or `env.imports=[my_envs]` trains with every RL
task, `python -m pipeline.eval` replays it (videos too) in a fresh process, `pipeline.load(run).act` and
`python -m pipeline.export` play it, sweep jobs import it; a bad entry is one line, exit 2, before any run dir.
MuJoCo replays render on a machine without a display."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from pipeline.config import env_ids
from pipeline.rl.envs import headless_gl, mujoco_available
from pipeline_testing import read_result, run_cli, run_module, sweep_dir

ROOT = Path(__file__).resolve().parents[1]
USER_ENVS = ROOT / "tests" / "user_envs"
DQN = ("experiment=dqn_cartpole", "trainer=debug")
APPEND = "my_envs.wrappers.AppendConstant"
WRAPPERS = f"env.wrappers=[{APPEND},{{_target_:my_envs.wrappers.ScaleReward,scale:2.0}}]"


@pytest.fixture
def work(tmp_path, monkeypatch):
    """The user's folder: their package my_envs (and a module with a bug) beside where they run the CLI. On sys.path of
    this test process too, as `python -m` puts the current folder there."""
    folder = tmp_path / "tests" / "user_envs"  # where the docs' commands `cd` to from the root (tmp_path)
    shutil.copytree(USER_ENVS, folder, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.syspath_prepend(str(folder))
    for name in [m for m in sys.modules if m == "my_envs" or m.startswith("my_envs.")]:
        monkeypatch.delitem(sys.modules, name)  # imported from this copy, not an earlier test's
    return folder


def refused(work: Path, *args: str) -> str:
    run_dir = work.parent / "run"
    done = run_cli(*DQN, *args, f"hydra.run.dir={run_dir}", cwd=work)
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: ") and "Traceback" not in lines[0]
    assert not run_dir.exists() and not (work / "outputs").exists()
    return lines[0].removeprefix("error: ")


@pytest.mark.parametrize(("args", "says"), [
    (("env.id=Corridor-v0",), "env.id=Corridor-v0 is not a registered gymnasium environment; "),
    (("env.id=nowhere:Corridor-v0",), "env.id=nowhere:Corridor-v0: no module named 'nowhere' here; run from the folder "
                                      "that holds it, or add that folder to PYTHONPATH"),
    (("env.imports=[broken_envs]", "env.id=Broken-v0"),
     "env.imports: broken_envs: importing broken_envs failed: RuntimeError: my env module has a bug ("),
    (("env=cartpole_tensor", f"env.wrappers=[{APPEND}]"),
     "env.wrappers wrap gymnasium envs, and env.backend=tensor builds its own; use env.backend=gym"),
])
def test_a_bad_user_env_is_one_line_before_any_run_dir(work, args, says):
    line = refused(work, *args)
    assert line.startswith(says), line
    if args == ("env.id=Corridor-v0",):  # the user's own env: name its module (the suggestions alone were Atari games)
        assert line.endswith("name the module: env.id=<module>:Corridor-v0 or env.imports=[<module>])"), line


def composed_check(*overrides: str) -> str:
    """The CLI's start-up checks on the composed config, in this process: the ConfigError's line."""
    from hydra import compose, initialize_config_module
    from omegaconf import open_dict

    from pipeline.config import checks

    with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
    choices = checks.runtime_choices(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    with pytest.raises(checks.ConfigError) as info:
        checks.check_types(cfg, choices)
        checks.check_values(cfg, choices)
    assert "\n" not in str(info.value)
    return str(info.value)


@pytest.mark.parametrize(("args", "says"), [
    (("env.id=my_envs:Corridor-v9",), "env.id=my_envs:Corridor-v9 is not a registered gymnasium environment; did you mean "
                                      "env.id=my_envs:Corridor-v0? (importing my_envs registered no Corridor-v9)"),
    (("env.id=my_envs:Corridor-v0", "env.wrappers=[my_envs.wrappers.Nope]"),
     "env.wrappers[0]=my_envs.wrappers.Nope: my_envs.wrappers has no class or function 'Nope'"),
    (("experiment=td3_hopper", "env.imports=[my_envs]", "env.id=Corridor-v0"),
     "task=td3 takes box actions, and env.id=Corridor-v0 has Discrete(2)"),
    (("experiment=td3_hopper", "env.id=my_envs:Slider-v0", "env.wrappers=[{_target_:DiscretizeAction,bins:3}]"),
     "task=td3 takes box actions, and env.id=my_envs:Slider-v0 has Discrete(3)"),  # the spaces of the wrapped env
    (("env.imports=my_envs", "env.id=Corridor-v0"), "env.imports: expected a list, got 'my_envs'"),
])
def test_the_start_up_checks_see_the_users_env_as_the_run_builds_it(work, args, says):
    line = composed_check(*DQN, *args)
    assert line.startswith(says), line


def test_the_start_up_check_imports_the_users_module_without_torch(work):
    probe = ("import sys; from pipeline.config import env_ids; "
             f"env = {{'id': 'Corridor-v0', 'imports': ['my_envs'], 'wrappers': ['{APPEND}'], 'kwargs': {{'length': 4}}}}; "
             "env_ids.check_env(env); print(env_ids.action_kind(env)[0], 'my_envs' in sys.modules, "
             "sorted(m for m in ('torch', 'lightning') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=work)
    assert done.returncode == 0 and done.stdout.strip() == "discrete True []", done.stderr[-2000:] + done.stdout


def test_a_run_from_python_carries_the_module_that_registered_its_env(work, caplog):
    """`import my_envs; pipeline.run(...)` names no module in the config: the one that registered the env goes into
    env.imports (a later eval in a fresh process imports it); one registered by a script cannot go, and says so."""
    import my_envs  # noqa: F401 - registers Corridor-v0 (entry point my_envs.corridor.CorridorEnv) and Slider-v0

    def carried(env_id, imports=()):
        cfg = OmegaConf.create({"env": {"id": env_id, "kwargs": {}, "imports": list(imports), "wrappers": []}})
        OmegaConf.set_struct(cfg, True)
        env_ids.carry_env_imports(cfg)
        return list(cfg.env.imports)

    assert carried("Corridor-v0") == ["my_envs.corridor"]
    assert carried("Slider-v0", ["other"]) == ["other", "my_envs.slider"]  # a "module:Class" entry point
    assert carried("my_envs:Corridor-v0") == [] and carried("Corridor-v0", ["my_envs.corridor"]) == ["my_envs.corridor"]
    assert carried("CartPole-v1") == [] and carried("ALE/Pong-v5") == []
    fresh = subprocess.run([sys.executable, "-c", "import gymnasium, my_envs.corridor; print('Corridor-v0' in gymnasium.registry)"],
                           capture_output=True, text=True, timeout=60, cwd=work)
    assert fresh.stdout.strip() == "True", fresh.stderr[-2000:]
    script_env = type("ScriptEnv", (gym.Env,), {"__module__": "__main__"})
    gym.register(id="ScriptOnly-v0", entry_point=script_env)
    try:
        assert carried("ScriptOnly-v0") == []
    finally:
        del gym.registry["ScriptOnly-v0"]
    assert any("registered by this script (__main__)" in r.getMessage() for r in caplog.records)


# ---- end to end --------------------------------------------------------------------------------------------------


def _by_hand(length: int, seed: int, act) -> float:
    """The return of one greedy episode on the env built with gymnasium and the wrappers directly."""
    import my_envs.wrappers as w

    env = w.ScaleReward(w.AppendConstant(gym.make("Corridor-v0", length=length)), scale=2.0)
    obs, _ = env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(act(obs))
        total, done = total + reward, terminated or truncated
    return total


def documented_commands() -> list[str]:
    """The shell lines of docs/bring_your_own.md that run the env example: `(cd tests/user_envs && python -m ...)` on
    outputs/corridor."""
    text = (ROOT / "docs" / "bring_your_own.md").read_text()
    return [line for line in text.splitlines()
            if line.startswith("(cd tests/user_envs && python -m pipeline") and "outputs/corridor" in line]


@pytest.mark.slow
def test_the_docs_commands_train_dqn_k4_replay_with_video_load_and_export(work):
    """docs/bring_your_own.md's env commands, as written, from a root holding tests/user_envs (fresh interpreters: a
    later eval and export import my_envs from what the run's config names)."""
    import imageio.v2 as imageio

    import pipeline

    train, replay, export = documented_commands()
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # `python` is this interpreter
    ran = {}
    for name, command in (("train", train), ("replay", replay), ("export", export)):
        ran[name] = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=900, cwd=work.parents[1],
                                   env={**os.environ, "PATH": path, "WANDB_MODE": "offline"})
        assert ran[name].returncode == 0, f"{command}\n{ran[name].stderr[-3000:]}"
    output = ran["train"].stdout + ran["train"].stderr
    assert output.count("my_envs:Corridor-v0 registers no reward_threshold and task.threshold is null") == 1, output[-2000:]
    run_dir = work / "outputs" / "corridor"
    for seed in (0, 1, 2, 3):
        record = read_result(run_dir / f"seed{seed}")
        assert record["status"] == "ok" and record["env_id"] == "my_envs:Corridor-v0" and record["env_steps"] == 3000
        assert record["threshold"] is None and record["time_to_threshold_s"] is None

    result = json.loads((run_dir / "seed0" / "eval.json").read_text())
    agent = pipeline.load(run_dir / "seed0")
    assert agent.observation_space.shape == (3,)  # the network trained behind AppendConstant: 3 inputs
    expected = [_by_hand(6, seed, agent.act) for seed in result["seeds"]]
    assert result["returns"] == pytest.approx(expected)  # kwargs (length 6) and both wrappers (x2 rewards) replayed
    assert len(result["videos"]) == 2 and "rendering" not in result
    frames = [np.asarray(f) for f in imageio.get_reader(work / result["videos"][0])]  # relative to where eval ran
    assert frames[0].shape == (16, 16 * 6, 3) and len(frames) == result["lengths"][0] + 1  # the corridor of 6 cells

    policy = torch.jit.load(str(run_dir / "seed0" / "policy.torchscript.pt"))
    obs = np.array([[i / 5, 1.0, 0.5] for i in range(6)], dtype=np.float32)
    assert policy(torch.from_numpy(obs)).tolist() == agent.act(obs).tolist()


def _first_layer_inputs(run_dir: Path) -> int:
    state = torch.load(run_dir / "model.pt", weights_only=True)
    return next(v.shape[-1] for k, v in state.items() if k.endswith("weight") and v.dim() >= 2)


@pytest.mark.slow
@pytest.mark.parametrize(("preset", "env_id"), [
    ("ppo_cartpole", "Corridor-v0"), ("cem_cartpole", "Corridor-v0"),
    ("sac_hopper", "Slider-v0"), ("td3_hopper", "Slider-v0"),
])
def test_every_rl_task_trains_on_a_user_env_with_its_wrappers(work, preset, env_id):
    run_dir = work.parent / "run"
    done = run_cli(f"experiment={preset}", "trainer=debug", "env.imports=[my_envs]", f"env.id={env_id}", "env.backend=gym",
                   f"env.wrappers=[{APPEND}]", "task.stop_at_return=null", f"hydra.run.dir={run_dir}", cwd=work)
    assert done.returncode == 0, done.stderr[-3000:]
    record = read_result(run_dir)
    assert record["status"] == "ok" and record["env_id"] == env_id and record["threshold"] is None
    assert _first_layer_inputs(run_dir) == 3  # two features and AppendConstant's
    replay = run_module("pipeline.eval", str(run_dir), "episodes=1", cwd=work, fresh=True)
    assert replay.returncode == 0, replay.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["joblib", "submitit_local"])
def test_every_sweep_job_imports_the_users_module(work, launcher):
    done = run_cli("-m", *DQN, "seed=0,1", f"hydra/launcher={launcher}", "env.id=my_envs:Corridor-v0",
                   f"env.wrappers=[{APPEND}]", *(["hydra.launcher.timeout_min=10"] if launcher == "submitit_local" else []),
                   cwd=work)
    assert done.returncode == 0, done.stderr[-3000:]
    sweep = sweep_dir(work)
    records = sorted((json.loads(p.read_text()) for p in sweep.glob("*/result.json")), key=lambda r: r["seed"])
    assert [(r["seed"], r["status"]) for r in records] == [(0, "ok"), (1, "ok")]
    job = work / "job0"  # a name without "=": pipeline.eval reads a `key=value` argument as an option
    job.symlink_to(next(p.parent for p in sweep.glob("*/result.json")))
    assert _first_layer_inputs(job) == 3
    replay = run_module("pipeline.eval", str(job), "episodes=1", cwd=work, fresh=True)  # the job's config names it
    assert replay.returncode == 0, replay.stderr[-3000:]


@pytest.mark.slow
def test_a_run_from_python_after_import_replays_in_a_fresh_process(work):
    run_dir = work.parent / "run"
    script = ("import my_envs, pipeline\n"
              "pipeline.run('dqn_cartpole', ['trainer=debug', 'env.id=Corridor-v0', "
              f"'hydra.run.dir={run_dir}'])\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=work,
                          env={**os.environ, "WANDB_MODE": "offline"})
    assert done.returncode == 0 and read_result(run_dir)["status"] == "ok", done.stderr[-3000:]
    assert list(OmegaConf.load(run_dir / ".hydra" / "config.yaml").env.imports) == ["my_envs.corridor"]
    replay = run_module("pipeline.eval", str(run_dir), "episodes=1", cwd=work, fresh=True)
    assert replay.returncode == 0, replay.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.skipif(not mujoco_available(), reason='MuJoCo is not installed (pip install -e ".[mujoco]")')
def test_a_mujoco_replay_records_its_video_without_a_display(tmp_path):
    import imageio.v2 as imageio

    headless = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL", "PYOPENGL_PLATFORM")}
    run_dir = tmp_path / "run"
    done = run_cli("experiment=td3_hopper", "trainer=debug", "env.kwargs.max_episode_steps=20", f"hydra.run.dir={run_dir}",
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    replay = subprocess.run([sys.executable, "-m", "pipeline.eval", str(run_dir), "video=true", "episodes=1"],
                            capture_output=True, text=True, timeout=600, cwd=tmp_path, env=headless)
    if replay.returncode and "no EGL or OSMesa library" in replay.stderr and headless_gl() is None:
        pytest.skip("no headless OpenGL here: sudo bash tools/headless_gl.sh")
    assert replay.returncode == 0 and "Traceback" not in replay.stderr, replay.stderr[-3000:]
    backend = replay.stdout.strip().splitlines()[-1]
    assert backend in ("MuJoCo frames render with MUJOCO_GL=egl (no display)",
                       "MuJoCo frames render with MUJOCO_GL=osmesa (no display)"), replay.stdout
    result = json.loads((run_dir / "eval.json").read_text())
    frames = np.stack([np.asarray(f) for f in imageio.get_reader(result["videos"][0])])
    assert len(frames) == result["lengths"][0] + 1 and frames.shape[1:] == (480, 480, 3)
    assert frames[0].std() > 10 and np.abs(np.diff(frames.astype(np.int16), axis=0)).max() > 0  # a scene, and it moves

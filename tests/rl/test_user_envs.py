"""A user's own gymnasium envs (tests/user_envs/my_envs: a discrete corridor, a continuous slider, wrappers): the env
group's `imports`, the id's `module:` prefix, `kwargs` and `wrappers` reach every env the run builds, and a bad entry
is one line naming the key and the fix."""

import logging
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from pipeline.rl import envs
from pipeline.rl.envs import (
    EnvError,
    EnvSettings,
    env_threshold,
    evaluate_greedy,
    headless_gl,
    make_env,
    play_episodes,
    run_threshold,
)
from pipeline.rl.vector import evaluate_agents, make_vector_env

USER_ENVS = Path(__file__).resolve().parents[1] / "user_envs"
APPEND = "my_envs.wrappers.AppendConstant"
SCALE = {"_target_": "my_envs.wrappers.ScaleReward", "scale": 2.0}


@pytest.fixture(autouse=True)
def _user_folder(monkeypatch):
    """The user's folder on sys.path, as `python -m pipeline` run from it has it."""
    monkeypatch.syspath_prepend(str(USER_ENVS))


def _hand_made(length=8, value=None, scale=None):
    """The expected env, built with gymnasium and the wrappers directly (not through pipeline)."""
    import my_envs.wrappers as w

    env = gym.make("Corridor-v0", length=length)
    if value is not None:
        env = w.AppendConstant(env, value=value)
    return w.ScaleReward(env, scale=scale) if scale is not None else env


def _chain(env):
    names = []
    while isinstance(env, gym.Wrapper):
        names.append(type(env).__name__)
        env = env.env
    return names, env


def test_the_module_prefix_and_imports_register_the_env_and_kwargs_reach_it():
    prefixed = make_env({"id": "my_envs:Corridor-v0", "kwargs": {"length": 5}})
    imported = make_env({"id": "Corridor-v0", "imports": ["my_envs"], "kwargs": {"length": 5}}, step_cost=0.5)
    assert prefixed.unwrapped.length == 5 and imported.unwrapped.length == 5
    assert prefixed.unwrapped.step_cost == 0.01 and imported.unwrapped.step_cost == 0.5  # call kwargs on top
    assert prefixed.spec.max_episode_steps == 50  # as registered
    assert EnvSettings.of({"id": "my_envs:Corridor-v0", "imports": "other"}).modules == ["other", "my_envs"]


def test_wrappers_wrap_in_their_order_with_their_arguments():
    clip = {"_target_": "ClipReward", "min_reward": -1.0, "max_reward": 1.0}  # a name in gymnasium.wrappers
    env = make_env({"id": "my_envs:Corridor-v0", "wrappers": [APPEND, SCALE, clip]}, seed=0)
    names, base = _chain(env)
    # RecordEpisodeStatistics outermost, the user's wrappers in order (first innermost), then gymnasium's make
    assert names[:4] == ["RecordEpisodeStatistics", "ClipReward", "ScaleReward", "AppendConstant"], names
    assert type(base).__name__ == "CorridorEnv"
    obs, _ = env.reset(seed=3)
    assert env.observation_space.shape == (3,) and obs.shape == (3,) and obs[2] == 0.5
    expected = _hand_made(value=0.5, scale=2.0)
    want, _ = expected.reset(seed=3)
    assert np.array_equal(obs, want)
    for action in (1, 1, 0, 1):
        got, reward, *_ = env.step(action)
        want, want_reward, *_ = expected.step(action)
        assert np.array_equal(got, want) and reward == want_reward == -0.02  # scaled by 2, within ClipReward's [-1, 1]


@pytest.mark.parametrize(("wrappers", "says"), [
    (["my_envs.wrappers.Nope"], "env.wrappers[0]=my_envs.wrappers.Nope: my_envs.wrappers has no class or function 'Nope'"),
    (["no_such_pkg.Wrap"], "env.wrappers[0]=no_such_pkg.Wrap: no module named 'no_such_pkg' here; run from the folder"),
    ([{"_target_": "my_envs.wrappers.ScaleReward", "scal": 2}],
     "env.wrappers[0]=my_envs.wrappers.ScaleReward: wrapping the env failed: TypeError: "),
    ([APPEND, "numpy.asarray"], "env.wrappers[1]=numpy.asarray: returned ndarray, not a gymnasium env"),
    ([3], "env.wrappers[0]=3: expected a class's dotted path or {_target_: <path>"),
    ([{"scale": 2}], "env.wrappers[0]={'scale': 2}: expected a class's dotted path"),
])
def test_a_bad_wrapper_is_one_line_naming_its_entry(wrappers, says):
    with pytest.raises(EnvError) as info:
        make_env({"id": "my_envs:Corridor-v0", "wrappers": wrappers})
    assert str(info.value).startswith(says) and "\n" not in str(info.value), str(info.value)


def test_a_module_that_does_not_import_is_one_line_saying_why(tmp_path, monkeypatch):
    (tmp_path / "needs_dep.py").write_text("import no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cases = {
        "nowhere:Corridor-v0": "env.id=nowhere:Corridor-v0: no module named 'nowhere' here; run from the folder that "
                               "holds it, or add that folder to PYTHONPATH",
        "broken_envs:Broken-v0": "env.id=broken_envs:Broken-v0: importing broken_envs failed: RuntimeError: my env "
                                 f"module has a bug ({USER_ENVS / 'broken_envs.py'}:6)",
        "needs_dep:X-v0": "env.id=needs_dep:X-v0: importing needs_dep failed: ModuleNotFoundError: No module named "
                          "'no_such_dependency'",
    }
    for env_id, says in cases.items():
        with pytest.raises(EnvError) as info:
            make_env(env_id)
        assert str(info.value).startswith(says) and "\n" not in str(info.value), str(info.value)
    with pytest.raises(EnvError, match=r"^env.imports: nowhere: no module named 'nowhere' here"):
        make_env({"id": "Corridor-v0", "imports": ["nowhere"]})


def test_an_id_nothing_registers_says_what_to_import():
    with pytest.raises(EnvError, match=r"^env.id=my_envs:Corridor-v9 is not a registered gymnasium environment; "
                                       r"importing my_envs registered no Corridor-v9$"):
        make_env("my_envs:Corridor-v9")
    with pytest.raises(EnvError, match=r"env.id=NoSuchEnv-v0 is not a registered .*name the module: "
                                       r"env.id=<module>:NoSuchEnv-v0 or env.imports=\[<module>\]$"):
        env_threshold("NoSuchEnv-v0")


def test_threshold_of_a_user_env_without_one_is_none_and_said_once(caplog):
    assert env_threshold("my_envs:Corridor-v0") is None  # gym.spec alone cannot read the prefixed id
    assert env_threshold("gymnasium.envs.classic_control:CartPole-v1") == 475.0
    with caplog.at_level(logging.INFO, logger="pipeline.rl.envs"):
        assert run_threshold({"id": "my_envs:Corridor-v0"}, 0.9) == 0.9
        assert run_threshold({"id": "CartPole-v1"}, None) == 475.0
        assert not caplog.records
        assert run_threshold({"id": "my_envs:Corridor-v0"}, None) is None
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == ("time_to_threshold_s: my_envs:Corridor-v0 registers no reward_threshold and task.threshold is "
                    "null, so the records hold null; set task.threshold=<return> to time one")


@pytest.mark.parametrize("envs_per_agent", [1, 2])  # one env (stepped directly) and a SyncVectorEnv of four
def test_the_vector_env_builds_every_row_with_the_wrappers_and_kwargs(envs_per_agent):
    group = {"id": "my_envs:Corridor-v0", "kwargs": {"length": 6}, "wrappers": [APPEND, SCALE], "backend": "gym"}
    seeds = [4] if envs_per_agent == 1 else [4, 5]
    vec = make_vector_env(group, seeds, envs_per_agent)
    rows = len(seeds) * envs_per_agent
    assert vec.observation_shape == (3,) and vec.n_actions == 2 and vec.reward_threshold is None
    obs = vec.reset()
    hand = [_hand_made(length=6, value=0.5, scale=2.0) for _ in range(rows)]
    row_seeds = [s + (e << 32) for s in seeds for e in range(envs_per_agent)]
    want = np.stack([env.reset(seed=s)[0] for env, s in zip(hand, row_seeds)])
    assert torch.equal(obs, torch.from_numpy(want))
    for _ in range(7):  # right every step: each row reaches the end (+2 scaled) within 5 steps and auto-resets
        step = vec.step(torch.ones(rows, dtype=torch.int64))
        for i, env in enumerate(hand):
            o, r, term, trunc, _ = env.step(1)
            assert step.reward[i].item() == pytest.approx(r) and bool(step.terminated[i]) == term
            assert torch.equal(step.final_obs[i], torch.from_numpy(o))
            if term or trunc:
                env.reset()
    vec.close()


def test_evaluations_play_the_wrapped_env():
    group = {"id": "my_envs:Corridor-v0", "kwargs": {"length": 6}, "wrappers": [APPEND, SCALE]}

    def right(obs: torch.Tensor) -> torch.Tensor:  # [K, n, 3] -> [K, n]
        assert obs.shape[-1] == 3 and bool((obs[..., 2] == 0.5).all())
        return torch.ones(obs.shape[:-1], dtype=torch.int64)

    returns = evaluate_agents(right, group, [0, 1], n_episodes=3, seed_offset=10)
    for agent, seed in enumerate([0, 1]):
        for j in range(3):
            env = _hand_made(length=6, value=0.5, scale=2.0)
            env.reset(seed=seed + 10 + j)
            total, done = 0.0, False
            while not done:
                _, r, term, trunc, _ = env.step(1)
                total, done = total + r, term or trunc
            assert returns[agent, j].item() == pytest.approx(total)
    assert evaluate_greedy(lambda o: torch.ones(o.shape[0], dtype=torch.int64), group, 3, seed=10) == returns[0].tolist()


def test_a_continuous_user_env_plays_box_actions_through_every_path():
    group = {"id": "my_envs:Slider-v0", "kwargs": {"speed": 0.5}, "wrappers": ["ClipAction"]}
    vec = make_vector_env(group, [0, 1], 1)
    assert vec.n_actions is None and vec.action_space.shape == (1,)
    vec.reset()
    vec.step(torch.tensor([[3.0], [-3.0]]))  # ClipAction clips to [-1, 1] before the env sees it
    assert [env.unwrapped.speed for env in vec.envs] == [0.5, 0.5]

    def towards_target(obs: np.ndarray, alive: np.ndarray) -> list:
        return [np.sign(o[1:2] - o[0:1]) for o in obs[alive]]

    returns = play_episodes(group, None, [7, 8], towards_target)
    for seed, got in zip([7, 8], returns):
        env = gym.make("Slider-v0", speed=0.5)
        obs, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            obs, r, term, trunc, _ = env.step(np.sign(obs[1:2] - obs[0:1]))
            total, done = total + r, term or trunc
        assert got == pytest.approx(total)
    vec.close()


@pytest.mark.parametrize("backend", ["tensor", "envpool"])
def test_wrappers_are_refused_where_the_backend_builds_its_own_envs(backend):
    with pytest.raises(ValueError, match=f"env.wrappers wrap gymnasium envs; env.backend={backend} builds its own"):
        make_vector_env({"id": "CartPole-v1", "backend": backend, "wrappers": [APPEND]}, [0], 1)


# ---- MuJoCo's frames without a display -----------------------------------------------------------------------

@pytest.fixture
def no_display(monkeypatch):
    """A process environment without a display or a MUJOCO_GL choice (restored after), headless_gl asked afresh."""
    environ = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL")}
    monkeypatch.setattr(os, "environ", environ)
    monkeypatch.setattr(sys, "platform", "linux")
    headless_gl.cache_clear()
    yield environ
    headless_gl.cache_clear()


@pytest.mark.parametrize(("installed", "chosen"), [
    ({"EGL", "EGL_mesa", "OSMesa"}, "egl"),
    ({"EGL", "EGL_nvidia"}, "egl"),
    ({"EGL", "OSMesa"}, "osmesa"),  # libEGL without a vendor library (Mesa's or NVIDIA's) cannot render
    ({"OSMesa"}, "osmesa"),
    (set(), None),
])
def test_without_a_display_mujoco_gets_egl_or_osmesa_as_installed(no_display, monkeypatch, installed, chosen):
    monkeypatch.setattr(envs.ctypes.util, "find_library", lambda name: f"lib{name}.so" if name in installed else None)
    assert headless_gl() == chosen and no_display.get("MUJOCO_GL") == chosen


def test_a_display_or_the_users_choice_is_left_alone(no_display, monkeypatch):
    monkeypatch.setattr(envs.ctypes.util, "find_library", lambda name: f"lib{name}.so")
    no_display["DISPLAY"] = ":0"
    assert headless_gl() is None and "MUJOCO_GL" not in no_display
    headless_gl.cache_clear()
    no_display.update(MUJOCO_GL="osmesa")
    del no_display["DISPLAY"]
    assert headless_gl() == "osmesa"


@pytest.mark.skipif(not envs.mujoco_available(), reason='MuJoCo is not installed (pip install -e ".[mujoco]")')
def test_a_mujoco_env_without_display_or_gl_library_is_one_line_with_the_install(no_display, monkeypatch):
    monkeypatch.setattr(envs.ctypes.util, "find_library", lambda name: None)
    with pytest.raises(EnvError) as info:
        make_env("Hopper-v5", render_mode="rgb_array")
    assert str(info.value) == ("no display, and no EGL or OSMesa library for MuJoCo to render off-screen; install one: "
                               f"{envs.HEADLESS_GL_INSTALL}")
    make_env("CartPole-v1", render_mode="rgb_array").close()  # other envs render without OpenGL


@pytest.mark.slow
@pytest.mark.skipif(not envs.mujoco_available(), reason='MuJoCo is not installed (pip install -e ".[mujoco]")')
def test_a_fresh_process_without_display_renders_mujoco_frames(tmp_path):
    """MUJOCO_GL must be set before MuJoCo makes its context: a fresh interpreter, as `python -m pipeline.eval` is."""
    probe = ("from pipeline.rl.envs import make_env\n"
             "env = make_env('Hopper-v5', render_mode='rgb_array', width=64, height=48)\n"
             "env.reset(seed=0)\n"
             "frame = env.render()\n"
             "env.close()\n"
             "import os; print(os.environ['MUJOCO_GL'], frame.shape, frame.dtype, int(frame.std() > 5))\n")
    environ = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL", "PYOPENGL_PLATFORM")}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=environ)
    if done.returncode and "no EGL or OSMesa library" in done.stderr:
        pytest.skip(f"no headless OpenGL here: {envs.HEADLESS_GL_INSTALL}")
    assert done.returncode == 0, done.stderr[-2000:]
    backend, shape = done.stdout.split(" ", 1)
    assert backend in ("egl", "osmesa") and shape.strip() == "(48, 64, 3) uint8 1", done.stdout
    assert "Traceback" not in done.stderr, done.stderr[-2000:]

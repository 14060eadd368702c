"""Save and restore one gymnasium env mid-episode, for resuming a run where it stopped.

gymnasium has no env state API, so this covers the envs we run, exactly, and says so for the rest:

- classic control (CartPole, Acrobot, MountainCar, Pendulum, ...): the physical state
  `env.unwrapped.state` and the env's generator (`np_random.bit_generator.state`).
- Atari (ale-py): the emulator with its own generator (sticky actions) through ALE's
  `cloneState(include_rng=True)`, the env's generator (no-ops at reset), AtariPreprocessing's lives
  and max-pooling buffers; FrameStackObservation's frames are the current observation itself.
- TimeLimit's step count. RecordEpisodeStatistics only writes `info`, which the vector env drops.

A snapshot holds only tensors, numbers, strings, lists and dicts, so it loads with
`torch.load(weights_only=True)`. Any other env, or a wrapper not listed here, is not restored:
`restore_env` returns False and the caller starts that env on a new episode instead.
"""

from __future__ import annotations

from collections import deque

import gymnasium as gym
import numpy as np
import torch

# Wrappers without state that matters for stepping on: their attributes are flags, checks, functions or episode stats.
_STATELESS = {"OrderEnforcing", "PassiveEnvChecker", "TransformReward", "RecordEpisodeStatistics"}


def _wrappers(env: gym.Env) -> list[gym.Wrapper]:
    chain = []
    while isinstance(env, gym.Wrapper):
        chain.append(env)
        env = env.env
    return chain


def _is_classic_control(base: gym.Env) -> bool:
    return type(base).__module__.startswith("gymnasium.envs.classic_control") and isinstance(getattr(base, "state", None), np.ndarray)


def _is_atari(base: gym.Env) -> bool:
    return hasattr(base, "ale")


def snapshot_env(env: gym.Env) -> dict:
    """What `restore_env` needs to continue `env` exactly; `exact` is False when it cannot."""
    base = env.unwrapped
    state: dict = {"exact": True, "rng": base.np_random.bit_generator.state, "wrappers": []}
    for wrapper in _wrappers(env):
        name = type(wrapper).__name__
        if name == "TimeLimit":
            state["wrappers"].append({"elapsed": int(wrapper._elapsed_steps or 0)})
        elif name == "AtariPreprocessing":
            buffers = torch.from_numpy(np.stack(wrapper.obs_buffer)).clone()
            state["wrappers"].append({"lives": int(wrapper.lives), "game_over": bool(wrapper.game_over), "obs_buffer": buffers})
        elif name == "FrameStackObservation" or name in _STATELESS:
            state["wrappers"].append({})
        else:
            state["exact"] = False
    if _is_atari(base):
        emulator = base.ale.cloneState(include_rng=True).serialize()
        state["ale"] = torch.frombuffer(bytearray(emulator), dtype=torch.uint8)
    elif _is_classic_control(base):
        state["physics"] = torch.from_numpy(np.array(base.state))  # its own dtype: Acrobot starts in float32
    else:
        state["exact"] = False
    return state


def restore_env(env: gym.Env, state: dict, obs: np.ndarray) -> bool:
    """Put `env` back where `snapshot_env` saw it, `obs` being its observation then. False if not possible."""
    chain = _wrappers(env)
    if not state["exact"] or len(chain) != len(state["wrappers"]):
        return False
    base = env.unwrapped
    # A reset first, so that every wrapper has been through one (OrderEnforcing, AtariEnv's ROM load).
    env.reset(seed=0)
    for wrapper, saved in zip(chain, state["wrappers"]):
        name = type(wrapper).__name__
        if name == "TimeLimit":
            wrapper._elapsed_steps = saved["elapsed"]
        elif name == "AtariPreprocessing":
            wrapper.lives, wrapper.game_over = saved["lives"], saved["game_over"]
            for buffer, frame in zip(wrapper.obs_buffer, saved["obs_buffer"].numpy()):
                buffer[...] = frame
        elif name == "FrameStackObservation":
            wrapper.obs_queue = deque(np.array(obs), maxlen=wrapper.stack_size)
    if _is_atari(base):
        from ale_py import ALEState

        base.ale.restoreState(ALEState(state["ale"].numpy().tobytes()))
    else:
        base.state = state["physics"].numpy().copy()
    base.np_random.bit_generator.state = state["rng"]
    return True


def derived_seed(seed: int, episode: int) -> int:
    """A seed for episode `episode` of the env seeded `seed`, far from every seed a run hands out."""
    return int(np.random.SeedSequence([int(seed), int(episode)]).generate_state(1, np.uint64)[0])

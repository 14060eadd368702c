"""A user module that fails on import (a bug of its own), for the one-line start-up refusal."""

import gymnasium as gym

gym.register(id="Broken-v0", entry_point="broken_envs:Nothing")
raise RuntimeError("my env module has a bug")

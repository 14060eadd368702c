"""A user's own gymnasium envs, as docs/bring_your_own.md describes them: registered when the package is imported.

- Corridor-v0 (my_envs.corridor): walk right along a corridor of `length` cells (Discrete(2) actions), +1 at its end,
  -0.01 a step; registered with the class itself as its entry point and no reward_threshold.
- Slider-v0 (my_envs.slider): push a point towards a target on a line (a Box action in [-1, 1]); registered with a
  "module:Class" entry point.

The tests run the CLI from tests/user_envs/ (the folder that holds the package), as a user runs it from theirs.
"""

import gymnasium as gym

from my_envs.corridor import CorridorEnv

gym.register(id="Corridor-v0", entry_point=CorridorEnv, max_episode_steps=50)
gym.register(id="Slider-v0", entry_point="my_envs.slider:SliderEnv", max_episode_steps=40)

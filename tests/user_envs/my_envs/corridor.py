"""Corridor-v0: cells 0 .. length-1, the agent starts in the first `length // 2`; right (1) or left (0)."""

import gymnasium as gym
import numpy as np


class CorridorEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, length: int = 8, step_cost: float = 0.01, render_mode: str | None = None):
        self.length, self.step_cost, self.render_mode = int(length), float(step_cost), render_mode
        # position / (length - 1) and a constant 1 (a second feature, so a wrapper has something to clip)
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.position = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.position / (self.length - 1), 1.0], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = int(self.np_random.integers(0, max(1, self.length // 2)))
        return self._obs(), {}

    def step(self, action):
        self.position = min(self.length - 1, max(0, self.position + (1 if int(action) == 1 else -1)))
        done = self.position == self.length - 1
        return self._obs(), (1.0 if done else -self.step_cost), done, False, {}

    def render(self):
        frame = np.full((16, 16 * self.length, 3), 255, dtype=np.uint8)
        frame[:, 16 * self.position:16 * (self.position + 1)] = (200, 30, 30)
        return frame

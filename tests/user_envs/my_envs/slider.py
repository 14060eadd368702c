"""Slider-v0: a point on [-1, 1] moved by a continuous push in [-1, 1] (times `speed`) towards a target."""

import gymnasium as gym
import numpy as np


class SliderEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}

    def __init__(self, speed: float = 0.2, render_mode: str | None = None):
        self.speed, self.render_mode = float(speed), render_mode
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self.position = self.target = 0.0

    def _obs(self) -> np.ndarray:
        return np.array([self.position, self.target], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position, self.target = (float(x) for x in self.np_random.uniform(-1.0, 1.0, size=2))
        return self._obs(), {}

    def step(self, action):
        push = float(np.clip(np.asarray(action, dtype=np.float64).reshape(-1)[0], -1.0, 1.0))
        self.position = float(np.clip(self.position + self.speed * push, -1.0, 1.0))
        return self._obs(), -abs(self.position - self.target), False, False, {}

    def render(self):
        frame = np.full((16, 64, 3), 255, dtype=np.uint8)
        frame[:, int(round((self.target + 1) * 31.5))] = (30, 30, 200)
        frame[4:12, int(round((self.position + 1) * 31.5))] = (200, 30, 30)
        return frame

"""Wrappers a user names in env.wrappers."""

import gymnasium as gym
import numpy as np


class AppendConstant(gym.ObservationWrapper):
    """One more observation feature, always `value`: a network trained behind it takes one input more, so an env
    built without it (evaluation, replay, load, export) cannot play the trained network."""

    def __init__(self, env: gym.Env, value: float = 0.5):
        super().__init__(env)
        self.value = float(value)
        low, high = env.observation_space.low, env.observation_space.high
        self.observation_space = gym.spaces.Box(np.append(low, self.value).astype(np.float32), np.append(high, self.value).astype(np.float32))

    def observation(self, observation):
        return np.append(observation, self.value).astype(np.float32)


class ScaleReward(gym.RewardWrapper):
    def __init__(self, env: gym.Env, scale: float = 1.0):
        super().__init__(env)
        self.scale = float(scale)

    def reward(self, reward):
        return self.scale * float(reward)

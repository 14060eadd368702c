"""Uniform experience replay over preallocated tensors."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch


class ReplayBatch(NamedTuple):
    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    next_obs: torch.Tensor
    dones: torch.Tensor


def _as_tensor(x, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.to(device=device, dtype=dtype)
    return torch.as_tensor(np.asarray(x), dtype=dtype, device=device)


class ReplayBuffer:
    """A ring buffer of transitions, stored as preallocated tensors.

    `dones` holds `terminated` only: a time-limit truncation is not the end of
    the MDP, so its next state must still be bootstrapped from.
    Observations keep `obs_dtype` (uint8 for Atari frames is 4x smaller than
    float32); the network is expected to convert them.
    """

    def __init__(
        self,
        capacity: int,
        obs_shape: tuple[int, ...],
        obs_dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ):
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = int(capacity)
        self.obs_shape = tuple(int(d) for d in obs_shape)
        self.obs_dtype = obs_dtype
        self.device = torch.device(device)
        shape = (self.capacity, *self.obs_shape)
        self.obs = torch.zeros(shape, dtype=obs_dtype, device=self.device)
        self.next_obs = torch.zeros(shape, dtype=obs_dtype, device=self.device)
        self.actions = torch.zeros(self.capacity, dtype=torch.int64, device=self.device)
        self.rewards = torch.zeros(self.capacity, dtype=torch.float32, device=self.device)
        self.dones = torch.zeros(self.capacity, dtype=torch.float32, device=self.device)
        self._pos = 0
        self._size = 0
        # On CPU, numpy views share the tensors' memory: writing one transition through them costs
        # a fraction of five tensor index-assignments, and the env hands us numpy arrays anyway.
        self._views = None
        if self.device.type == "cpu" and obs_dtype in (torch.float32, torch.uint8, torch.float64):
            self._views = tuple(t.numpy() for t in (self.obs, self.next_obs, self.actions, self.rewards, self.dones))

    def __len__(self) -> int:
        return self._size

    @property
    def nbytes(self) -> int:
        tensors = (self.obs, self.next_obs, self.actions, self.rewards, self.dones)
        return sum(t.element_size() * t.nelement() for t in tensors)

    def add(self, obs, action, reward, next_obs, terminated) -> None:
        """Store one transition; the oldest one is overwritten when full."""
        i = self._pos
        if self._views is not None and isinstance(obs, np.ndarray) and isinstance(next_obs, np.ndarray):
            o, no, a, r, d = self._views
            o[i], no[i], a[i], r[i], d[i] = obs, next_obs, action, reward, terminated
            self._pos = (i + 1) % self.capacity
            self._size = min(self._size + 1, self.capacity)
            return
        # Writing Python scalars straight into the slot avoids building a
        # tensor per field, which dominates the cost of a single add.
        self.obs[i] = _as_tensor(obs, self.obs_dtype, self.device)
        self.next_obs[i] = _as_tensor(next_obs, self.obs_dtype, self.device)
        self.actions[i] = int(action)
        self.rewards[i] = float(reward)
        self.dones[i] = float(bool(terminated))
        self._pos = (i + 1) % self.capacity
        self._size = min(self._size + 1, self.capacity)

    def add_batch(self, obs, actions, rewards, next_obs, terminated) -> None:
        """Store a batch of transitions (e.g. one step of a vectorized env)."""
        obs = _as_tensor(obs, self.obs_dtype, self.device)
        next_obs = _as_tensor(next_obs, self.obs_dtype, self.device)
        actions = _as_tensor(actions, torch.int64, self.device).reshape(-1)
        rewards = _as_tensor(rewards, torch.float32, self.device).reshape(-1)
        dones = _as_tensor(terminated, torch.float32, self.device).reshape(-1)
        n = obs.shape[0]
        if n > self.capacity:
            # Only the newest `capacity` transitions would survive anyway.
            obs, next_obs, actions, rewards, dones = (
                t[-self.capacity :] for t in (obs, next_obs, actions, rewards, dones)
            )
            self._pos = (self._pos + n - self.capacity) % self.capacity
            n = self.capacity
        idx = (torch.arange(n, device=self.device) + self._pos) % self.capacity
        self.obs[idx] = obs
        self.next_obs[idx] = next_obs
        self.actions[idx] = actions
        self.rewards[idx] = rewards
        self.dones[idx] = dones
        self._pos = (self._pos + n) % self.capacity
        self._size = min(self._size + n, self.capacity)

    def _draw(self, n: int, generator: torch.Generator | None) -> torch.Tensor:
        if self._size == 0:
            raise ValueError("cannot sample from an empty ReplayBuffer")
        device = generator.device if generator is not None else self.device
        idx = torch.randint(0, self._size, (n,), generator=generator, device=device)
        return idx.to(self.device)

    def _gather(self, idx: torch.Tensor) -> ReplayBatch:
        return ReplayBatch(
            self.obs.index_select(0, idx),
            self.actions.index_select(0, idx),
            self.rewards.index_select(0, idx),
            self.next_obs.index_select(0, idx),
            self.dones.index_select(0, idx),
        )

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> ReplayBatch:
        """Draw `batch_size` transitions uniformly, with replacement."""
        return self._gather(self._draw(batch_size, generator))

    def sample_many(
        self, n_batches: int, batch_size: int, generator: torch.Generator | None = None
    ) -> ReplayBatch:
        """Draw `n_batches` minibatches at once, shaped (n_batches, batch_size, ...).

        One index draw and one `index_select` per field on the flat index is
        several times faster than a loop of `sample` or 2-D fancy indexing,
        which matters when a training phase takes 100+ gradient steps.
        """
        flat = self._gather(self._draw(n_batches * batch_size, generator))
        return ReplayBatch(*(t.view(n_batches, batch_size, *t.shape[1:]) for t in flat))

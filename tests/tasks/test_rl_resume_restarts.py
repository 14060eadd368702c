"""A resume with envs that cannot be restored (pipeline.rl.vector: `restarted`): the task continues them from their
new episode."""

import torch
from tests.tasks.test_rl_task_units import Tiny

from pipeline.nets.mlp import MLP
from pipeline.store.checkpoint import rng_state


def test_a_resume_gives_restarted_envs_their_new_observation_and_a_zero_return(monkeypatch):
    """FrozenLake has no saved state (pipeline.rl.gym_state): a resume restarts its envs, which must act on their new
    episode's first square (0, where every FrozenLake episode starts), not the checkpoint's, with returns from 0."""
    lake = {"id": "FrozenLake-v1", "kwargs": {"is_slippery": False}, "backend": "gym"}

    def built():
        task = Tiny.create(net=lambda in_features, out_features: MLP(in_features, out_features, hidden=(4,)),
                           optimizer=lambda p: torch.optim.SGD(p, lr=0.1), env=lake, n_agents=2, seed=3, total_steps=1000)
        optimizer = torch.optim.SGD(task.net.parameters(), lr=0.1)
        monkeypatch.setattr(task, "optimizers", lambda: type("Wrapped", (), {"optimizer": optimizer})())
        task.on_fit_start()
        return task, optimizer

    task, optimizer = built()
    task.obs = task.env.step(torch.tensor([2, 1])).obs  # right: square 1; down: square 4
    task.episode_return = torch.tensor([0.25, 0.5], dtype=torch.float64)
    state = {"optimizer": optimizer.state_dict(), "generators": [g.get_state() for g in task.generators],
             "rng": rng_state(), "env": task.env.state_dict(), "obs": task.obs, "episode_return": task.episode_return}
    assert task.obs.tolist() == [1.0, 4.0]
    resumed, _ = built()
    resumed._restore_training_state(state)
    assert resumed.env.restarted == [0, 1]
    assert resumed.obs.tolist() == [0.0, 0.0] and resumed.episode_return.tolist() == [0.0, 0.0]

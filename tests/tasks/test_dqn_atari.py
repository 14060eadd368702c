"""DQN on real Atari pixels (ROMs from ale-py): preprocessing shapes, uint8 memory, an end-to-end debug run."""

import numpy as np
import pytest
import torch

from pipeline.nets.cnn import AtariCNN
from pipeline.rl.envs import make_env
from pipeline.rl.replay import ReplayBuffer
from pipeline_testing import read_result, run_cli


def test_atari_preprocessing_and_uint8_replay():
    env = make_env("ALE/Breakout-v5", seed=0)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    buffer = ReplayBuffer(16, obs.shape, n_agents=1, obs_dtype=torch.uint8)
    for _ in range(20):
        next_obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        assert reward in (-1.0, 0.0, 1.0)  # clipped to its sign
        as_step = [torch.as_tensor(np.asarray(x)).reshape(1, 1, *np.shape(x)) for x in (obs, 0, reward, next_obs, terminated)]
        buffer.add(*as_step)
        obs = next_obs
    batch = buffer.sample(1, 8, [torch.Generator().manual_seed(0)])
    assert batch.obs.dtype == torch.uint8 and batch.obs.shape == (1, 1, 8, 4, 84, 84)
    assert buffer.obs.dtype == torch.uint8 and batch.obs.max() > 0
    q = AtariCNN(env.action_space.n)(batch.obs[0, 0])
    assert q.shape == (8, env.action_space.n)
    env.close()


@pytest.mark.slow
def test_dqn_atari_debug_run_end_to_end(tmp_path):
    proc = run_cli(
        "experiment=dqn_atari", "device=cpu", "trainer=debug", "task.learning_starts=32", "task.final_eval_episodes=2",
        "env.kwargs.max_episode_steps=300", f"hydra.run.dir={tmp_path}",  # trainer=debug sets the key (conf/debug/env)
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = read_result(tmp_path)
    assert record["status"] == "ok", record["error"]
    assert record["env_steps"] > 0 and record["metrics"]["train/updates"] > 0
    assert record["replay_bytes_per_transition"] == 2 * 4 * 84 * 84 + 16
    state = torch.load(tmp_path / "model.pt", weights_only=True)
    net = AtariCNN(6)
    net.load_state_dict(state)

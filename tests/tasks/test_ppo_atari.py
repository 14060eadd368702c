"""PPO on Atari pixels: a flat network is refused at start-up; experiment=ppo_atari trains K Nature-CNN agents."""

import functools
from types import SimpleNamespace

import pytest
import torch

from pipeline.nets.actor_critic_cnn import ActorCriticCNN
from pipeline.tasks.ppo import PPOTask
from pipeline_testing import read_result, run_cli

ATARI = {"id": "ALE/Pong-v5", "backend": "gym",
         "kwargs": {"frame_skip": 4, "screen_size": 84, "noop_max": 30, "frame_stack": 4, "clip_rewards": True}}


def test_a_rollout_keeps_frames_uint8_and_the_cnn_scales_them():
    """Two agents, 3 steps of one Pong each: the rollout holds the env's uint8 frames, and member i's values on them
    are a plain ActorCriticCNN's with its weights (the /255 happens inside the network, once)."""
    task = PPOTask.create(net=functools.partial(ActorCriticCNN), optimizer=functools.partial(torch.optim.Adam, lr=1e-3),
                          env=ATARI, n_agents=2, total_steps=3, envs_per_agent=1, num_steps=3, num_minibatches=1,
                          update_epochs=1, eval_every=10**9, log_every=10**9, eval_episodes=1, final_eval_episodes=1)
    opt = task.configure_optimizers()
    task.optimizers = lambda: SimpleNamespace(optimizer=opt)
    task.on_fit_start()
    rollout = task.rollout()
    assert rollout.obs.dtype == torch.uint8 and rollout.obs.shape == (3, 2, 1, 4, 84, 84)
    assert int(rollout.obs.max()) > 1  # raw pixel values, not scaled
    for i in range(2):
        plain = ActorCriticCNN(task.action_space.n)
        plain.load_state_dict(task.net.member_state_dict(i))
        with torch.no_grad():
            _, values = plain(rollout.obs[:, i, 0])
        assert torch.allclose(rollout.values[:, i, 0], values, rtol=1e-5, atol=1e-5 * float(values.abs().max()))


@pytest.mark.parametrize("args", [("experiment=ppo_cartpole", "env=atari"),
                                  ("experiment=ppo_atari", "model=actor_critic")])
def test_a_flat_network_on_atari_frames_is_refused_in_one_line(tmp_path, args):
    run_dir = tmp_path / "run"
    proc = run_cli(*args, f"hydra.run.dir={run_dir}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "model=actor_critic flattens" in lines[0] and "model=actor_critic_cnn" in lines[0], lines[0]
    assert "experiment=ppo_atari" in lines[0]
    assert not run_dir.exists()


@pytest.mark.slow
def test_ppo_atari_trains_two_cnn_agents_and_writes_their_records(tmp_path):
    # The debug lengths of conf/debug/task/debug_ppo.yaml, typed out; episodes cut at 300 emulator frames.
    proc = run_cli(
        "experiment=ppo_atari", "device=cpu", "seeds_per_process=2", "trainer.enable_progress_bar=false",
        "task.envs_per_agent=2", "task.num_steps=32", "task.total_steps=192", "task.eval_every=128",
        "task.eval_episodes=1", "task.final_eval_episodes=1", "+env.kwargs.max_episode_steps=300",
        f"hydra.run.dir={tmp_path}",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    for seed in (0, 1):
        record = read_result(tmp_path / f"seed{seed}")
        assert record["status"] == "ok", record["error"]
        assert record["seed"] == seed and record["env_steps"] == 192
        assert record["metrics"]["train/updates"] == 3
        assert len(record["evaluations"]) >= 1
        net = ActorCriticCNN(6)  # Pong's 6 actions
        net.load_state_dict(torch.load(tmp_path / f"seed{seed}" / "model.pt", weights_only=True))

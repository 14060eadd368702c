import numpy as np
import torch

from pipeline.rl.envs import env_threshold, evaluate_greedy, make_env, obs_to_tensor


def test_env_threshold():
    assert env_threshold("CartPole-v1") == 475.0


def test_make_env_is_seeded_and_records_episodes():
    a, b = make_env("CartPole-v1", seed=3), make_env("CartPole-v1", seed=3)
    obs_a, _ = a.reset()
    obs_b, _ = b.reset()
    assert np.array_equal(obs_a, obs_b)
    assert a.action_space.sample() == b.action_space.sample()
    done, info = False, {}
    while not done:
        _, _, terminated, truncated, info = a.step(0)
        done = terminated or truncated
    assert "episode" in info


def test_obs_to_tensor_is_float32():
    t = obs_to_tensor(np.zeros(4, dtype=np.float64))
    assert t.dtype == torch.float32 and t.shape == (4,)


def test_evaluate_greedy_with_a_trivial_policy():
    def always_left(obs: torch.Tensor) -> torch.Tensor:
        return torch.zeros(obs.shape[0], dtype=torch.int64)

    returns = evaluate_greedy(always_left, "CartPole-v1", n_episodes=5, seed=0)
    assert len(returns) == 5
    assert all(5 <= r < 50 for r in returns)
    assert returns == evaluate_greedy(always_left, "CartPole-v1", n_episodes=5, seed=0)


def test_evaluate_greedy_restores_training_mode():
    net = torch.nn.Sequential(torch.nn.Linear(4, 2))
    seen = []

    class Greedy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, obs):
            seen.append(self.training)
            return self.net(obs).argmax(dim=1)

    policy = Greedy().train()
    evaluate_greedy(policy, "CartPole-v1", n_episodes=2, seed=0)
    assert seen and not any(seen)
    assert policy.training

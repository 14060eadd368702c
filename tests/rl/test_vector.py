"""make_vector_env and evaluate_agents against the single-env paths they replace."""

import io

import numpy as np
import pytest
import torch

from pipeline.rl.acrobot_tensor import TensorAcrobot
from pipeline.rl.cartpole_tensor import TensorCartPole, episode_returns
from pipeline.rl.envs import evaluate_greedy, make_env
from pipeline.rl.gym_state import derived_seed
from pipeline.rl.tensor_env import tensor_episode_returns
from pipeline.rl.vector import TensorVectorEnv, env_seeds, evaluate_agents, make_vector_env

CARTPOLE = {"id": "CartPole-v1", "kwargs": {}, "backend": "gym"}
CARTPOLE_TENSOR = {"id": "CartPole-v1", "kwargs": {}, "backend": "tensor", "dtype": "float64"}
ACROBOT = {"id": "Acrobot-v1", "kwargs": {}, "backend": "gym"}


def wobbly(obs: torch.Tensor) -> torch.Tensor:
    """A CartPole controller that lasts anywhere from ~100 steps to 500, depending on the start."""
    return (obs[..., 2] + 0.2 * obs[..., 3] - 0.1 * obs[..., 0] > 0).long()


class Reference:
    """The single-seed loop of tasks/dqn.py: one env, reset with its seed once, then reset() at every episode end."""

    def __init__(self, env_id: str, seed: int, **kwargs):
        self.env = make_env(env_id, seed=seed, **kwargs)
        self.obs = self.env.reset(seed=seed)[0]

    def step(self, action: int):
        final, reward, terminated, truncated, _ = self.env.step(action)
        if terminated or truncated:
            self.obs = self.env.reset()[0]
        else:
            self.obs = final
        return final, reward, terminated, truncated


def run_against_references(env, references, actions: torch.Tensor) -> int:
    """Step `env` and one reference per row with the same actions; returns how many episodes ended."""
    ended = 0
    for t in range(actions.shape[0]):
        step = env.step(actions[t])
        for row, ref in enumerate(references):
            final, reward, terminated, truncated = ref.step(int(actions[t, row]))
            assert np.array_equal(step.final_obs[row].numpy(), final), (t, row)
            assert np.array_equal(step.obs[row].numpy(), ref.obs), (t, row)
            assert float(step.reward[row]) == reward
            assert bool(step.terminated[row]) == terminated and bool(step.truncated[row]) == truncated
            assert bool(step.done[row]) == (terminated or truncated)
            ended += terminated or truncated
    return ended


@pytest.mark.parametrize("n_agents", [1, 3])
def test_gym_rows_are_seeded_and_reset_like_the_single_env_loop(n_agents):
    seeds = [3, 11, 40][:n_agents]
    env = make_vector_env(CARTPOLE, seeds, envs_per_agent=1, device="cpu")
    obs = env.reset()
    references = [Reference("CartPole-v1", s) for s in seeds]
    assert obs.shape == (n_agents, 4) and obs.dtype == torch.float32
    assert np.array_equal(obs.numpy(), np.stack([r.obs for r in references]))
    actions = torch.randint(0, 2, (120, n_agents), generator=torch.Generator().manual_seed(0))
    # Random CartPole episodes last ~20 steps: several auto-resets per row.
    assert run_against_references(env, references, actions) >= 3 * n_agents
    env.close()


def test_agent_rows_and_their_env_seeds():
    env = make_vector_env(CARTPOLE, [5, 9], envs_per_agent=2, device="cpu")
    assert env.num_envs == 4 and env_seeds([5, 9], 2) == [5, 5 + 2**32, 9, 9 + 2**32]
    obs = env.reset()
    for row, seed in enumerate(env_seeds([5, 9], 2)):
        assert np.array_equal(obs[row].numpy(), make_env("CartPole-v1").reset(seed=seed)[0])
    step = env.step(torch.zeros(4, dtype=torch.int64))
    assert step.obs.shape == step.final_obs.shape == (4, 4)
    assert step.reward.dtype == torch.float32 and step.done.dtype == torch.bool and step.reward.shape == (4,)


def test_finished_rows_show_the_next_episode_and_return_where_the_action_led():
    env = make_vector_env(CARTPOLE, [0, 1], envs_per_agent=1, device="cpu")
    env.reset()
    done_seen = False
    for _ in range(60):
        step = env.step(torch.ones(2, dtype=torch.int64))  # always push right: falls in ~10 steps
        assert torch.equal(step.obs[~step.done], step.final_obs[~step.done])
        if step.done.any():
            done_seen = True
            # The pole past 12 degrees (or the cart out) is the final obs; the next start is within 0.05.
            assert (step.final_obs[step.done].abs().max(1).values > 0.2).all()
            assert (step.obs[step.done].abs() <= 0.05).all()
    assert done_seen and env.episodes.min() >= 3


def test_keep_envs_continues_the_kept_rows():
    seeds = [2, 4, 6]
    env = make_vector_env(CARTPOLE, seeds, envs_per_agent=1, device="cpu")
    env.reset()
    references = [Reference("CartPole-v1", s) for s in seeds]
    actions = torch.randint(0, 2, (90, 3), generator=torch.Generator().manual_seed(1))
    run_against_references(env, references, actions[:30])
    env.keep_envs_(torch.tensor([2, 0]))
    assert env.num_envs == 2
    run_against_references(env, [references[2], references[0]], actions[30:60, [2, 0]])
    env.keep_envs_(torch.tensor([1]))  # one env left: the direct path
    assert env.num_envs == 1
    assert run_against_references(env, [references[0]], actions[60:, [0]]) >= 1


def test_acrobot_through_the_gym_backend():
    env = make_vector_env(ACROBOT, [0, 1], envs_per_agent=1, device="cpu")
    assert (env.observation_shape, env.n_actions, env.obs_dtype) == ((6,), 3, torch.float32)
    assert env.reward_threshold == -100.0 and env.return_bounds == (-500.0, 0.0)
    references = [Reference("Acrobot-v1", s) for s in (0, 1)]
    assert np.array_equal(env.reset().numpy(), np.stack([r.obs for r in references]))
    actions = torch.randint(0, 3, (40, 2), generator=torch.Generator().manual_seed(2))
    run_against_references(env, references, actions)


def test_tensor_backend_rows_are_the_tensor_env_seeded_per_agent():
    env = make_vector_env(CARTPOLE_TENSOR, [7, 8], envs_per_agent=3, device="cpu")
    reference = TensorCartPole(6)
    assert torch.equal(env.reset(), reference.reset(env_seeds([7, 8], 3)))
    assert (env.n_actions, env.observation_shape, env.reward_threshold, env.return_bounds) == (2, (4,), 475.0, (0.0, 500.0))
    actions = torch.randint(0, 2, (100, 6), generator=torch.Generator().manual_seed(0))
    for t in range(50):
        assert torch.equal(env.step(actions[t]).obs, reference.step(actions[t]).obs)
    env.keep_envs_(torch.tensor([3, 4, 5]))
    reference.keep_envs_(torch.tensor([3, 4, 5]))
    for t in range(50, 100):
        assert torch.equal(env.step(actions[t, 3:]).obs, reference.step(actions[t, 3:]).obs)


def test_bad_backend_choices_fail_with_one_line():
    with pytest.raises(ValueError, match="no tensor form of MountainCar-v0; tensor envs: CartPole-v1, Acrobot-v1, Pendulum-v1"):
        make_vector_env({"id": "MountainCar-v0", "backend": "tensor"}, [0], 1)
    with pytest.raises(ValueError, match="choose gym, tensor or envpool"):
        make_vector_env({"id": "CartPole-v1", "backend": "jax"}, [0], 1)
    with pytest.raises(ValueError, match=r"takes only env.kwargs.max_episode_steps; got \['render_mode'\]"):
        make_vector_env({**CARTPOLE_TENSOR, "kwargs": {"render_mode": "human"}}, [0], 1)


def test_evaluate_agents_matches_evaluate_greedy_per_agent():
    def policy(obs: torch.Tensor) -> torch.Tensor:
        assert obs.shape == (2, 6, 4)
        return wobbly(obs)

    returns = evaluate_agents(policy, CARTPOLE, agent_seeds=[0, 100], n_episodes=6, seed_offset=10_000, device="cpu")
    assert returns.shape == (2, 6) and returns.dtype == torch.float64
    for i, seed in enumerate([0, 100]):
        expected = evaluate_greedy(wobbly, "CartPole-v1", n_episodes=6, seed=seed + 10_000)
        assert returns[i].tolist() == expected
    # The policy lasts very differently from start to start: the comparison covers short and long episodes.
    assert returns.min() < 250 and returns.max() == 500


def test_evaluate_agents_on_tensor_envs():
    returns = evaluate_agents(wobbly, CARTPOLE_TENSOR, agent_seeds=[0, 100], n_episodes=6, seed_offset=10_000)
    expected = episode_returns(wobbly, [s + 10_000 + j for s in (0, 100) for j in range(6)])
    assert returns.shape == (2, 6) and torch.equal(returns, expected.double().view(2, 6))


def test_evaluate_agents_puts_a_module_in_eval_mode_and_back():
    modes = []

    class Policy(torch.nn.Module):
        def forward(self, obs):
            modes.append(self.training)
            return wobbly(obs)

    policy = Policy().train()
    evaluate_agents(policy, CARTPOLE, [0], n_episodes=2, seed_offset=0)
    assert modes and not any(modes) and policy.training


ATARI = {
    "id": "ALE/Pong-v5",
    "backend": "gym",
    "kwargs": {"frame_skip": 4, "screen_size": 84, "noop_max": 30, "frame_stack": 4, "terminal_on_life_loss": False,
               "clip_rewards": True, "max_episode_steps": 40},  # 40 emulator frames: 10 agent steps an episode
}


def test_atari_frames_stay_uint8_and_follow_the_single_env_loop():
    env = make_vector_env(ATARI, [0], envs_per_agent=2, device="cpu")
    assert (env.observation_shape, env.obs_dtype, env.n_actions, env.return_bounds) == ((4, 84, 84), torch.uint8, 6, None)
    obs = env.reset()
    assert obs.shape == (2, 4, 84, 84) and obs.dtype == torch.uint8
    references = [Reference("ALE/Pong-v5", seed, **ATARI["kwargs"]) for seed in env_seeds([0], 2)]
    actions = torch.randint(0, 6, (12, 2), generator=torch.Generator().manual_seed(0))
    # Episodes of 3-10 steps (the reset's no-ops count towards the 40 frames): each row restarts.
    assert run_against_references(env, references, actions) >= 2
    step = env.step(actions[0])
    assert step.obs.dtype == step.final_obs.dtype == torch.uint8 and step.obs.shape == (2, 4, 84, 84)


def test_atari_evaluation_matches_evaluate_greedy():
    def noop(obs: torch.Tensor) -> torch.Tensor:
        assert obs.shape == (1, 1, 4, 84, 84) and obs.dtype == torch.uint8
        return torch.zeros(obs.shape[:2], dtype=torch.int64)

    env = {**ATARI, "kwargs": {**ATARI["kwargs"], "max_episode_steps": 400}}
    # Each Pong env costs ~0.7 s to make and seed: one episode each way.
    returns = evaluate_agents(noop, env, [3], n_episodes=1, seed_offset=5)
    expected = evaluate_greedy(lambda obs: torch.zeros(obs.shape[0], dtype=torch.int64), "ALE/Pong-v5", 1, seed=8,
                               env_kwargs=env["kwargs"])
    assert returns.tolist() == [expected]


def test_acrobot_on_the_tensor_backend():
    env = make_vector_env({"id": "Acrobot-v1", "backend": "tensor", "dtype": "float64"}, [1, 2], envs_per_agent=2)
    assert (env.num_envs, env.observation_shape, env.n_actions, env.return_bounds) == (4, (6,), 3, (-500.0, 0.0))
    assert env.reset().shape == (4, 6) and env.step(torch.tensor([0, 1, 2, 1])).reward.tolist() == [-1.0] * 4

    def swing(obs: torch.Tensor) -> torch.Tensor:
        return torch.where(obs[..., 4] + 0.5 * obs[..., 5] > 0, 2, 0)

    returns = evaluate_agents(swing, {"id": "Acrobot-v1", "backend": "tensor"}, [1, 2], n_episodes=3, seed_offset=50)
    expected = tensor_episode_returns(TensorAcrobot, swing, [51, 52, 53, 52, 53, 54])
    assert torch.equal(returns, expected.double().view(2, 3)) and (returns > -500).any()


ACROBOT_TENSOR = {"id": "Acrobot-v1", "kwargs": {}, "backend": "tensor", "dtype": "float64"}


def through_a_checkpoint(state: dict) -> dict:
    """The state as a resumed run gets it back: saved by torch.save, loaded with weights_only=True."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def assert_same_steps(env, twin, actions: torch.Tensor) -> None:
    for t in range(actions.shape[0]):
        for a, b in zip(env.step(actions[t]), twin.step(actions[t])):
            assert torch.equal(a, b), t


@pytest.mark.parametrize(
    "env_cfg,n_agents", [(CARTPOLE, 1), (CARTPOLE, 3), (ACROBOT, 2), (CARTPOLE_TENSOR, 2), (ACROBOT_TENSOR, 2)],
    ids=["cartpole-1", "cartpole-3", "acrobot", "cartpole-tensor", "acrobot-tensor"],
)
def test_state_dict_round_trip_continues_the_same_trajectory(env_cfg, n_agents):
    seeds = list(range(10, 10 + n_agents))
    env = make_vector_env(env_cfg, seeds, envs_per_agent=1)
    env.reset()
    actions = torch.randint(0, env.n_actions, (150, n_agents), generator=torch.Generator().manual_seed(3))
    for t in range(50):
        env.step(actions[t])
    resumed = make_vector_env(env_cfg, seeds, envs_per_agent=1)
    resumed.load_state_dict(through_a_checkpoint(env.state_dict()))
    assert torch.equal(resumed.observation(), env.observation())
    # Random CartPole episodes end every ~20 steps: the restarts after the resume come from the restored generators.
    assert_same_steps(env, resumed, actions[50:])
    assert resumed.restarted == []


def test_atari_state_dict_restores_the_emulator():
    env = make_vector_env(ATARI, [4], envs_per_agent=1)
    env.reset()
    actions = torch.randint(0, 6, (30, 1), generator=torch.Generator().manual_seed(4))
    for t in range(6):
        env.step(actions[t])
    resumed = make_vector_env(ATARI, [4], envs_per_agent=1)
    resumed.load_state_dict(through_a_checkpoint(env.state_dict()))
    assert resumed.restarted == [] and torch.equal(resumed.observation(), env.observation())
    # 24 steps: sticky actions (ALE's generator), frame stacks, and restarts with no-ops (the env's generator).
    assert_same_steps(env, resumed, actions[6:])
    assert env.episodes[0] >= 2


def test_envs_without_a_saved_state_restart_from_a_derived_seed():
    lake = {"id": "FrozenLake-v1", "kwargs": {}, "backend": "gym"}
    env = make_vector_env(lake, [0, 1], envs_per_agent=1)
    env.reset()
    env.step(torch.tensor([1, 2]))
    state = through_a_checkpoint(env.state_dict())
    resumed, again = make_vector_env(lake, [0, 1], 1), make_vector_env(lake, [0, 1], 1)
    resumed.load_state_dict(state)
    again.load_state_dict(state)
    assert resumed.restarted == [0, 1] and resumed.episodes.tolist() == [1, 1]
    expected = [make_env("FrozenLake-v1").reset(seed=derived_seed(s, 1))[0] for s in (0, 1)]
    assert resumed.observation().tolist() == expected and torch.equal(again.observation(), resumed.observation())


def test_a_state_for_other_envs_does_not_load():
    env = make_vector_env(CARTPOLE, [0, 1], envs_per_agent=1)
    env.reset()
    with pytest.raises(ValueError, match="cannot load into 3 x CartPole-v1"):
        make_vector_env(CARTPOLE, [0, 1, 2], envs_per_agent=1).load_state_dict(env.state_dict())


def test_one_env_with_integer_observations():
    # K * E = 1 takes the direct path; FrozenLake's observations are plain ints.
    env = make_vector_env({"id": "FrozenLake-v1", "kwargs": {"is_slippery": False}}, [0], envs_per_agent=1)
    assert env.reset().tolist() == [0.0] and env.observation_shape == ()
    step = env.step(torch.tensor([2]))  # right
    assert step.obs.tolist() == [1.0] and step.obs.dtype == torch.float32 and not step.done.any()


# ---- the options each backend is built with, and the bookkeeping around them --------------------------


def test_tensor_backend_takes_its_time_limit_and_dtype_from_the_config():
    cfg = {"id": "CartPole-v1", "backend": "tensor", "dtype": "float32", "kwargs": {"max_episode_steps": 5}}
    env = make_vector_env(cfg, [1, 2], envs_per_agent=1)
    assert (env.env.dtype, env.env.max_episode_steps, env.return_bounds) == (torch.float32, 5, (0.0, 5.0))
    env.reset()
    for t in range(5):
        step = env.step(torch.tensor([t % 2, (t + 1) % 2]))
    assert step.truncated.all()
    default = make_vector_env({"id": "CartPole-v1", "backend": "tensor"}, [1], envs_per_agent=1)
    assert default.env.dtype == torch.float64 and default.env.max_episode_steps == 500
    assert TensorVectorEnv(TensorAcrobot, [1], "cpu").env.dtype == torch.float64


def swing_up(obs: torch.Tensor) -> torch.Tensor:
    """Acrobot: torque along the links' motion, for [B, 6] or [K, n, 6] observations alike."""
    return torch.where(obs[..., 4] + 0.5 * obs[..., 5] > 0, 2, 0)


def test_tensor_evaluation_takes_the_time_limit_and_dtype_and_returns_float64_on_the_cpu():
    cfg = {"id": "Acrobot-v1", "backend": "tensor", "dtype": "float32", "kwargs": {"max_episode_steps": 300}}
    returns = evaluate_agents(swing_up, cfg, [0, 4], n_episodes=4, seed_offset=0)
    assert returns.dtype == torch.float64 and returns.device.type == "cpu"
    seeds = list(range(8))
    expected32 = tensor_episode_returns(TensorAcrobot, swing_up, seeds, dtype="float32", max_episode_steps=300)
    expected64 = tensor_episode_returns(TensorAcrobot, swing_up, seeds, dtype="float64", max_episode_steps=300)
    assert returns.flatten().tolist() == expected32.tolist()
    assert (returns == -300).any() and not torch.equal(expected32, expected64)  # both options show in the returns


def test_without_a_tensor_form_the_choices_are_named():
    message = r"^env.backend=tensor has no tensor form of MountainCar-v0; tensor envs: CartPole-v1, Acrobot-v1, Pendulum-v1 \(or env.backend=gym\)$"
    cfg = {"id": "MountainCar-v0", "backend": "tensor"}
    with pytest.raises(ValueError, match=message):
        make_vector_env(cfg, [0], envs_per_agent=1)
    with pytest.raises(ValueError, match=message):
        evaluate_agents(wobbly, cfg, [0], n_episodes=1, seed_offset=0)


@pytest.mark.parametrize("seeds, per_agent", [([], 1), ([0], 0), ([0], -1)])
def test_no_agents_or_no_envs_is_refused(seeds, per_agent):
    with pytest.raises(ValueError, match="^make_vector_env needs at least one seed and envs_per_agent >= 1"):
        make_vector_env(CARTPOLE, seeds, per_agent)


def test_gym_return_bounds_scale_with_the_time_limit():
    assert make_vector_env(CARTPOLE, [0, 1], 1).return_bounds == (0.0, 500.0)
    assert make_vector_env(ACROBOT, [0], 1).return_bounds == (-500.0, 0.0)


def test_the_one_env_path_speaks_float32_and_counts_episodes_handed_to_it():
    env = make_vector_env(CARTPOLE, [3], envs_per_agent=1)
    obs = env.reset()
    step = env.step(torch.tensor([1]))
    assert step.reward.dtype == step.obs.dtype == torch.float32 and step.terminated.dtype == torch.bool
    env.set_position(obs, 2)  # DQN's fast path stepped the env itself, through two episodes
    env.set_position(obs + 1, 1)
    assert torch.equal(env.observation(), obs + 1)
    state = env.state_dict()
    assert state["episodes"].tolist() == [3] and state["episodes"].dtype == torch.int64
    batched = make_vector_env(CARTPOLE, [3, 4], 1)
    batched.reset()
    assert batched.state_dict()["episodes"].dtype == torch.int64


@pytest.mark.parametrize("cfg", [CARTPOLE, CARTPOLE_TENSOR])
def test_kept_rows_keep_their_observation_and_seed(cfg):
    env = make_vector_env(cfg, [0, 1, 2], envs_per_agent=1)
    obs = env.reset()
    env.keep_envs_(torch.tensor([2, 0]))
    assert torch.equal(env.observation(), obs[[2, 0]])
    again = env.reset()  # each kept row restarts from its own seed
    fresh = make_vector_env(cfg, [2, 0], envs_per_agent=1)
    assert torch.equal(again, fresh.reset())
    assert env.state_dict()["seeds"].tolist() == [2, 0]


def test_a_loaded_tensor_env_resets_from_the_loaded_seeds():
    env = make_vector_env(CARTPOLE_TENSOR, [5, 6], envs_per_agent=1)
    env.reset()
    resumed = make_vector_env(CARTPOLE_TENSOR, [0, 0], envs_per_agent=1)
    resumed.load_state_dict(env.state_dict())
    assert torch.equal(resumed.reset(), make_vector_env(CARTPOLE_TENSOR, [5, 6], 1).reset())


def test_restarted_envs_count_on_from_their_episode_and_start_from_the_derived_seed():
    taxi = {"id": "Taxi-v4", "kwargs": {"max_episode_steps": 2}, "backend": "gym"}  # random starts, no snapshot
    env = make_vector_env(taxi, [0, 1], envs_per_agent=1)
    env.reset()
    for _ in range(3):  # one episode over (truncated), the next under way
        env.step(torch.tensor([0, 1]))
    resumed = make_vector_env(taxi, [0, 1], envs_per_agent=1)
    resumed.load_state_dict(through_a_checkpoint(env.state_dict()))
    assert resumed.restarted == [0, 1] and resumed.episodes.tolist() == [2, 2]
    expected = [make_env("Taxi-v4").reset(seed=derived_seed(s, 2))[0] for s in (0, 1)]
    assert resumed.observation().tolist() == expected


def test_a_state_for_other_envs_names_what_it_holds_and_what_to_do():
    env = make_vector_env(CARTPOLE, [0, 1], envs_per_agent=1)
    env.reset()
    with pytest.raises(ValueError, match=r"^env state of 2 x CartPole-v1 cannot load into 2 x Acrobot-v1; build the vector env with the same env and seeds first$"):
        make_vector_env(ACROBOT, [0, 1], envs_per_agent=1).load_state_dict(env.state_dict())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_the_accelerator_gym_rows_and_evaluations_come_as_device_tensors():
    for seeds in ([0], [0, 1]):
        env = make_vector_env(CARTPOLE, seeds, envs_per_agent=1, device="cuda")
        assert env.reset().device.type == "cuda"
        step = env.step(torch.zeros(len(seeds), dtype=torch.int64, device="cuda"))
        assert {t.device.type for t in step} == {"cuda"}
        env.keep_envs_(torch.tensor([0]))
        assert env.observation().device.type == "cuda"
    devices = set()

    def left(obs):
        devices.add(obs.device.type)
        return torch.zeros(obs.shape[:2], dtype=torch.int64, device=obs.device)

    evaluate_agents(left, CARTPOLE, [0], n_episodes=2, seed_offset=0, device="cuda")
    assert devices == {"cuda"}
    assert make_vector_env(CARTPOLE_TENSOR, [0], envs_per_agent=1, device="cuda").reset().device.type == "cuda"
    returns = evaluate_agents(left, CARTPOLE_TENSOR, [0], n_episodes=2, seed_offset=0, device="cuda")
    assert returns.device.type == "cpu" and returns.dtype == torch.float64


@pytest.mark.parametrize("n_agents", [1, 2])
def test_a_gym_vector_env_asked_before_reset_says_to_reset(n_agents):
    """state_dict / observation / keep_envs_ before reset(): one line naming the env and the fix
    (was an AttributeError on a private field); keep_envs_ closes nothing when it refuses."""
    env = make_vector_env({"id": "CartPole-v1"}, list(range(n_agents)), 1)
    for call, what in ((env.state_dict, "state_dict"), (env.observation, "observation"),
                       (lambda: env.keep_envs_(torch.tensor([0])), "keep_envs_")):
        with pytest.raises(RuntimeError, match=rf"CartPole-v1 vector env: {what}\(\) before reset\(\); call reset\(\)"):
            call()
    assert env.num_envs == n_agents
    env.reset()
    assert env.state_dict()["obs"].shape == (n_agents, 4)


@pytest.mark.parametrize("backend", ["gym", "tensor"])
@pytest.mark.parametrize("n_agents", [1, 3])
def test_continuous_actions_step_both_backends_alike(backend, n_agents):
    """Pendulum-v1: torques [N, 1] (beyond the bounds too: the env clips them), a Box action space and no action count.
    Both backends start each env from its own states, so they are compared with each other through the physics:
    each step's reward is the cost of the state the step started from."""
    env = make_vector_env({"id": "Pendulum-v1", "backend": backend}, list(range(n_agents)), 1)
    assert env.n_actions is None and env.action_space.shape == (1,) and float(env.action_space.high[0]) == 2.0
    lo, hi = env.return_bounds
    assert hi == 0.0 and lo == pytest.approx(-16.2736044 * 200, abs=1e-4)
    obs = env.reset()
    assert obs.shape == (n_agents, 3)
    for t in range(5):
        actions = torch.full((n_agents, 1), 3.0 if t % 2 else -0.5)
        step = env.step(actions)
        cos, sin, speed = obs.double().unbind(1)
        theta = torch.atan2(sin, cos)
        expected = -(theta**2 + 0.1 * speed**2 + 0.001 * actions[:, 0].clamp(-2, 2).double() ** 2)
        # float32 observations: the angle to ~1e-7, so the cost to ~1e-6.
        assert torch.allclose(step.reward.double(), expected, atol=1e-5), t
        obs = step.obs
    env.close()


def test_evaluate_agents_plays_continuous_policies_on_both_backends():
    def hang(obs: torch.Tensor) -> torch.Tensor:
        assert obs.shape == (2, 3, 3)
        return torch.zeros(2, 3, 1)

    for backend in ("gym", "tensor"):
        returns = evaluate_agents(hang, {"id": "Pendulum-v1", "backend": backend}, [0, 1], 3, 0)
        assert returns.shape == (2, 3) and (returns < 0).all() and (returns > -16.3 * 200).all()

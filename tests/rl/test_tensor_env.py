"""The machinery every tensor env shares, on a toy env: seeding, clocks, auto-reset, shrinking, state_dict.

The toy env walks a point right by the action's step; it terminates past 1.5 and starts each episode
at a hashed uniform position, so every rule of `TensorEnv` shows in a few steps.
"""

import pytest
import torch

from pipeline.rl.tensor_env import (
    _GOLDEN,
    _MIX1,
    _MIX2,
    TensorEnv,
    _signed,
    _splitmix64,
    hashed_uniform,
    seed_keys,
)


class Walk(TensorEnv):
    env_id = "Walk-v0"
    observation_shape = (2,)
    n_actions = 2
    reward_threshold = None
    state_size = 2  # position, steps taken in this episode
    time_limit = 6

    def initial_rows(self, keys, episodes):
        position = hashed_uniform(keys, episodes, 1).to(self.dtype)
        return torch.cat((position, torch.zeros_like(position)))

    def physics(self, rows, actions):
        rows = rows + torch.stack((0.25 * actions.to(self.dtype), torch.ones_like(rows[1])))
        return rows, rows[0] > 1.5

    def observation_of(self, rows):
        return rows.t().to(torch.float32)

    def reward(self, terminated):
        return 1.0 - terminated.to(torch.float32)


def starts(seeds, episodes):
    """Where episode `episodes[b]` of seed `seeds[b]` starts."""
    return hashed_uniform(seed_keys(torch.tensor(seeds)), torch.tensor(episodes), 1)[0]


def test_the_hash_constants_are_splitmix64s_as_signed_int64():
    assert _signed(5) == 5 and _signed((1 << 63) - 1) == (1 << 63) - 1
    assert _signed(1 << 63) == -(1 << 63) and _signed((1 << 64) - 1) == -1
    assert (_GOLDEN, _MIX1, _MIX2) == (
        0x9E3779B97F4A7C15 - (1 << 64),
        0xBF58476D1CE4E5B9 - (1 << 64),
        0x94D049BB133111EB - (1 << 64),
    )
    # splitmix64's published first output from state 0 (Vigna's reference implementation).
    assert _splitmix64(torch.tensor([0])).item() == _signed(0xE220A8397B1DCDAF)


def test_seeds_and_counters_of_any_integer_dtype_give_the_int64_stream():
    seeds = torch.tensor([1, 2**31 - 1])
    assert torch.equal(seed_keys(seeds.to(torch.int32)), seed_keys(seeds))
    keys, counters = seed_keys(seeds), torch.tensor([2**30, 2**31 - 1])
    assert torch.equal(hashed_uniform(keys, counters.to(torch.int32), 4), hashed_uniform(keys, counters, 4))


def test_defaults_cpu_float64_the_class_time_limit_and_auto_reset():
    env = Walk(3)
    assert (env.device, env.dtype, env.max_episode_steps, env.auto_reset) == (
        torch.device("cpu"),
        torch.float64,
        6,
        True,
    )
    env.reset([0, 1, 2])
    for _ in range(6):
        step = env.step(torch.zeros(3, dtype=torch.int64))  # standing still: only the time limit ends it
    assert step.truncated.all() and env.episodes.tolist() == [1, 1, 1]
    assert torch.equal(env.rows[0], starts([0, 1, 2], [1, 1, 1]))


def test_a_time_limit_of_its_own_replaces_the_class_one():
    env = Walk(2, max_episode_steps=2)
    env.reset([0, 1])
    steps = [env.step(torch.zeros(2, dtype=torch.int64)) for _ in range(2)]
    assert env.max_episode_steps == 2 and [bool(s.truncated.all()) for s in steps] == [False, True]


def test_bad_sizes_and_dtypes_are_refused_with_what_was_given():
    with pytest.raises(ValueError, match="^num_envs must be positive, got 0$"):
        Walk(0)
    with pytest.raises(ValueError, match="^dtype must be float32 or float64, got torch.float16$"):
        Walk(2, dtype=torch.float16)
    with pytest.raises(ValueError, match="^reset got 3 seeds for 2 envs$"):
        Walk(2).reset([1, 2, 3])
    with pytest.raises(RuntimeError, match=r"^call reset\(seeds\) before step\(\)$"):
        Walk(2).step(torch.zeros(2, dtype=torch.int64))


def test_a_new_env_holds_zero_states_and_clocks_until_reset():
    for dtype in (torch.float64, torch.float32):
        rows = Walk(3, dtype=dtype).state_dict()["rows"]
        assert rows.dtype == dtype and torch.equal(rows, torch.zeros(2, 3, dtype=dtype))
    state = Walk(3).state_dict()
    for name in ("elapsed", "seeds", "episodes"):
        assert state[name].dtype == torch.int64 and torch.equal(
            state[name], torch.zeros(3, dtype=torch.int64)
        )
    assert torch.equal(Walk(3).keys, seed_keys(torch.zeros(3, dtype=torch.int64)))
    env = Walk(3)
    env.keep_envs_(torch.tensor([0, 2]))  # shrinking before the first reset
    assert env.num_envs == 2 and env.reset([4, 5]).shape == (2, 2)


def test_reset_holds_int64_seeds_whatever_it_was_given():
    env = Walk(2)
    env.reset(torch.tensor([3, 4], dtype=torch.int32))
    assert env.seeds.dtype == torch.int64 and env.state_dict()["seeds"].dtype == torch.int64
    assert torch.equal(env.rows[0], starts([3, 4], [0, 0]))
    env.reset(7)  # an int s gives s, s+1, ...
    assert env.seeds.tolist() == [7, 8] and env.seeds.dtype == torch.int64


def test_state_dict_round_trip_continues_bitwise_in_another_env():
    env = Walk(3)
    env.reset([10, 11, 12])
    actions = torch.tensor([1, 0, 1])
    for _ in range(4):
        env.step(actions)
    state = env.state_dict()
    clocks_as_int32 = {k: v if k == "rows" else v.to(torch.int32) for k, v in state.items()}
    resumed = Walk(1)  # the size comes from the state
    resumed.load_state_dict(clocks_as_int32)
    assert (
        resumed.num_envs == 3 and resumed.seeds.dtype == torch.int64 and resumed.elapsed.dtype == torch.int64
    )
    single = Walk(3, dtype="float32")
    single.load_state_dict(state)  # a float64 state into a float32 env: rows in the env's dtype
    assert single.rows.dtype == torch.float32 and torch.equal(single.rows, state["rows"].float())
    assert torch.equal(resumed.keys, env.keys)
    original = Walk(3)
    original.load_state_dict(env.state_dict())
    for _ in range(8):  # through terminations, truncations and new episodes from each env's stream
        a, b = original.step(actions), resumed.step(actions)
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert torch.equal(original.episodes, resumed.episodes) and torch.equal(original.elapsed, resumed.elapsed)
    assert original.episodes.tolist() != [0, 0, 0]
    with pytest.raises(ValueError, match="^state_dict holds 3 state variables; Walk-v0 has 2$"):
        Walk(3).load_state_dict({**env.state_dict(), "rows": torch.zeros(3, 5)})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_the_accelerator_the_env_steps_shrinks_and_saves_as_on_the_cpu():
    envs = [Walk(3, device=d) for d in ("cpu", "cuda")]
    fresh = envs[1]
    tensors = (fresh.rows, fresh.elapsed, fresh.seeds, fresh.keys, fresh.episodes)
    assert {t.device.type for t in tensors} == {"cuda"}
    for env in envs:
        env.reset([1, 2, 3])
        env.keep_envs_(torch.tensor([2, 0]))
        for _ in range(7):
            env.step(torch.ones(2, dtype=torch.int64, device=env.device))
    cpu, cuda = (env.state_dict() for env in envs)
    assert all(torch.equal(cpu[k], cuda[k]) for k in cpu)
    moved = Walk(2, device="cuda")
    moved.load_state_dict(cpu)
    assert moved.rows.device.type == "cuda" and moved.elapsed.device.type == "cuda"


@pytest.mark.parametrize("auto_reset", [True, False])
def test_each_step_follows_the_rules_env_by_env(auto_reset):
    """Every field of every step against the rules written out for one env at a time: terminated past 1.5,
    truncated once the clock reaches the limit (even on a terminating step), finished envs (only those)
    restarted at their next episode's start, `final_obs` where the action led."""
    seeds, actions = [0, 1, 2], torch.tensor([1, 0, 1])
    env = Walk(3, auto_reset=auto_reset)
    env.reset(seeds)
    position = starts(seeds, [0, 0, 0]).tolist()
    clock, episode = [0, 0, 0], [0, 0, 0]
    for t in range(14):
        step = env.step(actions)
        for b in range(3):
            moved = position[b] + 0.25 * int(actions[b])
            terminated, truncated = moved > 1.5, clock[b] + 1 >= 6
            assert (bool(step.terminated[b]), bool(step.truncated[b])) == (terminated, truncated), (t, b)
            assert bool(step.done[b]) == (terminated or truncated) and float(step.reward[b]) == 1.0 - terminated
            assert step.final_obs[b].tolist() == [float(torch.tensor(moved).float()), float(clock[b] + 1)]
            if auto_reset and (terminated or truncated):
                episode[b] += 1
                position[b], clock[b] = starts([seeds[b]], [episode[b]]).item(), 0
                assert step.obs[b].tolist() == [float(torch.tensor(position[b]).float()), 0.0]
            else:
                position[b], clock[b] = moved, clock[b] + 1
                assert torch.equal(step.obs[b], step.final_obs[b])
        assert env.episodes.tolist() == episode and env.elapsed.tolist() == clock
    assert max(episode) >= (2 if auto_reset else 0)


def _splitmix64_reference(z: int) -> int:
    """Vigna's splitmix64 step on unsigned 64-bit Python ints."""
    z = (z + 0x9E3779B97F4A7C15) % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return z ^ (z >> 31)


def test_hashed_uniforms_are_the_top_53_bits_of_splitmix64_of_key_xor_counter_and_lane():
    seeds, counters, n = [0, 7, 2**40], [0, 3, 12345], 5
    got = hashed_uniform(seed_keys(torch.tensor(seeds)), torch.tensor(counters), n)
    assert got.dtype == torch.float64 and got.shape == (n, 3)
    for b, (seed, counter) in enumerate(zip(seeds, counters)):
        key = _splitmix64_reference(seed)
        for lane in range(n):
            bits = _splitmix64_reference(key ^ (counter * n + lane))
            assert got[lane, b].item() == (bits >> 11) * 2.0**-53, (lane, b)
    many = hashed_uniform(seed_keys(torch.arange(4000)), torch.zeros(4000, dtype=torch.int64), 2)
    assert 0.0 <= many.min() < 0.001 and 0.999 < many.max() < 1.0 and abs(many.mean().item() - 0.5) < 0.02


def test_kept_envs_keep_their_state_clock_and_stream():
    env, reference = Walk(3), Walk(3)
    for e in (env, reference):
        e.reset([4, 5, 6])
        e.step(torch.tensor([1, 1, 0]))
    before = env.state_dict()
    env.keep_envs_(torch.tensor([2, 0]))
    after = env.state_dict()
    assert torch.equal(after["rows"], before["rows"][:, [2, 0]])
    assert all(torch.equal(after[k], before[k][[2, 0]]) for k in ("elapsed", "seeds", "episodes"))
    for _ in range(8):  # on through new episodes, each from its own stream
        a, b = env.step(torch.tensor([0, 1])), reference.step(torch.tensor([1, 1, 0]))
        assert torch.equal(a.obs, b.obs[[2, 0]]) and torch.equal(a.done, b.done[[2, 0]])


def test_a_reward_of_the_state_and_action_is_the_steps_reward_and_one_without_either_is_an_error():
    class Paid(Walk):
        def step_reward(self, rows, actions, terminated):
            # The position the step started from, minus the action: known before and after the step.
            return (rows[0] - actions.to(self.dtype)).to(torch.float32)

    env = Paid(2)
    env.reset([3, 4])
    before = env.rows[0].clone()
    step = env.step(torch.tensor([0, 1]))
    assert torch.equal(step.reward, (before - torch.tensor([0.0, 1.0], dtype=torch.float64)).float())

    with pytest.raises(TypeError, match=r"^Unpaid defines neither reward\(terminated\) nor step_reward"):
        class Unpaid(Walk):  # noqa: F841 - refused when the class is made
            reward = TensorEnv.reward

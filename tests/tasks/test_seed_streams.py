"""The start states of training, in-training evaluation (the stop rule's), final evaluation and replay never meet.

Pinned from the outside: every seed a real run hands to an env's reset is recorded (gymnasium's CartPole and the
tensor envs, spied on at their own `reset`), through `pipeline.run.run` and `pipeline.eval.main`, and sorted into
phases by when and how many: the training envs are reset first (K x E of them), then each in-training evaluation
(K x eval_episodes fresh envs; the record lists how many evaluations ran) and the stop rule's confirmation (K x
stop_confirm_episodes), then the final evaluation (K x final_eval_episodes), and the replay runs after the run. Nothing here reads the code's seed offsets: a wrong
offset that makes two phases share a start state fails, whatever the constants are.
"""

from __future__ import annotations

import json

import pytest
import torch
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from omegaconf import OmegaConf

from pipeline import eval as replay_cli
from pipeline.rl.tensor_env import TensorEnv
from pipeline.runtime.run import run

EVAL_EPISODES, FINAL_EPISODES, REPLAY_EPISODES, CONFIRM_EPISODES = 2, 3, 4, 5  # distinct: a batch's size names its phase


@pytest.fixture
def resets(monkeypatch):
    """Every seeded reset, in order: (env object, [seeds]) per call; unseeded resets (an episode's auto-reset) as []."""
    calls: list[tuple[object, list[int]]] = []
    gym_reset, tensor_reset = CartPoleEnv.reset, TensorEnv.reset

    def gym_spy(self, *, seed=None, options=None):
        calls.append((self, [] if seed is None else [int(seed)]))
        return gym_reset(self, seed=seed, options=options)

    def tensor_spy(self, seeds):
        listed = list(range(seeds, seeds + self.num_envs)) if isinstance(seeds, int) else torch.as_tensor(seeds).reshape(-1).tolist()
        calls.append((self, [int(s) for s in listed]))
        return tensor_reset(self, seeds)

    monkeypatch.setattr(CartPoleEnv, "reset", gym_spy)
    monkeypatch.setattr(TensorEnv, "reset", tensor_spy)
    return calls


def seeded(calls, start: int = 0) -> list[int]:
    """The seeds of the seeded resets from `start` on, in order."""
    return [s for _, seeds in calls[start:] for s in seeds]


def take(seeds: list[int], n: int, phase: str) -> tuple[list[int], list[int]]:
    assert len(seeds) >= n, f"{phase}: expected {n} seeded resets, {len(seeds)} left"
    return seeds[:n], seeds[n:]


def assert_disjoint(streams: dict[str, list[int]], one_agent: bool) -> None:
    """No seed in two phases (over all agents). With one agent, no phase plays a start state twice either (with
    K agents, agent i's episodes are those of the single run of seed + i, so neighbouring agents may share some)."""
    names = list(streams)
    for i, a in enumerate(names):
        if one_agent:
            assert len(set(streams[a])) == len(streams[a]), f"{a} reuses a start state: {streams[a]}"
        for b in names[i + 1:]:
            shared = set(streams[a]) & set(streams[b])
            assert not shared, f"{a} and {b} share start seeds {sorted(shared)[:5]}"


def save_config(cfg, run_dir) -> None:
    """What Hydra writes for a job started from the CLI: pipeline.eval reads the run's config there."""
    (run_dir / ".hydra").mkdir(exist_ok=True)
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")


def replay_seeds(calls, run_dir, capsys) -> list[int]:
    start = len(calls)
    assert replay_cli.main([str(run_dir), f"episodes={REPLAY_EPISODES}"]) == 0, capsys.readouterr().err
    got = seeded(calls, start)
    assert len(got) == REPLAY_EPISODES
    assert json.loads((run_dir / "eval.json").read_text())["seeds"] == got  # eval.json tells the truth
    return got


DQN = [
    "experiment=dqn_cartpole", "task.total_steps=600", "task.train_frequency=100", "task.learning_starts=64",
    "task.batch_size=32", "task.gradient_steps=2", "task.eval_every=200", f"task.eval_episodes={EVAL_EPISODES}",
    f"task.final_eval_episodes={FINAL_EPISODES}", f"task.stop_confirm_episodes={CONFIRM_EPISODES}",
    "trainer.enable_progress_bar=false", "checkpoint.enabled=false",
]


@pytest.mark.parametrize(
    ("backend", "k", "envs", "stop"),
    [("cartpole", 1, 1, None), ("cartpole", 2, 2, None), ("cartpole_tensor", 2, 2, None), ("cartpole", 2, 1, 0.0)],
    ids=["gym-K1", "gym-K2-E2", "tensor-K2-E2", "gym-K2-stop-rule"],
)
def test_dqn_seed_streams_are_pairwise_disjoint(make_cfg, tmp_path, resets, capsys, backend, k, envs, stop):
    cfg = make_cfg(*DQN, f"env={backend}", f"seeds_per_process={k}", f"task.envs_per_agent={envs}",
                   f"task.stop_at_return={'null' if stop is None else stop}", "seed=3")
    save_config(cfg, tmp_path)
    records = run(cfg, tmp_path)
    assert [r["status"] for r in records] == ["ok"] * k, [r["error"] for r in records]
    # The batch evaluates all agents still learning at once; K agents stop together (stop=0 stops at the first, once
    # its confirmation on fresh episodes agrees).
    n_evals = max(len(r["evaluations"]) for r in records)
    assert n_evals >= (1 if stop is not None else 2)
    if stop is not None:
        assert all(r["early_stop"] is not None for r in records)  # the stop rule did decide, on an evaluation
    seeds = seeded(resets)
    training, seeds = take(seeds, k * envs, "training envs")
    evaluation: list[int] = []
    for i in range(n_evals):
        batch, seeds = take(seeds, k * EVAL_EPISODES, f"evaluation {i}")
        evaluation += batch
    confirmation: list[int] = []
    if stop is not None:
        confirmation, seeds = take(seeds, k * CONFIRM_EPISODES, "the stop rule's confirmation")
    final, seeds = take(seeds, k * FINAL_EPISODES, "final evaluation")
    assert seeds == [], f"seeded resets nobody accounts for: {seeds}"
    # Every in-training evaluation faces the same start states (a fair curve), which are not training's.
    per_eval = [evaluation[i * k * EVAL_EPISODES:(i + 1) * k * EVAL_EPISODES] for i in range(n_evals)]
    assert all(batch == per_eval[0] for batch in per_eval)
    replayed = []
    for record in records:
        agent_dir = tmp_path if k == 1 else tmp_path / f"seed{record['seed']}"
        replayed += replay_seeds(resets, agent_dir, capsys)
    assert_disjoint({"training": training, "evaluation": per_eval[0], "confirmation": confirmation, "final evaluation": final,
                     "replay": replayed}, k == 1)


@pytest.mark.parametrize("seed", [0, 3])
def test_cem_seed_streams_are_pairwise_disjoint(make_cfg, tmp_path, resets, capsys, seed):
    n = 4
    cfg = make_cfg("experiment=cem_cartpole", f"task.episodes_per_batch={n}", "task.max_iterations=5",
                   f"task.final_eval_episodes={FINAL_EPISODES}", "task.stop_at_return=null", f"seed={seed}",
                   "trainer.enable_progress_bar=false", "checkpoint.enabled=false")
    save_config(cfg, tmp_path)
    (record,) = run(cfg, tmp_path)
    assert record["status"] == "ok", record["error"]
    iterations = int(record["metrics"]["train/iterations"])
    assert iterations == 5
    seeds = seeded(resets)
    training, seeds = take(seeds, iterations * n, "training episodes")
    final, seeds = take(seeds, FINAL_EPISODES, "final evaluation")
    assert seeds == [], f"seeded resets nobody accounts for: {seeds}"
    # CEM's stop rule reads the training batches' returns: its stream is training's.
    assert_disjoint({"training": training, "final evaluation": final,
                     "replay": replay_seeds(resets, tmp_path, capsys)}, True)

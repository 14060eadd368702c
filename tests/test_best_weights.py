"""task.keep_best (#41 item 7, SB3's EvalCallback habit): each RL agent keeps its best-evaluated weights as best.pt
beside model.pt, written as its evaluations improve; its record says which evaluation; a resumed run replaces it
only with a better one."""

from __future__ import annotations

import functools
import io

import lightning as L
import pytest
import torch

from pipeline.nets.factory import make_net
from pipeline.nets.mlp import MLP
from pipeline.runtime.run import run
from pipeline.store.layout import BEST, best_path
from pipeline.tasks.cem import CEMTask

NET = functools.partial(MLP, hidden=(4,))


def _plain(good: bool) -> dict[str, torch.Tensor]:
    """CartPole weights of the 4-4-2 MLP: `good` pushes toward the side the pole falls to (pole angle + angular
    velocity > 0: right), which balances for hundreds of steps; otherwise always left, which falls within ~10."""
    net = make_net(NET, 4, 2)
    state = {k: torch.zeros_like(v) for k, v in net.state_dict().items()}
    first, last = (k for k in state if k.endswith("weight"))
    if good:
        state[first][0, 2:] = 1.0  # hidden 0: relu(theta + omega)
        state[first][1, 2:] = -1.0  # hidden 1: relu(-(theta + omega))
        state[last][1, 0] = 1.0  # right's logit
        state[last][0, 1] = 1.0  # left's logit
    else:
        state[last.replace("weight", "bias")][0] = 1.0  # left, always
    return state


def _task(tmp_path, **values):
    values = {"net": NET, "optimizer": torch.optim.Adam, "env": {"id": "CartPole-v1"}, "run_dir": tmp_path,
              "episodes_per_batch": 2, "max_iterations": 1, "eval_every": 1, "eval_episodes": 4, "final_eval_episodes": 2,
              "stop_at_return": None, "keep_best": True, **values}
    return CEMTask.create(**values)


def _evaluate(task, weights: dict, steps: int) -> float:
    """Agent 0 with `weights` is evaluated at env step `steps` (as RLTask does every eval_every); its mean return."""
    task.net.load_member_state_dict(0, weights)
    task.agent_steps[0] = task.env_steps = steps
    task.evaluate_now()
    return task.evaluations[0][-1][1]


def _load(path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def test_an_agent_whose_evaluations_go_up_then_down_keeps_the_higher_one(tmp_path):
    task = _task(tmp_path)
    low = _evaluate(task, _plain(False), 100)
    assert task.best == [{"file": BEST, "env_step": 100, "return_mean": low}]  # the first evaluation is the best so far
    high = _evaluate(task, _plain(True), 200)
    again = _evaluate(task, _plain(False), 300)
    assert low == again < 20 < 100 < high  # up, then down (the same start states: the same returns for the same weights)
    assert task.best == [{"file": BEST, "env_step": 200, "return_mean": high}]
    assert task.agent_record(0)["best"] == {"file": BEST, "env_step": 200, "return_mean": high}
    # best.pt holds the weights of that evaluation as the plain network's state_dict: it loads into the network.
    saved = _load(best_path(tmp_path))
    net = make_net(NET, 4, 2)
    net.load_state_dict(saved)
    assert all(torch.equal(saved[k], v) for k, v in _plain(True).items())
    # An evaluation equal to the best does not replace it (the earlier one stays).
    assert _evaluate(task, _plain(True), 400) == high and task.best[0]["env_step"] == 200


def test_without_keep_best_nothing_is_written_and_the_record_says_nothing(tmp_path):
    task = _task(tmp_path, keep_best=False)
    _evaluate(task, _plain(True), 100)
    assert not best_path(tmp_path).exists() and task.best == [None] and "best" not in task.agent_record(0)


def test_each_agent_of_a_batch_keeps_its_own_best_in_its_record_dir(tmp_path):
    task = _task(tmp_path, n_agents=2, seed=7)
    for agent, good in ((0, True), (1, False)):
        task.net.load_member_state_dict(agent, _plain(good))
    task.agent_steps = [50, 60]
    task.evaluate_now()
    for agent, (seed, good) in enumerate(((7, True), (8, False))):
        saved = _load(best_path(tmp_path / f"seed{seed}"))
        assert all(torch.equal(saved[k], v) for k, v in _plain(good).items())
        assert task.best[agent]["env_step"] == (50, 60)[agent]
    assert task.best[0]["return_mean"] > 100 > 20 > task.best[1]["return_mean"]


def _through_a_file(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_a_resumed_run_does_not_replace_a_better_best_with_a_worse_one(tmp_path):
    """The checkpoint keeps which evaluation best.pt holds: after a resume, a worse evaluation leaves the file alone."""
    frozen = functools.partial(torch.optim.SGD, lr=0.0)  # training leaves the good weights as they are
    first, saved = _task(tmp_path, optimizer=frozen, max_iterations=2), []
    first.net.load_member_state_dict(0, _plain(True))

    def hook(final=False):
        if not final and first.iterations == 1:  # a stop request after the first iteration (its evaluation done)
            saved.append(_through_a_file(first.checkpoint_state()))
            first.trainer.should_stop = True

    first.checkpoint_hook = hook
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(first)
    (state,) = saved
    kept = first.best[0]
    assert kept is not None and kept["return_mean"] > 100 and state["best"] == [kept]
    on_disk = best_path(tmp_path).read_bytes()
    resumed = _task(tmp_path, optimizer=frozen, max_iterations=2)
    resumed.load_checkpoint_state(state)
    assert resumed.best == [kept]
    worse = _evaluate(resumed, _plain(False), kept["env_step"] + 100)
    assert worse < kept["return_mean"] and resumed.best == [kept] and best_path(tmp_path).read_bytes() == on_disk


@pytest.mark.slow
def test_a_run_with_keep_best_writes_best_pt_beside_model_pt_and_its_record_names_the_evaluation(make_cfg, tmp_path):
    """Through the lifecycle (CEM, greedy evaluations every iteration): best.pt is the best screening evaluation's
    weights, its record's `best` the first evaluation with the highest mean; continued with ckpt_path=last, the
    best is still the best over both segments' evaluations."""
    args = ("experiment=cem_cartpole", "trainer.enable_progress_bar=false", "task.episodes_per_batch=4",
            "task.stop_at_return=null", "task.eval_every=1", "task.eval_episodes=3", "task.final_eval_episodes=2",
            "task.keep_best=true", "model.hidden=[16]")
    for budget in ("task.max_iterations=3", "task.max_iterations=5"):
        extra = ("ckpt_path=last",) if budget.endswith("5") else ()
        (record,) = run(make_cfg(*args, budget, *extra), tmp_path)
        assert record["status"] == "ok", record["error"]
        evaluations = record["evaluations"]
        top = max(e["return_mean"] for e in evaluations)
        first_top = next(e for e in evaluations if e["return_mean"] == top)
        assert record["best"] == {"file": BEST, "env_step": first_top["env_step"], "return_mean": top}
        net = make_net(functools.partial(MLP, hidden=(16,)), 4, 2)
        net.load_state_dict(_load(tmp_path / BEST))  # loads into the network, weights_only
        assert (tmp_path / "model.pt").is_file()
    assert len(evaluations) == 5


def test_keep_best_is_refused_where_it_cannot_keep_what_it_says():
    from pipeline.config import ranges
    from pipeline.tasks.configs import CEMConfig, PPOConfig

    assert list(ranges.problems(CEMConfig(keep_best=True), "task")) == [
        "task.keep_best=true: needs evaluations to pick the best weights by; e.g. task.eval_every=2500 (or task.keep_best=false)"]
    assert list(ranges.problems(CEMConfig(keep_best=True, eval_every=100), "task")) == []
    assert list(ranges.problems(PPOConfig(keep_best=True, normalize_obs=True), "task")) == [
        "task.keep_best=true: is not kept with task.normalize_obs=true (the best weights would need the observation "
        "statistics of their evaluation); e.g. task.keep_best=false"]
    assert list(ranges.problems(PPOConfig(keep_best=True), "task")) == []

"""Pruning from inside a job: the reporter talks to the trial through the study's database."""

import lightning as L
import numpy as np
import optuna
import pytest
import torch

from pipeline.nets.mlp import MLP
from pipeline.store.curves import CurveLog
from pipeline.tasks.dqn import DQNTask
from pipeline.tune.pruning import PruningCallback, TrialReporter


@pytest.fixture
def study(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{tmp_path}/optuna.db"
    s = optuna.create_study(study_name="s", storage=url, direction="maximize",
                            pruner=optuna.pruners.MedianPruner(n_startup_trials=1))
    return s, url


def _reporter(url, trial):
    cfg = {"storage": url, "study_name": "s", "number": trial.number, "pruner": "median", "n_startup_trials": 1, "n_warmup_steps": 0}
    return TrialReporter.from_config(cfg)


def test_no_trial_no_reporter():
    assert TrialReporter.from_config(None) is None


def test_reporter_sends_the_iqm_and_the_median_pruner_answers(study):
    s, url = study
    first = s.ask()
    assert _reporter(url, first).report(1000, [0.8, 0.9, 1.0]) is False  # no finished trial yet: never prune
    s.tell(first, 0.9)

    bad = s.ask()
    assert _reporter(url, bad).report(1000, [0.1, 0.2, 0.3, 0.1, 9.0]) is True
    # 5 values: one trimmed from each end -> IQM = mean(0.1, 0.2, 0.3)
    assert s._storage.get_trial(bad._trial_id).intermediate_values == {1000: pytest.approx(0.2)}
    s.tell(bad, state=optuna.trial.TrialState.PRUNED)

    good = s.ask()
    assert _reporter(url, good).report(1000, [0.95, 0.97]) is False
    assert _reporter(url, good).report(2000, [float("nan")]) is False  # nothing finite to report


class _Flat(L.LightningModule):
    """Learns nothing and reports a fixed validation accuracy: a hopeless trial."""

    def __init__(self, acc):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.acc = acc

    def training_step(self, batch, _):
        return (self.w * batch[0]).sum() ** 2

    def validation_step(self, batch, _):
        self.log("val/acc", self.acc)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_pruning_callback_stops_a_hopeless_lightning_run(study, tmp_path):
    s, url = study
    first = s.ask()
    for epoch in range(5):
        s._storage.set_trial_intermediate_value(first._trial_id, epoch, 0.9)
    s.tell(first, 0.9)
    trial = s.ask()
    callback = PruningCallback(_reporter(url, trial), monitor="val/acc")
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4, 1)), batch_size=2)
    trainer = L.Trainer(max_epochs=5, callbacks=[callback], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path))
    trainer.fit(_Flat(0.1), data, data)
    assert callback.pruned_at_step == 0
    assert trainer.current_epoch == 1  # stopped after the first validation, not after 5 epochs


@pytest.mark.parametrize("direction", ["maximize", "minimize"])
def test_the_pruner_stops_the_trial_that_is_behind_in_either_study_direction(tmp_path, direction):
    """A study minimizing time to threshold is told evaluation returns (higher is better): the trial whose agents
    return 50-70 where the finished trial's returned 400-450 is behind, and the one at 470-490 is ahead."""
    url = f"sqlite:///{tmp_path}/optuna.db"
    s = optuna.create_study(study_name="s", storage=url, direction=direction,
                            pruner=optuna.pruners.MedianPruner(n_startup_trials=1))
    first = s.ask()
    assert _reporter(url, first).report(1000, [400.0, 420.0, 450.0]) is False
    s.tell(first, 420.0 if direction == "maximize" else 55.0)  # its objective: IQM return, or seconds to threshold
    behind, ahead = s.ask(), s.ask()
    assert _reporter(url, behind).report(1000, [50.0, 60.0, 70.0]) is True
    assert _reporter(url, ahead).report(1000, [470.0, 480.0, 490.0]) is False
    # Intermediate values are in the study's direction: returns as they are, or negated for a minimizing study.
    sign = 1.0 if direction == "maximize" else -1.0
    assert s._storage.get_trial(ahead._trial_id).intermediate_values == {1000: pytest.approx(sign * 480.0)}


def test_the_pruner_sees_every_agent_when_some_have_stopped():
    """K=3 DQN agents that do not learn (each evaluation repeats): the best one reaches stop_at_return at the first
    evaluation and stops; at the next evaluations the pruner still sees it, at its last evaluation."""
    def make(stop):
        return DQNTask.create(env={"id": "CartPole-v1", "backend": "tensor", "dtype": "float64"}, n_agents=3, total_steps=96,
                       train_frequency=16, gradient_steps=1, batch_size=8, learning_starts=10**9, eval_every=32,
                       eval_episodes=2, final_eval_episodes=1, log_every=10**9, buffer_size=1000, eps_duration=32,
                       optimizer=lambda p: torch.optim.SGD(p, lr=0.05), loss=torch.nn.SmoothL1Loss(),
                       net=lambda in_features, out_features: MLP(in_features, out_features, hidden=(8,)),
                       stop_at_return=stop, stop_confirm_episodes=0)  # no confirmation: these agents do not learn

    def fit(task):
        task.curves = [CurveLog(f"/nonexistent-{id(task)}/{i}.csv", flush_every_s=10**9) for i in range(3)]
        trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                            limit_val_batches=0)
        task.fit_and_evaluate(trainer, None, None)

    probe = make(None)
    fit(probe)
    means = [probe.evaluations[a][0][1] for a in range(3)]
    assert all(e[1] == means[a] for a in range(3) for e in probe.evaluations[a])  # no learning: evaluations repeat
    top = int(np.argmax(means))
    assert sorted(means)[-1] > sorted(means)[-2], means  # one agent alone reaches the stop

    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.NopPruner())
    trial = study.ask()
    task = make(max(means))
    task.trial_reporter = TrialReporter(trial)
    fit(task)
    assert task.stop_step[top] == 32 and task.env_steps == 96
    seen = study._storage.get_trial(trial._trial_id).intermediate_values
    # Three values, nothing trimmed: the IQM is their mean, the stopped agent's last evaluation included.
    assert seen == {step: pytest.approx(sum(means) / 3, rel=1e-12) for step in (32, 64, 96)}
    others = [m for a, m in enumerate(means) if a != top]
    assert seen[64] != pytest.approx(sum(others) / 2)  # not the two live agents alone

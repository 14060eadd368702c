"""Pruning from inside a job: the reporter talks to the trial through the study's database."""

import lightning as L
import optuna
import pytest
import torch

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

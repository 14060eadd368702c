"""Files `python -m pipeline.export` writes into a run dir count as the pipeline's own (a rerun there is not refused)."""

import pytest

from pipeline.store.layout import is_own_entry


@pytest.mark.parametrize("name", ["policy.onnx", "policy.best.onnx", "model.onnx", "policy.torchscript.pt",
                                  "model.best.torchscript.pt", "policy.onnx.sha256", "model.pt.sha256", "best.pt.sha256",
                                  "obs_norm.pt.sha256"])
def test_export_files_are_the_pipelines_own(name):
    assert is_own_entry(name)


@pytest.mark.parametrize("name", ["my_policy.onnx", "policy.onnx.bak", "notes.torchscript.pt", "model.pt.orig",
                                  "notes.txt.sha256", ".sha256"])
def test_a_users_files_with_similar_names_are_not(name):
    assert not is_own_entry(name)

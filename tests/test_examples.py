"""examples/quickstart.ipynb runs top to bottom in a fresh kernel (nbmake, as CI runs it): 4 seeds trained, their
curves plotted, the best agent loaded and played, its policy exported and run."""

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "quickstart.ipynb"


@pytest.mark.slow
def test_the_quickstart_notebook_runs(tmp_path):
    import shutil

    from nbmake.nb_run import NotebookRun

    # The kernel starts in the notebook's folder: a copy in tmp_path writes its outputs/ there.
    result = NotebookRun(Path(shutil.copy(NOTEBOOK, tmp_path)), default_timeout=600).execute()
    assert result.error is None, f"{result.error.summary}\n{result.error.trace[-3000:]}"
    (run_dir,) = (tmp_path / "outputs" / "quickstart").iterdir()
    assert sorted(p.name for p in run_dir.glob("seed*")) == ["seed0", "seed1", "seed2", "seed3"]
    assert len(list(run_dir.glob("seed*/policy.torchscript.pt"))) == 1  # the best seed's, exported
    outputs = [o for cell in result.nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert any(o.get("output_type") == "display_data" and "image/png" in o.get("data", {}) for o in outputs)  # the plot

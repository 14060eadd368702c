"""docs/python_api.md's examples run as written: each code block in a fresh folder, as a user would paste it into a
notebook (here: executed in the test's interpreter, whose torch and Lightning are already imported)."""

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "python_api.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_page_has_its_examples():
    joined = "\n".join(BLOCKS)
    for call in ("pipeline.run(", "pipeline.load(", ".act(", "pipeline.export", ".generator(", "format=onnx", 'weights="best"'):
        assert call in joined


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_a_python_api_example_runs(tmp_path, monkeypatch, capsys, index):
    if "import onnxruntime" in BLOCKS[index]:
        from pipeline.export import check_onnx_installed
        from pipeline.runtime.replay import EvalError

        try:
            check_onnx_installed()
        except EvalError as missing:
            pytest.skip(f"the ONNX example: {missing}")
    monkeypatch.chdir(tmp_path)
    exec(compile(BLOCKS[index], f"{DOC.name}, example {index + 1}", "exec"), {"__name__": "__main__"})  # noqa: S102
    assert capsys.readouterr().out.strip()  # each example prints what it shows

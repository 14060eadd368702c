"""The declared core, checked on the source: what import-linter cannot see (`make lint` checks the layers).

- Only the store (src/pipeline/store/) names the files of a run dir: everyone else asks it for a path or a record.
- No module imports another module's private name (`from pipeline.x import _y`) nor reaches one through the
  module (`x._y` after `from pipeline import x`): the Python API calls what the CLI calls, never the CLI's insides.
- One class named RunRecord; no `*batched*` twins of an algorithm.
- The lifecycle (src/pipeline/runtime/) never probes a task: no hasattr/getattr aimed at it, no signature sniffing.
- No import circles between modules, counting the imports inside functions (import-linter's layers see the
  packages; a circle inside one package, closed by a function-level import, passed them: runtime's replay ->
  model_eval -> run -> replay did).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
STORE = SRC / "pipeline" / "store"
RUN_DIR_FILES = ("result.json", "metrics.csv", "model.pt", "last.ckpt")


def _sources() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "__pycache__" not in p.parts)


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _docstring_nodes(tree: ast.Module) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                ids.add(id(first.value))
    return ids


def run_dir_file_names(path: Path) -> list[str]:
    """'line N: "result.json"' for each string constant (docstrings aside) that names a run-dir file."""
    tree = _tree(path)
    docs = _docstring_nodes(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            for name in RUN_DIR_FILES:
                if name in node.value:
                    found.append(f"line {node.lineno}: {node.value!r}")
    return found


def private_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("pipeline", "hydra_plugins"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
    return found


@functools.cache
def our_modules() -> frozenset[str]:
    return frozenset(module_name(p) for p in _sources())


OUR_PACKAGES = ("pipeline", "hydra_plugins")


def private_attribute_uses(path: Path) -> list[str]:
    """'line N: x._y' for each private attribute (`_y`, not a dunder) read from another of our modules through a name
    bound to that module (`import pipeline.x`, `import pipeline.x as m`, `from pipeline import x`)."""
    tree, modules = _tree(path), our_modules()
    bound: dict[str, str] = {}  # a local name -> the module it names
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in OUR_PACKAGES:
                    bound[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.split(".")[0] in OUR_PACKAGES:
            for alias in node.names:
                if f"{node.module}.{alias.name}" in modules:
                    bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    own = module_name(path) if SRC in path.parents else ""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        head, _, rest = ast.unparse(node.value).partition(".")
        target = f"{bound[head]}.{rest}".rstrip(".") if head in bound else None
        if target in modules and target != own:
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def _mentions_task(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and "task" in node.id) or (isinstance(node, ast.Attribute) and "task" in node.attr)


def task_probes(path: Path) -> list[str]:
    found = []
    for node in ast.walk(_tree(path)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("hasattr", "getattr") and node.args and _mentions_task(node.args[0]):
            found.append(f"line {node.lineno}: {func.id}({ast.unparse(node.args[0])}, ...)")
        if isinstance(func, ast.Attribute) and func.attr == "signature" and ast.unparse(func.value) == "inspect":
            if any(_mentions_task(a) or "cls" in ast.unparse(a) for a in node.args):
                found.append(f"line {node.lineno}: inspect.signature({ast.unparse(node.args[0])})")
    return found


def module_name(path: Path, root: Path = SRC) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that `path` imports anywhere in it (top level or inside a function)."""
    found = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in known else node.module)
    return found & known


def import_circles(paths: list[Path], root: Path = SRC) -> list[list[str]]:
    """Each circle of imports among `paths` (a strongly connected component of more than one module), sorted.

    A package's __init__ that only hands its modules' names on is left out: importing `pipeline.games` for a
    name that lives in `pipeline.games.solver` is not a tie to every module of the package."""
    modules = {module_name(p, root): p for p in paths}
    known = set(modules)
    graph = {m: imported_modules(p, known) - {m} for m, p in modules.items() if p.name != "__init__.py"}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(m: str) -> None:  # Tarjan's strongly connected components
        index[m] = low[m] = len(index)
        stack.append(m)
        for n in graph.get(m, ()):
            if n not in graph:
                continue
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            component = []
            while True:
                n = stack.pop()
                component.append(n)
                if n == m:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return sorted(circles)


def test_no_import_circles_even_through_imports_inside_functions():
    assert import_circles(_sources()) == [], "break the circle: move the shared part down a layer, or the caller up"


def test_the_circle_finder_finds_a_circle_closed_inside_a_function(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from pkg.a import f\n")
    (pkg / "a.py").write_text("from pkg.b import g\n\ndef f():\n    return g()\n")
    (pkg / "b.py").write_text("def g():\n    from pkg import c\n    return c.h()\n")
    (pkg / "c.py").write_text("def h():\n    return 1\n")
    files = sorted(pkg.glob("*.py"))
    assert import_circles(files, tmp_path) == []
    (pkg / "c.py").write_text("def h():\n    from pkg.a import f\n    return f\n")
    assert import_circles(files, tmp_path) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_only_the_store_names_the_files_of_a_run_dir():
    offenders = {str(p.relative_to(SRC)): hits for p in _sources() if STORE not in p.parents for hits in [run_dir_file_names(p)] if hits}
    assert offenders == {}, "ask pipeline.store (layout, record, curves, checkpoint) instead of naming run-dir files"


def test_no_module_imports_a_private_name_of_another():
    offenders = {str(p.relative_to(SRC)): hits for p in _sources() for hits in [private_imports(p)] if hits}
    assert offenders == {}


def test_no_module_reaches_a_private_name_of_another_through_the_module():
    offenders = {str(p.relative_to(SRC)): hits for p in _sources() for hits in [private_attribute_uses(p)] if hits}
    assert offenders == {}, "make it public where it is, or move it to a module both can import"


def test_one_run_record_class_and_no_batched_twins():
    classes = [(p.relative_to(SRC), n.name) for p in _sources() for n in ast.walk(_tree(p)) if isinstance(n, ast.ClassDef)]
    records = [str(p) for p, name in classes if name == "RunRecord"]
    assert records == ["pipeline/store/record.py"]
    defs = [(str(p.relative_to(SRC)), n.name) for p in _sources() for n in ast.walk(_tree(p))
            if isinstance(n, ast.ClassDef | ast.FunctionDef)]
    assert [d for d in defs if "batched" in d[1].lower()] == []
    assert [p for p in _sources() if "batched" in p.name.lower()] == []


def test_the_lifecycle_never_probes_a_task():
    runtime = [p for p in _sources() if (SRC / "pipeline" / "runtime") in p.parents]
    offenders = {str(p.relative_to(SRC)): hits for p in runtime for hits in [task_probes(p)] if hits}
    assert offenders == {}, "declare the hook in pipeline.tasks.base.Task and call it"


@pytest.mark.parametrize(
    "source, finder, expected",
    [
        ('x = "out/result.json"\n', run_dir_file_names, 1),
        ('"""Writes result.json."""\nx = 1\n', run_dir_file_names, 0),
        ("from pipeline.games.rmac import _interp\n", private_imports, 1),
        ("from pipeline.games.rmac import interp\n", private_imports, 0),
        ("from pipeline import cli\ncli._main([])\n", private_attribute_uses, 1),
        ("import pipeline.cli\npipeline.cli._check_sweep_first([])\n", private_attribute_uses, 1),
        ("import pipeline.config.checks as c\nc._leaves({})\n", private_attribute_uses, 1),
        ("from pipeline import cli\ncli.main([])\nx = object()\nx._y\n", private_attribute_uses, 0),
        ("from pipeline.cli import main\nmain._pipeline_guard\n", private_attribute_uses, 0),
        ("def f(task):\n    return hasattr(task, 'resume_step')\n", task_probes, 1),
        ("def f(self):\n    return getattr(self.task, 'n', 1)\n", task_probes, 1),
        ("def f(cfg):\n    return hasattr(cfg, 'x')\n", task_probes, 0),
        ("import inspect\ndef f(cls):\n    return inspect.signature(cls.__init__)\n", task_probes, 1),
    ],
)
def test_the_checks_themselves_find_what_they_look_for(tmp_path, source, finder, expected):
    path = tmp_path / "m.py"
    path.write_text(source)
    assert len(finder(path)) == expected

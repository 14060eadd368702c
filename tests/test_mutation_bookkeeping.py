"""tools/mutate.py's equivalent-mutant bookkeeping: entries keyed by text survive edits that renumber mutmut's mutants."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import mutate  # noqa: E402

SOURCE = '''
def scale(x, factor=2):
    return x * factor


class Box:
    def size(self, items):
        return len(items) + 1
'''


def test_texts_name_the_mutants_mutmut_generates_and_say_what_each_changes():
    from mutmut.mutation.file_mutation import mutate_file_contents

    texts = mutate.mutant_texts(SOURCE)
    assert set(texts) == set(mutate_file_contents("module.py", SOURCE).mutant_names)
    assert mutate.MutantText("scale", "return x * factor", "return x / factor") in texts.values()
    assert mutate.MutantText("Box.size", "return len(items) + 1", "return len(items) - 1") in texts.values()
    assert all(t.line != t.mutated for t in texts.values())


def test_an_entry_still_matches_after_an_edit_renumbers_the_mutants():
    before = mutate.mutant_texts(SOURCE)
    edited = SOURCE.replace("    return x * factor", "    if x is None:\n        return 0 - 1\n    return x * factor")
    after = mutate.mutant_texts(edited)
    (old_name,) = [n for n, t in before.items() if t.mutated == "return x / factor"]
    (new_name,) = [n for n, t in after.items() if t.mutated == "return x / factor"]
    assert old_name != new_name  # mutmut's number moved; the text did not


def test_entries_read_back_and_a_malformed_one_is_refused_naming_its_line(tmp_path, monkeypatch):
    monkeypatch.setattr(mutate, "ROOT", tmp_path)
    monkeypatch.setattr(mutate, "EQUIVALENT_DIR", tmp_path / "tools" / "mutation")
    text = mutate.MutantText("Box.size", "return len(items) + 1", "return len(items) - 1")
    path = mutate.equivalent_file("games/box.py")
    assert path == tmp_path / "tools" / "mutation" / "games" / "box.txt"
    path.parent.mkdir(parents=True)
    path.write_text("# comment\n\n" + mutate.format_entry(text, "why not"))
    assert mutate.load_equivalent("games/box.py") == {text: "why not"}
    path.write_text("Box.size\n  - return len(items) + 1\n  why not\n")
    with pytest.raises(SystemExit, match=r"tools/mutation/games/box.txt:1: an entry is four lines"):
        mutate.load_equivalent("games/box.py")


def test_every_equivalents_file_reads_and_names_a_module_that_exists():
    files = sorted(mutate.EQUIVALENT_DIR.rglob("*.txt"))
    assert files
    for path in files:
        module = str(path.relative_to(mutate.EQUIVALENT_DIR).with_suffix(".py"))
        assert (ROOT / "src" / "pipeline" / module).exists(), path
        assert mutate.load_equivalent(module), path
    assert set(mutate.DEFAULT) <= set(mutate.STABLE) <= set(mutate.MODULES)

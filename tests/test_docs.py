"""The documentation keeps its promises: README.md and docs/*.md link to files (and headings) that exist,
and every `python -m pipeline ...` command in their code blocks composes and passes the start-up checks,
as the CLI would run it. Running the commands end to end is the other tests' job (test_launchers, test_eval,
test_durable, the presets' debug runs); this file catches a renamed option, key or page the day it happens.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import open_dict

import pipeline.cli  # noqa: F401  (registers the resolvers the config uses, as `python -m pipeline` does)
from pipeline.config import checks as config_checks

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text without code blocks and code spans (a `[x](y)` inside code is not a link)."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def heading_anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = _CODE_SPAN.sub(lambda m: m.group(0)[1:-1], heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    headings = re.findall(r"^#{1,6} +(.+?) *$", _FENCE.sub("", page.read_text()), re.M)
    return {heading_anchor(h) for h in headings}


def broken_links(page: Path) -> list[str]:
    """'target (why)' for each relative link in ``page`` that does not resolve."""
    broken = []
    for target in _LINK.findall(_prose(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target} (no file {dest})")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading with anchor #{anchor} in {dest.name})")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    assert broken_links(page) == []


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "there.md").write_text("# A page\n\n## Its part\n")
    page = tmp_path / "index.md"
    page.write_text(
        "[fine](there.md), [fine too](there.md#its-part), [web](https://example.org/x.md), `[code](gone.md)`\n"
        "[missing](gone.md) and ![picture](img/none.png) and [bad anchor](there.md#no-such-part)\n"
        "```\n[in a code block](also_gone.md)\n```\n"
    )
    found = broken_links(page)
    assert [b.split(" ")[0] for b in found] == ["gone.md", "img/none.png", "there.md#no-such-part"]


def test_heading_anchors_follow_github():
    # Anchors as GitHub renders them for headings of these pages.
    assert heading_anchor("Mutation testing (`make mutate`)") == "mutation-testing-make-mutate"
    assert heading_anchor("Loggers: TensorBoard and Weights & Biases") == "loggers-tensorboard-and-weights--biases"
    assert heading_anchor("Many seeds in one process (`seeds_per_process`)") == "many-seeds-in-one-process-seeds_per_process"


def documented_commands(prefix: str = "python -m pipeline ") -> list[tuple[str, str]]:
    """(page, command) for each line starting with ``prefix`` in a code block of the docs, continuations joined."""
    found = []
    for page in PAGES:
        for block in _FENCE.findall(page.read_text()):
            joined = re.sub(r"\\\n\s*", " ", block)
            for line in joined.splitlines():
                line = line.strip()
                if line.startswith(prefix):
                    found.append((str(page.relative_to(ROOT)), line))
    return found


def test_documented_modules_exist():
    # `python -m pipeline.eval ...`, `python -m pipeline.report ...`: the modules they name can be run.
    modules = {line.split()[2] for _, line in documented_commands("python -m pipeline.")}
    assert {"pipeline.eval", "pipeline.report"} <= modules
    for module in sorted(modules):
        spec = importlib.util.find_spec(module)
        assert spec is not None, module
        if spec.submodule_search_locations:  # a package runs through its __main__
            assert importlib.util.find_spec(f"{module}.__main__") is not None, module


def _first_of_sweep(override: str, parsed) -> str | None:
    """A sweep override (`seed=range(0,10)`, `model=mlp,dueling`) as its first value; an interval: None."""
    if not parsed.is_sweep_override():
        return override
    if parsed.is_interval_sweep():
        return None
    first = next(iter(parsed.sweep_iterator()))
    value = "[" + ",".join(str(v) for v in first) + "]" if isinstance(first, list) else str(first)
    return f"{parsed.get_key_element()}={value}"


COMMANDS = documented_commands()


def test_the_docs_have_commands_to_check():
    # The README's tour alone has several; an empty list would mean the extraction broke.
    assert len([c for p, c in COMMANDS if p == "README.md"]) >= 5 and len(COMMANDS) >= 30


@pytest.mark.parametrize(("page", "command"), COMMANDS, ids=[f"{p}:{c[19:60]}" for p, c in COMMANDS])
def test_documented_command_composes(page, command, tmp_path, monkeypatch):
    # `hydra.run.dir=<its run dir>`: any folder name composes the same.
    argv = shlex.split(re.sub(r"<[^>]*>", "some_dir", command), comments=True)[3:]
    if any(a.startswith("-") and a != "-m" for a in argv) or any("searchpath" in a for a in argv):
        pytest.skip("a flag, or a user's config folder (test_cli, test_launchers and the tuner's tests run those)")
    argv = [a for a in argv if a != "-m"]
    config_checks.check_group_overrides(argv)
    parsed = OverridesParser.create().parse_overrides(argv)
    overrides = [o for o in (_first_of_sweep(a, p) for a, p in zip(argv, parsed, strict=True)) if o is not None]
    with initialize_config_module(config_module="pipeline.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    choices = config_checks.runtime_choices(cfg)
    with open_dict(cfg):
        del cfg["hydra"]  # the CLI's checks see the job's config, without Hydra's own node
    config_checks.check_missing(cfg)
    config_checks.check_types(cfg, choices)
    # A user's own file (`data.path=bids.csv`): the start-up checks look for it, so one stands in for it.
    monkeypatch.chdir(tmp_path)
    for name in [a.split("=", 1)[1] for a in overrides if a.startswith("data.path=") and not a.endswith("=null")
                 and not a.split("=", 1)[1].startswith(("/", "~"))]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).touch()
    config_checks.check_values(cfg, choices)


# ---- Python examples: every ```python block of README.md and docs/*.md runs as pasted (docs/python_api.md's in
# tests/test_python_api_docs.py), or, marked `<!-- excerpt of <file> -->`, shows lines its file holds.
_PYTHON = re.compile(r"(?:^<!-- excerpt of (?P<excerpt>\S+) -->\n)?^```python\n(?P<code>.*?)^```", re.M | re.S)
# A page whose examples run from a folder it names (`tests/user_envs` stands for the user's project there).
RUN_FROM = {"bring_your_own.md": ROOT / "tests" / "user_envs"}


def python_blocks(pages=PAGES) -> list[tuple[str, int, str, str | None]]:
    """(page, index on the page, code, the file it is an excerpt of or None) for each Python block."""
    return [(str(page.relative_to(ROOT)), i, m.group("code"), m.group("excerpt"))
            for page in pages if page.name != "python_api.md"
            for i, m in enumerate(_PYTHON.finditer(page.read_text()))]


def code_lines(code: str) -> list[str]:
    """The lines that say something: without trailing comments and indentation, none blank, comment-only or `...`."""
    lines = (re.sub(r"\s+#\s.*$", "", line).strip() for line in code.splitlines())
    return [line for line in lines if line and not line.startswith("#") and "..." not in line]


def missing_from(excerpt: str, file: Path) -> list[str]:
    held = set(code_lines(file.read_text()))
    return [line for line in code_lines(excerpt) if line not in held]


BLOCKS = python_blocks()
RUNNABLE = [b for b in BLOCKS if b[3] is None]


def test_the_docs_have_python_examples_to_run():
    assert any(page == "README.md" for page, *_ in RUNNABLE) and len(RUNNABLE) >= 3
    assert len(BLOCKS) > len(RUNNABLE)  # and excerpts, checked against their files below


@pytest.mark.parametrize(("page", "index", "code", "file"), [b for b in BLOCKS if b[3] is not None],
                         ids=lambda v: v if isinstance(v, str) and v.endswith(".md") else "")
def test_an_excerpt_holds_only_lines_of_its_file(page, index, code, file):
    assert (ROOT / file).is_file(), f"{page}: its excerpt names {file}, which does not exist"
    assert missing_from(code, ROOT / file) == [], f"{page}'s excerpt {index} has lines {file} does not"


def test_an_excerpt_that_drifted_from_its_file_is_found(tmp_path):
    (tmp_path / "m.py").write_text("def f(x: int) -> int:\n    return x + 1  # one more\n")
    assert missing_from("def f(x: int) -> int:  # f\n    ...\n    return x + 1\n", tmp_path / "m.py") == []
    assert missing_from("def f(x):\n    return x + 2\n", tmp_path / "m.py") == ["def f(x):", "return x + 2"]


@pytest.mark.slow
@pytest.mark.parametrize(("page", "index", "code", "file"), RUNNABLE, ids=lambda v: v if isinstance(v, str) and v.endswith(".md") else "")
def test_a_python_example_runs_as_pasted(page, index, code, file, tmp_path, monkeypatch):
    """In a fresh folder (or the one its page runs from), in this interpreter, as a notebook cell runs it."""
    folder = RUN_FROM.get(Path(page).name)
    if folder is not None:
        monkeypatch.syspath_prepend(str(folder))
    monkeypatch.chdir(folder or tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    exec(compile(code, f"{page}, Python example {index + 1}", "exec"), {"__name__": "__main__"})  # noqa: S102


# Words of a development log, not of a manual: the users' pages say what is true now (history: docs/changelog.md).
_LOG_WORDS = re.compile(r"\bissue( #?\d+|'s bar)|\b(this|last|previous|earlier) (session|round)\b|\b(seventh|eighth|ninth|tenth)"
                        r" session\b|\bother sessions'|\bsession's\b", re.I)


def log_words(text: str) -> list[str]:
    return [m.group(0) for m in _LOG_WORDS.finditer(_prose(text))]


# Pages still carrying log words, each rewritten on its own: strict, so the mark goes once the page is clean.
STILL_A_LOG: set[str] = set()  # pages with development-log words left (strict xfail until cleaned)


@pytest.mark.parametrize("page", [pytest.param(p, marks=pytest.mark.xfail(strict=True, reason="development-log words left"))
                                  if p.name in STILL_A_LOG else p for p in PAGES if p.name != "changelog.md"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_a_users_page_reads_as_a_manual(page):
    assert log_words(page.read_text()) == []


def test_development_log_words_are_found():
    text = "The issue's bar, issue 35's report, this round, the eighth session, other sessions' jobs; `issue 9` in code."
    assert log_words(text) == ["issue's bar", "issue 35", "this round", "eighth session", "other sessions'"]

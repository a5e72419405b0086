"""The documents and the code's prose point only at what the repository
holds.  In the READMEs and docs/**/*.md every relative link and every
backticked path under one of its top-level folders names a file or folder
that exists, every #anchor a heading, and nothing names a file kept outside
the repository (the original DESIGN.md, a machine's paths).  In the
docstrings and comments of the *.py files under gateway/, core/,
persistence/, tests/ and benchmarks/, in pyproject.toml's comments and in
docs/**/*.md, every path under a top-level folder (``dir/name.ext``, a
folder, or a glob that matches something) exists, so a moved or renamed file
leaves no stale name behind."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name not in ("build", "data"))
DOCS = sorted((ROOT / "docs").rglob("*.md"))
READMES = [ROOT / "README.md", ROOT / "deploy" / "README.md", *DOCS]
CODE_FOLDERS = ("gateway", "core", "persistence", "tests", "benchmarks")
PROSE = [*(p for folder in CODE_FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))), ROOT / "pyproject.toml", *DOCS]
# A repository path in prose: a top-level folder, a slash, then path characters
# (a glob's * too).  Not when it continues something else: a URL, a dotted or
# absolute path, a ~ or $ variable, an option's value.
PATH_IN_PROSE = re.compile(r"(?<![\w./@:~$=-])(?:%s)/[\w./*-]*" % "|".join(map(re.escape, TOP)))


def anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    out = set()
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        out.add(re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-"))
    return out


@pytest.mark.parametrize("readme", READMES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_and_paths_name_what_the_repository_holds(readme: Path) -> None:
    text = readme.read_text()
    here = readme.parent
    assert "DESIGN.md" not in text and "/work/" not in text
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        if path:
            assert (here / path).exists(), f"{readme.name} links to {path}, which is not in the repository"
        else:
            assert anchor in anchors(text), f"{readme.name} links to #{anchor}, which is no heading"
    for quoted in re.findall(r"`([^`\s]+)`", text):
        candidate = quoted.rstrip("/.,:;").split("::")[0]
        first = candidate.split("/", 1)[0]
        if "/" not in candidate or first not in TOP or any(c in candidate for c in "*{}<>$?=[]"):
            continue
        found = (ROOT / candidate).exists() or (here / candidate).exists()
        assert found, f"{readme.name} names `{quoted}`, which is not in the repository"


def prose(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of what in ``path`` is written for a reader: a Python
    file's docstrings and comments, a TOML file's comments, a document's lines."""
    text = path.read_text()
    if path.suffix == ".md":
        yield from enumerate(text.splitlines(), 1)
        return
    if path.suffix == ".py":
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
                first = node.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                    yield first.lineno, first.value.value
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                yield token.start[0], token.string
        return
    for number, line in enumerate(text.splitlines(), 1):
        if "#" in line:
            yield number, line[line.index("#"):]


def named_paths(text: str) -> Iterator[str]:
    for match in PATH_IN_PROSE.finditer(text):
        yield match.group(0).rstrip("/.,:;-")


def exists(name: str) -> bool:
    return any(ROOT.glob(name)) if "*" in name else (ROOT / name).exists()


def test_paths_in_docstrings_comments_and_docs_name_what_the_repository_holds() -> None:
    stale = []
    for path in PROSE:
        # Parsed only when its whole text names a path that is not there (a
        # string a test uses as data may): fast, as nearly every file passes.
        if all(exists(name) for name in named_paths(path.read_text())):
            continue
        for line, text in prose(path):
            stale += [f"{path.relative_to(ROOT)}:{line} names {name}" for name in named_paths(text) if not exists(name)]
    assert not stale, "paths that are not in the repository:\n" + "\n".join(stale)


def test_the_prose_check_finds_a_stale_path_and_passes_what_exists() -> None:
    names = list(named_paths("see gateway/ha/replicator.py, tests/e2e/test_ha_*.py and core/; "
                             "not https://example.org/core/x.py nor ./gateway/x.py nor a/gateway/x.py"))
    assert names == ["gateway/ha/replicator.py", "tests/e2e/test_ha_*.py", "core"]
    assert all(exists(name) for name in names)
    assert list(named_paths("as tests/test_17_deploy.py said.")) == ["tests/test_17_deploy.py"]
    assert not exists("tests/test_17_deploy.py")

"""The READMEs point only at what the repository holds: every relative link
and every backticked path under one of its top-level folders names a file or
folder that exists, every #anchor a heading, and nothing names a file kept
outside the repository (the original DESIGN.md, a machine's paths)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
READMES = [ROOT / "README.md", ROOT / "deploy" / "README.md"]
TOP = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name not in ("build", "data"))


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

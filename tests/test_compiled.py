"""The optional compiled build (`make fast`, mypyc): when it is there, the
modules build_fast.py names load compiled, and none is older than its source.

Skipped when nothing is compiled (the default: `make run` and `make test` are
pure Python). A stale build would run code that is no longer in the tree, so
it fails here rather than passing or failing for reasons nobody can see."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import build_fast

ROOT = Path(__file__).resolve().parent.parent


def fast_modules() -> list[Path]:
    """build_fast.FAST_MODULES: the one list of what `make fast` and the image's wheel compile."""
    return [ROOT / name for name in build_fast.FAST_MODULES]


def compiled_files() -> list[Path]:
    """The modules' extensions (not the library they share, the one named *__mypyc*)."""
    paths = (path for package in ("core", "gateway", "persistence") for path in (ROOT / package).rglob("*.so"))
    return sorted(path for path in paths if "__mypyc" not in path.name)


pytestmark = pytest.mark.skipif(not compiled_files(), reason="no compiled build here (`make fast` makes one)")


def test_the_compiled_build_is_whole_and_newer_than_its_sources() -> None:
    modules = fast_modules()
    for source in modules:
        assert source.exists(), f"{source} is in FAST_MODULES but not in the tree"
        extensions = list(source.parent.glob(source.stem + ".*.so"))
        assert extensions, f"{source} is not compiled: run `make fast` again (or `make unfast`)"
        for extension in extensions:
            assert extension.stat().st_mtime >= source.stat().st_mtime, (
                f"{extension.name} is older than {source.name}: run `make fast` again (or `make unfast`)"
            )
    others = {path.parent / path.name.split(".")[0] for path in compiled_files()} - {path.with_suffix("") for path in modules}
    assert not others, f"compiled modules build_fast.py does not name: {sorted(map(str, others))}"


def test_the_listed_modules_import_compiled() -> None:
    for source in fast_modules():
        name = ".".join(source.relative_to(ROOT).with_suffix("").parts)
        module = importlib.import_module(name)
        assert module.__file__ is not None and module.__file__.endswith(".so"), f"{name} loaded from {module.__file__}"

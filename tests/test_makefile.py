"""The Makefile's two commands install what each needs (checked with
`make -n`, which prints the recipe without running it, on a .venv of the
test's own): `make run` the broker's dependencies alone, `make test` the test
extras on top; with the broker's stamp in place `make run` installs nothing
and `make test` only the extras, with both nothing at all."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None, reason="make is not installed")


def planned(target: str, venv: Path) -> list[str]:
    """The pip installs `make -n target` would run."""
    out = subprocess.run([MAKE, "-n", target, f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         check=True).stdout
    return [line.split("pip install", 1)[1].replace("--quiet", "").split() for line in out.splitlines()
            if "/pip install" in line]


def test_make_run_installs_the_broker_alone_and_make_test_adds_the_extras(tmp_path):
    venv = tmp_path / ".venv"
    assert planned("run", venv) == [["--upgrade", "pip"], ["-e", "."]]
    assert planned("test", venv) == [["--upgrade", "pip"], ["-e", "."], ["-e", "'.[test]'"]]

    (venv / "bin").mkdir(parents=True)
    later = time.time() + 5  # newer than pyproject.toml, as after a real install
    (venv / "bin" / ".installed-broker").touch()
    os.utime(venv / "bin" / ".installed-broker", (later, later))
    assert planned("run", venv) == []  # after `make run` (or `make test`): nothing again
    assert planned("test", venv) == [["-e", "'.[test]'"]]  # after `make run`: the extras alone

    (venv / "bin" / ".installed").touch()
    os.utime(venv / "bin" / ".installed", (later + 1, later + 1))
    assert planned("test", venv) == [] and planned("run", venv) == []

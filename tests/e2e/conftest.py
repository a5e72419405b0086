"""Fixtures the end-to-end tests of one area share across their files."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from tests.deploy_helpers import render_kubectl, render_python


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    """deploy/ rendered, as the test_deploy_* files check it (kubectl's renderer where there is one)."""
    return render_kubectl() if shutil.which("kubectl") else render_python()

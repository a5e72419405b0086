"""Fixtures the core's unit tests share across their files."""

from __future__ import annotations

import pytest

from tests.support.core_fakes import World


@pytest.fixture
def world() -> World:
    return World()

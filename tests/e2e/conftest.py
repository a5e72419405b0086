"""Fixtures the end-to-end tests of one area share across their files."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.deploy_helpers import render_kubectl, render_python
from tests.support.durability_helpers import Peer
from tests.support.processes import BrokerProcess
from tests.support.zookeeper_helpers import ZooKeeperServer, unavailable_reason


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    """deploy/ rendered, as the test_deploy_* files check it (kubectl's renderer where there is one)."""
    return render_kubectl() if shutil.which("kubectl") else render_python()


@pytest.fixture
def broker_process(tmp_path: Path) -> Iterator[Callable[..., BrokerProcess]]:
    """``broker_process(*extra_args)``: a BrokerProcess on this test's folder,
    killed in teardown, with every durability Peer closed."""
    made: list[BrokerProcess] = []

    def make(*extra: str) -> BrokerProcess:
        process = BrokerProcess(tmp_path, *extra)
        made.append(process)
        return process

    yield make
    for process in made:
        process.kill()
    for peer in Peer.made:  # also those of a failed test (threads end at EOF)
        peer.raw.close()
    Peer.made.clear()


@pytest.fixture
def zookeeper(tmp_path: Path) -> Iterator[ZooKeeperServer]:
    """A real standalone ZooKeeper on 127.0.0.1 (Debian's package), killed in teardown."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    server = ZooKeeperServer(tmp_path / "zookeeper")
    try:
        server.start()
        yield server
    finally:
        server.kill()

"""What an operator sees of an HA group, end to end: two `gateway serve`
nodes on a real ZooKeeper, asked over HTTP with an admin user.  The primary's
/api/v1/cluster lists both nodes with their roles and epoch and, for the
backup, its acked LSN and lag; a backup stopped (SIGSTOP) shows a lag that
goes back to 0 once it catches up; /metrics carries the gateway_ha_* samples
with their labels, on the backup too (behind the same auth); after a SIGKILL
of the primary the backup that takes over counts the failover and a newer
epoch; without ZooKeeper a node answers with itself and the reason; the
primary's console lists both; and, in one process, the lag of a
backup held from applying is exactly the batch it has not acked.  (A single node answering role
"single": tests/e2e/test_admin.py.)"""

from __future__ import annotations

import base64
import contextlib
import json
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio
from prometheus_client.parser import text_string_to_metric_families

from gateway.admin.cluster import Lag
from tests.support.browser import console_login, requires_chromium
from tests.support import ha_nodes as failover
from tests.support.helpers import RawClient
from tests.support.processes import HOST
from tests.support.replication_helpers import everything
from tests.support.replicator_helpers import BackupNode, PrimaryNode, wait_for
from tests.support.zookeeper_helpers import ZooKeeperServer

READER = failover.READER
WAIT_S = failover.WAIT_S


class Node(failover.Node):
    """A test node whose admin answers are read whole (bytes), raising if the port is closed."""

    def fetch(self, path: str, *, auth: bool = True) -> tuple[int, bytes]:
        request = urllib.request.Request(f"http://{HOST}:{self.admin_port}{path}")
        if auth:
            request.add_header("Authorization", "Basic " + base64.b64encode(":".join(READER).encode()).decode())
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return int(response.status), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def cluster(self) -> dict[str, Any]:
        status, body = self.fetch("/api/v1/cluster")
        assert status == 200, (status, body)
        return dict(json.loads(body))

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        status, body = self.fetch("/metrics")
        assert status == 200, (status, body)
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(body.decode()) for s in family.samples}


def until(condition: Any, what: str, nodes: list[Node], timeout: float = WAIT_S) -> Any:
    """Poll ``condition()`` until it returns something true (bounded); that value."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s: {what} (last: {last})\n" + "\n".join(n.log_tail() for n in nodes))


def by_id(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["node_id"]: n for n in doc["nodes"]}


def caught_up(node: Node, backup: str) -> dict[str, Any] | None:
    """The primary's cluster document once ``backup`` is listed, in sync and not behind."""
    doc = node.cluster()
    replication = by_id(doc).get(backup, {}).get("replication")
    if replication and replication["in_sync"] and replication["lag_lsns"] == 0:
        return doc
    return None


def send(node: Node, count: int, queue: str = "/queue/seen") -> None:
    client = RawClient((HOST, node.stomp_port), timeout=30)
    client.connect()
    for i in range(count):
        client.send_frame("SEND", {"destination": queue, "persistent": "true", "receipt": f"r{i}"}, b"x" * 100)
    for i in range(count):
        client.receipt(f"r{i}", timeout=30)
    client.close()


@contextlib.contextmanager
def synced_pair(tmp_path: Path, zookeeper: ZooKeeperServer, count: int) -> Iterator[tuple[list[Node], Node, Node, dict[str, Any]]]:
    """A group of two on ``zookeeper``, its primary sent ``count`` persistent
    messages and its backup in sync: ``(nodes, primary, backup, the primary's
    cluster document)``; both nodes killed on the way out."""
    nodes = [Node(tmp_path, name, zookeeper, replicas=2).start() for name in ("gw-0", "gw-1")]
    try:
        primary = failover.wait_ready(nodes)
        (backup,) = [n for n in nodes if n is not primary]
        send(primary, count)
        yield nodes, primary, backup, until(lambda: caught_up(primary, backup.node_id), "the backup in sync", nodes)
    finally:
        for node in nodes:
            node.kill()


def test_the_cluster_view_shows_roles_epochs_lag_and_failovers(tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    with synced_pair(tmp_path, zookeeper, 10) as (nodes, primary, backup, doc):
        assert (doc["node_id"], doc["role"], doc["state"]) == (primary.node_id, "primary", "primary")
        epoch = doc["epoch"]
        assert epoch >= 1 and doc["lsn"] >= 10 and doc["primary"] == primary.node_id
        assert (doc["sync_replicas"], doc["in_sync"], doc["zookeeper"]) == (1, 1, "ok")
        listed = by_id(doc)
        assert sorted(listed) == ["gw-0", "gw-1"]
        assert listed[primary.node_id]["self"] and listed[primary.node_id]["epoch"] == epoch
        assert listed[backup.node_id]["role"] == "backup"
        replication = listed[backup.node_id]["replication"]
        assert replication["acked_lsn"] == doc["lsn"] and replication["acked_epoch"] == epoch
        assert (replication["lag_bytes"], replication["lag_seconds"]) == (0, 0)

        got = primary.metrics()
        assert got[("gateway_ha_role", (("role", "primary"),))] == 1
        assert got[("gateway_ha_role", (("role", "backup_in_sync"),))] == 0
        assert got[("gateway_ha_epoch", ())] == epoch and got[("gateway_ha_failovers_total", ())] == 1
        assert got[("gateway_ha_lsn", ())] >= doc["lsn"]
        label = (("backup", backup.node_id),)
        assert ("gateway_ha_replication_lag_bytes", label) in got and ("gateway_ha_replication_lag_seconds", label) in got
        assert got[("gateway_ha_backups_in_sync", ())] == 1

        # A stopped backup falls behind: the primary says by how much, and
        # that it is back to 0 once the backup has caught up.
        assert backup.proc is not None
        backup.proc.send_signal(signal.SIGSTOP)
        try:
            writer = RawClient((HOST, primary.stomp_port), timeout=30)
            writer.connect()
            writer.send_frame("SEND", {"destination": "/queue/seen", "persistent": "true", "receipt": "late"},
                              b"y" * 1000)

            def behind() -> dict[str, Any] | None:
                replication = by_id(primary.cluster()).get(backup.node_id, {}).get("replication")
                return replication if replication and replication["lag_bytes"] > 0 else None

            lagging = until(behind, "a lag while the backup is stopped", nodes)
            assert lagging["lag_lsns"] >= 1 and lagging["lag_bytes"] >= 1000 and lagging["lag_seconds"] >= 0
        finally:
            backup.proc.send_signal(signal.SIGCONT)
        writer.receipt("late", timeout=30)  # confirmed once it runs again
        writer.close()
        doc = until(lambda: caught_up(primary, backup.node_id), "the backup caught up again", nodes)
        assert by_id(doc)[backup.node_id]["replication"]["lag_bytes"] == 0

        # A backup answers the same reads behind the same auth, and nothing else.
        assert backup.fetch("/metrics", auth=False)[0] == 401
        assert backup.fetch("/api/v1/destinations")[0] == 503
        got = backup.metrics()
        assert got[("gateway_ha_role", (("role", "primary"),))] == 0
        assert sum(v for (name, _), v in got.items() if name == "gateway_ha_role") == 1
        assert got[("gateway_ha_failovers_total", ())] == 0
        assert until(lambda: backup.metrics()[("gateway_ha_lsn", ())] >= doc["lsn"], "the backup's applied LSN", nodes)
        seen = backup.cluster()
        assert seen["primary"] == primary.node_id and sorted(by_id(seen)) == ["gw-0", "gw-1"]
        assert by_id(seen)[primary.node_id]["role"] == "primary"

        # SIGKILL: the backup takes over in a newer epoch and counts it.
        primary.kill()
        new = failover.wait_ready([backup])
        got = new.metrics()
        assert got[("gateway_ha_failovers_total", ())] == 1
        assert got[("gateway_ha_role", (("role", "primary"),))] == 1
        assert got[("gateway_ha_epoch", ())] > epoch
        doc = new.cluster()
        assert (doc["role"], doc["primary"]) == ("primary", new.node_id) and doc["epoch"] > epoch
        # The old primary, restarted, is listed again as a backup of the new one.
        primary.start()
        doc = until(lambda: caught_up(new, primary.node_id), "the old primary back as a backup", nodes)
        assert by_id(doc)[primary.node_id]["role"] == "backup"

        # Without ZooKeeper a node still answers, with itself and the reason.
        zookeeper.kill()

        def alone() -> dict[str, Any] | None:
            doc = primary.cluster()
            return doc if doc["zookeeper"] != "ok" else None

        doc = until(alone, "the cluster view without ZooKeeper", nodes)
        assert [n["node_id"] for n in doc["nodes"] if n.get("self")] == [primary.node_id]


@requires_chromium
def test_the_primarys_console_shows_the_cluster(tmp_path: Path, zookeeper: ZooKeeperServer, browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    with synced_pair(tmp_path, zookeeper, 3) as (_, primary, backup, _doc):
        console_login(browser, f"http://{HOST}:{primary.admin_port}", *READER, page="cluster")
        wait = WebDriverWait(browser, 20)
        mine, theirs = (f'#nodes tr[data-node="{n.node_id}"]' for n in (primary, backup))
        wait.until(expected_conditions.text_to_be_present_in_element((By.CSS_SELECTOR, f"{theirs} td.lag"), "0"))
        assert browser.find_element(By.ID, "cluster").is_displayed()
        assert browser.find_element(By.CSS_SELECTOR, f"{mine} td.role").text == "primary"
        assert browser.find_element(By.CSS_SELECTOR, f"{theirs} td.role").text == "backup"
        epoch = primary.cluster()["epoch"]
        assert browser.find_element(By.CSS_SELECTOR, f"{mine} td.epoch").text == str(epoch)
        assert int(browser.find_element(By.CSS_SELECTOR, f"{theirs} td.lsn").text) >= 3
        # A backup's admin port serves the console too: its Cluster page, from the backup's view.
        console_login(browser, f"http://{HOST}:{backup.admin_port}", *READER, page="cluster")
        wait.until(expected_conditions.text_to_be_present_in_element((By.CSS_SELECTOR, f"{mine} td.role"), "primary"))
        assert "(this node)" in browser.find_element(By.CSS_SELECTOR, theirs).text


async def test_the_primary_measures_a_backups_lag_in_lsns_bytes_and_seconds(tmp_path: Path) -> None:
    """In one Trio process: a backup held from applying (its worker thread
    taken) lags by exactly the batch it has not acked, then by nothing."""
    node = PrimaryNode(tmp_path / "p")
    threads = trio.CapacityLimiter(1)
    async with trio.open_nursery() as nursery:
        await node.start(nursery)
        b = BackupNode(tmp_path / "b", "b", node.port, threads=threads).start(nursery)
        everything(node.store, n=8, tag="a")
        first = await node.commit()
        await node.confirmed()
        await wait_for(lambda: node.replicator.in_sync() == ["b"], "b in sync")
        assert node.replicator.lags() == [Lag("b", first, 1, True, 0, 0, 0.0, True)]
        async with threads:  # b cannot write what it receives
            before = node.store.stats()["bytes"]
            everything(node.store, n=8, tag="b")
            second = await node.commit()
            await trio.sleep(0.2)
            (lag,) = node.replicator.lags()
            assert (lag.acked_lsn, lag.lag_lsns, lag.lag_exact) == (first, second - first, True)
            assert lag.lag_bytes == node.store.stats()["bytes"] - before > 0
            assert lag.lag_seconds >= 0.2
        await node.confirmed()
        assert node.replicator.lags() == [Lag("b", second, 1, True, 0, 0, 0.0, True)]
        await b.stop()
        nursery.cancel_scope.cancel()
    node.store.close()


def test_a_lone_node_says_how_many_nodes_it_waits_for(tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    """A node of a three-node group (sync_replicas 1) started alone may not
    lead: an election needs replicas - sync_replicas = 2 nodes.  It says so,
    once in its log and in /api/v1/cluster, and says it again when the count
    changes; once a second node comes the wait is over and one of them leads."""
    lone = Node(tmp_path, "gw-0", zookeeper, replicas=3).start()
    other = Node(tmp_path, "gw-1", zookeeper, replicas=3)
    nodes = [lone, other]
    try:
        def waiting() -> dict[str, Any] | None:
            if lone.get("/healthz") is None:  # the admin port not open yet
                return None
            doc = lone.cluster()
            return doc if doc.get("waiting_for") else None

        doc = until(waiting, "the lone node's waiting_for", nodes)
        assert doc["state"] == "candidate" and doc["waiting_for"] == {"nodes_seen": 1, "nodes_needed": 2}, doc
        until(lambda: "ha_waiting_for_nodes" in lone.log_path.read_text(errors="replace"), "the log line", nodes)
        time.sleep(2.0)  # some election rounds (one per 0.5 s poll): the line is not repeated
        lines = [line for line in lone.log_path.read_text(errors="replace").splitlines()
                 if "ha_waiting_for_nodes" in line]
        assert len(lines) == 1, lines
        assert "nodes_seen=1" in lines[0] and "nodes_needed=2" in lines[0], lines[0]
        assert lone.readyz() == 503

        other.start()
        primary = failover.wait_ready(nodes)
        assert "waiting_for" not in primary.cluster()
    finally:
        for node in nodes:
            node.kill()

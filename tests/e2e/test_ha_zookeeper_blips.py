"""A ZooKeeper rolling restart costs the gateway nothing: no failover, no
client closed, no receipt lost.

Two `gateway serve` nodes with an [ha] table (replicas = 2) coordinate on a
real three-server ZooKeeper ensemble on loopback, the connect string listing
all three.  A producer sends receipted persistent SENDs to the primary on one
connection, each waiting (bounded) for its RECEIPT, while every ZooKeeper
server in turn is stopped (SIGTERM or SIGKILL) and started again, the next
one only once it has rejoined the quorum; the primary's own server, and the
ensemble's leader, are certainly among them.  Each time kazoo reports the
primary's connection suspended and reconnects, with the same session, to
another server.  A primary that fenced itself at "suspended" would close the
producer and fail over once per server; this one holds its receipts while
suspended and releases them once connected again.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from pathlib import Path

import pytest

from gateway.stomp import frames
from tests.support.ha_nodes import WAIT_S, Node, wait_ready, wait_role
from tests.support.helpers import Closed, RawClient
from tests.support.processes import HOST
from tests.support.zookeeper_ensemble import ZooKeeperEnsemble
from tests.support.zookeeper_helpers import unavailable_reason

QUEUE = "/queue/blips"
SESSION_TIMEOUT_S = 10  # the default: a suspended primary fences 5 s after ZooKeeper last answered it
PROGRESS = 5  # receipts the producer must get after each restart before the next


class Producer(threading.Thread):
    """Receipted persistent SENDs on one connection, one at a time, each
    RECEIPT awaited for at most WAIT_S: what it got, and how it ended if it did."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.client = RawClient((HOST, port), timeout=30)
        self.client.connect()
        self.receipted: list[str] = []
        self.failure: str | None = None
        self.stopping = threading.Event()
        self.progress = threading.Condition()

    def run(self) -> None:
        i = 0
        try:
            while not self.stopping.is_set():
                name = f"m{i}"
                self.client.send_frame("SEND", {"destination": QUEUE, "persistent": "true", "receipt": name},
                                       name.encode())
                frame = self.client.next_frame(WAIT_S)
                if type(frame) is not frames.Receipt or frame.headers.get("receipt-id") != name:
                    self.failure = f"for {name}: {frame!r}"
                    return
                with self.progress:
                    self.receipted.append(name)
                    self.progress.notify_all()
                i += 1
                time.sleep(0.02)
        except (Closed, OSError, AssertionError) as exc:
            self.failure = f"after {i} receipts: {exc!r}"
        finally:
            with self.progress:
                self.progress.notify_all()

    def count(self) -> int:
        with self.progress:
            return len(self.receipted)

    def wait_more(self, count: int) -> None:
        """Until ``count`` more receipts than now came; fails on the producer's failure or after WAIT_S."""
        target = self.count() + count
        with self.progress:
            self.progress.wait_for(lambda: len(self.receipted) >= target or self.failure is not None
                                   or not self.is_alive(), timeout=WAIT_S)
            assert self.failure is None, self.failure
            assert len(self.receipted) >= target, f"{len(self.receipted)} receipts, waited for {target}"

    def stop(self) -> None:
        self.stopping.set()
        self.join(WAIT_S)
        assert not self.is_alive(), "the producer still waits for a receipt"


def gauge(node: Node, name: str) -> int:
    answer = node.get("/metrics")
    assert answer is not None and answer[0] == 200, f"{node.node_id} /metrics: {answer}"
    found = re.search(rf"^{name} (\S+)$", answer[1], re.MULTILINE)
    assert found, f"no {name} in {node.node_id}'s /metrics"
    return int(float(found.group(1)))


def transitions(node: Node) -> list[str]:
    return [line for line in node.log_path.read_text(errors="replace").splitlines() if "ha_transition" in line]


def delivered(node: Node, names: set[str]) -> set[str]:
    """Consume the queue on ``node`` until every one of ``names`` came (bounded); what came."""
    consumer = RawClient((HOST, node.stomp_port), timeout=30)
    consumer.connect()
    consumer.send_frame("SUBSCRIBE", {"destination": QUEUE, "id": "s", "ack": "auto"})
    bodies: set[str] = set()
    deadline = time.monotonic() + WAIT_S
    while not names <= bodies and time.monotonic() < deadline:
        bodies |= {f.body.decode() for f in consumer.quiet_for(0.5) if f.command == "MESSAGE"}
    consumer.close()
    return bodies


@pytest.fixture
def ensemble(tmp_path: Path):
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    zookeeper = ZooKeeperEnsemble(tmp_path / "zookeeper")
    try:
        yield zookeeper.start()
    finally:
        zookeeper.stop()


def test_a_zookeeper_rolling_restart_keeps_the_primary_its_clients_and_every_receipt(
        tmp_path: Path, ensemble: ZooKeeperEnsemble) -> None:
    nodes = [Node(tmp_path, name, ensemble, replicas=2, session_timeout_s=SESSION_TIMEOUT_S).start()
             for name in ("gw-0", "gw-1")]
    producer: Producer | None = None
    try:
        primary = wait_ready(nodes)
        backup = next(n for n in nodes if n is not primary)
        wait_role(backup, "backup_in_sync")  # receipts need its confirmation (sync_replicas = 1)
        epoch, failovers = gauge(primary, "gateway_ha_epoch"), gauge(primary, "gateway_ha_failovers_total")
        producer = Producer(primary.stomp_port)
        producer.start()
        producer.wait_more(PROGRESS)

        for index, sig in enumerate((signal.SIGTERM, signal.SIGKILL, signal.SIGTERM)):
            ensemble.restart(index, sig)
            producer.wait_more(PROGRESS)  # the same connection goes on getting its receipts
            assert primary.readyz() == 200 and backup.readyz() == 503

        producer.stop()
        assert producer.failure is None, producer.failure
        assert not producer.client.eof, "the primary closed the producer's connection"
        # No failover: the same node leads in the same epoch, the backup never led.
        assert gauge(primary, "gateway_ha_epoch") == epoch
        assert gauge(primary, "gateway_ha_failovers_total") == failovers
        assert primary.readyz() == 200 and backup.readyz() == 503
        assert not [line for line in transitions(primary) if "state=fenced" in line], primary.log_tail(60)
        assert not [line for line in transitions(backup) if "on=promoted" in line], backup.log_tail(60)
        # The path this proves was taken: suspended, then the same session back, serving on.
        lines = transitions(primary)
        assert [line for line in lines if "on=fence " in line and "state=suspended" in line], primary.log_tail(80)
        assert [line for line in lines if "on=reconnect" in line and "before=suspended" in line
                and "state=primary" in line], primary.log_tail(80)
        # And every receipted message is there.
        names = set(producer.receipted)
        assert len(names) >= 4 * PROGRESS
        missing = names - delivered(primary, names)
        assert not missing, f"receipted, not delivered: {sorted(missing)[:20]}"
    finally:
        if producer is not None:
            producer.stopping.set()
            producer.client.close()
        for node in nodes:
            node.kill()


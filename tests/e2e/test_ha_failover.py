"""HA end to end: a real ZooKeeper and `gateway serve` processes with [ha]
tables on loopback.  Of three nodes exactly one is ready; receipted persistent
SENDs to it survive a SIGKILL of it, delivered by the backup that takes over
(the two backups settle the election on their final LSNs); the killed node,
restarted, rejoins as a backup and confirms the new primary's batches.  After
a full stop, the node that missed the last receipts does not lead alone."""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.ha_nodes import SESSION_TIMEOUT_S, WAIT_S, Node, wait_ready
from tests.support.helpers import RawClient
from tests.support.processes import HOST
from tests.support.zookeeper_helpers import ZooKeeperServer


def test_receipted_messages_survive_a_sigkill_of_the_primary(tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    # With ZooKeeper credentials, as deploy/ runs the group: the lock, the records and
    # /epoch all carry the group's ACL through the takeover and the rejoin.
    nodes = [Node(tmp_path, name, zookeeper, zookeeper_auth="gateway:failover-test").start()
             for name in ("gw-0", "gw-1", "gw-2")]
    try:
        primary = wait_ready(nodes)
        backups = [n for n in nodes if n is not primary]
        producer = RawClient((HOST, primary.stomp_port), timeout=30)
        producer.connect()
        sent = 50
        for i in range(sent):
            producer.send_frame("SEND", {"destination": "/queue/orders", "persistent": "true", "receipt": f"r{i}"},
                                f"order {i}".encode())
        for i in range(sent):
            producer.receipt(f"r{i}", timeout=30)  # each released only once a backup confirmed it
        primary.kill()
        producer.abort()
        # Either backup may hold the most (sync_replicas = 1); the election picks one that does.
        backup = wait_ready(backups)
        consumer = RawClient((HOST, backup.stomp_port), timeout=30)
        consumer.connect()
        consumer.send_frame("SUBSCRIBE", {"destination": "/queue/orders", "id": "s", "ack": "auto"})
        bodies = [consumer.expect("MESSAGE").body for _ in range(sent)]
        assert sorted(bodies) == sorted(f"order {i}".encode() for i in range(sent))
        assert consumer.quiet_for(0.5) == []  # none twice, none more
        consumer.close()
        # A restart is how the deposed primary rejoins: as a backup, whose
        # confirmations the new primary's receipts wait for (sync_replicas = 1).
        primary.start()
        assert wait_ready(nodes) is backup
        producer = RawClient((HOST, backup.stomp_port), timeout=30)
        producer.connect()
        producer.send_frame("SEND", {"destination": "/queue/later", "persistent": "true", "receipt": "after"}, b"x")
        producer.receipt("after", timeout=30)
        producer.close()
    finally:
        for node in nodes:
            node.kill()


def test_after_a_full_stop_the_least_advanced_node_alone_does_not_lead(tmp_path: Path,
                                                                       zookeeper: ZooKeeperServer) -> None:
    """A group of three whose first node back after a full stop is the one that
    missed the last receipted messages waits for a second node (the quorum,
    replicas - sync_replicas = 2), which holds them and leads: nothing receipted
    is thrown away by the lagging node leading and the other following it."""
    nodes = [Node(tmp_path, name, zookeeper).start() for name in ("gw-0", "gw-1", "gw-2")]
    try:
        primary = wait_ready(nodes)
        keeper, lagging = [n for n in nodes if n is not primary]
        producer = RawClient((HOST, primary.stomp_port), timeout=30)
        producer.connect()

        def send(label: str, count: int) -> list[bytes]:
            bodies = [f"{label} {i}".encode() for i in range(count)]
            for i, body in enumerate(bodies):
                producer.send_frame("SEND", {"destination": "/queue/kept", "persistent": "true",
                                             "receipt": f"{label}{i}"}, body)
            for i in range(count):
                producer.receipt(f"{label}{i}", timeout=30)
            return bodies

        receipted = send("early", 20)
        lagging.kill()
        receipted += send("late", 20)  # confirmed by the keeper alone
        primary.kill()
        keeper.kill()
        producer.abort()
        lagging.start()
        deadline = time.monotonic() + WAIT_S
        while "state=candidate" not in lagging.log_path.read_text(errors="replace"):
            assert time.monotonic() < deadline and lagging.alive(), lagging.log_tail()
            time.sleep(0.1)
        time.sleep(3 * SESSION_TIMEOUT_S)  # several rounds of trying to lead
        assert lagging.readyz() == 503, lagging.log_tail()
        keeper.start()
        assert wait_ready([lagging, keeper]) is keeper
        consumer = RawClient((HOST, keeper.stomp_port), timeout=30)
        consumer.connect()
        consumer.send_frame("SUBSCRIBE", {"destination": "/queue/kept", "id": "s", "ack": "auto"})
        bodies = [consumer.expect("MESSAGE").body for _ in receipted]
        assert sorted(bodies) == sorted(receipted)
        assert consumer.quiet_for(0.5) == []
        consumer.close()
    finally:
        for node in nodes:
            node.kill()

"""HA end to end, the consumer's side of a failover: a client-individual
ACK whose RECEIPT came from the primary is on a backup too, so after a
SIGKILL of the primary the node that takes over never delivers that message
again; what was delivered and not acked (or acked without a receipt) is
delivered again, as after a restart."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.test_ha_failover import Node, wait_ready
from tests.support.helpers import RawClient
from tests.support.processes import HOST
from tests.support.zookeeper_helpers import ZooKeeperServer


def test_a_receipted_ack_outlives_a_sigkill_of_the_primary(tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    nodes = [Node(tmp_path, name, zookeeper).start() for name in ("gw-0", "gw-1", "gw-2")]
    try:
        primary = wait_ready(nodes)
        client = RawClient((HOST, primary.stomp_port), timeout=30)
        client.connect()
        sent = 40
        for i in range(sent):
            client.send_frame("SEND", {"destination": "/queue/acks", "persistent": "true", "receipt": f"s{i}"},
                              f"m{i}".encode())
        for i in range(sent):
            client.receipt(f"s{i}", timeout=30)
        client.send_frame("SUBSCRIBE", {"destination": "/queue/acks", "id": "s", "ack": "client-individual"})
        delivered = [client.expect("MESSAGE") for _ in range(sent)]
        assert sorted(m.body for m in delivered) == sorted(f"m{i}".encode() for i in range(sent))
        acked = delivered[: sent // 2]
        for n, message in enumerate(acked):
            client.send_frame("ACK", {"id": message.headers["ack"], "receipt": f"a{n}"})
        for n in range(len(acked)):
            client.receipt(f"a{n}", timeout=30)  # each released only once a backup holds the ACK
        primary.kill()
        client.abort()
        successor = wait_ready([n for n in nodes if n is not primary])
        consumer = RawClient((HOST, successor.stomp_port), timeout=30)
        consumer.connect()
        consumer.send_frame("SUBSCRIBE", {"destination": "/queue/acks", "id": "s", "ack": "client-individual"})
        again = [consumer.expect("MESSAGE").body for _ in range(sent - len(acked))]
        assert sorted(again) == sorted(m.body for m in delivered[sent // 2:])
        assert consumer.quiet_for(1.0) == []  # none of the acked ones, nothing twice
        consumer.close()
    finally:
        for node in nodes:
            node.kill()

"""MQTT across a failover, end to end (a real ZooKeeper, three `gateway serve`
nodes with MQTT listeners, paho-mqtt clients): QoS 1 publishes PUBACKed by
the primary to the topic of an offline persistent session are all delivered,
in order, after the primary is SIGKILLed, to that session reconnecting to
the new primary, whose CONNACK says the session is present."""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.ha_nodes import WAIT_S, Node, wait_ready, wait_role
from tests.support.helpers import wait_for
from tests.support.mqtt_helpers import Paho
from tests.support.zookeeper_helpers import ZooKeeperServer

TOPIC = "plant/line-1/alarms"
COUNT = 40


def test_qos1_publishes_acked_before_a_primary_kill_reach_a_persistent_session_after_failover(
        tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    nodes = [Node(tmp_path, name, zookeeper, mqtt=True).start() for name in ("gw-0", "gw-1", "gw-2")]
    clients: list[Paho] = []
    try:
        primary = wait_ready(nodes)
        backups = [n for n in nodes if n is not primary]
        for backup in backups:
            wait_role(backup, "backup_in_sync")
        subscriber = Paho(primary.mqtt_port, "alarm-panel", clean=False)
        clients.append(subscriber)
        assert subscriber.connacks == [(False, 0)]
        assert subscriber.subscribe((TOPIC, 1)) == [1]
        subscriber.close()  # offline now: its session and subscription stay

        publisher = Paho(primary.mqtt_port, "sensor", clean=True)
        clients.append(publisher)
        sent = [f"alarm {i}".encode() for i in range(COUNT)]
        for payload in sent:
            info = publisher.client.publish(TOPIC, payload, qos=1)
            info.wait_for_publish(WAIT_S)
            assert info.is_published()  # PUBACKed: on disk here and on an in-sync backup
        primary.kill()
        publisher.drop()

        successor = wait_ready(backups)
        again = Paho(successor.mqtt_port, "alarm-panel", clean=False)
        clients.append(again)
        assert again.connacks == [(True, 0)]  # session present, on the new primary
        wait_for(lambda: len(again.messages) >= COUNT, WAIT_S, what=f"{COUNT} messages (have {len(again.messages)})")
        time.sleep(1.0)  # a spell for any duplicate to show up
        assert all(m.qos == 1 and m.topic == TOPIC for m in again.messages)
        assert again.payloads == sent  # each once, in the order published
    finally:
        for client in clients:
            try:
                client.drop()
            except Exception:  # already closed or dropped by the test
                pass
        for node in nodes:
            node.kill()

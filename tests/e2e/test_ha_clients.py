"""Clients across a failover as users run them: stomp.py given every node's
address finds whichever is primary (the backups do not listen for clients),
and an ActiveMQ-style durable topic subscription keeps what was published
for it while it was away, across a SIGKILL of the primary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import stomp

from tests.support.ha_nodes import WAIT_S, Node, wait_ready
from tests.support.helpers import Recorder, wait_for
from tests.support.processes import HOST
from tests.support.zookeeper_helpers import ZooKeeperServer

DURABLE = {"client-id": "watcher"}
SUBSCRIPTION = {"activemq.subscriptionName": "news"}


def connect(nodes: list[Node], **headers: str) -> tuple[Any, Recorder]:
    """A stomp.py connection over the node list, as an application configures it."""
    conn = stomp.Connection12([(HOST, n.stomp_port) for n in nodes], auto_decode=False, reconnect_attempts_max=40,
                              reconnect_sleep_initial=0.1, reconnect_sleep_max=1.0)
    recorder = Recorder()
    conn.set_listener("recorder", recorder)
    conn.connect(wait=True, headers=headers)
    return conn, recorder


def publish(nodes: list[Node], bodies: list[str]) -> None:
    conn, recorder = connect(nodes)
    for body in bodies:
        conn.send("/topic/news", body, headers={"persistent": "true"}, receipt=body)
    wait_for(lambda: set(bodies) <= set(recorder.receipts), WAIT_S, what="every receipt")
    conn.disconnect()


def test_a_durable_subscriber_gets_what_it_missed_across_a_failover_through_the_node_list(
        tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    nodes = [Node(tmp_path, name, zookeeper).start() for name in ("gw-0", "gw-1", "gw-2")]
    try:
        primary = wait_ready(nodes)
        watcher, _ = connect(nodes, **DURABLE)
        watcher.subscribe("/topic/news", "s", ack="client-individual", headers=SUBSCRIPTION)
        watcher.disconnect(receipt="away")  # offline: the subscription keeps what comes
        before = [f"before {i}" for i in range(30)]
        publish(nodes, before)
        primary.kill()
        wait_ready([n for n in nodes if n is not primary])
        after = [f"after {i}" for i in range(10)]
        publish(nodes, after)  # the same node list: stomp.py finds the new primary
        watcher, recorder = connect(nodes, **DURABLE)
        watcher.subscribe("/topic/news", "s", ack="client-individual", headers=SUBSCRIPTION)
        wait_for(lambda: len(recorder.messages) >= len(before) + len(after), WAIT_S, what="every message")
        bodies = [m.body.decode() for m in recorder.messages]
        assert sorted(bodies) == sorted(before + after)
        assert bodies[:len(before)] == before  # in order, what it missed first
        watcher.disconnect()
    finally:
        for node in nodes:
            node.kill()

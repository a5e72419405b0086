"""Many idle MQTT connections held by the real `gateway serve` process: each
is served, each still works after the others have come and sat idle, and
each connection event is one structured log line."""

from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter

from gateway.mqtt.codec import packets
from tests.support.helpers import wait_for
from tests.support.mqtt_helpers import RawMqtt
from tests.support.processes import GATEWAY, accepting, free_port

CONNECTIONS = 300


def test_many_idle_connections_are_served_and_each_still_works(tmp_path):
    port = free_port()
    log = tmp_path / "stderr"  # a file: a pipe nobody reads would fill and stall the broker
    with log.open("w") as stderr:
        process = subprocess.Popen([GATEWAY, "serve", "--stomp-port", "0", "--mqtt-port", str(port), "--admin-port", "0",
                                    "--data-dir", str(tmp_path / "d"), "--log-format", "json"],
                                   stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        wait_for(lambda: accepting(port), timeout=30, what="gateway listening")
        talk_to_many_idle_connections(port)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        process.kill()
        process.wait()

    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    events = Counter((r["event"], r.get("conn_id")) for r in records if r.get("conn_id", "").startswith("mqtt-"))
    connected = {conn_id for event, conn_id in events if event == "mqtt_connected"}
    assert len(connected) == CONNECTIONS + 2  # the idle ones, the publisher, the newcomer
    for conn_id in {conn_id for _, conn_id in events}:  # with the readiness probe, which never CONNECTs
        # One line per connection event, each with its peer.
        assert events["connection_opened", conn_id] == events["connection_closed", conn_id] == 1
        assert events["mqtt_connected", conn_id] == (conn_id in connected)
    assert all("peer" in r for r in records if r.get("conn_id", "").startswith("mqtt-"))


def talk_to_many_idle_connections(port: int) -> None:
    idle = [RawMqtt(port) for _ in range(CONNECTIONS)]
    publisher = RawMqtt(port)
    newcomer = RawMqtt(port)
    try:
        for number, client in enumerate(idle):
            client.send(packets.Connect(f"idle-{number}", keep_alive=60))
        for client in idle:
            assert client.next() == packets.ConnAck(False, packets.ACCEPTED)
        publisher.send(packets.Connect("publisher"))
        assert publisher.next() == packets.ConnAck(False, packets.ACCEPTED)

        # All of them connected and idle: each one is still a full session.
        for number, client in enumerate(idle):
            client.send(packets.PingReq())
            client.send(packets.Subscribe(1, [(f"idle/{number}", 1)]))
        for client in idle:
            assert client.next() == packets.PingResp()
            assert client.next() == packets.SubAck(1, [1])
        for number in range(CONNECTIONS):
            publisher.send(packets.Publish(f"idle/{number}", f"to {number}".encode(), 1, packet_id=number + 1))
        # Each PUBACK waits for the store (a gated outbox entry) and comes, in order.
        assert [publisher.next() for _ in range(CONNECTIONS)] == [packets.PubAck(n + 1) for n in range(CONNECTIONS)]
        for number, client in enumerate(idle):
            delivered = client.next()
            assert isinstance(delivered, packets.Publish), delivered
            assert (delivered.topic, delivered.payload, delivered.qos) == (f"idle/{number}", f"to {number}".encode(), 1)
            client.send(packets.PubAck(delivered.packet_id))
        # Taking over an idle session's client id still closes the old connection.
        newcomer.send(packets.Connect("idle-0"))
        assert newcomer.next() == packets.ConnAck(False, packets.ACCEPTED)
        idle[0].wait_closed()
    finally:
        for client in [*idle, publisher, newcomer]:
            client.close()

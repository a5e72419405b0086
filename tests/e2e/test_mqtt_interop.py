"""MQTT interop beyond paho: Debian's mosquitto_pub/mosquitto_sub and the amqtt
client against the real server; and an acknowledged publish surviving SIGKILL."""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess

import pytest

from gateway.mqtt.codec import packets as p
from tests.support.helpers import unique, wait_for
from tests.support.mqtt_helpers import Paho, RawMqtt, run_amqtt
from tests.support.processes import free_port

needs_mosquitto = pytest.mark.skipif(
    shutil.which("mosquitto_pub") is None, reason="mosquitto-clients not installed (make test installs it when it can)"
)


@needs_mosquitto
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_mosquitto_sub_receives_what_mosquitto_pub_sends(broker, qos):
    topic = f"{unique('mosq')}/x"
    port = str(broker.mqtt_port)
    sub = subprocess.Popen(
        ["mosquitto_sub", "-h", "127.0.0.1", "-p", port, "-t", topic, "-q", str(qos), "-C", "3", "-W", "10", "-v"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        # mosquitto_sub has no "subscribed" signal: wait until the broker holds its subscription.
        wait_for(lambda: broker.call(lambda: _subscribers(broker)) > 0, what="mosquitto_sub's subscription")
        for i in range(3):
            subprocess.run(
                ["mosquitto_pub", "-h", "127.0.0.1", "-p", port, "-t", topic, "-q", str(qos), "-m", f"hello {i}"],
                check=True, timeout=10,
            )
        out, err = sub.communicate(timeout=15)
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.communicate()
    assert sub.returncode == 0, err
    assert out.splitlines() == [f"{topic} hello {i}" for i in range(3)]


def _subscribers(broker) -> int:
    count = 0
    for connection in broker.running.server.connections.values():
        client = getattr(connection.session, "client", None)
        if client is not None and type(connection.session).__name__ == "MqttSession":
            count += len(client.subscriptions)
    return count


@needs_mosquitto
def test_a_retained_message_from_mosquitto_pub_reaches_a_later_subscriber(broker):
    topic = f"{unique('mosq')}/retained"
    port = str(broker.mqtt_port)
    subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", port, "-t", topic, "-q", "1", "-r", "-m", "kept"],
                   check=True, timeout=10)
    result = subprocess.run(
        ["mosquitto_sub", "-h", "127.0.0.1", "-p", port, "-t", topic, "-C", "1", "-W", "5", "-F", "%r %p"],
        capture_output=True, text=True, timeout=15,
    )
    assert result.stdout.strip() == "1 kept"


def test_the_amqtt_client_publishes_and_subscribes(broker):
    amqtt_client = pytest.importorskip("amqtt.client")
    topic = f"{unique('amqtt')}/t"
    url = f"mqtt://127.0.0.1:{broker.mqtt_port}/"

    async def scenario() -> list[tuple[str, bytes, int]]:
        subscriber = amqtt_client.MQTTClient(client_id=unique("amqtt-sub"))
        publisher = amqtt_client.MQTTClient(client_id=unique("amqtt-pub"))
        await subscriber.connect(url)
        await publisher.connect(url)
        await subscriber.subscribe([(topic, 2)])
        for qos in (0, 1, 2):
            await publisher.publish(topic, f"qos {qos}".encode(), qos=qos)
        got = []
        for _ in range(3):
            message = await asyncio.wait_for(subscriber.deliver_message(), 5)
            got.append((message.topic, bytes(message.data), message.qos))
        await publisher.disconnect()
        await subscriber.disconnect()
        return got

    got = run_amqtt(scenario())
    assert sorted(got) == [(topic, b"qos 0", 0), (topic, b"qos 1", 1), (topic, b"qos 2", 2)]


def test_an_acknowledged_publish_survives_sigkill(gateway, tmp_path):
    stomp_port, mqtt_port = free_port(), free_port()
    data = tmp_path / "d"
    args = ("--stomp-port", str(stomp_port), "--mqtt-port", str(mqtt_port), "--data-dir", str(data))
    topic = unique("kept")
    process = gateway(*args)
    process.wait_listening(mqtt_port)
    device = RawMqtt(mqtt_port)
    device.send(p.Connect("reader", clean_session=False))
    assert device.next() == p.ConnAck(False, 0)
    device.send(p.Subscribe(1, [(topic, 1)]))
    assert device.next() == p.SubAck(1, [1])
    device.close()
    acked: list[bytes] = []
    for round_number in range(3):
        publisher = RawMqtt(mqtt_port)
        publisher.send(p.Connect(f"writer-{round_number}"))
        assert publisher.next() == p.ConnAck(False, 0)
        for i in range(1, 51):
            payload = f"{round_number}-{i}".encode()
            publisher.send(p.Publish(topic, payload, qos=1, packet_id=i))
            publisher.send(p.Publish(topic, payload + b"-2", qos=2, packet_id=100 + i))
        answers = [publisher.next() for _ in range(100)]
        for answer in answers:
            assert isinstance(answer, (p.PubAck, p.PubRec))
            i = answer.packet_id if isinstance(answer, p.PubAck) else answer.packet_id - 100
            acked.append(f"{round_number}-{i}".encode() + (b"-2" if isinstance(answer, p.PubRec) else b""))
        process.proc.send_signal(signal.SIGKILL)  # the moment after the last acknowledgement
        process.wait_exit()
        publisher.close()
        process = gateway(*args)
        process.wait_listening(mqtt_port)
    reader = RawMqtt(mqtt_port)
    reader.send(p.Connect("reader", clean_session=False))
    assert reader.next() == p.ConnAck(True, 0)
    received = []
    while len(received) < len(acked):
        packet = reader.next()
        assert isinstance(packet, p.Publish)
        received.append(packet.payload)
        reader.send(p.PubAck(packet.packet_id))
    assert sorted(received) == sorted(acked)
    reader.close()


def test_a_stomp_durable_subscriber_keeps_what_mqtt_devices_published(broker_factory, stomp_client):
    broker = broker_factory()
    root = unique("fleet")
    client_id = unique("dashboard")
    dashboard = stomp_client(broker, headers={"client-id": client_id})
    dashboard.subscribe(f"/topic/{root}.>", "d", ack="client-individual", **{"activemq.subscriptionName": "all"})
    dashboard.close()
    device = Paho(broker.mqtt_port)
    for i in range(3):
        device.publish(f"{root}/{i}/temp", f"{i}".encode(), qos=1)
    device.close()
    broker.stop()
    broker = broker_factory()
    back = stomp_client(broker, headers={"client-id": client_id})
    back.subscribe(f"/topic/{root}.>", "d", ack="client-individual", **{"activemq.subscriptionName": "all"})
    back.wait_messages(3)
    assert back.bodies == [b"0", b"1", b"2"]
    assert [m.headers["destination"] for m in back.messages] == [f"/topic/{root}.{i}.temp" for i in range(3)]

"""More MQTT interop with other clients' own behaviour (mosquitto_sub's will and
persistent session, binary payloads through mosquitto_pub/_sub, amqtt's
persistent session), and what a SIGKILL must not lose: a SUBACKed persistent
subscription and a PUBACKed retained message."""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess

import pytest

from gateway.mqtt.codec import packets as p
from tests.support.helpers import unique, wait_for
from tests.support.mqtt_helpers import run_amqtt
from tests.support.processes import free_port

needs_mosquitto = pytest.mark.skipif(
    shutil.which("mosquitto_pub") is None or shutil.which("mosquitto_sub") is None,
    reason="mosquitto-clients not installed (make test installs it with apt-get when it can)",
)


@pytest.fixture
def processes():
    made: list[subprocess.Popen] = []

    def start(*args: str, **kwargs) -> subprocess.Popen:
        process = subprocess.Popen(list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)
        made.append(process)
        return process

    yield start
    for process in made:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)


def connected(broker, client_id: str) -> bool:
    for connection in broker.running.server.connections.values():
        registry = getattr(connection.session, "registry", None)
        if registry is not None:
            session = registry.active.get(client_id)
            client = getattr(session, "client", None)  # the core's view, what the admin API counts
            return client is not None and bool(client.subscriptions)
    return False


@needs_mosquitto
def test_mosquitto_subs_will_when_it_is_killed(broker, paho, processes):
    topic = unique("mosq-will")
    watcher = paho(broker)
    watcher.subscribe((topic, 1))
    client_id = unique("mosq-dev")
    sub = processes("mosquitto_sub", "-h", "127.0.0.1", "-p", str(broker.mqtt_port), "-i", client_id,
                    "-t", unique("other"), "--will-topic", topic, "--will-payload", "lost", "--will-qos", "1")
    wait_for(lambda: broker.call(lambda: connected(broker, client_id)), what="mosquitto_sub subscribed")
    sub.send_signal(signal.SIGKILL)
    message = watcher.wait(1)[0]
    assert (message.payload, message.qos, message.retain) == (b"lost", 1, False)


@needs_mosquitto
def test_mosquitto_sub_persistent_session_gets_what_was_sent_while_away(broker):
    topic = unique("mosq-away")
    client_id = unique("mosq-persistent")
    common = ["-h", "127.0.0.1", "-p", str(broker.mqtt_port)]
    first = subprocess.run(["mosquitto_sub", *common, "-c", "-i", client_id, "-q", "1", "-t", topic, "-E"],
                           capture_output=True, text=True, timeout=15)
    assert first.returncode == 0, first.stderr
    for i in range(3):
        subprocess.run(["mosquitto_pub", *common, "-q", "1", "-t", topic, "-m", f"away {i}"], check=True, timeout=10)
    back = subprocess.run(
        ["mosquitto_sub", *common, "-c", "-i", client_id, "-q", "1", "-t", topic, "-C", "3", "-W", "10"],
        capture_output=True, text=True, timeout=15,
    )
    assert back.returncode == 0, back.stderr
    assert back.stdout.splitlines() == [f"away {i}" for i in range(3)]


@needs_mosquitto
def test_binary_payloads_through_mosquitto_pub_and_sub(broker, paho, processes, tmp_path):
    topic = unique("mosq-bin")
    binary = bytes(range(256)) + b"\xc3\x28\xff\xfe"
    receiver = paho(broker)
    receiver.subscribe((topic, 1))
    payload_file = tmp_path / "payload"
    payload_file.write_bytes(binary)
    common = ["-h", "127.0.0.1", "-p", str(broker.mqtt_port)]
    subprocess.run(["mosquitto_pub", *common, "-q", "1", "-t", topic, "-f", str(payload_file)], check=True, timeout=10)
    assert receiver.wait(1)[0].payload == binary
    client_id = unique("mosq-bin-sub")
    sub = processes("mosquitto_sub", *common, "-i", client_id, "-q", "1", "-t", topic, "-C", "1", "-W", "10", "-N")
    wait_for(lambda: broker.call(lambda: connected(broker, client_id)), what="mosquitto_sub subscribed")
    paho(broker).publish(topic, binary[::-1], qos=1)
    out, err = sub.communicate(timeout=15)
    assert sub.returncode == 0, err
    assert out == binary[::-1]


def test_amqtt_persistent_session(broker, paho):
    amqtt_client = pytest.importorskip("amqtt.client")
    topic = f"{unique('amqtt')}/kept"
    client_id = unique("amqtt-persistent")
    url = f"mqtt://127.0.0.1:{broker.mqtt_port}/"

    async def subscribe_and_leave() -> bool:
        client = amqtt_client.MQTTClient(client_id=client_id, config={"auto_reconnect": False})
        await client.connect(url, cleansession=False)
        await client.subscribe([(topic, 1)])
        await client.disconnect()
        return True

    async def come_back() -> list[tuple[bytes, int]]:
        client = amqtt_client.MQTTClient(client_id=client_id, config={"auto_reconnect": False})
        await client.connect(url, cleansession=False)
        got = []
        for _ in range(2):
            message = await asyncio.wait_for(client.deliver_message(), 5)
            got.append((bytes(message.data), message.qos))
        await client.disconnect()
        return got

    assert run_amqtt(subscribe_and_leave())
    publisher = paho(broker)
    publisher.publish(topic, b"one", qos=1)
    publisher.publish(topic, b"two", qos=2)
    assert run_amqtt(come_back()) == [(b"one", 1), (b"two", 1)]


def test_a_subacked_subscription_and_a_pubacked_retained_message_survive_sigkill(gateway, tmp_path, raw_mqtt):
    stomp_port, mqtt_port = free_port(), free_port()
    args = ("--stomp-port", str(stomp_port), "--mqtt-port", str(mqtt_port), "--data-dir", str(tmp_path / "d"))
    topic = unique("crash")
    process = gateway(*args)
    process.wait_listening(mqtt_port)
    device = raw_mqtt(mqtt_port, "crash-reader", clean_session=False)
    device.send(p.Subscribe(1, [(f"{topic}/#", 1)]))
    assert device.next() == p.SubAck(1, [1])
    process.proc.send_signal(signal.SIGKILL)  # right after the SUBACK
    process.wait_exit()
    process = gateway(*args)
    process.wait_listening(mqtt_port)
    writer = raw_mqtt(mqtt_port, "crash-writer")
    writer.send(p.Publish(f"{topic}/state", b"retained", qos=1, retain=True, packet_id=1))
    assert writer.next() == p.PubAck(1)
    process.proc.send_signal(signal.SIGKILL)  # right after the PUBACK
    process.wait_exit()
    process = gateway(*args)
    process.wait_listening(mqtt_port)
    back = raw_mqtt(mqtt_port, "crash-reader", clean_session=False)
    assert back.connack.session_present
    kept = back.next()  # it was subscribed when the message came: a plain delivery
    assert (kept.topic, kept.payload, kept.qos, kept.retain) == (f"{topic}/state", b"retained", 1, False)
    back.send(p.PubAck(kept.packet_id))
    late = raw_mqtt(mqtt_port, "crash-late")
    late.send(p.Subscribe(1, [(f"{topic}/+", 1)]))
    assert late.next() == p.SubAck(1, [1])
    retained = late.next()
    assert (retained.payload, retained.qos, retained.retain) == (b"retained", 1, True)


def test_a_qos2_publish_resent_after_a_crash_between_pubrec_and_pubrel_is_delivered_once(gateway, tmp_path, raw_mqtt):
    stomp_port, mqtt_port = free_port(), free_port()
    args = ("--stomp-port", str(stomp_port), "--mqtt-port", str(mqtt_port), "--data-dir", str(tmp_path / "d"))
    topic = unique("exactly-once")
    process = gateway(*args)
    process.wait_listening(mqtt_port)
    reader = raw_mqtt(mqtt_port, "q2-reader", clean_session=False)
    reader.send(p.Subscribe(1, [(topic, 2)]))
    assert reader.next() == p.SubAck(1, [2])
    reader.send(p.Disconnect())
    writer = raw_mqtt(mqtt_port, "q2-writer", clean_session=False)
    writer.send(p.Publish(topic, b"once", qos=2, packet_id=7))
    assert writer.next() == p.PubRec(7)
    process.proc.send_signal(signal.SIGKILL)  # between PUBREC and PUBREL
    process.wait_exit()
    process = gateway(*args)
    process.wait_listening(mqtt_port)
    writer = raw_mqtt(mqtt_port, "q2-writer", clean_session=False)
    assert writer.connack.session_present
    # The writer could not know its PUBREC arrived before the crash: it resends.
    writer.send(p.Publish(topic, b"once", qos=2, dup=True, packet_id=7))
    assert writer.next() == p.PubRec(7)
    writer.send(p.PubRel(7))
    assert writer.next() == p.PubComp(7)
    reader = raw_mqtt(mqtt_port, "q2-reader", clean_session=False)
    got = reader.next()
    assert (got.topic, got.payload, got.qos) == (topic, b"once", 2)
    reader.send(p.PubRec(got.packet_id))
    assert reader.next() == p.PubRel(got.packet_id)
    reader.send(p.PubComp(got.packet_id))
    reader.send(p.PingReq())
    assert reader.next() == p.PingResp()  # and no second copy before it

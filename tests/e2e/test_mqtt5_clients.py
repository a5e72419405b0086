"""MQTT 5 through the clients users have, against a real ``gateway serve``:
aiomqtt (asyncio, over paho) and Debian's mosquitto_pub / mosquitto_sub
with ``-V mqttv5``.  The 3.1.1 counterparts are tests/e2e/test_mqtt_interop.py."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.helpers import unique, wait_for
from tests.support.processes import free_port

needs_mosquitto = pytest.mark.skipif(
    shutil.which("mosquitto_pub") is None, reason="mosquitto-clients not installed (make test installs it when it can)"
)
CLIENT_TIMEOUT_S = 20  # a mosquitto client or an asyncio scenario on a loaded 2-core machine


@pytest.fixture
def serve(gateway) -> Iterator[int]:
    """A ``gateway serve`` child process; yields its MQTT port."""
    mqtt_port, stomp_port = free_port(), free_port()
    process = gateway("--mqtt-port", str(mqtt_port), "--stomp-port", str(stomp_port))
    process.wait_listening(mqtt_port)
    yield mqtt_port


# -- aiomqtt --------------------------------------------------------------------


def test_aiomqtt_v5_publishes_and_subscribes_with_properties_at_qos_1(serve):
    """aiomqtt (which speaks 3.1.1 unless told) with ``ProtocolVersion.V5``:
    a subscription with an identifier and No Local, QoS 1 publishes with
    User Properties (a repeated name among them), a Response Topic, binary
    Correlation Data, a content type, a payload format and an expiry, then
    two by a topic alias; the subscriber gets each with its properties (and
    its topic), and not its own publish."""
    aiomqtt = pytest.importorskip("aiomqtt")
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties
    from paho.mqtt.subscribeoptions import SubscribeOptions

    root = unique("aio5")
    request = Properties(PacketTypes.PUBLISH)
    request.UserProperty = [("unit", "C"), ("tag", "a"), ("tag", "b")]
    request.ResponseTopic = f"{root}/replies"
    request.CorrelationData = b"\x00\xffreq-1"
    request.ContentType = "text/plain"
    request.PayloadFormatIndicator = 1
    request.MessageExpiryInterval = 600

    def client(name: str, **kwargs: Any) -> Any:
        connect = Properties(PacketTypes.CONNECT)
        connect.ReceiveMaximum = 8  # no Topic Alias Maximum: paho (under aiomqtt) cannot resolve aliases it receives
        return aiomqtt.Client("127.0.0.1", serve, identifier=unique(name), protocol=aiomqtt.ProtocolVersion.V5,
                              properties=connect, timeout=CLIENT_TIMEOUT_S, **kwargs)

    async def scenario() -> tuple[list[Any], list[Any]]:
        async with client("aio-sub") as subscriber, client("aio-pub") as publisher:
            subscribe = Properties(PacketTypes.SUBSCRIBE)
            subscribe.SubscriptionIdentifier = 3
            granted = await subscriber.subscribe(f"{root}/#", options=SubscribeOptions(qos=1, noLocal=True),
                                                 properties=subscribe)
            await subscriber.publish(f"{root}/own", b"not for me", qos=1)  # No Local: never comes back
            await publisher.publish(f"{root}/1/temp", b"21.5", qos=1, properties=request)
            alias = Properties(PacketTypes.PUBLISH)
            alias.TopicAlias = 1
            await publisher.publish(f"{root}/1/temp", b"21.75", qos=1, properties=alias)  # sets alias 1
            await publisher.publish("", b"22.0", qos=1, properties=alias)  # by alias alone
            got = []
            async with asyncio.timeout(CLIENT_TIMEOUT_S):
                async for message in subscriber.messages:
                    got.append(message)
                    if len(got) == 3:
                        break
            return list(granted), got

    granted, (first, second, third) = asyncio.run(scenario())
    assert [code.value for code in granted] == [1]
    assert [(str(m.topic), m.payload, m.qos) for m in (first, second, third)] == [
        (f"{root}/1/temp", b"21.5", 1), (f"{root}/1/temp", b"21.75", 1), (f"{root}/1/temp", b"22.0", 1)]
    properties = first.properties
    assert properties.UserProperty == [("unit", "C"), ("tag", "a"), ("tag", "b")]  # order and repeats kept
    assert (properties.ResponseTopic, properties.CorrelationData) == (f"{root}/replies", b"\x00\xffreq-1")
    assert (properties.ContentType, properties.PayloadFormatIndicator) == ("text/plain", 1)
    assert 0 < properties.MessageExpiryInterval <= 600
    assert properties.SubscriptionIdentifier == [3]
    for plain in (second, third):  # nothing of the first's metadata, nor the publisher's alias
        assert plain.properties.SubscriptionIdentifier == [3]
        assert not any(hasattr(plain.properties, name) for name in ("UserProperty", "ResponseTopic", "TopicAlias"))


# -- mosquitto_pub / mosquitto_sub -V mqttv5 -------------------------------------------


def subscriptions(broker) -> int:
    """How many MQTT subscriptions the in-process broker holds (mosquitto_sub
    has no "subscribed" signal to wait for)."""
    def count() -> int:
        total = 0
        for connection in broker.running.server.connections.values():
            client = getattr(connection.session, "client", None)
            if client is not None and type(connection.session).__name__ == "MqttSession":
                total += len(client.subscriptions)
        return total
    return broker.call(count)


def mosquitto(command: str, port: int, *args: str) -> list[str]:
    return [command, "-h", "127.0.0.1", "-p", str(port), "-V", "mqttv5", *args]


def publish(port: int, *args: str) -> None:
    subprocess.run(mosquitto("mosquitto_pub", port, *args), check=True, timeout=CLIENT_TIMEOUT_S,
                   capture_output=True, text=True)


class Sub:
    """A mosquitto_sub child, its output read once it exits."""

    def __init__(self, broker, *args: str, wait_subscribed: int = 1) -> None:
        before = subscriptions(broker)
        self.proc = subprocess.Popen(mosquitto("mosquitto_sub", broker.mqtt_port, "-W", str(CLIENT_TIMEOUT_S), *args),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: self.proc.poll() is not None or subscriptions(broker) >= before + wait_subscribed,
                 what="mosquitto_sub's subscription")

    def lines(self) -> list[str]:
        try:
            out, err = self.proc.communicate(timeout=CLIENT_TIMEOUT_S + 5)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.communicate()
        assert self.proc.returncode == 0, err
        return out.splitlines()


@needs_mosquitto
@pytest.mark.parametrize("qos", [1, 2])
def test_mosquitto_v5_user_properties_expiry_and_response_topic_reach_mqtt_and_stomp(broker, stomp_client, qos):
    topic = f"{unique('mosq5')}/cmd"
    stomp = stomp_client(broker)
    stomp.subscribe(f"/topic/{topic.replace('/', '.')}")
    sub = Sub(broker, "-t", topic, "-q", "2", "-C", "1", "-D", "subscribe", "subscription-identifier", "9",
              "-F", "%t|%p|%q|%P|%E|%R|%D|%C|%S")
    publish(broker.mqtt_port, "-t", topic, "-q", str(qos), "-m", "heat on",
            "-D", "publish", "user-property", "unit", "C", "-D", "publish", "user-property", "site", "north",
            "-D", "publish", "message-expiry-interval", "120", "-D", "publish", "response-topic", f"{topic}/replies",
            "-D", "publish", "correlation-data", "req-7", "-D", "publish", "content-type", "text/plain")
    (line,) = sub.lines()
    name, payload, got_qos, user, expiry, response, correlation, content_type, identifier = line.split("|")
    assert (name, payload, got_qos) == (topic, "heat on", str(qos))
    assert user.split() == ["unit:C", "site:north"]
    assert 0 < int(expiry) <= 120
    assert (response, correlation, content_type, identifier) == (f"{topic}/replies", "req-7", "text/plain", "9")

    (message,) = stomp.wait_messages(1)
    assert message.body == b"heat on"
    assert (message.headers["unit"], message.headers["site"]) == ("C", "north")
    assert (message.headers["reply-to"], message.headers["correlation-id"]) == (
        f"/topic/{topic.replace('/', '.')}.replies", "req-7")


@needs_mosquitto
def test_mosquitto_v5_an_expired_message_is_not_delivered_to_a_returning_session(broker):
    topic = f"{unique('mosq5')}/expiring"
    client_id = unique("mosq5-sess")
    # Away with a session kept for 5 minutes (-c keeps it; -x says for how long).
    subprocess.run(mosquitto("mosquitto_sub", broker.mqtt_port, "-i", client_id, "-c", "-x", "300", "-t", topic,
                             "-q", "1", "-E"), check=True, timeout=CLIENT_TIMEOUT_S, capture_output=True)
    publish(broker.mqtt_port, "-t", topic, "-q", "1", "-m", "short", "-D", "publish", "message-expiry-interval", "1")
    publish(broker.mqtt_port, "-t", topic, "-q", "1", "-m", "long", "-D", "publish", "message-expiry-interval", "300")
    time.sleep(2.2)  # past the first one's expiry (an expiry, not a timing assert)
    back = subprocess.run(
        mosquitto("mosquitto_sub", broker.mqtt_port, "-i", client_id, "-c", "-x", "300", "-t", topic, "-q", "1",
                  "-C", "1", "-W", "10", "-F", "%p %E"),
        capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S)
    assert back.returncode == 0, back.stderr
    payload, left = back.stdout.split()
    assert payload == "long" and 0 < int(left) <= 300


@needs_mosquitto
def test_mosquitto_v5_session_expiry_interval_keeps_what_arrives_while_away(broker):
    """In MQTT 5 Clean Start and the session's lifetime are apart: a clean
    start with ``session-expiry-interval 600`` leaves a session behind, which
    a later connection without clean start (``-c``) takes up."""
    topic = f"{unique('mosq5')}/away"
    client_id = unique("mosq5-keep")
    subscribe = ("-i", client_id, "-t", topic, "-q", "2")
    subprocess.run(mosquitto("mosquitto_sub", broker.mqtt_port, *subscribe, "-D", "connect",
                             "session-expiry-interval", "600", "-E"), check=True, timeout=CLIENT_TIMEOUT_S,
                   capture_output=True)
    for qos in (1, 2):
        publish(broker.mqtt_port, "-t", topic, "-q", str(qos), "-m", f"while away {qos}")
    # Back without clean start, subscribing to something else: what the kept
    # subscription holds comes on its own.
    back = subprocess.run(mosquitto("mosquitto_sub", broker.mqtt_port, "-i", client_id, "-t", f"{topic}/other", "-c",
                                    "-x", "0", "-C", "2", "-W", "10", "-F", "%p|%q"),
                          capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S)
    assert back.returncode == 0, back.stderr
    assert back.stdout.splitlines() == ["while away 1|1", "while away 2|2"]
    # That connection said session expiry 0: the session ended with it, so
    # what is published next waits for nobody.
    publish(broker.mqtt_port, "-t", topic, "-q", "1", "-m", "after the end")
    fresh = subprocess.run(mosquitto("mosquitto_sub", broker.mqtt_port, "-i", client_id, "-c", "-x", "600",
                                     "-t", f"{topic}/other", "-C", "1", "-W", "2", "-F", "%p"),
                           capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S)
    assert fresh.stdout == ""  # -W ran out with nothing (mosquitto_sub exits 27 for that)


@needs_mosquitto
@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
def test_a_kept_session_subscribing_again_gets_a_qos_2_message_once(broker, version):
    """``mosquitto_sub -c`` (like every client that keeps its session)
    subscribes again on each connect, to the filter its kept session already
    has: the message that waited for it must come exactly once [MQTT-4.3.3],
    and the replaced subscription must not interrupt the flow [MQTT-3.8.4-3]."""
    topic = f"{unique('mosq5')}/once"
    kept = ("-V", version, "-i", unique("mosq-once"), "-c", "-t", topic, "-q", "2")
    subprocess.run(["mosquitto_sub", "-h", "127.0.0.1", "-p", str(broker.mqtt_port), *kept, "-E"],
                   check=True, timeout=CLIENT_TIMEOUT_S, capture_output=True)
    subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.mqtt_port), "-V", version, "-t", topic,
                    "-q", "2", "-m", "exactly once"], check=True, timeout=CLIENT_TIMEOUT_S, capture_output=True)
    back = subprocess.run(["mosquitto_sub", "-h", "127.0.0.1", "-p", str(broker.mqtt_port), *kept, "-W", "3",
                           "-F", "%p|%q"], capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S)
    assert back.stdout.splitlines() == ["exactly once|2"]  # until -W's 3 s ran out


@needs_mosquitto
def test_mosquitto_v5_retained_with_properties_and_retain_handling(broker):
    from gateway.mqtt.codec import packets as p
    from tests.support.mqtt_helpers import RawMqtt

    topic = f"{unique('mosq5')}/state"
    publish(broker.mqtt_port, "-t", topic, "-q", "1", "-r", "-m", "on", "-D", "publish", "user-property", "by", "panel",
            "-D", "publish", "content-type", "text/plain")
    late = subprocess.run(mosquitto("mosquitto_sub", broker.mqtt_port, "-t", topic, "-C", "1", "-W", "10",
                                    "--retain-as-published", "-F", "%r|%p|%P|%C"),
                          capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S)
    assert late.stdout.splitlines() == ["1|on|by:panel|text/plain"]

    # Retain Handling, which mosquitto_sub does not expose, from the raw client.
    raw = RawMqtt(broker.mqtt_port)
    raw.send(p.Connect(unique("rh"), protocol_level=5))
    assert isinstance(raw.next(), p.ConnAck)
    raw.send(p.Subscribe(1, [(topic, p.options(1, retain_handling=2))]))  # 2: never the retained ones
    raw.send(p.Subscribe(2, [(topic, p.options(1, retain_handling=1))]))  # 1: only if the subscription is new
    raw.send(p.Subscribe(3, [(f"{topic}/../#".replace("/..", ""), p.options(1, retain_handling=1))]))  # new: sent
    packets = [raw.next() for _ in range(4)]
    raw.close()
    assert [type(packet).__name__ for packet in packets] == ["SubAck", "SubAck", "SubAck", "Publish"]
    assert (packets[3].topic, packets[3].payload, packets[3].retain) == (topic, b"on", True)


@needs_mosquitto
def test_mosquitto_v5_a_will_with_properties_reaches_a_subscriber(broker):
    topic = f"{unique('mosq5')}/status"
    watcher = Sub(broker, "-t", topic, "-q", "1", "-C", "1", "-F", "%p|%q|%P|%C")
    device = subprocess.Popen(
        mosquitto("mosquitto_sub", broker.mqtt_port, "-t", f"{topic}/in", "-k", "5",
                  "--will-topic", topic, "--will-payload", "offline", "--will-qos", "1",
                  "-D", "will", "user-property", "reason", "lost", "-D", "will", "content-type", "text/plain"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: subscriptions(broker) >= 2, what="the device's connection")
    finally:
        device.kill()  # no DISCONNECT: the will is published
        device.wait()
    assert watcher.lines() == ["offline|1|reason:lost|text/plain"]

"""The v5 codec against paho-mqtt's own MQTT 5 client: a socket on 127.0.0.1
answered packet by packet with the codec in the server role.  What paho
sends (CONNECT with properties and a will, SUBSCRIBE with options and an
identifier, PUBLISH with properties) decodes to what paho was asked to send;
what the codec encodes (CONNACK, SUBACK, PUBLISH with properties, a server
DISCONNECT) reaches paho's callbacks as sent."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from gateway.mqtt.codec import packets as p
from gateway.mqtt.codec import MqttConnection, Role
from tests.support.helpers import TIMEOUT


class Peer:
    """The accepted socket and the codec reading it, one packet at a time."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.settimeout(TIMEOUT)
        self.codec = MqttConnection(Role.SERVER)
        self.waiting: list[p.Packet] = []

    def next(self) -> p.Packet:
        while not self.waiting:
            data = self.sock.recv(65536)
            assert data, "paho closed the connection"
            self.codec.receive_data(data)
            self.waiting.extend(self.codec.events())
        return self.waiting.pop(0)

    def send(self, packet: p.Packet) -> None:
        self.sock.sendall(self.codec.send(packet))


@pytest.fixture
def paho_and_peer() -> Iterator[tuple[mqtt.Client, dict[str, Any], Peer]]:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(TIMEOUT)
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="paho5", protocol=mqtt.MQTTv5)
    seen: dict[str, Any] = {}
    events = {name: threading.Event() for name in ("connack", "message", "disconnect")}

    def record(name: str) -> Any:
        def callback(*args: Any) -> None:
            seen[name] = args
            events[name].set()
        return callback

    client.on_connect = record("connack")
    client.on_message = record("message")
    client.on_disconnect = record("disconnect")
    seen["events"] = events
    will = Properties(PacketTypes.WILLMESSAGE)
    will.WillDelayInterval = 10
    will.ContentType = "text/plain"
    client.will_set("wills/paho5", b"gone", 1, True, will)
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 120
    props.ReceiveMaximum = 7
    props.UserProperty = ("who", "paho")
    client.connect("127.0.0.1", listener.getsockname()[1], keepalive=30, clean_start=True, properties=props)
    sock, _ = listener.accept()
    listener.close()  # nothing to reconnect to once the test is over
    client.loop_start()
    try:
        yield client, seen, Peer(sock)
    finally:
        client.loop_stop()
        client._reset_sockets()  # paho's wake-up socket pair, else left to the garbage collector (as in tests/support/mqtt_helpers.py)
        sock.close()


def test_paho_v5_and_the_codec_understand_each_other(paho_and_peer: tuple[mqtt.Client, dict[str, Any], Peer]) -> None:
    client, seen, peer = paho_and_peer
    events = seen["events"]
    will_props = p.Properties(content_type="text/plain", will_delay_interval=10)
    assert peer.next() == p.Connect(
        "paho5", True, 30, None, None, p.Will("wills/paho5", b"gone", 1, True, will_props), "MQTT", 5,
        p.Properties(session_expiry_interval=120, receive_maximum=7, user_properties=(("who", "paho"),)),
    )
    peer.send(p.ConnAck(False, 0, p.Properties(
        maximum_qos=1, topic_alias_maximum=5, assigned_client_identifier="gw-1", reason_string="welcome",
        receive_maximum=20, retain_available=0, user_properties=(("a", "b"), ("a", "c")))))
    assert events["connack"].wait(TIMEOUT)
    _, _, flags, reason, props = seen["connack"]
    assert reason.value == 0 and not flags.session_present
    assert (props.MaximumQoS, props.TopicAliasMaximum, props.AssignedClientIdentifier, props.ReasonString) == (
        1, 5, "gw-1", "welcome")
    assert (props.ReceiveMaximum, props.RetainAvailable, props.UserProperty) == (20, 0, [("a", "b"), ("a", "c")])

    sub_props = Properties(PacketTypes.SUBSCRIBE)
    sub_props.SubscriptionIdentifier = 9
    options = SubscribeOptions(qos=1, noLocal=True, retainAsPublished=True, retainHandling=2)
    client.subscribe([("a/+", options), ("b", SubscribeOptions(qos=0))], properties=sub_props)
    subscribe = peer.next()
    assert isinstance(subscribe, p.Subscribe)
    assert subscribe.topics == [("a/+", p.options(1, True, True, 2)), ("b", p.options(0))]
    assert subscribe.properties == p.Properties(subscription_identifiers=(9,))
    peer.send(p.SubAck(subscribe.packet_id, [1, 0]))

    pub_props = Properties(PacketTypes.PUBLISH)
    pub_props.PayloadFormatIndicator = 1
    pub_props.MessageExpiryInterval = 60
    pub_props.ContentType = "text/plain"
    pub_props.ResponseTopic = "replies/paho5"
    pub_props.CorrelationData = b"\x00id"
    pub_props.TopicAlias = 2
    pub_props.UserProperty = ("k", "v")
    client.publish("a/b", b"request", qos=1, properties=pub_props)
    publish = peer.next()
    assert isinstance(publish, p.Publish) and publish.packet_id is not None
    assert publish == p.Publish("a/b", b"request", 1, False, False, publish.packet_id, p.Properties(
        payload_format_indicator=1, message_expiry_interval=60, content_type="text/plain",
        response_topic="replies/paho5", correlation_data=b"\x00id", topic_alias=2, user_properties=(("k", "v"),)))
    peer.send(p.PubAck(publish.packet_id, 0x10, p.Properties(reason_string="nobody listens")))

    peer.send(p.Publish("a/c", b"response", 1, False, False, 1, p.Properties(
        subscription_identifiers=(9, 12), correlation_data=b"\x00id", message_expiry_interval=59,
        user_properties=(("k", "v"), ("k", "w")))))
    assert events["message"].wait(TIMEOUT)
    message = seen["message"][2]
    assert (message.topic, message.payload, message.qos) == ("a/c", b"response", 1)
    assert message.properties.SubscriptionIdentifier == [9, 12]
    assert message.properties.CorrelationData == b"\x00id" and message.properties.MessageExpiryInterval == 59
    assert message.properties.UserProperty == [("k", "v"), ("k", "w")]
    assert peer.next() == p.PubAck(1)

    peer.send(p.Disconnect(0x8B, p.Properties(reason_string="shutting down")))
    assert events["disconnect"].wait(TIMEOUT)
    assert seen["disconnect"][3].value == 0x8B

"""What the MQTT codec tests share: the packets each role sends, golden
openings, Hypothesis strategies for every packet type, and helpers that drive
a connection (connected, decode, encode, refused)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from gateway.mqtt import codec
from gateway.mqtt.codec import packets as p
from gateway.mqtt.codec import MqttConnection, RemoteProtocolError, Role, State

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
OTHER = {Role.CLIENT: Role.SERVER, Role.SERVER: Role.CLIENT}
CONNECT_WIRE = b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01c"
CONNACK_WIRE = b"\x20\x02\x00\x00"

FROM_CLIENT: list[p.Packet] = [
    p.Publish("a/b", b"payload"),
    p.Publish("a/b", b"\xff\x00binary", qos=1, retain=True, packet_id=7),
    p.Publish("a/b", b"", qos=2, dup=True, packet_id=65535),
    p.Publish("\u00e9t\u00e9/\U0001f600", b"x" * 200, qos=1, packet_id=1),
    p.PubAck(1), p.PubRec(2), p.PubRel(3), p.PubComp(4),
    p.Subscribe(5, [("a/+", 0), ("b/#", 2), ("", 1), ("a#", 1)]),  # bad filters are the session's call
    p.Unsubscribe(6, ["a/+", "b/#"]),
    p.PingReq(),
    p.Disconnect(),
]
FROM_SERVER: list[p.Packet] = [
    p.Publish("x", b"y" * 300, qos=1, packet_id=9),
    p.Publish("x/y", b""),
    p.PubAck(1), p.PubRec(2), p.PubRel(3), p.PubComp(4),
    p.SubAck(5, [0, 1, 2, p.SUBACK_FAILURE]), p.UnsubAck(6), p.PingResp(),
]
CONNECTS = [
    p.Connect("dev-1"),
    p.Connect(""),
    p.Connect("dev-2", clean_session=False, keep_alive=65535, username="u", password=b"\x00pw",
              will=p.Will("wills/dev-2", b"bye", 1, True)),
    p.Connect("dev-3", username="", will=p.Will("w", b"", 2, False)),
    p.Connect("old", protocol_name="MQIsdp", protocol_level=3),
]
CONNACKS = [p.ConnAck(True, p.ACCEPTED), p.ConnAck(False, p.ACCEPTED), p.ConnAck(False, p.NOT_AUTHORIZED)]


def connected(role: Role, **kwargs: int) -> MqttConnection:
    """A connection past its opening packet."""
    conn = MqttConnection(role, **kwargs)
    conn.receive_data(CONNECT_WIRE if role is Role.SERVER else CONNACK_WIRE)
    assert len(list(conn.events())) == 1
    assert conn.state is State.CONNECTED
    return conn


def decode(role: Role, chunks: list[bytes], *, opened: bool = True, **kwargs: int) -> list[p.Packet]:
    """Feed ``chunks`` one by one, collecting packets after each; check nothing is left over."""
    conn = connected(role, **kwargs) if opened else MqttConnection(role, **kwargs)
    out: list[p.Packet] = []
    for chunk in chunks:
        conn.receive_data(chunk)
        out.extend(conn.events())
    assert conn.buffered_bytes == 0
    assert not conn.mid_packet
    return out


def encode(role: Role, packets: list[p.Packet]) -> bytes:
    conn = MqttConnection(role)
    return b"".join(conn.send(packet) for packet in packets)


def refused(role: Role, wire: bytes, *, opened: bool = True) -> RemoteProtocolError:
    with pytest.raises(RemoteProtocolError) as caught:
        decode(role, [wire], opened=opened)
    return caught.value


# Text from a fixed alphabet: the characters the rules care about and UTF-8 of
# every length (all of Unicode costs more per example and reaches no other branch).
TOPIC_CHARS = ["a", "b", "/", "$", " ", "\x01", "\x7f", "\u00e9", "\u2028", "\ufeff", "\U0001f600"]
text = st.text(alphabet=TOPIC_CHARS + ["+", "#"], max_size=12)
topic_names = st.text(alphabet=TOPIC_CHARS, min_size=1, max_size=12)
payloads = st.binary(max_size=300)
packet_ids = st.integers(1, 65535)
qos_st = st.integers(0, 2)


@st.composite
def publishes(draw: st.DrawFn) -> p.Publish:
    qos = draw(qos_st)
    return p.Publish(draw(topic_names), draw(payloads), qos, draw(st.booleans()),
                     draw(st.booleans()) if qos else False, draw(packet_ids) if qos else None)


wills = st.builds(p.Will, topic_names, payloads, qos_st, st.booleans())


@st.composite
def connects(draw: st.DrawFn) -> p.Connect:
    username = draw(st.none() | text)
    password = None if username is None else draw(st.none() | payloads)
    name, level = draw(st.sampled_from(sorted(codec.SUPPORTED_PROTOCOLS)))
    return p.Connect(draw(text), draw(st.booleans()), draw(st.integers(0, 65535)), username, password,
                     draw(st.none() | wills), name, level)


acks = st.one_of(*(st.builds(cls, packet_ids) for cls in (p.PubAck, p.PubRec, p.PubRel, p.PubComp)))
client_packets = st.one_of(
    publishes(), acks,
    st.builds(p.Subscribe, packet_ids, st.lists(st.tuples(text, qos_st), min_size=1, max_size=5)),
    st.builds(p.Unsubscribe, packet_ids, st.lists(text, min_size=1, max_size=5)),
    st.builds(p.PingReq), st.builds(p.Disconnect),
)
server_packets = st.one_of(
    publishes(), acks, st.builds(p.UnsubAck, packet_ids), st.builds(p.PingResp),
    st.builds(p.SubAck, packet_ids, st.lists(st.sampled_from([0, 1, 2, 0x80]), min_size=1, max_size=5)),
)
SENDS = {Role.CLIENT: client_packets, Role.SERVER: server_packets}

"""The MQTT 3.1.1 codec: round trips, every split, each malformation, fuzz."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.mqtt import packets as p
from gateway.mqtt.codec import (
    LocalProtocolError,
    MqttConnection,
    RemoteProtocolError,
    Role,
    validate_topic_filter,
    validate_topic_name,
)

FROM_CLIENT = [
    p.Connect("dev-1"),
    p.Connect("dev-2", clean_session=False, keep_alive=60, username="u", password=b"\x00pw",
              will=p.Will("wills/dev-2", b"bye", 1, True)),
    p.Publish("a/b", b"payload"),
    p.Publish("a/b", b"\xff\x00binary", qos=1, retain=True, packet_id=7),
    p.Publish("a/b", b"", qos=2, dup=True, packet_id=65535),
    p.PubAck(1), p.PubRec(2), p.PubRel(3), p.PubComp(4),
    p.Subscribe(5, [("a/+", 0), ("b/#", 2)]),
    p.Unsubscribe(6, ["a/+", "b/#"]),
    p.PingReq(),
    p.Disconnect(),
]
FROM_SERVER = [
    p.ConnAck(True, 0), p.ConnAck(False, p.NOT_AUTHORIZED),
    p.Publish("x", b"y" * 300, qos=1, packet_id=9),
    p.PubAck(1), p.PubRec(2), p.PubRel(3), p.PubComp(4),
    p.SubAck(5, [0, 1, 2, p.SUBACK_FAILURE]), p.UnsubAck(6), p.PingResp(),
]


def decode(role: Role, chunks: list[bytes], connected: bool = True) -> list[p.Packet]:
    conn = MqttConnection(role)
    if role is Role.SERVER and connected:
        conn.receive_data(MqttConnection(Role.CLIENT).send(p.Connect("setup")))
        list(conn.events())
    out = []
    for chunk in chunks:
        conn.receive_data(chunk)
        out.extend(conn.events())
    return out


def test_every_client_packet_round_trips_through_the_server() -> None:
    client = MqttConnection(Role.CLIENT)
    wire = [client.send(packet) for packet in FROM_CLIENT]
    server = MqttConnection(Role.SERVER)
    server.receive_data(b"".join(wire[:1]))
    got = list(server.events())
    with pytest.raises(RemoteProtocolError):  # the second CONNECT in the list
        server.receive_data(wire[1])
        list(server.events())
    assert got == FROM_CLIENT[:1]
    assert decode(Role.SERVER, [b"".join(wire[2:])]) == FROM_CLIENT[2:]


def test_a_connect_with_will_and_credentials_round_trips() -> None:
    wire = MqttConnection(Role.CLIENT).send(FROM_CLIENT[1])
    assert decode(Role.SERVER, [wire], connected=False) == [FROM_CLIENT[1]]


def test_every_server_packet_round_trips_through_a_client() -> None:
    server = MqttConnection(Role.SERVER)
    wire = b"".join(server.send(packet) for packet in FROM_SERVER)
    assert decode(Role.CLIENT, [wire]) == FROM_SERVER


def test_packets_split_at_every_byte_decode_the_same() -> None:
    client = MqttConnection(Role.CLIENT)
    wire = b"".join(client.send(packet) for packet in FROM_CLIENT[2:])
    for cut in range(1, len(wire)):
        assert decode(Role.SERVER, [wire[:cut], wire[cut:]]) == FROM_CLIENT[2:]
    assert decode(Role.SERVER, [bytes([b]) for b in wire]) == FROM_CLIENT[2:]


@pytest.mark.parametrize(
    ("length", "encoded"),
    [(0, b"\x00"), (127, b"\x7f"), (128, b"\x80\x01"), (16383, b"\xff\x7f"), (16384, b"\x80\x80\x01"),
     (2097151, b"\xff\xff\x7f"), (2097152, b"\x80\x80\x80\x01"), (268435455, b"\xff\xff\xff\x7f")],
)
def test_remaining_length_encoding_edges(length: int, encoded: bytes) -> None:
    wire = MqttConnection(Role.CLIENT).send(p.Publish("t", b"x" * (length - 3))) if 3 <= length <= 20000 else None
    if wire is not None:
        assert wire[1 : 1 + len(encoded)] == encoded
    # Decoding the header alone: complete lengths wait for the body, never fail.
    conn = MqttConnection(Role.SERVER)
    conn.receive_data(MqttConnection(Role.CLIENT).send(p.Connect("c")))
    list(conn.events())
    conn.receive_data(b"\x30" + encoded)
    if length == 0:
        with pytest.raises(RemoteProtocolError):  # a PUBLISH needs at least a topic
            list(conn.events())
    else:
        assert list(conn.events()) == []


def test_a_five_byte_remaining_length_is_malformed() -> None:
    with pytest.raises(RemoteProtocolError):
        decode(Role.SERVER, [b"\x30\xff\xff\xff\xff\x01"])


def test_the_size_limit_applies_before_the_body_arrives() -> None:
    conn = MqttConnection(Role.SERVER, max_packet_bytes=100)
    conn.receive_data(MqttConnection(Role.CLIENT).send(p.Connect("c")))
    list(conn.events())
    conn.receive_data(b"\x30\xc8\x01")  # declares 200 bytes, sends none
    with pytest.raises(RemoteProtocolError, match="over the limit"):
        list(conn.events())


def raw_connect(name: bytes = b"MQTT", level: int = 4, flags: int = 2, rest: bytes = b"\x00\x01c") -> bytes:
    body = len(name).to_bytes(2, "big") + name + bytes((level, flags)) + b"\x00\x3c" + rest
    return b"\x10" + bytes((len(body),)) + body


@pytest.mark.parametrize(
    ("wire", "connected", "return_code"),
    [
        (raw_connect(level=5), False, p.UNACCEPTABLE_PROTOCOL_VERSION),  # [MQTT-3.1.2-2]
        (raw_connect(level=3), False, p.UNACCEPTABLE_PROTOCOL_VERSION),
        (raw_connect(name=b"MQTX"), False, None),  # [MQTT-3.1.2-1]
        (raw_connect(flags=3), False, None),  # reserved flag [MQTT-3.1.2-3]
        (raw_connect(flags=2 | 0x08), False, None),  # will QoS without will [MQTT-3.1.2-13]
        (raw_connect(flags=2 | 0x40), False, None),  # password without user [MQTT-3.1.2-22]
        (b"\x30\x03\x00\x01t", False, None),  # first packet not CONNECT [MQTT-3.1.0-1]
        (raw_connect(), True, None),  # a second CONNECT [MQTT-3.1.0-2]
        (b"\x36\x05\x00\x01t\x00\x01", True, None),  # PUBLISH QoS 3 [MQTT-3.3.1-4]
        (b"\x38\x03\x00\x01t", True, None),  # DUP on QoS 0 [MQTT-3.3.1-2]
        (b"\x32\x05\x00\x01t\x00\x00", True, None),  # packet id 0 [MQTT-2.3.1-1]
        (b"\x30\x05\x00\x03a/+", True, None),  # wildcard in topic name [MQTT-3.3.2-2]
        (b"\x30\x02\x00\x00", True, None),  # empty topic name [MQTT-4.7.3-1]
        (b"\x30\x05\x00\x03a\x00b", True, None),  # U+0000 [MQTT-1.5.3-2]
        (b"\x30\x04\x00\x02\xc3\x28", True, None),  # invalid UTF-8 [MQTT-1.5.3-1]
        (b"\x41\x02\x00\x01", True, None),  # PUBACK with a reserved flag [MQTT-2.2.2-2]
        (b"\x60\x02\x00\x01", True, None),  # PUBREL without its 0b0010 [MQTT-3.6.1-1]
        (b"\x80\x06\x00\x01\x00\x01a\x00", True, None),  # SUBSCRIBE flags [MQTT-3.8.1-1]
        (b"\x82\x02\x00\x01", True, None),  # SUBSCRIBE without filters [MQTT-3.8.3-3]
        (b"\x82\x06\x00\x01\x00\x01a\x03", True, None),  # requested QoS 3 [MQTT-3.8.3-4]
        (b"\xa2\x02\x00\x01", True, None),  # UNSUBSCRIBE without filters [MQTT-3.10.3-2]
        (b"\xc0\x01\x00", True, None),  # PINGREQ with a body
        (b"\x20\x02\x00\x00", True, None),  # a client may not send CONNACK
        (b"\x00\x00", True, None),  # packet type 0 is reserved
        (b"\xf0\x00", True, None),  # packet type 15 is reserved
    ],
)
def test_malformed_packets_are_refused(wire: bytes, connected: bool, return_code: int | None) -> None:
    with pytest.raises(RemoteProtocolError) as caught:
        decode(Role.SERVER, [wire], connected=connected)
    assert caught.value.return_code == return_code


def test_a_server_cannot_send_a_client_packet() -> None:
    with pytest.raises(LocalProtocolError):
        MqttConnection(Role.SERVER).send(p.Subscribe(1, [("a", 0)]))
    with pytest.raises(LocalProtocolError):
        MqttConnection(Role.SERVER).send(p.Publish("a", b"", qos=1))  # no packet id


@pytest.mark.parametrize(
    ("name", "ok"), [("a/b", True), ("/", True), ("$SYS/x", True), ("", False), ("a/+", False), ("#", False), ("a\x00", False)]
)
def test_topic_names(name: str, ok: bool) -> None:
    assert (validate_topic_name(name) is None) is ok


@pytest.mark.parametrize(
    ("topic_filter", "ok"),
    [("#", True), ("a/#", True), ("+", True), ("+/+/#", True), ("/", True), ("a/#/b", False), ("a#", False),
     ("a+", False), ("a/b+/c", False), ("", False)],
)
def test_topic_filters(topic_filter: str, ok: bool) -> None:
    assert (validate_topic_filter(topic_filter) is None) is ok


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(min_value=1, max_value=40), max_size=10), st.booleans())
def test_arbitrary_bytes_only_ever_raise_the_protocol_error(data: bytes, cuts: list[int], connected: bool) -> None:
    chunks = []
    rest = data
    for cut in cuts:
        chunks.append(rest[:cut])
        rest = rest[cut:]
    chunks.append(rest)
    try:
        decode(Role.SERVER, [c for c in chunks if c], connected=connected)
    except RemoteProtocolError:
        pass


@settings(max_examples=200, deadline=None)
@given(
    st.text(alphabet=st.characters(blacklist_characters="+#\x00", blacklist_categories=("Cs",)), min_size=1, max_size=50),
    st.binary(max_size=500), st.integers(0, 2), st.booleans(),
)
def test_any_valid_publish_round_trips(topic: str, payload: bytes, qos: int, retain: bool) -> None:
    packet = p.Publish(topic, payload, qos, retain, False, 1 if qos else None)
    assert decode(Role.SERVER, [MqttConnection(Role.CLIENT).send(packet)]) == [packet]

"""What the MQTT 3.1.1 codec refuses: each malformation with the spec statement
it breaks, refusals decided from the fixed header before the body arrives,
sticky errors, packet order, what a role may not send, and fuzz properties
that arbitrary or mutated bytes raise nothing but RemoteProtocolError.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.mqtt.codec import packets as p
from gateway.mqtt.codec import LocalProtocolError, MqttConnection, RemoteProtocolError, Role, State
from tests.support.mqtt_codec_helpers import (
    CONNACK_WIRE,
    OTHER,
    SENDS,
    connected,
    connects,
    encode,
    refused,
)


# -- malformations, each with its spec statement ------------------------------------


def raw_connect(name: bytes = b"MQTT", level: int = 4, flags: int = 2, rest: bytes = b"\x00\x01c") -> bytes:
    body = len(name).to_bytes(2, "big") + name + bytes((level, flags)) + b"\x00\x3c" + rest
    return b"\x10" + bytes((len(body),)) + body


@pytest.mark.parametrize(
    ("wire", "return_code"),
    [
        (raw_connect(level=6), p.UNACCEPTABLE_PROTOCOL_VERSION),  # [MQTT-3.1.2-2] (5 is MQTT 5.0, spoken)
        (raw_connect(level=3), p.UNACCEPTABLE_PROTOCOL_VERSION),  # "MQTT" is level 4 [MQTT-3.1.2-2]
        (raw_connect(name=b"MQIsdp", level=4), p.UNACCEPTABLE_PROTOCOL_VERSION),
        (raw_connect(name=b"MQTX"), None),  # [MQTT-3.1.2-1]
        (raw_connect(name=b"\xff"), None),  # [MQTT-1.5.3-1]
        (raw_connect(flags=3), None),  # reserved flag [MQTT-3.1.2-3]
        (raw_connect(flags=2 | 0x08), None),  # will QoS without will [MQTT-3.1.2-13]
        (raw_connect(flags=2 | 0x20), None),  # will retain without will [MQTT-3.1.2-15]
        (raw_connect(flags=2 | 0x04 | 0x18, rest=b"\x00\x01c\x00\x01t\x00\x00"), None),  # will QoS 3 [MQTT-3.1.2-14]
        (raw_connect(flags=2 | 0x04), None),  # will flag without will topic [MQTT-3.1.2-9]
        (raw_connect(flags=2 | 0x04, rest=b"\x00\x01c\x00\x01t"), None),  # ... or will message [MQTT-3.1.2-9]
        (raw_connect(flags=2 | 0x04, rest=b"\x00\x01c\x00\x01#\x00\x00"), None),  # will topic wildcard [MQTT-3.3.2-2]
        (raw_connect(flags=2 | 0x40, rest=b"\x00\x01c\x00\x01p"), None),  # password without user [MQTT-3.1.2-22]
        (raw_connect(flags=2 | 0x80), None),  # user flag without user name [MQTT-3.1.2-19]
        (raw_connect(flags=2 | 0xC0, rest=b"\x00\x01c\x00\x01u"), None),  # no password [MQTT-3.1.2-21]
        (raw_connect(rest=b"\x00\x01c\x00\x01u"), None),  # unannounced field [MQTT-3.1.2-18]
        (raw_connect(rest=b"\x00\x02c"), None),  # a string past the packet end (§1.5.3)
        (raw_connect(rest=b"\x00\x01\x00"), None),  # U+0000 in the client id [MQTT-1.5.3-2]
        (raw_connect(rest=b""), None),  # no client id [MQTT-3.1.3-3]
        (b"\x10\x03\x00\x04M", None),  # truncated protocol name
        (b"\x10\x06\x00\x04MQTT", None),  # truncated before the level
        (b"\x11" + raw_connect()[1:], None),  # CONNECT with fixed-header flags [MQTT-2.2.2-2]
        (b"\x30\x03\x00\x01t", None),  # first packet not CONNECT [MQTT-3.1.0-1]
        (b"\xc0\x00", None),  # ... not even PINGREQ [MQTT-3.1.0-1]
    ],
)
def test_malformed_openings_are_refused(wire: bytes, return_code: int | None) -> None:
    assert refused(Role.SERVER, wire, opened=False).return_code == return_code


@pytest.mark.parametrize(
    "wire",
    [
        raw_connect(),  # a second CONNECT [MQTT-3.1.0-2]
        b"\x36\x05\x00\x01t\x00\x01",  # PUBLISH QoS 3 [MQTT-3.3.1-4]
        b"\x38\x03\x00\x01t",  # DUP on QoS 0 [MQTT-3.3.1-2]
        b"\x32\x05\x00\x01t\x00\x00",  # packet id 0 [MQTT-2.3.1-1]
        b"\x32\x04\x00\x01t\x00",  # packet id cut short [MQTT-2.3.1-1]
        b"\x30\x05\x00\x03a/+",  # wildcard in topic name [MQTT-3.3.2-2]
        b"\x30\x03\x00\x01#",  # wildcard in topic name [MQTT-3.3.2-2]
        b"\x30\x02\x00\x00",  # empty topic name [MQTT-4.7.3-1]
        b"\x30\x01\x00",  # no topic name [MQTT-3.3.2-1]
        b"\x30\x03\x00\x05a",  # topic past the packet end (§1.5.3)
        b"\x30\x05\x00\x03a\x00b",  # U+0000 [MQTT-1.5.3-2]
        b"\x30\x04\x00\x02\xc3\x28",  # invalid UTF-8 [MQTT-1.5.3-1]
        b"\x30\x05\x00\x03\xed\xa0\x80",  # an encoded surrogate [MQTT-1.5.3-1]
        b"\x30\x04\x00\x02\xc0\x80",  # overlong NUL [MQTT-1.5.3-1]
        b"\x41\x02\x00\x01",  # PUBACK with a reserved flag [MQTT-2.2.2-2]
        b"\x40\x02\x00\x00",  # PUBACK packet id 0 [MQTT-2.3.1-1]
        b"\x40\x03\x00\x01\x00",  # PUBACK too long (§3.4.1)
        b"\x50\x01\x00",  # PUBREC too short (§3.5.1)
        b"\x60\x02\x00\x01",  # PUBREL without its 0b0010 [MQTT-3.6.1-1]
        b"\x72\x02\x00\x01",  # PUBCOMP with flags [MQTT-2.2.2-2]
        b"\x80\x06\x00\x01\x00\x01a\x00",  # SUBSCRIBE flags [MQTT-3.8.1-1]
        b"\x82\x02\x00\x01",  # SUBSCRIBE without filters [MQTT-3.8.3-3]
        b"\x82\x06\x00\x00\x00\x01a\x00",  # SUBSCRIBE packet id 0 [MQTT-2.3.1-1]
        b"\x82\x06\x00\x01\x00\x01a\x03",  # requested QoS 3 [MQTT-3.8.3-4]
        b"\x82\x06\x00\x01\x00\x01a\x04",  # reserved option bits [MQTT-3.8.3-4]
        b"\x82\x05\x00\x01\x00\x01a",  # filter without its QoS byte
        b"\x82\x06\x00\x01\x00\x01\xff\x00",  # filter not UTF-8 [MQTT-1.5.3-1]
        b"\xa0\x05\x00\x01\x00\x01a",  # UNSUBSCRIBE flags [MQTT-3.10.1-1]
        b"\xa2\x02\x00\x01",  # UNSUBSCRIBE without filters [MQTT-3.10.3-2]
        b"\xa2\x05\x00\x01\x00\x01\x00",  # U+0000 in a filter [MQTT-1.5.3-2]
        b"\xc0\x01\x00",  # PINGREQ with a body (§3.12.1)
        b"\xc1\x00",  # PINGREQ with flags [MQTT-2.2.2-2]
        b"\xe1\x00",  # DISCONNECT with flags [MQTT-3.14.1-1]
        b"\xe0\x01\x00",  # DISCONNECT with a body (§3.14.1)
        b"\x20\x02\x00\x00",  # a client may not send CONNACK (§2.2.1)
        b"\x90\x03\x00\x01\x00",  # ... nor SUBACK
        b"\xb0\x02\x00\x01",  # ... nor UNSUBACK
        b"\xd0\x00",  # ... nor PINGRESP
        b"\x00\x00",  # packet type 0 is reserved (§2.2.1)
        b"\xf0\x00",  # packet type 15 is reserved (§2.2.1)
    ],
)
def test_malformed_client_packets_are_refused(wire: bytes) -> None:
    assert refused(Role.SERVER, wire).return_code is None


@pytest.mark.parametrize(
    ("wire", "opened"),
    [
        (b"\x40\x02\x00\x01", False),  # first packet not CONNACK [MQTT-3.2.0-1]
        (CONNACK_WIRE, True),  # a second CONNACK [MQTT-3.2.0-1]
        (b"\x20\x02\x02\x00", False),  # reserved CONNACK flag (§3.2.2.1)
        (b"\x20\x02\x01\x05", False),  # session present on a refusal [MQTT-3.2.2-4]
        (b"\x20\x02\x00\x06", False),  # reserved return code (§3.2.2.3)
        (b"\x20\x03\x00\x00\x00", False),  # CONNACK too long (§3.2.1)
        (b"\x90\x02\x00\x01", True),  # SUBACK without codes [MQTT-3.8.4-5]
        (b"\x90\x03\x00\x01\x03", True),  # reserved SUBACK code [MQTT-3.9.3-2]
        (b"\x90\x03\x00\x00\x00", True),  # SUBACK packet id 0 [MQTT-2.3.1-1]
        (b"\xd0\x01\x00", True),  # PINGRESP with a body (§3.13.1)
        (b"\x10\x00", True),  # a server may not send CONNECT (§2.2.1)
        (b"\x82\x02\x00\x01", True),  # ... nor SUBSCRIBE
        (b"\xc0\x00", True),  # ... nor PINGREQ
    ],
)
def test_malformed_server_packets_are_refused(wire: bytes, opened: bool) -> None:
    refused(Role.CLIENT, wire, opened=opened)


def test_refusals_come_from_the_fixed_header_before_the_body() -> None:
    # A bad first byte or an out-of-order type fails without waiting for the
    # body (a TLS hello, an HTTP request, a second CONNECT of 200 MB...).
    for wire, opened in [(b"\x36", True), (b"\x16\x03\x01\x02\x00", True), (b"GET / HTTP/1.1", True),
                         (b"\x30\xff\xff\x7f", False), (b"\x10\xff\xff\x7f", True)]:
        conn = connected(Role.SERVER) if opened else MqttConnection(Role.SERVER)
        conn.receive_data(wire)
        with pytest.raises(RemoteProtocolError):
            list(conn.events())


def test_an_error_is_sticky_and_keeps_its_return_code() -> None:
    conn = MqttConnection(Role.SERVER)
    conn.receive_data(raw_connect(level=6) + b"\xc0\x00")
    with pytest.raises(RemoteProtocolError) as first:
        list(conn.events())
    assert conn.state is State.ERROR
    with pytest.raises(RemoteProtocolError) as again:
        list(conn.events())
    assert again.value.message == first.value.message and again.value.return_code == p.UNACCEPTABLE_PROTOCOL_VERSION
    # The session can still answer before it closes.
    assert conn.send(p.ConnAck(False, p.UNACCEPTABLE_PROTOCOL_VERSION)) == b"\x20\x02\x00\x01"


def test_mqtt_3_1_is_accepted_and_its_connack_has_no_session_present() -> None:
    conn = MqttConnection(Role.SERVER)
    conn.receive_data(raw_connect(name=b"MQIsdp", level=3))
    (connect,) = conn.events()
    assert connect == p.Connect("c", keep_alive=60, protocol_name="MQIsdp", protocol_level=3)
    assert conn.protocol_level == 3
    assert conn.send(p.ConnAck(True, p.ACCEPTED)) == b"\x20\x02\x00\x00"  # reserved in 3.1


# -- what may be sent ------------------------------------------------------------


@pytest.mark.parametrize(
    ("role", "packet"),
    [
        (Role.SERVER, p.Subscribe(1, [("a", 0)])),  # a client packet (§2.2.1)
        (Role.SERVER, p.Connect("c")),
        (Role.SERVER, p.PingReq()),
        (Role.CLIENT, p.ConnAck(False, 0)),
        (Role.CLIENT, p.SubAck(1, [0])),
        (Role.CLIENT, p.PingResp()),
        (Role.SERVER, p.Publish("a", b"", qos=1)),  # no packet id [MQTT-2.3.1-1]
        (Role.SERVER, p.Publish("a", b"", qos=1, packet_id=0)),
        (Role.SERVER, p.Publish("a", b"", qos=1, packet_id=65536)),
        (Role.SERVER, p.Publish("a", b"", packet_id=1)),  # QoS 0 with an id [MQTT-2.3.1-5]
        (Role.SERVER, p.Publish("a", b"", dup=True)),  # [MQTT-3.3.1-2]
        (Role.SERVER, p.Publish("a", b"", qos=3, packet_id=1)),  # [MQTT-3.3.1-4]
        (Role.SERVER, p.Publish("a/+", b"")),  # [MQTT-3.3.2-2]
        (Role.SERVER, p.Publish("", b"")),  # [MQTT-4.7.3-1]
        (Role.SERVER, p.Publish("a\x00", b"")),  # [MQTT-1.5.3-2]
        (Role.SERVER, p.Publish("\ud800", b"")),  # [MQTT-1.5.3-1]
        (Role.SERVER, p.Publish("a" * 65536, b"", qos=1, packet_id=1)),  # §1.5.3
        (Role.SERVER, p.PubAck(0)),  # [MQTT-2.3.1-1]
        (Role.SERVER, p.SubAck(1, [])),  # [MQTT-3.9.3-2]
        (Role.SERVER, p.SubAck(1, [3])),  # [MQTT-3.9.3-2]
        (Role.SERVER, p.ConnAck(True, p.NOT_AUTHORIZED)),  # [MQTT-3.2.2-4]
        (Role.SERVER, p.ConnAck(False, 6)),  # §3.2.2.3
        (Role.CLIENT, p.Subscribe(1, [])),  # [MQTT-3.8.3-3]
        (Role.CLIENT, p.Subscribe(1, [("a", 3)])),  # [MQTT-3.8.3-4]
        (Role.CLIENT, p.Unsubscribe(1, [])),  # [MQTT-3.10.3-2]
        (Role.CLIENT, p.Unsubscribe(1, ["\x00"])),  # [MQTT-1.5.3-2]
        (Role.CLIENT, p.Unsubscribe(1, ["\udfff"])),  # [MQTT-1.5.3-1]
        (Role.CLIENT, p.Subscribe(1, [("a" * 65536, 0)])),  # §1.5.3
        (Role.CLIENT, p.Connect("c", password=b"p")),  # [MQTT-3.1.2-22]
        (Role.CLIENT, p.Connect("c", keep_alive=65536)),  # §3.1.2.10
        (Role.CLIENT, p.Connect("c", will=p.Will("t", b"", 3, False))),  # [MQTT-3.1.2-14]
        (Role.CLIENT, p.Connect("c", will=p.Will("t", b"x" * 65536, 0, False))),  # §3.1.3.3
        (Role.CLIENT, "not a packet"),
    ],
)
def test_what_cannot_be_sent_raises_local_protocol_error(role: Role, packet: p.Packet) -> None:
    with pytest.raises(LocalProtocolError):
        MqttConnection(role).send(packet)


# -- fuzz ------------------------------------------------------------------------------


def feed_all(role: Role, opened: bool, chunks: list[bytes]) -> None:
    conn = connected(role) if opened else MqttConnection(role)
    try:
        for chunk in chunks:
            conn.receive_data(chunk)
            for _ in conn.events():
                pass
    except RemoteProtocolError:
        assert conn.state is State.ERROR


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    chunks = []
    for cut in cuts:
        chunks.append(data[:cut])
        data = data[cut:]
    return [c for c in [*chunks, data] if c]


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(1, 40), max_size=10), st.sampled_from(list(Role)),
       st.booleans())
def test_arbitrary_bytes_only_ever_raise_the_remote_protocol_error(
    data: bytes, cuts: list[int], role: Role, opened: bool
) -> None:
    feed_all(role, opened, chunked(data, cuts))


@settings(max_examples=500, deadline=None)
@given(st.data(), st.sampled_from(list(Role)))
def test_mutated_valid_packets_only_ever_raise_the_remote_protocol_error(data: st.DataObject, role: Role) -> None:
    # Mutating real packets reaches the decoders far more often than noise does.
    packets = data.draw(st.lists(SENDS[role], min_size=1, max_size=4))
    wire = bytearray(encode(role, packets))
    opening = b""
    if role is Role.CLIENT and data.draw(st.booleans()):
        opening = MqttConnection(Role.CLIENT).send(data.draw(connects()))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(wire) - 1))
        wire[i] = data.draw(st.integers(0, 255))
    cuts = data.draw(st.lists(st.integers(1, 40), max_size=6))
    feed_all(OTHER[role], not opening, chunked(opening + bytes(wire), cuts))


# -- MQTT 3.1 (level 3): a resend may carry DUP -------------------------------------


@pytest.mark.parametrize("first", [0x6A, 0x8A, 0xAA], ids=["PUBREL", "SUBSCRIBE", "UNSUBSCRIBE"])
def test_level_3_takes_dup_where_3_1_1_fixed_the_flags(first: int) -> None:
    # 3.1 sets DUP on a resent PUBREL, SUBSCRIBE or UNSUBSCRIBE; 3.1.1 fixed
    # their flags at 0b0010 [MQTT-2.2.2-2], so level 4 still refuses them.
    body = {0x6A: b"\x00\x05", 0x8A: b"\x00\x05\x00\x01a\x01", 0xAA: b"\x00\x05\x00\x01a"}[first]
    wire = bytes((first, len(body))) + body
    old = MqttConnection(Role.SERVER)
    old.receive_data(raw_connect(b"MQIsdp", 3))
    assert len(list(old.events())) == 1
    old.receive_data(wire)
    (packet,) = list(old.events())
    assert getattr(packet, "packet_id") == 5
    new = MqttConnection(Role.SERVER)
    new.receive_data(raw_connect())
    assert len(list(new.events())) == 1
    new.receive_data(wire)
    with pytest.raises(RemoteProtocolError, match="fixed-header flags"):
        list(new.events())

"""The MQTT 3.1.1 codec through its own door: bytes in, packets out; packets in, bytes out.

Golden vectors from the specification, Hypothesis round trips of every packet
type in both roles, the same bytes fed whole, byte by byte and split at every
index (h11's ``tr()``), each malformation with the spec statement it breaks,
remaining-length edges, the size limit applied before the body arrives, packet
order, and a fuzz property that arbitrary bytes raise nothing but
RemoteProtocolError.
"""

from __future__ import annotations


import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.mqtt import codec
from gateway.mqtt import packets as p
from gateway.mqtt.wire import remaining_length
from gateway.mqtt.codec import (
    LocalProtocolError,
    MqttConnection,
    RemoteProtocolError,
    Role,
    State,
    validate_topic_filter,
    validate_topic_name,
)
from tests.helpers import splits

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


# -- golden vectors --------------------------------------------------------------


@pytest.mark.parametrize(
    ("packet", "wire"),
    [
        # §3.1.2.10 and Figure 3.6: protocol name, level 4, flags, keep alive 10.
        (p.Connect("", clean_session=False, keep_alive=10), b"\x10\x0c\x00\x04MQTT\x04\x00\x00\x0a\x00\x00"),
        (p.Connect("c", keep_alive=60), CONNECT_WIRE),
        (p.Connect("c", username="u", password=b"p", will=p.Will("t", b"m", 1, True)),
         b"\x10\x19\x00\x04MQTT\x04\xee\x00\x00\x00\x01c\x00\x01t\x00\x01m\x00\x01u\x00\x01p"),
        # §3.3.2.3, Figure 3.11: topic "a/b", packet identifier 10.
        (p.Publish("a/b", b"", qos=1, packet_id=10), b"\x32\x07\x00\x03a/b\x00\x0a"),
        (p.Publish("a/b", b"hi", retain=True), b"\x31\x07\x00\x03a/bhi"),
        (p.Publish("a", b"", qos=2, dup=True, packet_id=1), b"\x3c\x05\x00\x01a\x00\x01"),
        (p.PubAck(10), b"\x40\x02\x00\x0a"),
        (p.PubRel(10), b"\x62\x02\x00\x0a"),
        # §3.8.3.1, Figure 3.23: "a/b" QoS 1 and "c/d" QoS 2, packet identifier 10.
        (p.Subscribe(10, [("a/b", 1), ("c/d", 2)]), b"\x82\x0e\x00\x0a\x00\x03a/b\x01\x00\x03c/d\x02"),
        (p.Unsubscribe(10, ["a/b", "c/d"]), b"\xa2\x0c\x00\x0a\x00\x03a/b\x00\x03c/d"),
        (p.PingReq(), b"\xc0\x00"),
        (p.Disconnect(), b"\xe0\x00"),
    ],
)
def test_golden_client_packets(packet: p.Packet, wire: bytes) -> None:
    assert MqttConnection(Role.CLIENT).send(packet) == wire
    assert decode(Role.SERVER, [wire], opened=not isinstance(packet, p.Connect)) == [packet]


@pytest.mark.parametrize(
    ("packet", "wire"),
    [
        (p.ConnAck(True, 0), b"\x20\x02\x01\x00"),
        (p.ConnAck(False, p.UNACCEPTABLE_PROTOCOL_VERSION), b"\x20\x02\x00\x01"),
        # §3.9.3, Figure 3.26: QoS 0, QoS 2 and failure.
        (p.SubAck(10, [0, 2, 0x80]), b"\x90\x05\x00\x0a\x00\x02\x80"),
        (p.UnsubAck(10), b"\xb0\x02\x00\x0a"),
        (p.PubComp(65535), b"\x70\x02\xff\xff"),
        (p.PingResp(), b"\xd0\x00"),
    ],
)
def test_golden_server_packets(packet: p.Packet, wire: bytes) -> None:
    assert MqttConnection(Role.SERVER).send(packet) == wire
    assert decode(Role.CLIENT, [wire], opened=not isinstance(packet, p.ConnAck)) == [packet]


# -- round trips -------------------------------------------------------------------

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


@FAST
@given(st.lists(client_packets, max_size=6), st.data())
def test_client_packets_round_trip_through_a_server(packets: list[p.Packet], data: st.DataObject) -> None:
    wire = encode(Role.CLIENT, packets)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=4)))
    chunks = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)]) if b > a]
    assert decode(Role.SERVER, chunks) == packets


@FAST
@given(st.lists(server_packets, max_size=6))
def test_server_packets_round_trip_through_a_client(packets: list[p.Packet]) -> None:
    assert decode(Role.CLIENT, [encode(Role.SERVER, packets)]) == packets


@FAST
@given(connects())
def test_any_connect_round_trips_and_fixes_the_protocol_level(packet: p.Connect) -> None:
    server = MqttConnection(Role.SERVER)
    assert server.state is State.AWAITING_CONNECT
    server.receive_data(MqttConnection(Role.CLIENT).send(packet))
    assert list(server.events()) == [packet]
    assert server.state is State.CONNECTED
    assert server.protocol_level == packet.protocol_level


@pytest.mark.parametrize("connack", CONNACKS)
def test_connacks_round_trip(connack: p.ConnAck) -> None:
    assert decode(Role.CLIENT, [MqttConnection(Role.SERVER).send(connack)], opened=False) == [connack]


@pytest.mark.parametrize(("role", "packets"), [(Role.CLIENT, FROM_CLIENT), (Role.SERVER, FROM_SERVER)])
def test_every_split_decodes_the_same(role: Role, packets: list[p.Packet]) -> None:
    wire = encode(role, packets)
    for chunks in splits(wire):
        assert decode(OTHER[role], chunks) == packets


@pytest.mark.parametrize("connect", CONNECTS)
def test_every_split_of_an_opening_decodes_the_same(connect: p.Connect) -> None:
    wire = encode(Role.CLIENT, [connect, p.PingReq()])
    for chunks in splits(wire):
        assert decode(Role.SERVER, chunks, opened=False) == [connect, p.PingReq()]
    wire = encode(Role.SERVER, [CONNACKS[0], p.PingResp()])
    for chunks in splits(wire):
        assert decode(Role.CLIENT, chunks, opened=False) == [CONNACKS[0], p.PingResp()]


def test_a_large_packet_in_small_pieces_is_buffered_then_parsed_once() -> None:
    packet = p.Publish("big", bytes(range(256)) * 4096, qos=1, packet_id=3)
    wire = MqttConnection(Role.CLIENT).send(packet)
    conn = connected(Role.SERVER)
    for i in range(0, len(wire) - 1, 1000):
        conn.receive_data(wire[i : min(i + 1000, len(wire) - 1)])
        assert list(conn.events()) == []
    assert conn.mid_packet and conn.buffered_bytes == len(wire) - 1
    conn.receive_data(wire[-1:])
    assert list(conn.events()) == [packet]
    assert conn.buffered_bytes == 0


def test_events_are_lazy_and_the_rest_stays_buffered() -> None:
    one = MqttConnection(Role.CLIENT).send(p.PubAck(1))
    conn = connected(Role.SERVER)
    conn.receive_data(one * 3 + one[:1])
    events = conn.events()
    assert next(events) == p.PubAck(1)
    assert conn.buffered_bytes == 2 * len(one) + 1
    assert list(conn.events()) == [p.PubAck(1), p.PubAck(1)]
    assert conn.mid_packet and conn.buffered_bytes == 1


def test_eof_is_recorded_and_complete_packets_are_still_parsed() -> None:
    conn = connected(Role.SERVER)
    conn.receive_data(b"\xc0\x00\xc0")
    conn.receive_data(b"")
    assert conn.their_eof
    assert list(conn.events()) == [p.PingReq()]
    assert conn.mid_packet  # EOF cut a packet; the session decides what that means
    with pytest.raises(LocalProtocolError):
        conn.receive_data(b"\x00")


def test_bytearray_and_memoryview_input_are_accepted() -> None:
    conn = connected(Role.SERVER)
    conn.receive_data(bytearray(b"\xc0\x00"))
    conn.receive_data(memoryview(b"\xe0\x00"))
    assert list(conn.events()) == [p.PingReq(), p.Disconnect()]


# -- remaining length (§2.2.3) ------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "encoded"),
    [(0, b"\x00"), (127, b"\x7f"), (128, b"\x80\x01"), (16383, b"\xff\x7f"), (16384, b"\x80\x80\x01"),
     (2097151, b"\xff\xff\x7f"), (2097152, b"\x80\x80\x80\x01"), (268435455, b"\xff\xff\xff\x7f")],
)
def test_remaining_length_edges(length: int, encoded: bytes) -> None:
    assert remaining_length(length) == encoded
    if 3 <= length <= 2097152:  # through a real PUBLISH: topic "t" takes 3 bytes
        wire = MqttConnection(Role.CLIENT).send(p.Publish("t", b"x" * (length - 3)))
        assert wire[1 : 1 + len(encoded)] == encoded and len(wire) == 1 + len(encoded) + length
        assert decode(Role.SERVER, [wire]) == [p.Publish("t", b"x" * (length - 3))]
    # The header alone: a complete length waits for its body (and never fails).
    conn = connected(Role.SERVER)
    conn.receive_data(b"\x30" + encoded)
    if length == 0:
        with pytest.raises(RemoteProtocolError, match="without a topic"):  # [MQTT-3.3.2-1]
            list(conn.events())
    else:
        assert list(conn.events()) == [] and conn.mid_packet


def test_the_largest_length_is_the_last_that_encodes() -> None:
    with pytest.raises(LocalProtocolError):
        remaining_length(codec.MAX_REMAINING_LENGTH + 1)


@pytest.mark.parametrize("wire", [b"\x30\xff\xff\xff\xff\x01", b"\x30\x80\x80\x80\x80", b"\xc0\x80\x80\x80\x80\x00"])
def test_a_five_byte_remaining_length_is_malformed(wire: bytes) -> None:
    for chunks in splits(wire):
        with pytest.raises(RemoteProtocolError, match="longer than 4 bytes"):  # §2.2.3
            decode(Role.SERVER, chunks)


def test_an_incomplete_remaining_length_waits() -> None:
    conn = connected(Role.SERVER)
    conn.receive_data(b"\x30\xff\xff\xff")
    assert list(conn.events()) == [] and conn.buffered_bytes == 4


def test_the_size_limit_applies_before_the_body_arrives() -> None:
    conn = connected(Role.SERVER, max_packet_bytes=100)
    conn.receive_data(b"\x30\x64")  # 100: at the limit, waits for its body
    assert list(conn.events()) == []
    conn = connected(Role.SERVER, max_packet_bytes=100)
    conn.receive_data(b"\x30\x65")  # 101 declared, none sent
    with pytest.raises(RemoteProtocolError, match="over the limit"):
        list(conn.events())
    conn = connected(Role.SERVER, max_packet_bytes=1000)
    conn.receive_data(b"\x30\xff\xff\xff\x7f")  # the largest MQTT length
    with pytest.raises(RemoteProtocolError, match="over the limit"):
        list(conn.events())


def test_the_size_limit_can_be_raised_after_connect() -> None:
    big = MqttConnection(Role.CLIENT).send(p.Publish("t", b"x" * 500))
    conn = connected(Role.SERVER, max_packet_bytes=100)
    conn.max_packet_bytes = 1000
    conn.receive_data(big)
    assert list(conn.events()) == [p.Publish("t", b"x" * 500)]


# -- malformations, each with its spec statement ------------------------------------


def raw_connect(name: bytes = b"MQTT", level: int = 4, flags: int = 2, rest: bytes = b"\x00\x01c") -> bytes:
    body = len(name).to_bytes(2, "big") + name + bytes((level, flags)) + b"\x00\x3c" + rest
    return b"\x10" + bytes((len(body),)) + body


@pytest.mark.parametrize(
    ("wire", "return_code"),
    [
        (raw_connect(level=5), p.UNACCEPTABLE_PROTOCOL_VERSION),  # [MQTT-3.1.2-2]
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
    conn.receive_data(raw_connect(level=5) + b"\xc0\x00")
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


# -- topic names and filters -------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "ok"),
    [("a/b", True), ("/", True), ("a//b", True), ("$SYS/x", True), (" ", True), ("\u00e9", True),
     ("", False),  # [MQTT-4.7.3-1]
     ("a/+", False), ("#", False), ("a/#", False), ("a+b", False),  # [MQTT-3.3.2-2]
     ("a\x00", False),  # [MQTT-4.7.3-2]
     ("a" * 65536, False)],  # [MQTT-4.7.3-3]
)
def test_topic_names(name: str, ok: bool) -> None:
    assert (validate_topic_name(name) is None) is ok


@pytest.mark.parametrize(
    ("topic_filter", "ok"),
    [("#", True), ("a/#", True), ("+", True), ("+/+/#", True), ("/", True), ("a/+/b", True), ("/#", True),
     ("$SYS/#", True), ("+/", True),
     ("a/#/b", False), ("#/a", False), ("a#", False), ("a/b#", False), ("##", False),  # [MQTT-4.7.1-2]
     ("a+", False), ("a/b+/c", False), ("++", False), ("+a", False),  # [MQTT-4.7.1-3]
     ("", False),  # [MQTT-4.7.3-1]
     ("a\x00", False)],  # [MQTT-4.7.3-2]
)
def test_topic_filters(topic_filter: str, ok: bool) -> None:
    assert (validate_topic_filter(topic_filter) is None) is ok


def test_packet_codes_are_enums_equal_to_their_numbers() -> None:
    assert p.ACCEPTED == 0 and p.NOT_AUTHORIZED == 5 and p.SUBACK_FAILURE == 0x80
    assert p.ConnAck(False, 0) == p.ConnAck(False, p.ACCEPTED)
    assert [int(t) for t in p.PacketType] == list(range(1, 15))

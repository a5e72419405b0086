"""The MQTT 3.1.1 codec's framing through its own door: bytes in, packets out;
packets in, bytes out.

Golden vectors from the specification, Hypothesis round trips of every packet
type in both roles, the same bytes fed whole, byte by byte and split at every
index (h11's ``tr()``), lazy parsing and buffering, remaining-length edges,
and the size limit applied before the body arrives.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.mqtt import codec
from gateway.mqtt.codec import packets as p
from gateway.mqtt.codec import LocalProtocolError, MqttConnection, RemoteProtocolError, Role, State
from gateway.mqtt.codec.wire import remaining_length
from tests.support.helpers import splits
from tests.support.mqtt_codec_helpers import (
    CONNACKS,
    CONNECT_WIRE,
    CONNECTS,
    FAST,
    FROM_CLIENT,
    FROM_SERVER,
    OTHER,
    client_packets,
    connected,
    connects,
    decode,
    encode,
    server_packets,
)


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

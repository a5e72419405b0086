"""The PUBLISH hot path's shortcuts, pinned to the general path they stand in for.

The connection parses a whole, well-formed QoS 0/1 PUBLISH without the
decoder table (and falls back to it for anything else); a PUBLISH is encoded
from a topic field that deliveries cache per address.  Each is checked here
against the general path on the same input: the same packet or the same
error, the same bytes, including the inputs that must fall back.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core import names
from core.broker import Broker
from gateway.mqtt import codec, topics
from gateway.mqtt.codec import packets as p
from gateway.mqtt.codec import LocalProtocolError, MqttConnection, RemoteProtocolError, Role
from gateway.mqtt.codec.decoders import DECODERS_V311
from gateway.mqtt.session import MqttSession, MqttSettings, Registry
from gateway.mqtt.codec.wire import PT, remaining_length
from tests.support.core_fakes import FakeClock
from tests.support.helpers import splits
from tests.support.mqtt_codec_helpers import FAST, connected

# Topic bytes the rules care about: valid UTF-8, '+', '#', NUL, bad UTF-8, empty.
TOPIC_BYTES = st.one_of(
    st.text(alphabet=st.sampled_from("ab/+#\x00é😀 .%"), max_size=12).map(lambda t: t.encode()),
    st.binary(max_size=6),
)
# Payload sizes around the remaining length's 1-, 2- and 3-byte boundaries.
SIZES = st.one_of(st.integers(0, 140), st.integers(16_360, 16_400))


def publish_wire(first: int, topic: bytes, payload: bytes, packet_id: int | None, *, topic_len: int | None = None) -> bytes:
    """A PUBLISH built by hand, so malformed ones can be made too."""
    body = (len(topic) if topic_len is None else topic_len).to_bytes(2, "big") + topic
    if packet_id is not None:
        body += packet_id.to_bytes(2, "big")
    body += payload
    return bytes((first,)) + remaining_length(len(body)) + body


def general(role: Role, wire: bytes) -> p.Packet | str:
    """The general path alone: the fixed header read here, the body by the
    decoder table's PUBLISH decoder.  A packet, or the error's message."""
    conn = connected(role)
    length, shift, i = 0, 0, 1
    while True:
        length |= (wire[i] & 0x7F) << shift
        i += 1
        if wire[i - 1] < 0x80:
            break
        shift += 7
    try:
        return DECODERS_V311[PT.PUBLISH](conn, wire, i, i + length, wire[0] & 0x0F)
    except RemoteProtocolError as exc:
        return exc.message


def parsed(role: Role, chunks: list[bytes], **kwargs: int) -> p.Packet | str:
    conn = connected(role, **kwargs)
    out: list[p.Packet] = []
    try:
        for chunk in chunks:
            conn.receive_data(chunk)
            out.extend(conn.events())
    except RemoteProtocolError as exc:
        return exc.message
    assert len(out) == 1 and conn.buffered_bytes == 0
    return out[0]


@FAST
@given(
    role=st.sampled_from(list(Role)),
    flags=st.sampled_from([0x0, 0x1, 0x2, 0x3, 0x4, 0x5, 0xA, 0xB, 0xC]),  # every legal QoS/retain/DUP mix
    topic=TOPIC_BYTES,
    size=SIZES,
    packet_id=st.sampled_from([0, 1, 0x100, 65535]),
)
def test_the_connection_parses_a_publish_as_the_general_decoder_does(
    role: Role, flags: int, topic: bytes, size: int, packet_id: int
) -> None:
    wire = publish_wire(0x30 | flags, topic, b"\x00x" * (size // 2), packet_id if flags & 6 else None)
    expected = general(role, wire)
    assert parsed(role, [wire]) == expected
    assert parsed(role, [wire[:2], wire[2:5], wire[5:]]) == expected  # arriving in pieces


@pytest.mark.parametrize(
    ("first", "topic", "packet_id", "topic_len"),
    [
        (0x30, b"", None, None),  # empty topic
        (0x30, b"a/+", None, None),  # wildcard
        (0x31, b"a\x00", None, None),  # NUL
        (0x30, b"\xc3", None, None),  # not UTF-8
        (0x32, b"a", 0, None),  # packet identifier 0
        (0x33, b"a", None, None),  # QoS 1 without a packet identifier (2 bytes short)
        (0x30, b"abc", None, 200),  # the topic length runs past the packet
    ],
)
def test_a_malformed_publish_falls_back_and_is_refused_as_before(
    first: int, topic: bytes, packet_id: int | None, topic_len: int | None
) -> None:
    wire = publish_wire(first, topic, b"", packet_id, topic_len=topic_len)
    expected = general(Role.SERVER, wire)
    assert isinstance(expected, str)
    assert parsed(Role.SERVER, [wire]) == expected


def test_too_short_for_a_topic_length_is_refused_as_before() -> None:
    for wire in (b"\x30\x00", b"\x30\x01a", b"\x32\x80\x00"):  # the last: a non-minimal remaining length of 0
        assert parsed(Role.SERVER, [wire]) == "PUBLISH without a topic name"


def test_the_size_limit_and_the_packet_order_still_apply_to_a_publish() -> None:
    wire = publish_wire(0x30, b"a/b", b"x" * 100, None)
    assert parsed(Role.SERVER, [wire], max_packet_bytes=50) == "packet of 105 bytes is over the limit of 50"
    fresh = MqttConnection(Role.SERVER)  # no CONNECT yet [MQTT-3.1.0-1]
    fresh.receive_data(wire)
    with pytest.raises(RemoteProtocolError, match="the first packet must be CONNECT"):
        list(fresh.events())


def test_publishes_back_to_back_split_anywhere_parse_alike() -> None:
    packets = [
        p.Publish("a/b", b"x" * 130), p.Publish("c", b"", 1, True, False, 9), p.Publish("d", b"y", 2, False, True, 3),
        p.Publish("é", b"z" * 200), p.PingReq(),
    ]
    wire = b"".join(MqttConnection(Role.CLIENT).send(packet) for packet in packets)
    for chunks in splits(wire):
        conn = connected(Role.SERVER)
        out = []
        for chunk in chunks:
            conn.receive_data(chunk)
            out.extend(conn.events())
        assert out == packets


@pytest.mark.parametrize("role", list(Role))
@pytest.mark.parametrize(
    "wire", [b"\x40\x02\x00\x01", b"\x40\x02\x01\x00", b"\x40\x02\xff\xff", b"\x40\x02\x00\x00", b"\x40\x03\x00\x01\x00"],
)
def test_the_connection_parses_a_puback_as_its_table_decoder_does(role: Role, wire: bytes) -> None:
    conn = connected(role)
    try:
        expected: p.Packet | str = DECODERS_V311[PT.PUBACK](conn, wire, 2, len(wire), 0)
    except RemoteProtocolError as exc:
        expected = exc.message
    for chunks in splits(wire):
        assert parsed(role, chunks) == expected
    conn = connected(role)
    conn.max_packet_bytes = 1  # as a session may set it after CONNECT
    conn.receive_data(wire)
    with pytest.raises(RemoteProtocolError, match=f"packet of {wire[1]} bytes is over the limit of 1"):
        list(conn.events())


# -- encoding --------------------------------------------------------------------


def reference(topic: str, payload: bytes, qos: int, retain: bool, dup: bool, packet_id: int | None) -> bytes:
    raw = topic.encode()
    body = len(raw).to_bytes(2, "big") + raw + (packet_id.to_bytes(2, "big") if qos else b"") + payload
    return bytes((0x30 | dup << 3 | qos << 1 | retain,)) + remaining_length(len(body)) + body


@FAST
@given(
    topic=st.text(alphabet=st.sampled_from("ab/é😀 .%"), min_size=1, max_size=12),
    size=SIZES,
    qos=st.integers(0, 2),
    retain=st.booleans(),
    dup=st.booleans(),
    packet_id=st.integers(1, 65535),
)
def test_publish_bytes_from_a_topic_field_are_the_publish_packet_encoded(
    topic: str, size: int, qos: int, retain: bool, dup: bool, packet_id: int
) -> None:
    payload = b"\x01" * size
    dup = dup and qos > 0
    pid = packet_id if qos else None
    expected = reference(topic, payload, qos, retain, dup, pid)
    assert codec.publish_bytes(codec.topic_field(topic), payload, qos, retain, dup, pid) == expected
    assert MqttConnection(Role.SERVER).send(p.Publish(topic, payload, qos, retain, dup, pid)) == expected
    decoded = connected(Role.CLIENT)
    decoded.receive_data(expected)
    assert list(decoded.events()) == [p.Publish(topic, payload, qos, retain, dup, pid)]


@pytest.mark.parametrize(
    ("topic", "qos", "dup", "packet_id"),
    [("", 0, False, None), ("a/+", 0, False, None), ("a/#", 1, False, 1), ("a\x00", 0, False, None),
     ("a\ud800", 0, False, None), ("a", 0, True, None), ("a", 0, False, 1), ("a", 3, False, 1),
     ("a", 1, False, None), ("a", 1, False, 0), ("a", 2, False, 65536)],
)
def test_what_cannot_go_on_the_wire_is_refused_by_both_encoders(topic: str, qos: int, dup: bool, packet_id: int | None) -> None:
    with pytest.raises(LocalProtocolError):
        MqttConnection(Role.SERVER).send(p.Publish(topic, b"x", qos, False, dup, packet_id))
    with pytest.raises(LocalProtocolError):
        codec.publish_bytes(codec.topic_field(topic), b"x", qos, False, dup, packet_id)


@pytest.mark.parametrize("packet_id", [1, 255, 256, 65535])
def test_puback_bytes_are_the_puback_packet_encoded(packet_id: int) -> None:
    assert codec.puback_bytes(packet_id) == MqttConnection(Role.SERVER).send(p.PubAck(packet_id))


@pytest.mark.parametrize("packet_id", [0, 65536, -1])
def test_puback_bytes_refuse_what_the_puback_encoder_refuses(packet_id: int) -> None:
    with pytest.raises(LocalProtocolError):
        MqttConnection(Role.SERVER).send(p.PubAck(packet_id))
    with pytest.raises(LocalProtocolError):
        codec.puback_bytes(packet_id)


# -- the delivery cache ----------------------------------------------------------


def topic_address(text: str) -> names.Address:
    address = names.parse(text)
    assert isinstance(address, names.Address), address
    return address


@pytest.mark.parametrize("text", ["/topic/a.b.c", "/topic/spBv1%2E0.g", "/topic/%.x.%", "/topic/100%25.%2A", "/topic/é.😀"])
def test_a_delivery_field_is_the_topic_field_of_the_address_mqtt_name(text: str) -> None:
    address = topic_address(text)
    assert topics.delivery_field[address.text] == codec.topic_field(topics.from_address(address))
    assert topics.delivery_field[address.text] == codec.topic_field(topics.from_address(address))  # cached, the same


@pytest.mark.parametrize("text", ["/topic/a+b.c", "/topic/x.#y"])
def test_a_name_mqtt_cannot_carry_has_no_delivery_field(text: str) -> None:
    assert topics.delivery_field[topic_address(text).text] is None


def test_the_delivery_cache_is_bounded_and_keeps_no_long_names() -> None:
    for i in range(topics.CACHE_ENTRIES + 10):
        assert topics.delivery_field[f"/topic/bound.{i}"] == codec.topic_field(f"bound/{i}")
        assert len(topics.delivery_field) <= topics.CACHE_ENTRIES
    long = "/topic/" + "x" * topics.CACHED_CHARS
    assert topics.delivery_field[long] == codec.topic_field("x" * topics.CACHED_CHARS)
    assert long not in topics.delivery_field


def test_a_name_that_cannot_be_encoded_raises_each_time_and_is_not_kept() -> None:
    text = topic_address("/topic/a\ud800").text  # a lone surrogate, only reachable from outside MQTT
    for _ in range(2):
        with pytest.raises(LocalProtocolError):
            topics.delivery_field[text]  # noqa: B018
    assert text not in topics.delivery_field


# -- a session's deliveries --------------------------------------------------------


class _Log:
    def bind(self, **_: object) -> _Log:
        return self

    def info(self, *_: object, **__: object) -> None:
        pass

    warning = info


def _sessions(broker: Broker) -> Callable[[str], MqttSession]:
    clock, registry = FakeClock(), Registry()

    def session(client_id: str) -> MqttSession:
        s = MqttSession(broker, clock, MqttSettings(), registry, conn_id=client_id, log=_Log())
        s.skeleton.receive_data(MqttConnection(Role.CLIENT).send(p.Connect(client_id)))
        s.outbox.drain(1 << 62)
        return s

    return session


def test_a_session_delivers_the_bytes_the_publish_packet_encodes_to() -> None:
    """QoS 0 and 1, retained and live, from MQTT and from STOMP (persistent:
    QoS 2 offered), and a name MQTT cannot carry, settled and not sent."""
    broker = Broker(FakeClock())
    session = _sessions(broker)
    pub, sub0, sub1 = session("p"), session("s0"), session("s1")
    out = MqttConnection(Role.SERVER)
    pub.skeleton.receive_data(out.send(p.Publish("r/é", b"kept", 1, True, False, 1)))
    for sub, qos in ((sub0, 0), (sub1, 1)):
        sub.skeleton.receive_data(MqttConnection(Role.CLIENT).send(p.Subscribe(1, [("#", qos)])))
        retained = p.Publish("r/é", b"kept", qos, True, False, 1 if qos else None)
        assert sub.outbox.drain(1 << 62) == out.send(p.SubAck(1, [qos])) + out.send(retained)
    pub.skeleton.receive_data(out.send(p.Publish("a/b", b"x" * 200, 1, False, False, 2)))
    live = broker.message(topic_address("/topic/a+b"), {}, b"from STOMP", persistent=True)
    broker.open_client(sub0).send(live)  # '+' inside a segment: MQTT cannot name it
    stomp = broker.message(topic_address("/topic/s.t"), {}, b"y", persistent=True)
    broker.open_client(sub0).send(stomp)
    assert sub0.outbox.drain(1 << 62) == out.send(p.Publish("a/b", b"x" * 200)) + out.send(p.Publish("s/t", b"y"))
    assert sub1.outbox.drain(1 << 62) == (
        out.send(p.Publish("a/b", b"x" * 200, 1, False, False, 2)) + out.send(p.Publish("s/t", b"y", 1, False, False, 3))
    )


def test_the_publish_address_cache_is_bounded_and_answers_as_the_mapping_does() -> None:
    for i in range(topics.CACHE_ENTRIES + 10):
        address = topics.to_address(f"bound/{i}")
        assert isinstance(address, names.Address) and address.text == f"/topic/bound.{i}"
    assert topics.to_address("bound/0") is topics.to_address("bound/0")  # kept again after emptying
    assert topics.to_address("a/\x01") == names.topic("a.\x01")  # a reason, cached as well
    assert topics.to_address("a/\x01") == "control character in destination name"
    long = "x/" * (topics.CACHED_CHARS // 2) + "end"
    first = topics.to_address(long)
    assert isinstance(first, names.Address) and first == topics.to_address(long)
    assert topics.from_address(first) == long
    cache = topics.to_address.__self__  # type: ignore[attr-defined]
    assert long not in cache and len(cache) <= topics.CACHE_ENTRIES


def test_a_message_fanned_out_is_encoded_once_and_each_subscriber_gets_its_packet() -> None:
    """QoS 0 subscribers of one message share its encoded PUBLISH (the
    registry's one-entry cache); a QoS 1 subscriber between them, a retained
    copy and the next message each get their own."""
    session = _sessions(Broker(FakeClock()))
    pub = session("p")
    out = MqttConnection(Role.SERVER)
    pub.skeleton.receive_data(out.send(p.Publish("t/r", b"kept", 0, True)))
    subs = [session(f"s{i}") for i in range(4)]
    for i, sub in enumerate(subs):
        qos = 1 if i == 2 else 0
        sub.skeleton.receive_data(MqttConnection(Role.CLIENT).send(p.Subscribe(1, [("t/#", qos)])))
        # Published at QoS 0: every subscriber gets it at QoS 0, from the cache.
        assert sub.outbox.drain(1 << 62) == out.send(p.SubAck(1, [qos])) + out.send(p.Publish("t/r", b"kept", 0, True))
    pub.skeleton.receive_data(out.send(p.Publish("t/a", b"one", 1, False, False, 1)) + out.send(
        p.Publish("t/b", b"two" * 50, 1, False, False, 2)))
    for i, sub in enumerate(subs):
        if i == 2:
            expected = out.send(p.Publish("t/a", b"one", 1, False, False, 1)) + out.send(
                p.Publish("t/b", b"two" * 50, 1, False, False, 2))
        else:
            expected = out.send(p.Publish("t/a", b"one")) + out.send(p.Publish("t/b", b"two" * 50))
        assert sub.outbox.drain(1 << 62) == expected

"""MQTT 5's use of the hot path, pinned to the general path it stands in for:
the connection's inline PUBLISH parse takes a v5 PUBLISH whose property
block is empty or a Topic Alias alone (and leaves anything else to the v5
decoder), the inline PUBACK
parse serves v5's two-byte form, and ``publish_bytes`` with a property block
makes what the v5 PUBLISH encoder makes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.mqtt import codec
from gateway.mqtt.codec import packets as p
from gateway.mqtt.codec import properties
from gateway.mqtt.codec import LocalProtocolError, MqttConnection, RemoteProtocolError, Role
from gateway.mqtt.codec.decoders import DECODERS_V5
from gateway.mqtt.codec.wire import PT, remaining_length
from tests.support.helpers import splits
from tests.support.mqtt5_codec_helpers import connected5, encode5, properties_for
from tests.support.mqtt_codec_helpers import FAST

TOPIC_BYTES = st.one_of(
    st.text(alphabet=st.sampled_from("ab/+#\x00é😀 .%"), max_size=12).map(lambda t: t.encode()),
    st.binary(max_size=6),
)
SIZES = st.one_of(st.integers(0, 140), st.integers(16_360, 16_400))
# Property blocks: empty (the fast path's), valid, and broken.
BLOCKS = st.sampled_from([b"\x00", b"\x02\x23\x00", b"\x03\x23\x00\x07", b"\x03\x23\x00\x00", b"\x03\x23\x01\x2c", b"\x05\x02\x00\x00\x00\x09", b"\x01", b"\x7f",
                          b"\x02\x0b\x05", b"\x80\x00"])


def publish_wire(first: int, topic: bytes, props: bytes | None, payload: bytes, packet_id: int | None) -> bytes:
    body = len(topic).to_bytes(2, "big") + topic
    if packet_id is not None:
        body += packet_id.to_bytes(2, "big")
    body += (props or b"") + payload
    return bytes((first,)) + remaining_length(len(body)) + body


def general(role: Role, wire: bytes) -> p.Packet | str:
    """The v5 PUBLISH decoder alone, on the body the fixed header frames."""
    conn = connected5(role)
    length, shift, i = 0, 0, 1
    while True:
        length |= (wire[i] & 0x7F) << shift
        i += 1
        if wire[i - 1] < 0x80:
            break
        shift += 7
    try:
        return DECODERS_V5[PT.PUBLISH](conn, wire, i, i + length, wire[0] & 0x0F)
    except RemoteProtocolError as exc:
        return exc.message


def parsed(role: Role, chunks: list[bytes]) -> p.Packet | str:
    conn = connected5(role)
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
    flags=st.sampled_from([0x0, 0x1, 0x2, 0x3, 0x4, 0x5, 0xA, 0xB, 0xC]),
    topic=TOPIC_BYTES,
    props=BLOCKS,
    size=SIZES,
    packet_id=st.sampled_from([0, 1, 0x100, 65535]),
)
def test_a_v5_publish_parses_as_the_v5_decoder_parses_it(
    role: Role, flags: int, topic: bytes, props: bytes, size: int, packet_id: int
) -> None:
    wire = publish_wire(0x30 | flags, topic, props, b"\x00x" * (size // 2), packet_id if flags & 6 else None)
    expected = general(role, wire)
    assert parsed(role, [wire]) == expected
    assert parsed(role, [wire[:2], wire[2:5], wire[5:]]) == expected


@pytest.mark.parametrize(
    "wire",
    [
        publish_wire(0x30, b"a/b", b"\x00", b"hello", None),  # the fast path's own
        publish_wire(0x33, b"a/b", b"\x00", b"x" * 200, 0x102),
        publish_wire(0x32, b"a", b"\x03\x23\x00\x01", b"aliased", 7),  # properties: the decoder's
        publish_wire(0x30, b"", b"\x03\x23\x00\x01", b"by alias", None),  # an empty topic with an alias
        publish_wire(0x30, b"", b"\x00", b"", None),  # empty, no alias: the session's refusal, not the codec's
        publish_wire(0x30, b"a", None, b"", None),  # no property length at all
        publish_wire(0x32, b"a", None, b"", 1),
    ],
)
def test_a_v5_publish_split_at_every_index_parses_alike(wire: bytes) -> None:
    expected = general(Role.SERVER, wire)
    for chunks in splits(wire):
        assert parsed(Role.SERVER, chunks) == expected


def test_the_v5_fast_path_takes_no_3_1_1_publish_and_3_1_1_none_of_v5() -> None:
    wire = publish_wire(0x30, b"t", None, b"\x00abc", None)  # 3.1.1: payload "\x00abc"
    v311 = codec.MqttConnection(Role.SERVER)
    v311.receive_data(b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01c" + wire)
    assert list(v311.events())[1] == p.Publish("t", b"\x00abc")
    assert parsed(Role.SERVER, [wire]) == p.Publish("t", b"abc")  # v5: a property length 0, then "abc"


@pytest.mark.parametrize("role", list(Role))
@pytest.mark.parametrize("wire", [b"\x40\x02\x00\x01", b"\x40\x02\xff\xff", b"\x40\x02\x00\x00", b"\x40\x03\x00\x01\x10",
                                  b"\x40\x03\x00\x01\x01", b"\x40\x04\x00\x01\x00\x00"])
def test_a_v5_puback_parses_as_its_table_decoder_does(role: Role, wire: bytes) -> None:
    try:
        expected: p.Packet | str = DECODERS_V5[PT.PUBACK](connected5(role), wire, 2, len(wire), 0)
    except RemoteProtocolError as exc:
        expected = exc.message
    for chunks in splits(wire):
        conn = connected5(role)
        try:
            out = []
            for chunk in chunks:
                conn.receive_data(chunk)
                out.extend(conn.events())
            assert out == [expected]
        except RemoteProtocolError as exc:
            assert exc.message == expected


@FAST
@given(
    topic=st.text(alphabet=st.sampled_from("ab/é😀 .%"), min_size=1, max_size=12),
    size=SIZES,
    qos=st.integers(0, 2),
    retain=st.booleans(),
    dup=st.booleans(),
    packet_id=st.integers(1, 65535),
    data=st.data(),
)
def test_publish_bytes_with_a_property_block_are_the_v5_publish_encoded(
    topic: str, size: int, qos: int, retain: bool, dup: bool, packet_id: int, data: st.DataObject
) -> None:
    props = data.draw(properties_for(PT.PUBLISH, role=Role.SERVER))
    dup = dup and qos > 0
    pid = packet_id if qos else None
    packet = p.Publish(topic, b"\x01" * size, qos, retain, dup, pid, props)
    block = codec.encode_properties(props)
    wire = codec.publish_bytes(codec.topic_field(topic), packet.payload, qos, retain, dup, pid, block)
    assert wire == encode5(Role.SERVER, [packet])
    client = connected5(Role.CLIENT)
    client.receive_data(wire)
    assert list(client.events()) == [packet]


def test_publish_bytes_refuse_on_v5_what_they_refuse_on_3_1_1() -> None:
    field = codec.topic_field("a")
    for qos, dup, packet_id in [(0, True, None), (0, False, 1), (3, False, 1), (1, False, None), (2, False, 65536)]:
        with pytest.raises(LocalProtocolError):
            codec.publish_bytes(field, b"x", qos, False, dup, packet_id, codec.EMPTY_PROPERTIES)


def test_an_aliased_publish_goes_with_an_empty_topic() -> None:
    props = p.Properties(topic_alias=4)
    packet = p.Publish("", b"x", properties=props)
    wire = codec.publish_bytes(codec.EMPTY_TOPIC_FIELD, b"x", 0, False, props=codec.encode_properties(props))
    assert wire == encode5(Role.SERVER, [packet]) == b"\x30\x07\x00\x00\x03\x23\x00\x04x"


@pytest.mark.parametrize("packet_id", [1, 255, 65535])
def test_puback_bytes_are_the_v5_puback_with_reason_0(packet_id: int) -> None:
    assert codec.puback_bytes(packet_id) == encode5(Role.SERVER, [p.PubAck(packet_id)])
    assert codec.puback_bytes(packet_id) == MqttConnection(Role.SERVER).send(p.PubAck(packet_id))


def test_a_delivery_builds_its_block_from_kept_items_and_its_own() -> None:
    kept = properties.property_items(p.Properties(content_type="text/plain", user_properties=(("k", "v"),)))
    own = (properties.topic_alias_item(300) + properties.subscription_identifier_item(200)
           + properties.message_expiry_item(59))
    expected = p.Properties(message_expiry_interval=59, content_type="text/plain", subscription_identifiers=(200,),
                            topic_alias=300, user_properties=(("k", "v"),))
    block = properties.property_block(kept + own)
    assert properties.read_properties(block, 0, len(block), PT.PUBLISH) == (expected, len(block))
    assert properties.property_block(b"") == codec.EMPTY_PROPERTIES
    for bad in (lambda: properties.topic_alias_item(0), lambda: properties.topic_alias_item(65536),
                lambda: properties.subscription_identifier_item(0),
                lambda: properties.subscription_identifier_item(268_435_456),
                lambda: properties.message_expiry_item(1 << 32)):
        with pytest.raises(LocalProtocolError):
            bad()

"""Each MQTT 3.1.1 packet, packet to bytes: one encoder per packet class,
checking what the peer would refuse (LocalProtocolError) before any byte is
made.  :data:`SENDERS` holds, for each role, the encoders of the packets that
role may send; PUBLISH, the hot path, is :func:`encode_publish`, called
directly by the connection.  MQTT 5's are gateway.mqtt.codec.encoders_v5; the
PUBLISH bytes are shared (:func:`publish_bytes` takes v5's property block).
These write the 3.1.1 form and leave out what 3.1.1 has no room for (an
ack's v5 reason code, properties), so a session may build one packet for
either level; a code 3.1.1 cannot carry (CONNACK, SUBACK) is refused.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from gateway.mqtt.codec import packets as p
from gateway.mqtt.codec.wire import (
    FIXED_FLAGS,
    PT,
    SENT_BY,
    SUBACK_CODES,
    LocalProtocolError,
    Negotiated,
    Role,
    binary_field,
    checked_qos,
    frame,
    packet_id_field,
    remaining_length,
    string_field,
)

Encoder = Callable[[Negotiated, p.Packet], bytes]
# The encoders' own struct, not wire's: CPython 3.11 compiles a method call on
# a name bound by ``import`` as an attribute load (it takes the name for a
# module), which costs PUBLISH, the hot path, a bound method each time.
_U16 = struct.Struct(">H")
# A first byte and a remaining length of 1 byte, or of 2 (packed as one
# little-endian u16: low 7 bits | 0x80, then the rest): faster than bytes((...)).
_HEAD1 = struct.Struct(">BB")
_HEAD2 = struct.Struct("<BH")
_ID_NO_PROPS = struct.Struct(">Hx")  # v5: a packet identifier, then a property length of 0


def topic_field(topic: str) -> bytes:
    """A PUBLISH's topic name as it goes on the wire (2-byte length, UTF-8),
    or LocalProtocolError if a PUBLISH may not carry it.  Deliveries cache
    what this returns (gateway.mqtt.topics.delivery_field)."""
    if not topic or "+" in topic or "#" in topic or "\x00" in topic:
        raise LocalProtocolError(f"invalid topic name {topic[:40]!r}")  # [MQTT-3.3.2-2], [MQTT-4.7.3-1]
    try:
        raw = topic.encode("utf-8")
    except UnicodeEncodeError:
        raise LocalProtocolError("topic with a lone surrogate") from None  # [MQTT-1.5.3-1]
    if len(raw) > 65535:
        raise LocalProtocolError("topic name longer than 65535 bytes")  # [MQTT-4.7.3-3]
    return _U16.pack(len(raw)) + raw


# A v5 PUBLISH sent by Topic Alias alone has an empty topic name (v5 §3.3.2.3.4).
EMPTY_TOPIC_FIELD = b"\x00\x00"


def publish_bytes(
    field: bytes, payload: bytes, qos: int, retain: bool, dup: bool = False, packet_id: int | None = None,
    props: bytes = b"",
) -> bytes:
    """A whole PUBLISH, its topic already a :func:`topic_field`.  On a v5
    connection ``props`` is the property block, its length first
    (gateway.mqtt.codec.properties.encode_properties; ``b"\x00"`` for none); 3.1.1
    has none (``b""``)."""
    if props:
        return _publish_v5(field, payload, qos, retain, dup, packet_id, props)
    first = 0x30 | (0x08 if dup else 0) | (0x01 if retain else 0)
    if qos == 0:
        if dup:
            raise LocalProtocolError("DUP on a QoS 0 PUBLISH")  # [MQTT-3.3.1-2]
        if packet_id is not None:
            raise LocalProtocolError("a QoS 0 PUBLISH has no packet identifier")  # [MQTT-2.3.1-5]
        length = len(field) + len(payload)
        # The remaining length inline for 1 and 2 bytes (up to 16 KiB): the hot path.
        if length < 128:
            return _HEAD1.pack(first, length) + field + payload
        if length < 16384:
            return _HEAD2.pack(first, (length & 0x7F) | 0x80 | (length >> 7) << 8) + field + payload
        return bytes((first,)) + remaining_length(length) + field + payload
    if qos != 1 and qos != 2:
        raise LocalProtocolError(f"invalid QoS {qos!r}")  # [MQTT-3.3.1-4]
    if packet_id is None or not 0 < packet_id <= 65535:
        raise LocalProtocolError(f"invalid packet identifier {packet_id!r}")  # [MQTT-2.3.1-1]
    first |= qos << 1
    length = len(field) + 2 + len(payload)
    if length < 128:
        head = _HEAD1.pack(first, length)
    elif length < 16384:
        head = _HEAD2.pack(first, (length & 0x7F) | 0x80 | (length >> 7) << 8)
    else:
        head = bytes((first,)) + remaining_length(length)
    return head + field + _U16.pack(packet_id) + payload


def _publish_v5(
    field: bytes, payload: bytes, qos: int, retain: bool, dup: bool, packet_id: int | None, props: bytes
) -> bytes:
    """publish_bytes with a property block after the packet identifier (v5 §3.3.2)."""
    first = 0x30 | (0x08 if dup else 0) | (0x01 if retain else 0)
    if qos == 0:
        if dup:
            raise LocalProtocolError("DUP on a QoS 0 PUBLISH")  # [MQTT-3.3.1-2]
        if packet_id is not None:
            raise LocalProtocolError("a QoS 0 PUBLISH has no packet identifier")  # [MQTT-2.2.1-2]
        head = field + props
    else:
        if qos != 1 and qos != 2:
            raise LocalProtocolError(f"invalid QoS {qos!r}")  # [MQTT-3.3.1-4]
        if packet_id is None or not 0 < packet_id <= 65535:
            raise LocalProtocolError(f"invalid packet identifier {packet_id!r}")  # [MQTT-2.2.1-3]
        first |= qos << 1
        # The packet identifier and an empty property block packed at once: the common case.
        head = field + (_ID_NO_PROPS.pack(packet_id) if props == b"\x00" else _U16.pack(packet_id) + props)
    length = len(head) + len(payload)
    if length < 128:
        return _HEAD1.pack(first, length) + head + payload
    if length < 16384:
        return _HEAD2.pack(first, (length & 0x7F) | 0x80 | (length >> 7) << 8) + head + payload
    return bytes((first,)) + remaining_length(length) + head + payload


def puback_bytes(packet_id: int) -> bytes:
    """A whole PUBACK: what the PubAck encoder makes, without the packet
    object (one is sent per QoS 1 PUBLISH).  The same bytes are v5's short
    form, reason 0x00 without properties (v5 §3.4.2.1)."""
    if not 0 < packet_id <= 65535:
        raise LocalProtocolError(f"invalid packet identifier {packet_id!r}")  # [MQTT-2.3.1-1]
    return bytes((0x40, 2, packet_id >> 8, packet_id & 0xFF))


def encode_publish(conn: Negotiated, packet: p.Publish) -> bytes:
    return publish_bytes(topic_field(packet.topic), packet.payload, packet.qos, packet.retain, packet.dup, packet.packet_id)


def _encode_connect(conn: Negotiated, packet: p.Connect) -> bytes:
    flags = 0x02 if packet.clean_session else 0
    payload = string_field(packet.client_id)
    will = packet.will
    if will is not None:
        flags |= 0x04 | checked_qos(will.qos) << 3 | (0x20 if will.retain else 0)
        payload += string_field(will.topic) + binary_field(will.payload)
    if packet.username is not None:
        flags |= 0x80
        payload += string_field(packet.username)
    if packet.password is not None:
        if packet.username is None:
            raise LocalProtocolError("password without a user name")  # [MQTT-3.1.2-22]
        flags |= 0x40
        payload += binary_field(packet.password)
    if not 0 <= packet.keep_alive <= 65535:
        raise LocalProtocolError("keep alive out of range")  # §3.1.2.10
    # The name and level are sent as given, so tests can offer levels we refuse.
    head = string_field(packet.protocol_name) + bytes((packet.protocol_level & 0xFF, flags)) + _U16.pack(packet.keep_alive)
    return frame(PT.CONNECT, head + payload)


def _encode_connack(conn: Negotiated, packet: p.ConnAck) -> bytes:
    code = packet.return_code
    if not 0 <= code <= 5:
        raise LocalProtocolError(f"reserved CONNACK return code {code}")  # §3.2.2.3
    present = packet.session_present
    if present and code:
        raise LocalProtocolError("session present on a refused connection")  # [MQTT-3.2.2-4]
    if conn.protocol_level == 3:
        present = False  # 3.1 has no session-present flag: the byte is reserved
    return frame(PT.CONNACK, bytes((1 if present else 0, code)))


def _ack_encoder(kind: PT) -> Encoder:
    first = bytes((kind << 4 | FIXED_FLAGS[kind], 2))

    def encode(conn: Negotiated, packet: p.Packet) -> bytes:
        return first + packet_id_field(packet.packet_id)  # type: ignore[union-attr]

    return encode


def _encode_subscribe(conn: Negotiated, packet: p.Subscribe) -> bytes:
    if not packet.topics:
        raise LocalProtocolError("SUBSCRIBE without a topic filter")  # [MQTT-3.8.3-3]
    topics = b"".join(string_field(t) + bytes((checked_qos(q),)) for t, q in packet.topics)
    body = packet_id_field(packet.packet_id) + topics
    return frame(PT.SUBSCRIBE, body)


def _encode_suback(conn: Negotiated, packet: p.SubAck) -> bytes:
    if not packet.return_codes or not set(packet.return_codes) <= SUBACK_CODES:
        raise LocalProtocolError("SUBACK needs return codes 0, 1, 2 or 0x80")  # [MQTT-3.9.3-2]
    return frame(PT.SUBACK, packet_id_field(packet.packet_id) + bytes(packet.return_codes))


def _encode_unsubscribe(conn: Negotiated, packet: p.Unsubscribe) -> bytes:
    if not packet.topics:
        raise LocalProtocolError("UNSUBSCRIBE without a topic filter")  # [MQTT-3.10.3-2]
    return frame(PT.UNSUBSCRIBE, packet_id_field(packet.packet_id) + b"".join(string_field(t) for t in packet.topics))


def _empty_encoder(kind: PT) -> Encoder:
    whole = bytes((kind << 4, 0))
    return lambda conn, packet: whole


# The 3.1.1 table: packet class -> (its type, its encoder).  MQTT 5's
# (gateway.mqtt.codec.encoders_v5) is this one with its own encoders merged
# over it, as the decoders' tables are built.
ENCODERS: dict[type, tuple[PT, Encoder]] = {
    p.Connect: (PT.CONNECT, _encode_connect),  # type: ignore[dict-item]
    p.ConnAck: (PT.CONNACK, _encode_connack),  # type: ignore[dict-item]
    p.Publish: (PT.PUBLISH, encode_publish),  # type: ignore[dict-item]
    p.PubAck: (PT.PUBACK, _ack_encoder(PT.PUBACK)),
    p.PubRec: (PT.PUBREC, _ack_encoder(PT.PUBREC)),
    p.PubRel: (PT.PUBREL, _ack_encoder(PT.PUBREL)),
    p.PubComp: (PT.PUBCOMP, _ack_encoder(PT.PUBCOMP)),
    p.Subscribe: (PT.SUBSCRIBE, _encode_subscribe),  # type: ignore[dict-item]
    p.SubAck: (PT.SUBACK, _encode_suback),  # type: ignore[dict-item]
    p.Unsubscribe: (PT.UNSUBSCRIBE, _encode_unsubscribe),  # type: ignore[dict-item]
    p.UnsubAck: (PT.UNSUBACK, _ack_encoder(PT.UNSUBACK)),
    p.PingReq: (PT.PINGREQ, _empty_encoder(PT.PINGREQ)),
    p.PingResp: (PT.PINGRESP, _empty_encoder(PT.PINGRESP)),
    p.Disconnect: (PT.DISCONNECT, _empty_encoder(PT.DISCONNECT)),
}


def senders(encoders: dict[type, tuple[PT, Encoder]], sent_by: dict[Role, frozenset[PT]]) -> dict[Role, dict[type, Encoder]]:
    """For each role, the encoders of the packets that role may send."""
    return {role: {cls: encode for cls, (kind, encode) in encoders.items() if kind in sent_by[role]} for role in Role}


SENDERS = senders(ENCODERS, SENT_BY)

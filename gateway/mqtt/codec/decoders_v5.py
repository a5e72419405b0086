"""Each MQTT 5.0 packet's variable header and payload, bytes to packet: the
decoders that differ from 3.1.1's (PINGREQ and PINGRESP do not), which
gateway.mqtt.codec.decoders merges over its own into ``DECODERS_V5``, and the part
of CONNECT after the protocol level, which its CONNECT decoder calls once it
has read level 5.

Spec references are to MQTT 5.0 (https://docs.oasis-open.org/mqtt/mqtt/v5.0/os/mqtt-v5.0-os.html).
Errors say which reason code the peer is answered with: 0x81 Malformed Packet
when none is named (the connection fills it in), 0x82 Protocol Error where the
spec calls it one.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.mqtt.codec import packets as p
from gateway.mqtt.codec.properties import WILL, Budget, read_properties
from gateway.mqtt.codec.reasons import DISCONNECT_CLIENT_ONLY, DISCONNECT_SERVER_ONLY, VALID, ReasonCode
from gateway.mqtt.codec.wire import (
    PROTOCOL_ERROR,
    PT,
    FieldReader,
    Negotiated,
    RemoteProtocolError,
    Role,
    too_many_filters,
    validate_topic_name,
)

Decoder = Callable[[Negotiated, bytes, int, int, int], p.Packet]
TOPIC_NAME_INVALID = int(ReasonCode.TOPIC_NAME_INVALID)


def budget(conn: Negotiated, kind: PT) -> Budget:
    """One packet's allowance for its properties, from its connection's limits."""
    return Budget(kind.name, conn.max_properties, conn.max_user_property_bytes)


def decode_connect_rest(conn: Negotiated, r: FieldReader, name: str, level: int) -> p.Connect:
    """A v5 CONNECT after its protocol name and level (v5 §3.1.2): the
    connection is already v5 here, so a refusal is answered in v5's terms."""
    connect_flags = r.u8()
    if connect_flags & 0x01:
        raise RemoteProtocolError("reserved CONNECT flag set")  # [MQTT-3.1.2-3]: malformed
    keep_alive = r.u16()
    allowance = budget(conn, PT.CONNECT)  # its properties and its will's together
    props, r.pos = read_properties(r.buf, r.pos, r.end, PT.CONNECT, allowance)
    if props is not None and props.authentication_data is not None and props.authentication_method is None:
        raise RemoteProtocolError("authentication data without a method", reason_code=PROTOCOL_ERROR)  # §3.1.2.11.10
    client_id = r.string()  # [MQTT-3.1.3-3], [MQTT-3.1.3-4]
    will_qos = (connect_flags >> 3) & 3
    will_retain = bool(connect_flags & 0x20)
    will = None
    if connect_flags & 0x04:
        if will_qos == 3:
            raise RemoteProtocolError("will QoS 3")  # [MQTT-3.1.2-12]: malformed
        will_props, r.pos = read_properties(r.buf, r.pos, r.end, WILL, allowance)  # [MQTT-3.1.3-10]
        topic = r.string()
        reason = validate_topic_name(topic)
        if reason is not None:
            raise RemoteProtocolError(f"will topic: {reason}", reason_code=TOPIC_NAME_INVALID)  # [MQTT-3.1.3-11]
        will = p.Will(topic, r.binary(), will_qos, will_retain, will_props)
    elif will_qos:
        raise RemoteProtocolError("will QoS set without a will")  # [MQTT-3.1.2-11]
    elif will_retain:
        raise RemoteProtocolError("will retain set without a will")  # [MQTT-3.1.2-13]
    # v5 allows a password without a user name (§3.1.2.9).
    username = r.string() if connect_flags & 0x80 else None  # [MQTT-3.1.2-17]
    password = r.binary() if connect_flags & 0x40 else None  # [MQTT-3.1.2-19]
    r.done()
    return p.Connect(client_id, bool(connect_flags & 0x02), keep_alive, username, password, will, name, level, props)


def _decode_connack(conn: Negotiated, buf: bytes, pos: int, end: int, flags: int) -> p.ConnAck:
    if end - pos < 3:
        raise RemoteProtocolError("CONNACK too short")  # §3.2.2
    ack_flags, code = buf[pos], buf[pos + 1]
    if ack_flags & 0xFE:
        raise RemoteProtocolError("reserved CONNACK flags set")  # [MQTT-3.2.2-1]
    if code not in VALID[PT.CONNACK]:
        raise RemoteProtocolError(f"invalid CONNACK reason code {code:#04x}")  # [MQTT-3.2.2-8]
    if code and ack_flags:
        raise RemoteProtocolError("session present on a refused connection", reason_code=PROTOCOL_ERROR)  # [MQTT-3.2.2-6]
    props, stop = read_properties(buf, pos + 2, end, PT.CONNACK, budget(conn, PT.CONNACK))
    _done(stop, end)
    return p.ConnAck(bool(ack_flags), code, props)


def _done(stop: int, end: int) -> None:
    if stop != end:
        raise RemoteProtocolError("bytes left over at the end of the packet")  # §2.1.4 remaining length


def _decode_publish(conn: Negotiated, buf: bytes, pos: int, end: int, flags: int) -> p.Publish:
    if end - pos < 2:
        raise RemoteProtocolError("PUBLISH without a topic name")  # [MQTT-3.3.2-1]
    topic_end = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
    if topic_end > end:
        raise RemoteProtocolError("a length runs past the end of the packet")  # §1.5.4
    try:
        topic = buf[pos + 2 : topic_end].decode("utf-8")
    except UnicodeDecodeError:
        raise RemoteProtocolError("topic name is not well-formed UTF-8") from None  # [MQTT-1.5.4-1]
    # An empty topic is the session's to judge: valid with a Topic Alias (§3.3.2.1).
    if "+" in topic or "#" in topic:
        raise RemoteProtocolError("wildcard in a PUBLISH topic name", reason_code=TOPIC_NAME_INVALID)  # [MQTT-3.3.2-2]
    if "\x00" in topic:
        raise RemoteProtocolError("string contains U+0000")  # [MQTT-1.5.4-2]
    qos = (flags >> 1) & 3
    packet_id = None
    start = topic_end
    if qos:
        if topic_end + 2 > end:
            raise RemoteProtocolError("QoS 1/2 PUBLISH without a packet identifier")  # [MQTT-2.2.1-2]
        packet_id = (buf[topic_end] << 8) | buf[topic_end + 1]
        if packet_id == 0:
            raise RemoteProtocolError("packet identifier 0")  # [MQTT-2.2.1-3]
        start += 2
    if start >= end:
        raise RemoteProtocolError("PUBLISH without a property length")  # §3.3.2.3
    if buf[start] == 0:
        props, data = None, start + 1
    else:
        props, data = read_properties(buf, start, end, PT.PUBLISH, budget(conn, PT.PUBLISH))
        if props is not None and props.subscription_identifiers and conn.role is Role.SERVER:
            raise RemoteProtocolError("a subscription identifier from a client",
                                      reason_code=PROTOCOL_ERROR)  # [MQTT-3.3.4-6]
    return p.Publish(topic, buf[data:end], qos, bool(flags & 1), bool(flags & 8), packet_id, props)


def _packet_id(buf: bytes, pos: int, end: int) -> int:
    if end - pos < 2:
        raise RemoteProtocolError("packet ends too early")
    packet_id = (buf[pos] << 8) | buf[pos + 1]
    if packet_id == 0:
        raise RemoteProtocolError("packet identifier 0")  # [MQTT-2.2.1-3]
    return packet_id


def _ack_decoder(cls: Callable[..., p.Packet], kind: PT) -> Decoder:
    """PUBACK, PUBREC, PUBREL, PUBCOMP in their three forms: the packet
    identifier alone (reason 0, no properties), then a reason code, then a
    property block (§3.4.2.1: the length says which)."""
    valid = VALID[kind]

    def decode(conn: Negotiated, buf: bytes, pos: int, end: int, flags: int) -> p.Packet:
        packet_id = _packet_id(buf, pos, end)
        if end - pos == 2:
            return cls(packet_id)
        code = buf[pos + 2]
        if code not in valid:
            raise RemoteProtocolError(f"invalid {kind.name} reason code {code:#04x}")  # [MQTT-3.4.2-1] and peers
        if end - pos == 3:
            return cls(packet_id, code)
        props, stop = read_properties(buf, pos + 3, end, kind, budget(conn, kind))
        _done(stop, end)
        return cls(packet_id, code, props)

    return decode


def _codes(buf: bytes, pos: int, end: int, kind: PT) -> list[int]:
    codes = list(buf[pos:end])
    if not codes:
        raise RemoteProtocolError(f"{kind.name} without reason codes", reason_code=PROTOCOL_ERROR)  # §3.9.3, §3.11.3
    if not set(codes) <= VALID[kind]:
        raise RemoteProtocolError(f"invalid {kind.name} reason code")  # [MQTT-3.9.3-2], [MQTT-3.11.3-2]
    return codes


def _decode_subscribe(conn: Negotiated, buf: bytes, pos: int, end: int, flags: int) -> p.Subscribe:
    packet_id = _packet_id(buf, pos, end)
    props, start = read_properties(buf, pos + 2, end, PT.SUBSCRIBE, budget(conn, PT.SUBSCRIBE))
    r = FieldReader(buf, start, end)
    topics: list[tuple[str, int]] = []
    while r.more():
        if len(topics) == conn.max_topic_filters:
            raise too_many_filters(conn, PT.SUBSCRIBE)
        topic_filter = r.string()  # whether it is a valid filter is the session's call (0x8F)
        options = r.u8()
        if options & 0xC0:
            raise RemoteProtocolError("reserved subscription option bits set")  # [MQTT-3.8.3-5]: malformed
        if options & 0x03 == 3:
            raise RemoteProtocolError("subscription QoS 3")  # §3.8.3.1: malformed
        if options & 0x30 == 0x30:
            raise RemoteProtocolError("retain handling 3", reason_code=PROTOCOL_ERROR)  # §3.8.3.1
        topics.append((topic_filter, options))
    if not topics:
        raise RemoteProtocolError("SUBSCRIBE without a topic filter", reason_code=PROTOCOL_ERROR)  # [MQTT-3.8.3-2]
    return p.Subscribe(packet_id, topics, props)


def _decode_suback(conn: Negotiated, buf: bytes, pos: int, end: int, flags: int) -> p.SubAck:
    packet_id = _packet_id(buf, pos, end)
    props, start = read_properties(buf, pos + 2, end, PT.SUBACK, budget(conn, PT.SUBACK))
    return p.SubAck(packet_id, _codes(buf, start, end, PT.SUBACK), props)


def _decode_unsubscribe(conn: Negotiated, buf: bytes, pos: int, end: int, flags: int) -> p.Unsubscribe:
    packet_id = _packet_id(buf, pos, end)
    props, start = read_properties(buf, pos + 2, end, PT.UNSUBSCRIBE, budget(conn, PT.UNSUBSCRIBE))
    r = FieldReader(buf, start, end)
    topics: list[str] = []
    while r.more():
        if len(topics) == conn.max_topic_filters:
            raise too_many_filters(conn, PT.UNSUBSCRIBE)
        topics.append(r.string())
    if not topics:
        raise RemoteProtocolError("UNSUBSCRIBE without a topic filter", reason_code=PROTOCOL_ERROR)  # [MQTT-3.10.3-2]
    return p.Unsubscribe(packet_id, topics, props)


def _decode_unsuback(conn: Negotiated, buf: bytes, pos: int, end: int, flags: int) -> p.UnsubAck:
    packet_id = _packet_id(buf, pos, end)
    props, start = read_properties(buf, pos + 2, end, PT.UNSUBACK, budget(conn, PT.UNSUBACK))
    return p.UnsubAck(packet_id, _codes(buf, start, end, PT.UNSUBACK), props)


def _decode_disconnect(conn: Negotiated, buf: bytes, pos: int, end: int, flags: int) -> p.Disconnect:
    # Remaining length 0: reason 0x00; below 2: no property length (§3.14.2.1, §3.14.2.2.1).
    if end == pos:
        return p.Disconnect()
    code = buf[pos]
    if code not in VALID[PT.DISCONNECT]:
        raise RemoteProtocolError(f"invalid DISCONNECT reason code {code:#04x}")  # [MQTT-3.14.2-1]
    if code in (DISCONNECT_SERVER_ONLY if conn.role is Role.SERVER else DISCONNECT_CLIENT_ONLY):
        raise RemoteProtocolError(f"DISCONNECT reason code {code:#04x} from the wrong side",
                                  reason_code=PROTOCOL_ERROR)  # §3.14.2.1 "sent by"
    if end - pos == 1:
        return p.Disconnect(code)
    props, stop = read_properties(buf, pos + 1, end, PT.DISCONNECT, budget(conn, PT.DISCONNECT))
    _done(stop, end)
    if props is not None and props.session_expiry_interval is not None and conn.role is Role.CLIENT:
        raise RemoteProtocolError("session expiry interval from the server", reason_code=PROTOCOL_ERROR)  # [MQTT-3.14.2-2]
    return p.Disconnect(code, props)


def _decode_auth(conn: Negotiated, buf: bytes, pos: int, end: int, flags: int) -> p.Auth:
    # Remaining length 0: success without properties (§3.15.2.1); otherwise both follow.
    if end == pos:
        return p.Auth()
    code = buf[pos]
    if code not in VALID[PT.AUTH]:
        raise RemoteProtocolError(f"invalid AUTH reason code {code:#04x}")  # [MQTT-3.15.2-1]
    props, stop = read_properties(buf, pos + 1, end, PT.AUTH, budget(conn, PT.AUTH))
    _done(stop, end)
    if props is None or props.authentication_method is None:
        raise RemoteProtocolError("AUTH without an authentication method", reason_code=PROTOCOL_ERROR)  # §3.15.2.2.2
    return p.Auth(code, props)


# Merged over the 3.1.1 table by gateway.mqtt.codec.decoders (PINGREQ, PINGRESP and
# CONNECT, whose decoder reads the level first, are shared).
DECODERS: dict[PT, Decoder] = {
    PT.CONNACK: _decode_connack,
    PT.PUBLISH: _decode_publish,
    PT.PUBACK: _ack_decoder(p.PubAck, PT.PUBACK),
    PT.PUBREC: _ack_decoder(p.PubRec, PT.PUBREC),
    PT.PUBREL: _ack_decoder(p.PubRel, PT.PUBREL),
    PT.PUBCOMP: _ack_decoder(p.PubComp, PT.PUBCOMP),
    PT.SUBSCRIBE: _decode_subscribe,
    PT.SUBACK: _decode_suback,
    PT.UNSUBSCRIBE: _decode_unsubscribe,
    PT.UNSUBACK: _decode_unsuback,
    PT.DISCONNECT: _decode_disconnect,
    PT.AUTH: _decode_auth,
}

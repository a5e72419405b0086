"""Each MQTT 3.1.1 packet's variable header and payload, bytes to packet: one
decoder per packet type, chosen by :data:`DECODERS_V311` from the type the
fixed header named.  The connection (codec.py) has already checked the first
byte, the packet order and the remaining length; a decoder sees exactly one
packet's body, ``buf[pos:end]``, and the fixed header's flags.

MQTT 5 is a second table, :data:`DECODERS_V5`, chosen by the connection once
CONNECT fixed level 5: gateway.mqtt.codec.decoders_v5's decoders merged over these.
The CONNECT decoder serves both: it reads the protocol name and level, then
the rest as that level lays it out.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.mqtt.codec import decoders_v5
from gateway.mqtt.codec import packets as p
from gateway.mqtt.codec.wire import (
    KNOWN_PROTOCOL_NAMES,
    MQTT5,
    PT,
    SUBACK_CODES,
    SUPPORTED_PROTOCOLS,
    FieldReader,
    Negotiated,
    RemoteProtocolError,
    too_many_filters,
    validate_topic_name,
)

Decoder = Callable[[Negotiated, bytes, int, int, int], p.Packet]


def _decode_connect(conn: Negotiated, buf: bytes, pos: int, end: int, flags: int) -> p.Connect:
    r = FieldReader(buf, pos, end)
    name = r.string()
    level = r.u8()
    if name not in KNOWN_PROTOCOL_NAMES:
        raise RemoteProtocolError(f"unknown protocol name {name[:20]!r}")  # [MQTT-3.1.2-1]
    if (name, level) not in SUPPORTED_PROTOCOLS:
        # Answer CONNACK 0x01 and close [MQTT-3.1.2-2]; a v5 server would say 0x84, but a
        # client of an unknown level is answered in the oldest form it may read.
        raise RemoteProtocolError(
            f"unsupported protocol {name} level {level}", return_code=p.UNACCEPTABLE_PROTOCOL_VERSION,
            reason_code=0x84,
        )
    # Fixed before anything else is read, so a refusal of what follows is
    # answered in this level's terms (v5: a CONNACK with a reason code).
    conn.protocol_level = level
    if level == MQTT5:
        return decoders_v5.decode_connect_rest(conn, r, name, level)
    connect_flags = r.u8()
    if connect_flags & 0x01:
        raise RemoteProtocolError("reserved CONNECT flag set")  # [MQTT-3.1.2-3]
    keep_alive = r.u16()
    client_id = r.string()  # [MQTT-3.1.3-3], [MQTT-3.1.3-4]; first in the payload [MQTT-3.1.3-1]
    will_qos = (connect_flags >> 3) & 3
    will_retain = bool(connect_flags & 0x20)
    will = None
    if connect_flags & 0x04:
        if will_qos == 3:
            raise RemoteProtocolError("will QoS 3")  # [MQTT-3.1.2-14]
        topic = r.string()  # [MQTT-3.1.2-9], [MQTT-3.1.3-10]
        reason = validate_topic_name(topic)
        if reason is not None:
            raise RemoteProtocolError(f"will topic: {reason}")  # a will topic is a topic name [MQTT-3.3.2-2]
        will = p.Will(topic, r.binary(), will_qos, will_retain)  # [MQTT-3.1.2-9]
    elif will_qos:
        raise RemoteProtocolError("will QoS set without a will")  # [MQTT-3.1.2-11], [MQTT-3.1.2-13]
    elif will_retain:
        raise RemoteProtocolError("will retain set without a will")  # [MQTT-3.1.2-15]
    has_username = bool(connect_flags & 0x80)
    has_password = bool(connect_flags & 0x40)
    if has_password and not has_username:
        raise RemoteProtocolError("password without a user name")  # [MQTT-3.1.2-22]
    username = r.string() if has_username else None  # [MQTT-3.1.2-19], [MQTT-3.1.3-11]
    password = r.binary() if has_password else None  # [MQTT-3.1.2-21]
    r.done()  # nothing the flags do not announce [MQTT-3.1.2-18], [MQTT-3.1.2-20]
    return p.Connect(client_id, bool(connect_flags & 0x02), keep_alive, username, password, will, name, level)


def _decode_connack(conn: Negotiated, buf: bytes, pos: int, end: int, flags: int) -> p.ConnAck:
    if end - pos != 2:
        raise RemoteProtocolError("CONNACK remaining length must be 2")  # §3.2.1
    ack_flags, code = buf[pos], buf[pos + 1]
    if ack_flags & 0xFE:
        raise RemoteProtocolError("reserved CONNACK flags set")  # §3.2.2.1
    if code > 5:
        raise RemoteProtocolError(f"reserved CONNACK return code {code}")  # §3.2.2.3
    if code and ack_flags:
        raise RemoteProtocolError("session present on a refused connection")  # [MQTT-3.2.2-4]
    return p.ConnAck(bool(ack_flags), code)


def _ack_decoder(cls: Callable[[int], p.Packet], name: str) -> Decoder:
    def decode(conn: Negotiated, buf: bytes, pos: int, end: int, flags: int) -> p.Packet:
        if end - pos != 2:
            raise RemoteProtocolError(f"{name} remaining length must be 2")  # §3.4.1 to §3.7.1, §3.11.1
        packet_id = (buf[pos] << 8) | buf[pos + 1]
        if packet_id == 0:
            raise RemoteProtocolError("packet identifier 0")  # [MQTT-2.3.1-1]
        return cls(packet_id)

    return decode


def _decode_subscribe(conn: Negotiated, buf: bytes, pos: int, end: int, flags: int) -> p.Subscribe:
    r = FieldReader(buf, pos, end)
    packet_id = r.packet_id()
    topics: list[tuple[str, int]] = []
    while r.more():
        if len(topics) == conn.max_topic_filters:
            raise too_many_filters(conn, PT.SUBSCRIBE)
        # The filter is only decoded here; whether it is a valid filter is the
        # session's call, answered with 0x80 for that filter alone.
        topic_filter = r.string()
        options = r.u8()
        if options > 2:
            raise RemoteProtocolError("reserved bits or QoS 3 in a requested QoS")  # [MQTT-3.8.3-4]
        topics.append((topic_filter, options))
    if not topics:
        raise RemoteProtocolError("SUBSCRIBE without a topic filter")  # [MQTT-3.8.3-3]
    return p.Subscribe(packet_id, topics)


def _decode_suback(conn: Negotiated, buf: bytes, pos: int, end: int, flags: int) -> p.SubAck:
    r = FieldReader(buf, pos, end)
    packet_id = r.packet_id()
    codes = list(buf[r.pos : end])
    if not codes:
        raise RemoteProtocolError("SUBACK without return codes")  # [MQTT-3.8.4-5]
    if not set(codes) <= SUBACK_CODES:
        raise RemoteProtocolError("reserved SUBACK return code")  # [MQTT-3.9.3-2]
    return p.SubAck(packet_id, codes)


def _decode_unsubscribe(conn: Negotiated, buf: bytes, pos: int, end: int, flags: int) -> p.Unsubscribe:
    r = FieldReader(buf, pos, end)
    packet_id = r.packet_id()
    topics: list[str] = []
    while r.more():
        if len(topics) == conn.max_topic_filters:
            raise too_many_filters(conn, PT.UNSUBSCRIBE)
        topics.append(r.string())
    if not topics:
        raise RemoteProtocolError("UNSUBSCRIBE without a topic filter")  # [MQTT-3.10.3-2]
    return p.Unsubscribe(packet_id, topics)


def _empty_decoder(cls: Callable[[], p.Packet], name: str) -> Decoder:
    def decode(conn: Negotiated, buf: bytes, pos: int, end: int, flags: int) -> p.Packet:
        if end != pos:
            raise RemoteProtocolError(f"{name} must have no body")  # §3.12.1, §3.13.1, §3.14.1
        return cls()

    return decode


def _decode_publish(conn: Negotiated, buf: bytes, pos: int, end: int, flags: int) -> p.Publish:
    # The hot path: inline, no cursor object.  QoS 3 and DUP on QoS 0 were
    # refused from the first byte.
    if end - pos < 2:
        raise RemoteProtocolError("PUBLISH without a topic name")  # [MQTT-3.3.2-1]
    topic_end = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
    if topic_end > end:
        raise RemoteProtocolError("a length runs past the end of the packet")  # §1.5.3
    try:
        topic = buf[pos + 2 : topic_end].decode("utf-8")
    except UnicodeDecodeError:
        raise RemoteProtocolError("topic name is not well-formed UTF-8") from None  # [MQTT-1.5.3-1]
    if not topic:
        raise RemoteProtocolError("empty topic name")  # [MQTT-4.7.3-1]
    if "+" in topic or "#" in topic:
        raise RemoteProtocolError("wildcard in a PUBLISH topic name")  # [MQTT-3.3.2-2]
    if "\x00" in topic:
        raise RemoteProtocolError("string contains U+0000")  # [MQTT-1.5.3-2]
    qos = (flags >> 1) & 3
    if qos:
        if topic_end + 2 > end:
            raise RemoteProtocolError("QoS 1/2 PUBLISH without a packet identifier")  # [MQTT-2.3.1-1]
        packet_id = (buf[topic_end] << 8) | buf[topic_end + 1]
        if packet_id == 0:
            raise RemoteProtocolError("packet identifier 0")  # [MQTT-2.3.1-1]
        return p.Publish(topic, buf[topic_end + 2 : end], qos, bool(flags & 1), bool(flags & 8), packet_id)
    return p.Publish(topic, buf[topic_end:end], 0, bool(flags & 1))


DECODERS_V311: dict[PT, Decoder] = {
    PT.CONNECT: _decode_connect,
    PT.CONNACK: _decode_connack,
    PT.PUBLISH: _decode_publish,
    PT.PUBACK: _ack_decoder(p.PubAck, "PUBACK"),
    PT.PUBREC: _ack_decoder(p.PubRec, "PUBREC"),
    PT.PUBREL: _ack_decoder(p.PubRel, "PUBREL"),
    PT.PUBCOMP: _ack_decoder(p.PubComp, "PUBCOMP"),
    PT.SUBSCRIBE: _decode_subscribe,
    PT.SUBACK: _decode_suback,
    PT.UNSUBSCRIBE: _decode_unsubscribe,
    PT.UNSUBACK: _ack_decoder(p.UnsubAck, "UNSUBACK"),
    PT.PINGREQ: _empty_decoder(p.PingReq, "PINGREQ"),
    PT.PINGRESP: _empty_decoder(p.PingResp, "PINGRESP"),
    PT.DISCONNECT: _empty_decoder(p.Disconnect, "DISCONNECT"),
}
DECODERS_V5: dict[PT, Decoder] = {**DECODERS_V311, **decoders_v5.DECODERS}


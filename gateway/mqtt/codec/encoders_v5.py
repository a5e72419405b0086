"""Each MQTT 5.0 packet, packet to bytes, for a connection at level 5:
:data:`SENDERS_V5` holds, for each role, the encoders of the packets that role
may send; :func:`encode_publish_v5` is PUBLISH's, called directly by the
connection.  Like 3.1.1's encoders, each refuses (LocalProtocolError) what the
peer would refuse: a property the packet may not carry, a value out of range,
a reason code not valid for the packet.

The acknowledgements use their shortest form: the packet identifier alone
when the reason is 0x00 and there are no properties, then the reason code
without a property length (v5 §3.4.2.1 and peers); DISCONNECT and AUTH the
same with an empty body (§3.14.2.1, §3.15.2.1).
"""

from __future__ import annotations

import struct

from gateway.mqtt.codec import packets as p
from gateway.mqtt.codec.encoders import EMPTY_TOPIC_FIELD, ENCODERS, Encoder, publish_bytes, senders, topic_field
from gateway.mqtt.codec.properties import WILL, encode_properties
from gateway.mqtt.codec.reasons import DISCONNECT_CLIENT_ONLY, DISCONNECT_SERVER_ONLY, VALID
from gateway.mqtt.codec.wire import (
    FIXED_FLAGS,
    PT,
    SENT_BY_V5,
    LocalProtocolError,
    Negotiated,
    Role,
    binary_field,
    checked_qos,
    frame,
    packet_id_field,
    string_field,
)

_U16 = struct.Struct(">H")


def _reason(kind: PT, code: int) -> int:
    if code not in VALID[kind]:
        raise LocalProtocolError(f"reason code {code!r} is not valid in {kind.name}")  # v5 §2.4
    return code


def encode_publish_v5(conn: Negotiated, packet: p.Publish) -> bytes:
    props = packet.properties
    if props is not None and props.topic_alias is not None and not packet.topic:
        field = EMPTY_TOPIC_FIELD  # the alias names the topic (v5 §3.3.2.3.4)
    else:
        field = topic_field(packet.topic)
    if props is not None and props.subscription_identifiers and conn.role is Role.CLIENT:
        raise LocalProtocolError("a client's PUBLISH carries no subscription identifier")  # [MQTT-3.3.4-6]
    block = encode_properties(props, PT.PUBLISH)
    return publish_bytes(field, packet.payload, packet.qos, packet.retain, packet.dup, packet.packet_id, block)


def _encode_connect(conn: Negotiated, packet: p.Connect) -> bytes:
    flags = 0x02 if packet.clean_session else 0
    payload = string_field(packet.client_id)
    will = packet.will
    if will is not None:
        flags |= 0x04 | checked_qos(will.qos) << 3 | (0x20 if will.retain else 0)
        payload += encode_properties(will.properties, WILL) + string_field(will.topic) + binary_field(will.payload)
    if packet.username is not None:
        flags |= 0x80
        payload += string_field(packet.username)
    if packet.password is not None:  # without a user name too, in v5 (§3.1.2.9)
        flags |= 0x40
        payload += binary_field(packet.password)
    if not 0 <= packet.keep_alive <= 65535:
        raise LocalProtocolError("keep alive out of range")  # §3.1.2.10
    head = string_field(packet.protocol_name) + bytes((packet.protocol_level & 0xFF, flags))
    head += _U16.pack(packet.keep_alive) + encode_properties(packet.properties, PT.CONNECT)
    return frame(PT.CONNECT, head + payload)


def _encode_connack(conn: Negotiated, packet: p.ConnAck) -> bytes:
    code = _reason(PT.CONNACK, packet.return_code)
    if packet.session_present and code:
        raise LocalProtocolError("session present on a refused connection")  # [MQTT-3.2.2-6]
    body = bytes((1 if packet.session_present else 0, code)) + encode_properties(packet.properties, PT.CONNACK)
    return frame(PT.CONNACK, body)


def _ack_encoder(kind: PT) -> Encoder:
    first = kind << 4 | FIXED_FLAGS[kind]
    short = bytes((first, 2))
    medium = bytes((first, 3))

    def encode(conn: Negotiated, packet: p.Packet) -> bytes:
        head = packet_id_field(packet.packet_id)  # type: ignore[union-attr]
        code = _reason(kind, packet.reason_code)  # type: ignore[union-attr]
        props = packet.properties  # type: ignore[union-attr]
        if props is None:
            return short + head if code == 0 else medium + head + bytes((code,))
        return frame(kind, head + bytes((code,)) + encode_properties(props, kind))

    return encode


def _encode_subscribe(conn: Negotiated, packet: p.Subscribe) -> bytes:
    if not packet.topics:
        raise LocalProtocolError("SUBSCRIBE without a topic filter")  # [MQTT-3.8.3-2]
    parts = [packet_id_field(packet.packet_id), encode_properties(packet.properties, PT.SUBSCRIBE)]
    for topic_filter, options in packet.topics:
        if not 0 <= options <= 0x3F or options & 0x03 == 3 or options & 0x30 == 0x30:
            raise LocalProtocolError(f"invalid subscription options {options!r}")  # [MQTT-3.8.3-5], §3.8.3.1
        parts.append(string_field(topic_filter) + bytes((options,)))
    return frame(PT.SUBSCRIBE, b"".join(parts))


def _codes(kind: PT, codes: list[int]) -> bytes:
    if not codes:
        raise LocalProtocolError(f"{kind.name} needs a reason code per topic filter")  # [MQTT-3.9.3-1], [MQTT-3.11.3-1]
    for code in codes:
        _reason(kind, code)
    return bytes(codes)


def _encode_suback(conn: Negotiated, packet: p.SubAck) -> bytes:
    body = packet_id_field(packet.packet_id) + encode_properties(packet.properties, PT.SUBACK)
    return frame(PT.SUBACK, body + _codes(PT.SUBACK, packet.return_codes))


def _encode_unsubscribe(conn: Negotiated, packet: p.Unsubscribe) -> bytes:
    if not packet.topics:
        raise LocalProtocolError("UNSUBSCRIBE without a topic filter")  # [MQTT-3.10.3-2]
    body = packet_id_field(packet.packet_id) + encode_properties(packet.properties, PT.UNSUBSCRIBE)
    return frame(PT.UNSUBSCRIBE, body + b"".join(string_field(t) for t in packet.topics))


def _encode_unsuback(conn: Negotiated, packet: p.UnsubAck) -> bytes:
    body = packet_id_field(packet.packet_id) + encode_properties(packet.properties, PT.UNSUBACK)
    return frame(PT.UNSUBACK, body + _codes(PT.UNSUBACK, packet.reason_codes))


def _encode_disconnect(conn: Negotiated, packet: p.Disconnect) -> bytes:
    code = _reason(PT.DISCONNECT, packet.reason_code)
    if code in (DISCONNECT_CLIENT_ONLY if conn.role is Role.SERVER else DISCONNECT_SERVER_ONLY):
        raise LocalProtocolError(f"a {conn.role.value} does not send DISCONNECT {code:#04x}")  # §3.14.2.1
    props = packet.properties
    if props is not None and props.session_expiry_interval is not None and conn.role is Role.SERVER:
        raise LocalProtocolError("the server sends no session expiry interval in DISCONNECT")  # [MQTT-3.14.2-2]
    if props is None:
        return frame(PT.DISCONNECT, bytes((code,)) if code else b"")
    return frame(PT.DISCONNECT, bytes((code,)) + encode_properties(props, PT.DISCONNECT))


def _encode_auth(conn: Negotiated, packet: p.Auth) -> bytes:
    code = _reason(PT.AUTH, packet.reason_code)
    props = packet.properties
    if props is None and code == 0:
        return frame(PT.AUTH, b"")  # §3.15.2.1: both may be omitted
    if props is None or props.authentication_method is None:
        raise LocalProtocolError("AUTH needs an authentication method")  # §3.15.2.2.2
    return frame(PT.AUTH, bytes((code,)) + encode_properties(props, PT.AUTH))


# 3.1.1's table with v5's encoders merged over it (PINGREQ and PINGRESP are shared).
_ENCODERS: dict[type, tuple[PT, Encoder]] = {
    **ENCODERS,
    p.Connect: (PT.CONNECT, _encode_connect),  # type: ignore[dict-item]
    p.ConnAck: (PT.CONNACK, _encode_connack),  # type: ignore[dict-item]
    p.Publish: (PT.PUBLISH, encode_publish_v5),  # type: ignore[dict-item]
    p.PubAck: (PT.PUBACK, _ack_encoder(PT.PUBACK)),
    p.PubRec: (PT.PUBREC, _ack_encoder(PT.PUBREC)),
    p.PubRel: (PT.PUBREL, _ack_encoder(PT.PUBREL)),
    p.PubComp: (PT.PUBCOMP, _ack_encoder(PT.PUBCOMP)),
    p.Subscribe: (PT.SUBSCRIBE, _encode_subscribe),  # type: ignore[dict-item]
    p.SubAck: (PT.SUBACK, _encode_suback),  # type: ignore[dict-item]
    p.Unsubscribe: (PT.UNSUBSCRIBE, _encode_unsubscribe),  # type: ignore[dict-item]
    p.UnsubAck: (PT.UNSUBACK, _encode_unsuback),  # type: ignore[dict-item]
    p.Disconnect: (PT.DISCONNECT, _encode_disconnect),  # type: ignore[dict-item]
    p.Auth: (PT.AUTH, _encode_auth),  # type: ignore[dict-item]
}
SENDERS_V5 = senders(_ENCODERS, SENT_BY_V5)

"""A strict sans-IO MQTT 3.1.1 codec in the style of h11 (and of the STOMP codec).

Feed bytes with :meth:`MqttConnection.receive_data`, take packets from
:meth:`MqttConnection.events`, turn packets into bytes with
:meth:`MqttConnection.send`.  No sockets, clocks or logs.  A peer that breaks
the protocol gets :class:`RemoteProtocolError`; when the right answer is a
CONNACK with a refusal code (an unsupported protocol level) the error carries it
in ``return_code``, otherwise the answer is to close.

Every rule cites its normative statement in the 3.1.1 specification
(https://docs.oasis-open.org/mqtt/mqtt/v3.1.1/os/mqtt-v3.1.1-os.html) as
``[MQTT-x.y.z-n]``, or its section where the rule has no number.

Checks that need only the fixed header (packet type for this role, reserved
flags, PUBLISH QoS and DUP, packet order, size limit) run as soon as that header
is buffered, so a hostile first byte or length never makes us buffer a body.

MQTT 5: the protocol level is fixed on the connection by CONNECT
(``protocol_level``).  A v5 parser would be a second decoder table chosen there,
its decoders reading the properties that follow each variable header (into
defaulted fields of the packet classes) and its acks' reason codes.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable, Iterator

from gateway.mqtt import packets as p

MAX_REMAINING_LENGTH = 268_435_455  # four bytes of seven bits (§2.2.3)
MAX_PACKET_BYTES = 256 * 1024 * 1024
# (protocol name, level) pairs we speak: 3.1.1, and 3.1 whose packets are the same
# for everything parsed here ("MQIsdp" level 3).
SUPPORTED_PROTOCOLS = frozenset({("MQTT", 4), ("MQIsdp", 3)})
KNOWN_PROTOCOL_NAMES = frozenset(name for name, _ in SUPPORTED_PROTOCOLS)

_U16 = struct.Struct(">H")
_BBH = struct.Struct(">BBH")  # first byte, one-byte remaining length, topic length


class Role(enum.Enum):
    SERVER = "server"  # parses client packets, serializes server packets
    CLIENT = "client"  # the reverse; for tests and benchmarks


class State(enum.Enum):
    """What the peer may send next."""

    AWAITING_CONNECT = "awaiting connect"  # server: nothing but CONNECT [MQTT-3.1.0-1]
    AWAITING_CONNACK = "awaiting connack"  # client: nothing but CONNACK [MQTT-3.2.0-1]
    CONNECTED = "connected"
    ERROR = "error"  # the peer broke the protocol; events() raises again


class ProtocolError(Exception):
    """An MQTT protocol violation.  ``return_code`` is the CONNACK code to answer
    with before closing, or None when the answer is just to close."""

    def __init__(self, message: str, *, return_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.return_code = return_code


class RemoteProtocolError(ProtocolError):
    """The peer sent something malformed or out of order."""


class LocalProtocolError(ProtocolError):
    """We were asked to send something the protocol does not allow."""


# -- topic names and filters (§4.7) --------------------------------------------


def validate_topic_name(name: str) -> str | None:
    """Why ``name`` cannot be a PUBLISH topic, or None."""
    if not name:
        return "empty topic name"  # [MQTT-4.7.3-1]
    if "+" in name or "#" in name:
        return "wildcard in a topic name"  # [MQTT-3.3.2-2], [MQTT-4.7.1-1]
    if "\x00" in name:
        return "U+0000 in a topic name"  # [MQTT-4.7.3-2]
    if len(name.encode("utf-8", "surrogatepass")) > 65535:
        return "topic name longer than 65535 bytes"  # [MQTT-4.7.3-3]
    return None


def validate_topic_filter(topic_filter: str) -> str | None:
    """Why ``topic_filter`` cannot be subscribed to, or None."""
    if not topic_filter:
        return "empty topic filter"  # [MQTT-4.7.3-1]
    if "\x00" in topic_filter:
        return "U+0000 in a topic filter"  # [MQTT-4.7.3-2]
    if "+" in topic_filter or "#" in topic_filter:
        levels = topic_filter.split("/")
        last = len(levels) - 1
        for i, level in enumerate(levels):
            if "#" in level and (level != "#" or i != last):
                return "'#' must be alone in the last level"  # [MQTT-4.7.1-2]
            if "+" in level and level != "+":
                return "'+' must be alone in its level"  # [MQTT-4.7.1-3]
    return None


# -- the fixed header (§2.2) ---------------------------------------------------

PT = p.PacketType

# Flags each packet type must carry exactly ([MQTT-2.2.2-1], [MQTT-2.2.2-2]);
# PUBLISH's are its own (DUP, QoS, RETAIN) and are checked in _first_byte_table.
_FIXED_FLAGS = {kind: 0 for kind in PT}
_FIXED_FLAGS[PT.PUBREL] = 0b0010  # [MQTT-3.6.1-1]
_FIXED_FLAGS[PT.SUBSCRIBE] = 0b0010  # [MQTT-3.8.1-1]
_FIXED_FLAGS[PT.UNSUBSCRIBE] = 0b0010  # [MQTT-3.10.1-1]

# Who sends what (§2.2.1, "Direction of flow").
_SENT_BY = {
    Role.CLIENT: frozenset({PT.CONNECT, PT.PUBLISH, PT.PUBACK, PT.PUBREC, PT.PUBREL, PT.PUBCOMP,
                            PT.SUBSCRIBE, PT.UNSUBSCRIBE, PT.PINGREQ, PT.DISCONNECT}),
    Role.SERVER: frozenset({PT.CONNACK, PT.PUBLISH, PT.PUBACK, PT.PUBREC, PT.PUBREL, PT.PUBCOMP,
                            PT.SUBACK, PT.UNSUBACK, PT.PINGRESP}),
}


def _first_byte_table(incoming: frozenset[PT]) -> tuple[PT | str, ...]:
    """For each possible first byte: its packet type, or why it is refused."""
    table: list[PT | str] = []
    for first in range(256):
        kind, flags = first >> 4, first & 0x0F
        if kind in (0, 15):
            table.append(f"reserved packet type {kind}")  # §2.2.1
        elif kind not in incoming:
            table.append(f"unexpected {PT(kind).name} from this peer")  # §2.2.1 direction of flow
        elif kind == PT.PUBLISH and flags & 0b0110 == 0b0110:
            table.append("PUBLISH with QoS 3")  # [MQTT-3.3.1-4]
        elif kind == PT.PUBLISH and flags & 0b1000 and not flags & 0b0110:
            table.append("DUP set on a QoS 0 PUBLISH")  # [MQTT-3.3.1-2]
        elif kind != PT.PUBLISH and flags != _FIXED_FLAGS[PT(kind)]:
            table.append(f"invalid fixed-header flags {flags:#06b} on {PT(kind).name}")  # [MQTT-2.2.2-2]
        else:
            table.append(PT(kind))
    return tuple(table)


_FIRST_BYTE = {
    Role.SERVER: _first_byte_table(_SENT_BY[Role.CLIENT]),
    Role.CLIENT: _first_byte_table(_SENT_BY[Role.SERVER]),
}

# Packet order as a table: (state, incoming type) -> next state.  Anything
# missing is a violation, explained by _ORDER_ERRORS.
_TRANSITIONS: dict[tuple[State, PT], State] = {
    (State.AWAITING_CONNECT, PT.CONNECT): State.CONNECTED,  # [MQTT-3.1.0-1]
    (State.AWAITING_CONNACK, PT.CONNACK): State.CONNECTED,  # [MQTT-3.2.0-1]
}
for _kind in _SENT_BY[Role.CLIENT] - {PT.CONNECT}:  # a second CONNECT is refused [MQTT-3.1.0-2]
    _TRANSITIONS[(State.CONNECTED, _kind)] = State.CONNECTED
for _kind in _SENT_BY[Role.SERVER] - {PT.CONNACK}:  # CONNACK comes once, first [MQTT-3.2.0-1]
    _TRANSITIONS[(State.CONNECTED, _kind)] = State.CONNECTED
# The same table indexed by state first, so the per-packet lookup builds no tuple.
_ALLOWED: dict[State, dict[PT, State]] = {state: {} for state in State}
for (_state, _kind), _next_state in _TRANSITIONS.items():
    _ALLOWED[_state][_kind] = _next_state
_ORDER_ERRORS = {
    State.AWAITING_CONNECT: "the first packet must be CONNECT",  # [MQTT-3.1.0-1]
    State.AWAITING_CONNACK: "the first packet from the server must be CONNACK",  # [MQTT-3.2.0-1]
}  # else, when CONNECTED: "a second CONNECT" [MQTT-3.1.0-2] (or, to a client, a second CONNACK)


# -- variable headers and payloads -------------------------------------------


class _Reader:
    """Cursor over one packet's variable header and payload (not the hot path:
    PUBLISH and the acks are parsed inline)."""

    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf: bytes, pos: int, end: int) -> None:
        self.buf = buf
        self.pos = pos
        self.end = end

    def u8(self) -> int:
        if self.pos >= self.end:
            raise RemoteProtocolError("packet ends too early")  # §1.5.1 / remaining length
        value = self.buf[self.pos]
        self.pos += 1
        return value

    def u16(self) -> int:
        if self.pos + 2 > self.end:
            raise RemoteProtocolError("packet ends too early")
        value = (self.buf[self.pos] << 8) | self.buf[self.pos + 1]
        self.pos += 2
        return value

    def binary(self) -> bytes:
        n = self.u16()
        if self.pos + n > self.end:
            raise RemoteProtocolError("a length runs past the end of the packet")  # §1.5.3
        value = self.buf[self.pos : self.pos + n]
        self.pos += n
        return value

    def string(self) -> str:
        return _decode_string(self.binary())

    def packet_id(self) -> int:
        value = self.u16()
        if value == 0:
            raise RemoteProtocolError("packet identifier 0")  # [MQTT-2.3.1-1]
        return value

    def more(self) -> bool:
        return self.pos < self.end

    def done(self) -> None:
        if self.pos != self.end:
            raise RemoteProtocolError("bytes left over at the end of the packet")  # §2.2.3


def _decode_string(raw: bytes) -> str:
    try:
        # Python's strict decoder refuses ill-formed UTF-8, overlong forms and
        # encoded surrogates U+D800..U+DFFF [MQTT-1.5.3-1].
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RemoteProtocolError("string is not well-formed UTF-8") from None  # [MQTT-1.5.3-1]
    if "\x00" in text:
        raise RemoteProtocolError("string contains U+0000")  # [MQTT-1.5.3-2]
    return text


_Decoder = Callable[["MqttConnection", bytes, int, int, int], p.Packet]


def _decode_connect(conn: MqttConnection, buf: bytes, pos: int, end: int, flags: int) -> p.Connect:
    r = _Reader(buf, pos, end)
    name = r.string()
    level = r.u8()
    if name not in KNOWN_PROTOCOL_NAMES:
        raise RemoteProtocolError(f"unknown protocol name {name[:20]!r}")  # [MQTT-3.1.2-1]
    if (name, level) not in SUPPORTED_PROTOCOLS:
        # Answer CONNACK 0x01 and close [MQTT-3.1.2-2].
        raise RemoteProtocolError(
            f"unsupported protocol {name} level {level}", return_code=p.UNACCEPTABLE_PROTOCOL_VERSION
        )
    conn.protocol_level = level
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


def _decode_connack(conn: MqttConnection, buf: bytes, pos: int, end: int, flags: int) -> p.ConnAck:
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


def _ack_decoder(cls: Callable[[int], p.Packet], name: str) -> _Decoder:
    def decode(conn: MqttConnection, buf: bytes, pos: int, end: int, flags: int) -> p.Packet:
        if end - pos != 2:
            raise RemoteProtocolError(f"{name} remaining length must be 2")  # §3.4.1 to §3.7.1, §3.11.1
        packet_id = (buf[pos] << 8) | buf[pos + 1]
        if packet_id == 0:
            raise RemoteProtocolError("packet identifier 0")  # [MQTT-2.3.1-1]
        return cls(packet_id)

    return decode


def _decode_subscribe(conn: MqttConnection, buf: bytes, pos: int, end: int, flags: int) -> p.Subscribe:
    r = _Reader(buf, pos, end)
    packet_id = r.packet_id()
    topics = []
    while r.more():
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


def _decode_suback(conn: MqttConnection, buf: bytes, pos: int, end: int, flags: int) -> p.SubAck:
    r = _Reader(buf, pos, end)
    packet_id = r.packet_id()
    codes = list(buf[r.pos : end])
    if not codes:
        raise RemoteProtocolError("SUBACK without return codes")  # [MQTT-3.8.4-5]
    if not set(codes) <= _SUBACK_CODES:
        raise RemoteProtocolError("reserved SUBACK return code")  # [MQTT-3.9.3-2]
    return p.SubAck(packet_id, codes)


_SUBACK_CODES = frozenset(int(code) for code in p.SubscribeReturnCode)


def _decode_unsubscribe(conn: MqttConnection, buf: bytes, pos: int, end: int, flags: int) -> p.Unsubscribe:
    r = _Reader(buf, pos, end)
    packet_id = r.packet_id()
    topics = []
    while r.more():
        topics.append(r.string())
    if not topics:
        raise RemoteProtocolError("UNSUBSCRIBE without a topic filter")  # [MQTT-3.10.3-2]
    return p.Unsubscribe(packet_id, topics)


def _empty_decoder(cls: Callable[[], p.Packet], name: str) -> _Decoder:
    def decode(conn: MqttConnection, buf: bytes, pos: int, end: int, flags: int) -> p.Packet:
        if end != pos:
            raise RemoteProtocolError(f"{name} must have no body")  # §3.12.1, §3.13.1, §3.14.1
        return cls()

    return decode


def _decode_publish(conn: MqttConnection, buf: bytes, pos: int, end: int, flags: int) -> p.Publish:
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


_DECODERS_V311: dict[PT, _Decoder] = {
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


# -- encoding ------------------------------------------------------------------


def _remaining_length(n: int) -> bytes:
    if n < 128:
        return bytes((n,))
    if n < 16384:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    if n > MAX_REMAINING_LENGTH:
        raise LocalProtocolError(f"packet of {n} bytes is too large for MQTT")  # §2.2.3
    out = bytearray()
    while n:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | 0x80 if n else byte)
    return bytes(out)


def _string(text: str) -> bytes:
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:
        raise LocalProtocolError("string with a lone surrogate") from None  # [MQTT-1.5.3-1]
    if "\x00" in text:
        raise LocalProtocolError("string contains U+0000")  # [MQTT-1.5.3-2]
    if len(raw) > 65535:
        raise LocalProtocolError("string longer than 65535 bytes")  # §1.5.3
    return _U16.pack(len(raw)) + raw


def _binary(data: bytes) -> bytes:
    if len(data) > 65535:
        raise LocalProtocolError("binary field longer than 65535 bytes")  # §3.1.3.4
    return _U16.pack(len(data)) + data


def _packet_id(packet_id: int | None) -> bytes:
    if packet_id is None or not 0 < packet_id <= 65535:
        raise LocalProtocolError(f"invalid packet identifier {packet_id!r}")  # [MQTT-2.3.1-1]
    return _U16.pack(packet_id)


def _qos(qos: int) -> int:
    if qos not in (0, 1, 2):
        raise LocalProtocolError(f"invalid QoS {qos!r}")  # [MQTT-3.3.1-4]
    return qos


def _frame(kind: PT, body: bytes) -> bytes:
    return bytes((kind << 4 | _FIXED_FLAGS[kind],)) + _remaining_length(len(body)) + body


def _encode_publish(conn: MqttConnection, packet: p.Publish) -> bytes:
    topic = packet.topic
    qos = packet.qos
    if not topic or "+" in topic or "#" in topic or "\x00" in topic:
        raise LocalProtocolError(f"invalid topic name {topic[:40]!r}")  # [MQTT-3.3.2-2], [MQTT-4.7.3-1]
    try:
        raw = topic.encode("utf-8")
    except UnicodeEncodeError:
        raise LocalProtocolError("topic with a lone surrogate") from None  # [MQTT-1.5.3-1]
    if len(raw) > 65535:
        raise LocalProtocolError("topic name longer than 65535 bytes")  # [MQTT-4.7.3-3]
    payload = packet.payload
    first = 0x30 | (0x08 if packet.dup else 0) | (0x01 if packet.retain else 0)
    if qos == 0:
        if packet.dup:
            raise LocalProtocolError("DUP on a QoS 0 PUBLISH")  # [MQTT-3.3.1-2]
        if packet.packet_id is not None:
            raise LocalProtocolError("a QoS 0 PUBLISH has no packet identifier")  # [MQTT-2.3.1-5]
        length = 2 + len(raw) + len(payload)
        if length < 128:
            return _BBH.pack(first, length, len(raw)) + raw + payload
        return bytes((first,)) + _remaining_length(length) + _U16.pack(len(raw)) + raw + payload
    if qos != 1 and qos != 2:
        raise LocalProtocolError(f"invalid QoS {qos!r}")  # [MQTT-3.3.1-4]
    packet_id = packet.packet_id
    if packet_id is None or not 0 < packet_id <= 65535:
        raise LocalProtocolError(f"invalid packet identifier {packet_id!r}")  # [MQTT-2.3.1-1]
    first |= qos << 1
    length = 4 + len(raw) + len(payload)
    if length < 128:
        return _BBH.pack(first, length, len(raw)) + raw + _U16.pack(packet_id) + payload
    head = bytes((first,)) + _remaining_length(length) + _U16.pack(len(raw)) + raw + _U16.pack(packet_id)
    return head + payload


def _encode_connect(conn: MqttConnection, packet: p.Connect) -> bytes:
    flags = 0x02 if packet.clean_session else 0
    payload = _string(packet.client_id)
    will = packet.will
    if will is not None:
        flags |= 0x04 | _qos(will.qos) << 3 | (0x20 if will.retain else 0)
        payload += _string(will.topic) + _binary(will.payload)
    if packet.username is not None:
        flags |= 0x80
        payload += _string(packet.username)
    if packet.password is not None:
        if packet.username is None:
            raise LocalProtocolError("password without a user name")  # [MQTT-3.1.2-22]
        flags |= 0x40
        payload += _binary(packet.password)
    if not 0 <= packet.keep_alive <= 65535:
        raise LocalProtocolError("keep alive out of range")  # §3.1.2.10
    # The name and level are sent as given, so tests can offer levels we refuse.
    head = _string(packet.protocol_name) + bytes((packet.protocol_level & 0xFF, flags)) + _U16.pack(packet.keep_alive)
    return _frame(PT.CONNECT, head + payload)


def _encode_connack(conn: MqttConnection, packet: p.ConnAck) -> bytes:
    code = packet.return_code
    if not 0 <= code <= 5:
        raise LocalProtocolError(f"reserved CONNACK return code {code}")  # §3.2.2.3
    present = packet.session_present
    if present and code:
        raise LocalProtocolError("session present on a refused connection")  # [MQTT-3.2.2-4]
    if conn.protocol_level == 3:
        present = False  # 3.1 has no session-present flag: the byte is reserved
    return _frame(PT.CONNACK, bytes((1 if present else 0, code)))


def _ack_encoder(kind: PT) -> Callable[[MqttConnection, p.Packet], bytes]:
    first = bytes((kind << 4 | _FIXED_FLAGS[kind], 2))

    def encode(conn: MqttConnection, packet: p.Packet) -> bytes:
        return first + _packet_id(packet.packet_id)  # type: ignore[union-attr]

    return encode


def _encode_subscribe(conn: MqttConnection, packet: p.Subscribe) -> bytes:
    if not packet.topics:
        raise LocalProtocolError("SUBSCRIBE without a topic filter")  # [MQTT-3.8.3-3]
    body = _packet_id(packet.packet_id) + b"".join(_string(t) + bytes((_qos(q),)) for t, q in packet.topics)
    return _frame(PT.SUBSCRIBE, body)


def _encode_suback(conn: MqttConnection, packet: p.SubAck) -> bytes:
    if not packet.return_codes or not set(packet.return_codes) <= _SUBACK_CODES:
        raise LocalProtocolError("SUBACK needs return codes 0, 1, 2 or 0x80")  # [MQTT-3.9.3-2]
    return _frame(PT.SUBACK, _packet_id(packet.packet_id) + bytes(packet.return_codes))


def _encode_unsubscribe(conn: MqttConnection, packet: p.Unsubscribe) -> bytes:
    if not packet.topics:
        raise LocalProtocolError("UNSUBSCRIBE without a topic filter")  # [MQTT-3.10.3-2]
    return _frame(PT.UNSUBSCRIBE, _packet_id(packet.packet_id) + b"".join(_string(t) for t in packet.topics))


def _empty_encoder(kind: PT) -> Callable[[MqttConnection, p.Packet], bytes]:
    wire = bytes((kind << 4, 0))
    return lambda conn, packet: wire


_ENCODERS: dict[type, tuple[PT, Callable[[MqttConnection, p.Packet], bytes]]] = {
    p.Connect: (PT.CONNECT, _encode_connect),  # type: ignore[dict-item]
    p.ConnAck: (PT.CONNACK, _encode_connack),  # type: ignore[dict-item]
    p.Publish: (PT.PUBLISH, _encode_publish),  # type: ignore[dict-item]
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
_SENDERS = {
    role: {cls: encode for cls, (kind, encode) in _ENCODERS.items() if kind in _SENT_BY[role]} for role in Role
}


# -- the connection ----------------------------------------------------------


class MqttConnection:
    """One side of an MQTT byte stream.

    ``max_packet_bytes`` bounds the remaining length of an incoming packet (the
    fixed header's own 2 to 5 bytes are not counted); a session may raise it
    after CONNECT.  Bytes are kept until the packet they complete is whole:
    arriving pieces are listed and joined once, so a large packet in small
    reads costs linear, not quadratic, copying.
    """

    def __init__(self, role: Role = Role.SERVER, *, max_packet_bytes: int = MAX_PACKET_BYTES) -> None:
        self.role = role
        self.max_packet_bytes = max_packet_bytes
        self.protocol_level = 4  # fixed by CONNECT; decides the decoder table (MQTT 5 later)
        self.state = State.AWAITING_CONNECT if role is Role.SERVER else State.AWAITING_CONNACK
        self.their_eof = False
        self._first_byte = _FIRST_BYTE[role]
        self._decoders = _DECODERS_V311
        self._senders = _SENDERS[role]
        self._error: RemoteProtocolError | None = None
        self._buf = b""
        self._pos = 0
        self._pieces: list[bytes] = []  # received after _buf, not yet joined
        self._pieces_bytes = 0
        self._need = 1  # bytes from _pos needed before parsing can progress

    # -- receiving -----------------------------------------------------------

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf) - self._pos + self._pieces_bytes

    @property
    def mid_packet(self) -> bool:
        """True when part of a packet is buffered (EOF now would cut it)."""
        return self.buffered_bytes > 0

    def receive_data(self, data: bytes) -> None:
        """Add bytes from the peer; ``b""`` means the peer closed its side."""
        if not data:
            self.their_eof = True
            return
        if self.their_eof:
            raise LocalProtocolError("data received after EOF")
        if type(data) is not bytes:
            data = bytes(data)
        if self._pos >= len(self._buf) and not self._pieces:
            self._buf = data
            self._pos = 0
        else:
            self._pieces.append(data)
            self._pieces_bytes += len(data)

    def events(self) -> Iterator[p.Packet]:
        """Yield every complete packet buffered so far, lazily: stop early and
        the rest stays buffered.  Raises RemoteProtocolError, and raises it
        again on every later call."""
        if self._error is not None:
            raise RemoteProtocolError(self._error.message, return_code=self._error.return_code)
        try:
            while True:
                packet = self._next()
                if packet is None:
                    return
                yield packet
        except RemoteProtocolError as exc:
            self.state = State.ERROR
            self._error = exc
            raise

    def _next(self) -> p.Packet | None:
        buf = self._buf
        pos = self._pos
        n = len(buf)
        if n - pos < self._need:
            if n - pos + self._pieces_bytes < self._need:
                return None
            buf = self._buf = b"".join([buf[pos:], *self._pieces])
            pos = self._pos = 0
            n = len(buf)
            self._pieces.clear()
            self._pieces_bytes = 0
        first = buf[pos]
        kind = self._first_byte[first]
        if isinstance(kind, str):
            raise RemoteProtocolError(kind)
        next_state = _ALLOWED[self.state].get(kind)
        if next_state is None:
            raise RemoteProtocolError(_ORDER_ERRORS.get(self.state, f"a second {kind.name}"))
        # Remaining length: 1 to 4 bytes of 7 bits, low first (§2.2.3).
        i = pos + 1
        if i < n and buf[i] < 0x80:
            length = buf[i]
            i += 1
        else:
            length = 0
            shift = 0
            while True:
                if i >= n:
                    self._need = i - pos + 1
                    return None
                byte = buf[i]
                i += 1
                length |= (byte & 0x7F) << shift
                if byte < 0x80:
                    break
                shift += 7
                if shift == 28:
                    raise RemoteProtocolError("remaining length longer than 4 bytes")  # §2.2.3
        if length > self.max_packet_bytes:
            raise RemoteProtocolError(f"packet of {length} bytes is over the limit of {self.max_packet_bytes}")
        end = i + length
        if end > n:
            self._need = end - pos
            return None
        packet = self._decoders[kind](self, buf, i, end, first & 0x0F)
        self.state = next_state
        self._need = 1
        if end == n:
            self._buf = b""
            self._pos = 0
        else:
            self._pos = end
        return packet

    # -- sending -------------------------------------------------------------

    def send(self, packet: p.Packet) -> bytes:
        """Serialize one packet; LocalProtocolError if this role may not send it
        or it cannot be encoded validly."""
        if type(packet) is p.Publish:
            return _encode_publish(self, packet)
        encode = self._senders.get(type(packet))
        if encode is None:
            raise LocalProtocolError(f"a {self.role.value} cannot send {type(packet).__name__}")
        return encode(self, packet)

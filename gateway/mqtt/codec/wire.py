"""The MQTT wire format's building blocks (3.1.1 and 5.0), shared by the packet decoders
and encoders: the errors, the fixed header's rules (which first bytes a role
may receive), the remaining length, and the fields a packet is made of
(UTF-8 strings, binary data, packet identifiers, QoS, topic names and filters).

Sans-IO and stdlib only, like the rest of the codec; rules cite the 3.1.1
specification as ``[MQTT-x.y.z-n]`` or by section (see codec.py), and the 5.0
one the same way where a rule is v5's ("v5 §x.y").
"""

from __future__ import annotations

import enum
import struct
from typing import Protocol

from gateway.mqtt.codec import packets as p

MAX_REMAINING_LENGTH = 268_435_455  # four bytes of seven bits (§2.2.3)
MAX_PACKET_BYTES = 256 * 1024 * 1024
# (protocol name, level) pairs we speak: 3.1.1, 3.1 whose packets are the same
# for everything parsed here ("MQIsdp" level 3), and 5.0.
SUPPORTED_PROTOCOLS = frozenset({("MQTT", 4), ("MQIsdp", 3), ("MQTT", 5)})
MQTT5 = 5  # the protocol level of MQTT 5.0
MQTT31 = 3  # ... and of MQTT 3.1 ("MQIsdp")
# The v5 reason codes the codec itself answers with (gateway.mqtt.codec.reasons has them all).
MALFORMED = 0x81
PROTOCOL_ERROR = 0x82
PACKET_TOO_LARGE = 0x95
KNOWN_PROTOCOL_NAMES = frozenset(name for name, _ in SUPPORTED_PROTOCOLS)

_U16 = struct.Struct(">H")


class Role(enum.Enum):
    SERVER = "server"  # parses client packets, serializes server packets
    CLIENT = "client"  # the reverse; for tests and benchmarks


class ProtocolError(Exception):
    """An MQTT protocol violation.  ``return_code`` is the 3.1.1 CONNACK code to
    answer with before closing, or None when the answer is just to close.
    ``reason_code`` is the v5 reason code for the answer (a CONNACK before
    CONNECT is done, else a DISCONNECT): on a v5 connection the codec's
    errors always carry one (0x81 Malformed Packet unless the spec names
    another, e.g. 0x82 Protocol Error or 0x95 Packet too large)."""

    def __init__(self, message: str, *, return_code: int | None = None, reason_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.return_code = return_code
        self.reason_code = reason_code


class RemoteProtocolError(ProtocolError):
    """The peer sent something malformed or out of order."""


class LocalProtocolError(ProtocolError):
    """We were asked to send something the protocol does not allow."""


class Negotiated(Protocol):
    """What a packet's decoder or encoder sees of its connection: the protocol
    level, which decoding CONNECT fixes and encoding CONNACK reads, the
    role (some v5 rules depend on who sent the packet), and what one v5
    packet's properties may hold (see gateway.mqtt.codec.properties.Budget).  A
    protocol rather than the connection class, so the packet modules need
    not import the module that imports them."""

    protocol_level: int
    role: Role
    max_properties: int
    max_user_property_bytes: int
    max_topic_filters: int  # in one SUBSCRIBE or UNSUBSCRIBE


def too_many_filters(conn: Negotiated, kind: PT) -> RemoteProtocolError:
    """The refusal of a SUBSCRIBE or UNSUBSCRIBE past the connection's
    ``max_topic_filters``, raised before the next filter is read: each one
    costs the loop (a subscription made or refused, a code answered), so one
    packet of a million must not be read whole (v5: DISCONNECT 0x95)."""
    return RemoteProtocolError(f"{kind.name} with more than {conn.max_topic_filters} topic filters (the server's limit)",
                               reason_code=PACKET_TOO_LARGE)


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
FIXED_FLAGS = {kind: 0 for kind in PT}
FIXED_FLAGS[PT.PUBREL] = 0b0010  # [MQTT-3.6.1-1]
FIXED_FLAGS[PT.SUBSCRIBE] = 0b0010  # [MQTT-3.8.1-1]
FIXED_FLAGS[PT.UNSUBSCRIBE] = 0b0010  # [MQTT-3.10.1-1]

# Who sends what (§2.2.1, "Direction of flow").
SENT_BY = {
    Role.CLIENT: frozenset({PT.CONNECT, PT.PUBLISH, PT.PUBACK, PT.PUBREC, PT.PUBREL, PT.PUBCOMP,
                            PT.SUBSCRIBE, PT.UNSUBSCRIBE, PT.PINGREQ, PT.DISCONNECT}),
    Role.SERVER: frozenset({PT.CONNACK, PT.PUBLISH, PT.PUBACK, PT.PUBREC, PT.PUBREL, PT.PUBCOMP,
                            PT.SUBACK, PT.UNSUBACK, PT.PINGRESP}),
}
# MQTT 5 adds AUTH both ways and a DISCONNECT from the server (v5 §2.1.2).
SENT_BY_V5 = {
    Role.CLIENT: SENT_BY[Role.CLIENT] | {PT.AUTH},
    Role.SERVER: SENT_BY[Role.SERVER] | {PT.AUTH, PT.DISCONNECT},
}


class Refusal(str):
    """Why a first byte is refused, with the v5 reason code to answer it with.
    A str, so the parser's ``isinstance(kind, str)`` test is all it costs."""

    reason_code: int

    def __new__(cls, message: str, reason_code: int = MALFORMED) -> Refusal:
        self = super().__new__(cls, message)
        self.reason_code = reason_code
        return self


# MQTT 3.1 (level 3) gave PUBREL, SUBSCRIBE and UNSUBSCRIBE a DUP flag to set
# on a resend (3.1 §2.1, "DUP flag"); 3.1.1 made their flags fixed.  So at
# level 3 the fixed flags with DUP (0b1010) are accepted too.
DUP_ALLOWED_V31 = frozenset({PT.PUBREL, PT.SUBSCRIBE, PT.UNSUBSCRIBE})


def _first_byte_table(incoming: frozenset[PT], known: frozenset[int],
                      dup_allowed: frozenset[PT] = frozenset()) -> tuple[PT | str, ...]:
    """For each possible first byte: its packet type, or why it is refused."""
    table: list[PT | str] = []
    for first in range(256):
        kind, flags = first >> 4, first & 0x0F
        if kind in dup_allowed and flags == FIXED_FLAGS[PT(kind)] | 0b1000:
            table.append(PT(kind))
        elif kind not in known:
            table.append(Refusal(f"reserved packet type {kind}"))  # §2.2.1
        elif kind not in incoming:
            # A packet the peer's role never sends (v5 §4.13: a Protocol Error).
            table.append(Refusal(f"unexpected {PT(kind).name} from this peer", PROTOCOL_ERROR))  # §2.2.1
        elif kind == PT.PUBLISH and flags & 0b0110 == 0b0110:
            table.append(Refusal("PUBLISH with QoS 3"))  # [MQTT-3.3.1-4]
        elif kind == PT.PUBLISH and flags & 0b1000 and not flags & 0b0110:
            table.append(Refusal("DUP set on a QoS 0 PUBLISH"))  # [MQTT-3.3.1-2]
        elif kind != PT.PUBLISH and flags != FIXED_FLAGS[PT(kind)]:
            table.append(Refusal(f"invalid fixed-header flags {flags:#06b} on {PT(kind).name}"))  # [MQTT-2.2.2-2]
        else:
            table.append(PT(kind))
    return tuple(table)


# What a role receives, indexed by the first byte: a packet type, or why not.
_KNOWN_V311 = frozenset(range(1, 15))
_KNOWN_V5 = frozenset(range(1, 16))
FIRST_BYTE = {
    Role.SERVER: _first_byte_table(SENT_BY[Role.CLIENT], _KNOWN_V311),
    Role.CLIENT: _first_byte_table(SENT_BY[Role.SERVER], _KNOWN_V311),
}
FIRST_BYTE_V31 = {
    Role.SERVER: _first_byte_table(SENT_BY[Role.CLIENT], _KNOWN_V311, DUP_ALLOWED_V31),
    Role.CLIENT: _first_byte_table(SENT_BY[Role.SERVER], _KNOWN_V311, DUP_ALLOWED_V31),
}
FIRST_BYTE_V5 = {
    Role.SERVER: _first_byte_table(SENT_BY_V5[Role.CLIENT], _KNOWN_V5),
    Role.CLIENT: _first_byte_table(SENT_BY_V5[Role.SERVER], _KNOWN_V5),
}


def remaining_length(n: int) -> bytes:
    """The remaining length ``n`` as 1 to 4 bytes of 7 bits, low first (§2.2.3).
    (Decoding it is inline in the connection's parser, the hot path.)"""
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


def frame(kind: PT, body: bytes) -> bytes:
    """A whole packet: the fixed header of ``kind`` and then ``body``."""
    return bytes((kind << 4 | FIXED_FLAGS[kind],)) + remaining_length(len(body)) + body


# -- fields: reading -------------------------------------------------------------


class FieldReader:
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
        return decode_string(self.binary())

    def u32(self) -> int:
        if self.pos + 4 > self.end:
            raise RemoteProtocolError("packet ends too early")
        value = int.from_bytes(self.buf[self.pos : self.pos + 4], "big")
        self.pos += 4
        return value

    def vbi(self) -> int:
        """A variable byte integer (v5 §1.5.5): 1 to 4 bytes of 7 bits, low first."""
        value = 0
        for shift in (0, 7, 14, 21):
            byte = self.u8()
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
        raise RemoteProtocolError("variable byte integer longer than 4 bytes")  # v5 §1.5.5

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


def decode_string(raw: bytes) -> str:
    try:
        # Python's strict decoder refuses ill-formed UTF-8, overlong forms and
        # encoded surrogates U+D800..U+DFFF [MQTT-1.5.3-1].
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RemoteProtocolError("string is not well-formed UTF-8") from None  # [MQTT-1.5.3-1]
    if "\x00" in text:
        raise RemoteProtocolError("string contains U+0000")  # [MQTT-1.5.3-2]
    return text


# The SUBACK return codes 3.1.1 defines; any other is reserved [MQTT-3.9.3-2].
SUBACK_CODES = frozenset(int(code) for code in p.SubscribeReturnCode)


# -- fields: writing ---------------------------------------------------------------


def string_field(text: str) -> bytes:
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:
        raise LocalProtocolError("string with a lone surrogate") from None  # [MQTT-1.5.3-1]
    if "\x00" in text:
        raise LocalProtocolError("string contains U+0000")  # [MQTT-1.5.3-2]
    if len(raw) > 65535:
        raise LocalProtocolError("string longer than 65535 bytes")  # §1.5.3
    return _U16.pack(len(raw)) + raw


def binary_field(data: bytes) -> bytes:
    if len(data) > 65535:
        raise LocalProtocolError("binary field longer than 65535 bytes")  # §3.1.3.4
    return _U16.pack(len(data)) + data


def packet_id_field(packet_id: int | None) -> bytes:
    if packet_id is None or not 0 < packet_id <= 65535:
        raise LocalProtocolError(f"invalid packet identifier {packet_id!r}")  # [MQTT-2.3.1-1]
    return _U16.pack(packet_id)


def checked_qos(qos: int) -> int:
    if qos not in (0, 1, 2):
        raise LocalProtocolError(f"invalid QoS {qos!r}")  # [MQTT-3.3.1-4]
    return qos

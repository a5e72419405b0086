"""MQTT 5 properties (v5 §2.2.2): the table of every property (identifier,
data type, the packets that may carry it, whether it may repeat), and the
property block read into a :class:`~gateway.mqtt.codec.packets.Properties` and
written back from one.

Refusals follow v5 §2.2.2.2: an identifier unknown or not valid for its
packet, a value not of its data type (UTF-8 not well formed, a variable byte
integer over 4 bytes, a length past the block) is a Malformed Packet (0x81); a
property given twice where it may appear once, or a value the spec calls a
Protocol Error (Receive Maximum 0, Topic Alias 0, ...) is a Protocol Error
(0x82).  Encoding refuses the same things with LocalProtocolError.

Reading is linear in the block, and a :class:`Budget` bounds what one packet
may make it do: past its count of properties or its bytes of User Properties
the packet is refused with 0x95 Packet too large as soon as the limit is
crossed, so neither the parse nor what the broker does with the properties
afterwards (headers, the journal, each delivery) grows with a hostile block.
"""

from __future__ import annotations

import operator
from typing import Any, NamedTuple

from gateway.mqtt.codec import packets as p
from gateway.mqtt.codec.wire import (
    MALFORMED,
    PACKET_TOO_LARGE,
    PROTOCOL_ERROR,
    PT,
    FieldReader,
    LocalProtocolError,
    RemoteProtocolError,
    binary_field,
    remaining_length,
    string_field,
    validate_topic_name,
)

WILL = "will"  # where the will properties of a CONNECT sit (v5 §3.1.3.2)
Where = PT | str
EMPTY_PROPERTIES = b"\x00"  # a property block with nothing in it: its length, 0

# The data types of v5 §1.5.
BYTE, U16, U32, VBI, STRING, BINARY, PAIR = range(7)
MAX_VBI = 268_435_455


class Spec(NamedTuple):
    attr: str  # the field of packets.Properties
    kind: int  # data type
    where: frozenset[Where]  # the packets that may carry it
    repeats: bool = False


_PUB: frozenset[Where] = frozenset({PT.PUBLISH, WILL})
_ACKS = frozenset({PT.PUBACK, PT.PUBREC, PT.PUBREL, PT.PUBCOMP, PT.SUBACK, PT.UNSUBACK})

# v5 §2.2.2.2, in identifier order (the order they are written in).
SPECS: dict[int, Spec] = {
    0x01: Spec("payload_format_indicator", BYTE, _PUB),
    0x02: Spec("message_expiry_interval", U32, _PUB),
    0x03: Spec("content_type", STRING, _PUB),
    0x08: Spec("response_topic", STRING, _PUB),
    0x09: Spec("correlation_data", BINARY, _PUB),
    # Several in a PUBLISH to a subscriber, one in a SUBSCRIBE (checked below).
    0x0B: Spec("subscription_identifiers", VBI, frozenset({PT.PUBLISH, PT.SUBSCRIBE}), True),
    0x11: Spec("session_expiry_interval", U32, frozenset({PT.CONNECT, PT.CONNACK, PT.DISCONNECT})),
    0x12: Spec("assigned_client_identifier", STRING, frozenset({PT.CONNACK})),
    0x13: Spec("server_keep_alive", U16, frozenset({PT.CONNACK})),
    0x15: Spec("authentication_method", STRING, frozenset({PT.CONNECT, PT.CONNACK, PT.AUTH})),
    0x16: Spec("authentication_data", BINARY, frozenset({PT.CONNECT, PT.CONNACK, PT.AUTH})),
    0x17: Spec("request_problem_information", BYTE, frozenset({PT.CONNECT})),
    0x18: Spec("will_delay_interval", U32, frozenset({WILL})),
    0x19: Spec("request_response_information", BYTE, frozenset({PT.CONNECT})),
    0x1A: Spec("response_information", STRING, frozenset({PT.CONNACK})),
    0x1C: Spec("server_reference", STRING, frozenset({PT.CONNACK, PT.DISCONNECT})),
    0x1F: Spec("reason_string", STRING, _ACKS | {PT.CONNACK, PT.DISCONNECT, PT.AUTH}),
    0x21: Spec("receive_maximum", U16, frozenset({PT.CONNECT, PT.CONNACK})),
    0x22: Spec("topic_alias_maximum", U16, frozenset({PT.CONNECT, PT.CONNACK})),
    0x23: Spec("topic_alias", U16, frozenset({PT.PUBLISH})),
    0x24: Spec("maximum_qos", BYTE, frozenset({PT.CONNACK})),
    0x25: Spec("retain_available", BYTE, frozenset({PT.CONNACK})),
    0x26: Spec("user_properties", PAIR, _PUB | _ACKS | {PT.CONNECT, PT.CONNACK, PT.SUBSCRIBE, PT.UNSUBSCRIBE,
                                                         PT.DISCONNECT, PT.AUTH}, True),
    0x27: Spec("maximum_packet_size", U32, frozenset({PT.CONNECT, PT.CONNACK})),
    0x28: Spec("wildcard_subscription_available", BYTE, frozenset({PT.CONNACK})),
    0x29: Spec("subscription_identifier_available", BYTE, frozenset({PT.CONNACK})),
    0x2A: Spec("shared_subscription_available", BYTE, frozenset({PT.CONNACK})),
}
_BY_ATTR = list(SPECS.items())
_USER_PROPERTY = SPECS[0x26]
_ALL_VALUES = operator.attrgetter(*(spec.attr for spec in SPECS.values()))  # one C call for all 27

# Values the spec calls a Protocol Error (v5 §3.1.2.11, §3.2.2.3, §3.3.2.3).
_ZERO_OR_ONE = "must be 0 or 1"
_NOT_ZERO = "must not be 0"
_RULES: dict[str, tuple[str, str]] = {
    "payload_format_indicator": (_ZERO_OR_ONE, "v5 §3.3.2.3.2"),
    "request_problem_information": (_ZERO_OR_ONE, "v5 §3.1.2.11.7"),
    "request_response_information": (_ZERO_OR_ONE, "v5 §3.1.2.11.6"),
    "maximum_qos": (_ZERO_OR_ONE, "v5 §3.2.2.3.4"),
    "retain_available": (_ZERO_OR_ONE, "v5 §3.2.2.3.5"),
    "wildcard_subscription_available": (_ZERO_OR_ONE, "v5 §3.2.2.3.11"),
    "subscription_identifier_available": (_ZERO_OR_ONE, "v5 §3.2.2.3.12"),
    "shared_subscription_available": (_ZERO_OR_ONE, "v5 §3.2.2.3.13"),
    "receive_maximum": (_NOT_ZERO, "v5 §3.1.2.11.3"),
    "maximum_packet_size": (_NOT_ZERO, "v5 §3.1.2.11.4"),
    "topic_alias": (_NOT_ZERO, "[MQTT-3.3.2-8]"),
    "subscription_identifiers": (_NOT_ZERO, "v5 §3.8.2.1.2"),
}
_LIMITS = {BYTE: 0xFF, U16: 0xFFFF, U32: 0xFFFF_FFFF, VBI: MAX_VBI}


def value_problem(attr: str, value: int) -> str | None:
    """Why ``value`` is not allowed for the numeric property ``attr``, or None."""
    rule = _RULES.get(attr)
    if rule is None:
        return None
    if rule[0] is _ZERO_OR_ONE:
        return None if value in (0, 1) else f"{attr} {value} {_ZERO_OR_ONE} ({rule[1]})"
    return None if value else f"{attr} {_NOT_ZERO} ({rule[1]})"


# -- reading ------------------------------------------------------------------


class Budget:
    """What one packet's property blocks may hold together (a CONNECT has
    two, its own and its will's): ``max_properties`` property items, repeats
    counted, and ``max_user_bytes`` bytes of User Property names and values.
    ``packet`` names the packet in a refusal.  Made per packet by its decoder
    from the connection's limits; :func:`read_properties` spends it."""

    __slots__ = ("packet", "max_properties", "max_user_bytes", "properties", "user_bytes")

    def __init__(self, packet: str, max_properties: int, max_user_bytes: int) -> None:
        self.packet = packet
        self.max_properties = max_properties
        self.max_user_bytes = max_user_bytes
        self.properties = 0  # spent so far
        self.user_bytes = 0


def read_properties(buf: bytes, pos: int, end: int, where: Where,
                    budget: Budget | None = None) -> tuple[p.Properties | None, int]:
    """The property block at ``buf[pos:]`` (its length first) of a packet
    ending at ``end``: the properties (None if the block is empty) and the
    position after the block.  ``budget``: the packet's limits (None: only
    the packet's size bounds the block), refused with 0x95 once crossed."""
    r = FieldReader(buf, pos, end)
    length = r.vbi()
    start = r.pos
    stop = start + length
    if stop > end:
        raise RemoteProtocolError("property length runs past the end of the packet")  # v5 §2.2.2.1
    if not length:
        return None, stop
    r.end = stop  # a value running past the block is malformed, not read from what follows
    if budget is None:
        count = user_bytes = 0
        max_count = max_user_bytes = stop  # a property takes 2 bytes at least: never reached
    else:
        count, user_bytes = budget.properties, budget.user_bytes
        max_count, max_user_bytes = budget.max_properties, budget.max_user_bytes
    props = p.Properties()
    seen: set[int] = set()
    # Repeated values gather in lists, set as tuples once at the end: a tuple
    # rebuilt per repeat would make a block of n User Properties cost n².
    repeated: dict[str, list[Any]] = {}
    pairs: list[tuple[str, str]] | None = None
    pairs_allowed = where in _USER_PROPERTY.where
    while r.pos < stop:
        count += 1
        if count > max_count:
            raise _over(budget, f"more than {max_count} properties")
        ident = r.u8()  # every identifier is one byte; a longer variable byte integer is unknown
        if ident == 0x26 and pairs_allowed:
            # A run of User Properties, UTF-8 string pairs (v5 §1.5.7), read
            # inline: a flood of them is this loop, so it costs little per pair.
            if pairs is None:
                pairs = repeated[_USER_PROPERTY.attr] = []
            i = r.pos
            try:
                while True:
                    if i + 2 > stop:
                        raise RemoteProtocolError("packet ends too early")
                    j = i + 2 + ((buf[i] << 8) | buf[i + 1])
                    if j + 2 > stop:
                        raise RemoteProtocolError("a length runs past the end of the packet")  # §1.5.4
                    k = j + 2 + ((buf[j] << 8) | buf[j + 1])
                    if k > stop:
                        raise RemoteProtocolError("a length runs past the end of the packet")
                    user_bytes += k - i - 4  # the two strings, without their lengths
                    if user_bytes > max_user_bytes:
                        raise _over(budget, f"more than {max_user_bytes} bytes of user properties")
                    # Strict UTF-8 (no surrogates, no overlong forms) [MQTT-1.5.4-1]
                    name, text = buf[i + 2 : j].decode("utf-8"), buf[j + 2 : k].decode("utf-8")
                    if "\x00" in name or "\x00" in text:
                        raise RemoteProtocolError("string contains U+0000")  # [MQTT-1.5.4-2]
                    pairs.append((name, text))
                    if k >= stop or buf[k] != 0x26:
                        break
                    count += 1
                    if count > max_count:
                        raise _over(budget, f"more than {max_count} properties")
                    i = k + 1
            except UnicodeDecodeError:
                raise RemoteProtocolError("string is not well-formed UTF-8") from None  # [MQTT-1.5.4-1]
            r.pos = k
            continue
        spec = SPECS.get(ident)
        if spec is None:
            raise RemoteProtocolError(f"unknown property identifier {ident:#04x}", reason_code=MALFORMED)  # v5 §2.2.2.2
        if where not in spec.where:
            raise RemoteProtocolError(f"property {spec.attr} is not allowed in {_name(where)}",
                                      reason_code=MALFORMED)  # v5 §2.2.2.2
        kind = spec.kind
        value: Any
        if kind == BYTE:
            value = r.u8()
        elif kind == U16:
            value = r.u16()
        elif kind == U32:
            value = r.u32()
        elif kind == VBI:
            value = r.vbi()
        elif kind == STRING:
            value = r.string()  # well-formed UTF-8 without U+0000 [MQTT-1.5.4-1], [MQTT-1.5.4-2]
        else:
            value = r.binary()  # (PAIR, a User Property, is read above)
        if kind <= VBI:
            problem = value_problem(spec.attr, value)
            if problem is not None:
                raise RemoteProtocolError(problem, reason_code=PROTOCOL_ERROR)
        elif ident == 0x08:  # a topic name: not empty, no wildcard [MQTT-3.3.2-14]
            problem = validate_topic_name(value)
            if problem is not None:
                raise RemoteProtocolError(f"response topic: {problem}", reason_code=PROTOCOL_ERROR)
        if spec.repeats and not (ident == 0x0B and where == PT.SUBSCRIBE):
            values = repeated.get(spec.attr)
            if values is None:
                repeated[spec.attr] = [value]
            else:
                values.append(value)
            continue
        if ident in seen:
            # v5 §2.2.2.2 and each property's "more than once is a Protocol Error"
            raise RemoteProtocolError(f"property {spec.attr} more than once", reason_code=PROTOCOL_ERROR)
        seen.add(ident)
        setattr(props, spec.attr, (value,) if spec.repeats else value)
    for attr, values in repeated.items():
        setattr(props, attr, tuple(values))
    if budget is not None:
        budget.properties, budget.user_bytes = count, user_bytes
    return props, stop


def _over(budget: Budget | None, what: str) -> RemoteProtocolError:
    # Only a budget's limits can be crossed (see read_properties).
    packet = budget.packet if budget is not None else "packet"
    return RemoteProtocolError(f"{packet} with {what} (the server's limit)",
                               reason_code=PACKET_TOO_LARGE)  # v5 §4.13: the server's own size limit


def _name(where: Where) -> str:
    return where.name if isinstance(where, PT) else "will properties"  # the one str place is WILL


# -- writing -------------------------------------------------------------------


def encode_properties(props: p.Properties | None, where: Where = PT.PUBLISH) -> bytes:
    """The property block for ``props`` as it goes on the wire, its length first
    (:data:`EMPTY_PROPERTIES` for None or nothing set); LocalProtocolError for a
    property ``where`` may not carry or a value out of range."""
    if props is None:
        return EMPTY_PROPERTIES
    return property_block(property_items(props, where))


def property_block(items: bytes) -> bytes:
    """Property items (:func:`property_items` and the ``*_item`` helpers,
    concatenated) as a block: their length first."""
    return remaining_length(len(items)) + items


def property_items(props: p.Properties, where: Where = PT.PUBLISH) -> bytes:
    """What :func:`encode_properties` writes after the length: a delivery may
    keep a message's items and add its own per subscriber (an alias, its
    subscription identifiers, the expiry left) before :func:`property_block`."""
    out: list[bytes] = []
    for (ident, spec), value in zip(_BY_ATTR, _ALL_VALUES(props)):
        if value is None or value == ():
            continue
        if where not in spec.where:
            raise LocalProtocolError(f"property {spec.attr} is not allowed in {_name(where)}")  # v5 §2.2.2.2
        if spec.repeats:
            if ident == 0x0B and where == PT.SUBSCRIBE and len(value) > 1:
                raise LocalProtocolError("a SUBSCRIBE carries one subscription identifier")  # v5 §3.8.2.1.2
            for item in value:
                out.append(_encode_value(ident, spec, item))
        else:
            out.append(_encode_value(ident, spec, value))
    return b"".join(out)


def topic_alias_item(alias: int) -> bytes:
    """A Topic Alias property item (v5 §3.3.2.3.4), 1 to 65535."""
    if not 0 < alias <= 0xFFFF:
        raise LocalProtocolError(f"topic alias {alias!r} out of range")  # [MQTT-3.3.2-8]
    return bytes((0x23, alias >> 8, alias & 0xFF))


def subscription_identifier_item(identifier: int) -> bytes:
    """A Subscription Identifier property item (v5 §3.3.2.3.8), 1 to 268,435,455."""
    if not 0 < identifier <= MAX_VBI:
        raise LocalProtocolError(f"subscription identifier {identifier!r} out of range")  # v5 §3.8.2.1.2
    return b"\x0b" + remaining_length(identifier)


def message_expiry_item(seconds: int) -> bytes:
    """A Message Expiry Interval property item (v5 §3.3.2.3.3): on delivery,
    the interval left [MQTT-3.3.2-6]."""
    if not 0 <= seconds <= 0xFFFF_FFFF:
        raise LocalProtocolError(f"message expiry interval {seconds!r} out of range")  # v5 §1.5.3
    return b"\x02" + seconds.to_bytes(4, "big")


def _encode_value(ident: int, spec: Spec, value: Any) -> bytes:
    kind = spec.kind
    head = bytes((ident,))
    if kind <= VBI:
        if not isinstance(value, int) or not 0 <= value <= _LIMITS[kind]:
            raise LocalProtocolError(f"property {spec.attr} out of range: {value!r}")  # v5 §1.5
        problem = value_problem(spec.attr, value)
        if problem is not None:
            raise LocalProtocolError(problem)
        if kind == BYTE:
            return head + bytes((value,))
        if kind == U16:
            return head + value.to_bytes(2, "big")
        if kind == U32:
            return head + value.to_bytes(4, "big")
        return head + remaining_length(value)
    if kind == STRING:
        if ident == 0x08 and validate_topic_name(value) is not None:
            raise LocalProtocolError(f"response topic: {validate_topic_name(value)}")  # [MQTT-3.3.2-14]
        return head + string_field(value)
    if kind == BINARY:
        return head + binary_field(bytes(value))
    name, text = value
    return head + string_field(name) + string_field(text)

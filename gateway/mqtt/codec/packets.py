"""MQTT 3.1.1 and 5.0 control packets as plain slotted data classes.

Spec references are to https://docs.oasis-open.org/mqtt/mqtt/v3.1.1/os/mqtt-v3.1.1-os.html
and https://docs.oasis-open.org/mqtt/mqtt/v5.0/os/mqtt-v5.0-os.html.
Fields are those of 3.1.1; MQTT 5's properties and reason codes are further
defaulted fields, so one class serves a packet type in both versions and every
3.1.1 construction and comparison stays as it was.  A packet without
properties carries ``properties=None`` (decoding never builds an empty
:class:`Properties`).

Hot-path note: these are mutable ``slots`` dataclasses, not frozen ones, because
a PUBLISH is built for every message parsed or delivered and a frozen
dataclass's ``__init__`` (``object.__setattr__`` per field) costs several times
more.  They are not validated when constructed; :meth:`MqttConnection.send`
refuses what cannot go on the wire (``LocalProtocolError``), and the parser
only ever builds valid ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Union


class PacketType(IntEnum):
    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15  # MQTT 5 only; reserved in 3.1.1


class ConnectReturnCode(IntEnum):
    """CONNACK return codes (3.1.1 §3.2.2.3); 6-255 are reserved.  MQTT 5 replaces
    them with reason codes (gateway.mqtt.codec.reasons.ReasonCode)."""

    ACCEPTED = 0
    UNACCEPTABLE_PROTOCOL_VERSION = 1
    IDENTIFIER_REJECTED = 2
    SERVER_UNAVAILABLE = 3
    BAD_USERNAME_OR_PASSWORD = 4
    NOT_AUTHORIZED = 5


class SubscribeReturnCode(IntEnum):
    """SUBACK return codes (3.1.1 §3.9.3): the granted QoS, or failure."""

    MAXIMUM_QOS_0 = 0
    MAXIMUM_QOS_1 = 1
    MAXIMUM_QOS_2 = 2
    FAILURE = 0x80


# The same codes as plain names (IntEnum members compare equal to the ints the
# codec decodes, so ``ConnAck(False, 0) == ConnAck(False, ACCEPTED)``).
ACCEPTED = ConnectReturnCode.ACCEPTED
UNACCEPTABLE_PROTOCOL_VERSION = ConnectReturnCode.UNACCEPTABLE_PROTOCOL_VERSION
IDENTIFIER_REJECTED = ConnectReturnCode.IDENTIFIER_REJECTED
SERVER_UNAVAILABLE = ConnectReturnCode.SERVER_UNAVAILABLE
BAD_USERNAME_OR_PASSWORD = ConnectReturnCode.BAD_USERNAME_OR_PASSWORD
NOT_AUTHORIZED = ConnectReturnCode.NOT_AUTHORIZED
SUBACK_FAILURE = SubscribeReturnCode.FAILURE


@dataclass(slots=True, repr=False)
class Properties:
    """Every MQTT 5 property (v5 §2.2.2.2), None when absent.  The two that may
    repeat are tuples: ``subscription_identifiers`` (a PUBLISH to a subscriber
    carries one per matching subscription, a SUBSCRIBE at most one) and
    ``user_properties`` (name, value) pairs in wire order, repeats allowed.
    Which packet may carry which, and the values allowed, are
    gateway.mqtt.codec.properties' table."""

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifiers: tuple[int, ...] = ()
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    user_properties: tuple[tuple[str, str], ...] = ()
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifier_available: int | None = None
    shared_subscription_available: int | None = None

    def __repr__(self) -> str:  # only what is set: 27 fields of None say nothing
        fields = (f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"Properties({', '.join(f for f in fields if not f.endswith(('=None', '=()')))})"


# -- subscription options (v5 §3.8.3.1): the int beside each SUBSCRIBE filter --

NO_LOCAL = 0x04
RETAIN_AS_PUBLISHED = 0x08


def options(qos: int, no_local: bool = False, retain_as_published: bool = False, retain_handling: int = 0) -> int:
    """A subscription options byte; ``options(qos)`` is 3.1.1's requested QoS."""
    return qos | (NO_LOCAL if no_local else 0) | (RETAIN_AS_PUBLISHED if retain_as_published else 0) | retain_handling << 4


def options_qos(byte: int) -> int:
    return byte & 0x03


def options_no_local(byte: int) -> bool:
    return bool(byte & NO_LOCAL)


def options_retain_as_published(byte: int) -> bool:
    return bool(byte & RETAIN_AS_PUBLISHED)


def options_retain_handling(byte: int) -> int:
    return (byte >> 4) & 0x03


@dataclass(slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties | None = None  # the will properties (v5 §3.1.3.2)


@dataclass(slots=True)
class Connect:
    client_id: str
    clean_session: bool = True  # Clean Start in MQTT 5
    keep_alive: int = 0
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    protocol_name: str = "MQTT"
    protocol_level: int = 4
    properties: Properties | None = None


@dataclass(slots=True)
class ConnAck:
    session_present: bool
    return_code: int  # the v5 reason code on a v5 connection
    properties: Properties | None = None


@dataclass(slots=True)
class Publish:
    topic: str  # v5: may be empty when properties.topic_alias names it
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties | None = None


@dataclass(slots=True)
class PubAck:
    packet_id: int
    reason_code: int = 0
    properties: Properties | None = None


@dataclass(slots=True)
class PubRec:
    packet_id: int
    reason_code: int = 0
    properties: Properties | None = None


@dataclass(slots=True)
class PubRel:
    packet_id: int
    reason_code: int = 0
    properties: Properties | None = None


@dataclass(slots=True)
class PubComp:
    packet_id: int
    reason_code: int = 0
    properties: Properties | None = None


@dataclass(slots=True)
class Subscribe:
    packet_id: int
    topics: list[tuple[str, int]] = field(default_factory=list)  # (filter, options byte)
    properties: Properties | None = None


@dataclass(slots=True)
class SubAck:
    packet_id: int
    return_codes: list[int] = field(default_factory=list)  # v5: the reason codes
    properties: Properties | None = None


@dataclass(slots=True)
class Unsubscribe:
    packet_id: int
    topics: list[str] = field(default_factory=list)
    properties: Properties | None = None


@dataclass(slots=True)
class UnsubAck:
    packet_id: int
    reason_codes: list[int] = field(default_factory=list)  # v5 only (3.1.1's UNSUBACK has none)
    properties: Properties | None = None


@dataclass(slots=True)
class PingReq:
    pass


@dataclass(slots=True)
class PingResp:
    pass


@dataclass(slots=True)
class Disconnect:
    reason_code: int = 0  # v5 only
    properties: Properties | None = None


@dataclass(slots=True)
class Auth:
    """MQTT 5's AUTH (v5 §3.15): a step of enhanced authentication."""

    reason_code: int = 0
    properties: Properties | None = None


Packet = Union[
    Connect, ConnAck, Publish, PubAck, PubRec, PubRel, PubComp, Subscribe, SubAck, Unsubscribe, UnsubAck,
    PingReq, PingResp, Disconnect, Auth,
]

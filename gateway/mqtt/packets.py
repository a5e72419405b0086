"""MQTT 3.1.1 control packets as plain slotted data classes.

Spec references are to https://docs.oasis-open.org/mqtt/mqtt/v3.1.1/os/mqtt-v3.1.1-os.html.
Fields are those of 3.1.1; MQTT 5 adds properties and reason codes per packet,
which will be further (defaulted, keyword) fields here, so the codec keeps one
class per packet type across versions.

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


class ConnectReturnCode(IntEnum):
    """CONNACK return codes (3.1.1 §3.2.2.3); 6-255 are reserved.  MQTT 5 replaces
    them with reason codes, which will be a separate enum."""

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


@dataclass(slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False


@dataclass(slots=True)
class Connect:
    client_id: str
    clean_session: bool = True
    keep_alive: int = 0
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    protocol_name: str = "MQTT"
    protocol_level: int = 4


@dataclass(slots=True)
class ConnAck:
    session_present: bool
    return_code: int


@dataclass(slots=True)
class Publish:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None


@dataclass(slots=True)
class PubAck:
    packet_id: int


@dataclass(slots=True)
class PubRec:
    packet_id: int


@dataclass(slots=True)
class PubRel:
    packet_id: int


@dataclass(slots=True)
class PubComp:
    packet_id: int


@dataclass(slots=True)
class Subscribe:
    packet_id: int
    topics: list[tuple[str, int]] = field(default_factory=list)


@dataclass(slots=True)
class SubAck:
    packet_id: int
    return_codes: list[int] = field(default_factory=list)


@dataclass(slots=True)
class Unsubscribe:
    packet_id: int
    topics: list[str] = field(default_factory=list)


@dataclass(slots=True)
class UnsubAck:
    packet_id: int


@dataclass(slots=True)
class PingReq:
    pass


@dataclass(slots=True)
class PingResp:
    pass


@dataclass(slots=True)
class Disconnect:
    pass


Packet = Union[
    Connect, ConnAck, Publish, PubAck, PubRec, PubRel, PubComp, Subscribe, SubAck, Unsubscribe, UnsubAck,
    PingReq, PingResp, Disconnect,
]

"""A strict sans-IO MQTT 3.1.1 and 5.0 codec in the style of h11 (and of the STOMP codec).

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

This module is the connection: buffering, the fixed header's parse, packet
order.  The rest of the codec is its sibling modules in this package (see its
``__init__``), whose public names are all importable from the package.

MQTT 5: the protocol level is fixed on the connection by CONNECT
(``protocol_level``: decoding it on a server, encoding it on a client).  Level 5
swaps in v5's first-byte table (AUTH both ways, DISCONNECT from the server), its
decoders and its encoders (``decoders_v5``, ``encoders_v5``, the property
block in ``properties``, reason codes in ``reasons``); the connection's parse,
packet order and fast paths are the same code.  On a v5 connection every
RemoteProtocolError carries ``reason_code``, the v5 reason code to answer
with (0x81 Malformed Packet unless the spec names another).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator

from gateway.mqtt.codec import packets as p
from gateway.mqtt.codec.decoders import DECODERS_V5, DECODERS_V311
from gateway.mqtt.codec.encoders import SENDERS, encode_publish
from gateway.mqtt.codec.encoders_v5 import SENDERS_V5, encode_publish_v5
from gateway.mqtt.codec.wire import (
    FIRST_BYTE,
    FIRST_BYTE_V31,
    FIRST_BYTE_V5,
    MALFORMED,
    MAX_PACKET_BYTES,
    MAX_REMAINING_LENGTH,
    MQTT5,
    PACKET_TOO_LARGE,
    PROTOCOL_ERROR,
    PT,
    SENT_BY,
    SENT_BY_V5,
    LocalProtocolError,
    RemoteProtocolError,
    Role,
)


class State(enum.Enum):
    """What the peer may send next."""

    AWAITING_CONNECT = "awaiting connect"  # server: nothing but CONNECT [MQTT-3.1.0-1]
    AWAITING_CONNACK = "awaiting connack"  # client: nothing but CONNACK [MQTT-3.2.0-1]
    CONNECTED = "connected"
    ERROR = "error"  # the peer broke the protocol; events() raises again

    # Enum's own __hash__ is Python code, and every packet looks its state up:
    # members are singletons compared by identity, so identity hashing agrees.
    __hash__ = object.__hash__


# Packet order as a table: (state, incoming type) -> next state.  Anything
# missing is a violation, explained by _ORDER_ERRORS.
_TRANSITIONS: dict[tuple[State, PT], State] = {
    (State.AWAITING_CONNECT, PT.CONNECT): State.CONNECTED,  # [MQTT-3.1.0-1]
    (State.AWAITING_CONNACK, PT.CONNACK): State.CONNECTED,  # [MQTT-3.2.0-1]
}
for _kind in SENT_BY[Role.CLIENT] - {PT.CONNECT}:  # a second CONNECT is refused [MQTT-3.1.0-2]
    _TRANSITIONS[(State.CONNECTED, _kind)] = State.CONNECTED
for _kind in SENT_BY[Role.SERVER] - {PT.CONNACK}:  # CONNACK comes once, first [MQTT-3.2.0-1]
    _TRANSITIONS[(State.CONNECTED, _kind)] = State.CONNECTED
# MQTT 5's additions (the 3.1.1 first-byte tables refuse AUTH before the order is
# looked at): AUTH once connected, and AUTH exchanged before CONNACK (enhanced
# authentication, v5 §4.12).  A server's DISCONNECT (SENT_BY_V5) needs no entry:
# (CONNECTED, DISCONNECT) is there for the client's.
for _kind in SENT_BY_V5[Role.CLIENT] - SENT_BY[Role.CLIENT]:
    _TRANSITIONS[(State.CONNECTED, _kind)] = State.CONNECTED
_TRANSITIONS[(State.AWAITING_CONNACK, PT.AUTH)] = State.AWAITING_CONNACK
_CONNECTED = State.CONNECTED
_V5_CONNECT_START = b"\x00\x04MQTT\x05"  # a v5 CONNECT's protocol name and level
# The same table indexed by state first, so the per-packet lookup builds no tuple.
_ALLOWED: dict[State, dict[PT, State]] = {state: {} for state in State}
for (_state, _kind), _next_state in _TRANSITIONS.items():
    _ALLOWED[_state][_kind] = _next_state
_ORDER_ERRORS = {
    State.AWAITING_CONNECT: "the first packet must be CONNECT",  # [MQTT-3.1.0-1]
    State.AWAITING_CONNACK: "the first packet from the server must be CONNACK",  # [MQTT-3.2.0-1]
}  # else, when CONNECTED: "a second CONNECT" [MQTT-3.1.0-2] (or, to a client, a second CONNACK)


# The Properties of a PUBLISH carrying only a Topic Alias, one per alias up to
# ALIAS_CACHE and shared: building one (27 fields) costs more than the rest of
# the parse.  Read only, like every decoded packet (nothing changes a packet
# it received).
ALIAS_CACHE = 256
_ALIAS_ONLY = [p.Properties(topic_alias=alias) for alias in range(ALIAS_CACHE + 1)]


def _alias_only(alias: int) -> p.Properties:
    return _ALIAS_ONLY[alias] if alias <= ALIAS_CACHE else p.Properties(topic_alias=alias)


# -- the connection ----------------------------------------------------------


class MqttConnection:
    """One side of an MQTT byte stream.

    ``max_packet_bytes`` bounds the remaining length of an incoming packet (the
    fixed header's own 2 to 5 bytes are not counted); a session may raise it
    after CONNECT.  ``max_properties`` and ``max_user_property_bytes`` bound
    what one incoming v5 packet's properties may hold (property items, and
    bytes of User Property names and values): past either it is refused with
    0x95, as a packet over the size limit is (by default only the packet's
    size bounds them; a session sets them, and may raise them after CONNECT).
    ``max_topic_filters`` bounds the topic filters of one SUBSCRIBE or
    UNSUBSCRIBE the same way (3.1.1 too: there the answer is to close).  Bytes are kept until the packet they complete is whole:
    arriving pieces are listed and joined once, so a large packet in small
    reads costs linear, not quadratic, copying.
    """

    def __init__(self, role: Role = Role.SERVER, *, max_packet_bytes: int = MAX_PACKET_BYTES,
                 max_properties: int = MAX_REMAINING_LENGTH, max_user_property_bytes: int = MAX_REMAINING_LENGTH,
                 max_topic_filters: int = MAX_REMAINING_LENGTH) -> None:
        self.role = role
        self.max_packet_bytes = max_packet_bytes
        self.max_properties = max_properties
        self.max_user_property_bytes = max_user_property_bytes
        self.max_topic_filters = max_topic_filters
        self.state = State.AWAITING_CONNECT if role is Role.SERVER else State.AWAITING_CONNACK
        self.their_eof = False
        self._level = 4
        self._v5 = False
        self._first_byte = FIRST_BYTE[role]
        self._decoders = DECODERS_V311
        self._senders = SENDERS[role]
        self._encode_publish = encode_publish
        self._error: RemoteProtocolError | None = None
        self._buf = b""
        self._pos = 0
        self._pieces: list[bytes] = []  # received after _buf, not yet joined
        self._pieces_bytes = 0
        self._need = 1  # bytes from _pos needed before parsing can progress

    @property
    def protocol_level(self) -> int:
        """3 or 4 (3.1/3.1.1) or 5: fixed by CONNECT; decides the tables."""
        return self._level

    @protocol_level.setter
    def protocol_level(self, level: int) -> None:
        self._level = level
        self._v5 = v5 = level == MQTT5
        self._first_byte = (FIRST_BYTE_V5 if v5 else FIRST_BYTE_V31 if level == 3 else FIRST_BYTE)[self.role]
        self._decoders = DECODERS_V5 if v5 else DECODERS_V311
        self._senders = (SENDERS_V5 if v5 else SENDERS)[self.role]
        self._encode_publish = encode_publish_v5 if v5 else encode_publish

    # -- receiving -----------------------------------------------------------

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf) - self._pos + self._pieces_bytes

    @property
    def mid_packet(self) -> bool:
        """True when part of a packet is buffered (EOF now would cut it)."""
        return self.buffered_bytes > 0

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Add bytes from the peer; ``b""`` means the peer closed its side."""
        if not data:
            self.their_eof = True
            return
        if self.their_eof:
            raise LocalProtocolError("data received after EOF")
        if not isinstance(data, bytes):
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
            error = self._error
            raise RemoteProtocolError(error.message, return_code=error.return_code, reason_code=error.reason_code)
        try:
            while True:
                packet = self._next()
                if packet is None:
                    return
                yield packet
        except RemoteProtocolError as exc:
            self.state = State.ERROR
            if exc.reason_code is None and self._v5:
                exc.reason_code = MALFORMED  # v5 §4.13.1: what no rule names otherwise
            self._error = exc
            raise

    def _next(self) -> p.Packet | None:
        buf = self._buf
        pos = self._pos
        n = len(buf)
        if n - pos < self._need:
            if n - pos + self._pieces_bytes < self._need:
                if pos == n:  # all parsed: let the read buffer go (an idle connection keeps none)
                    self._buf = b""
                    self._pos = 0
                return None
            buf = self._buf = b"".join([buf[pos:], *self._pieces])
            pos = self._pos = 0
            n = len(buf)
            self._pieces.clear()
            self._pieces_bytes = 0
        first = buf[pos]
        if 0x30 <= first <= 0x33 and self.state is _CONNECTED and n - pos > 3:
            publish = self._publish(buf, pos, n, first)
            if publish is not None:
                return publish
        elif (
            first == 0x40 and n - pos > 3 and buf[pos + 1] == 2 and (buf[pos + 2] or buf[pos + 3])
            and self.state is _CONNECTED and self.max_packet_bytes >= 2
        ):
            # A whole, valid PUBACK (one per QoS 1 message): what its table decoder returns.
            self._need = 1
            self._pos = pos + 4
            return p.PubAck((buf[pos + 2] << 8) | buf[pos + 3])
        kind = self._first_byte[first]
        if isinstance(kind, str):
            raise RemoteProtocolError(str(kind), reason_code=kind.reason_code)  # type: ignore[attr-defined]
        next_state = _ALLOWED[self.state].get(kind)
        if next_state is None:
            message = _ORDER_ERRORS.get(self.state, f"a second {kind.name}")
            raise RemoteProtocolError(message, reason_code=PROTOCOL_ERROR)  # [MQTT-3.1.0-2]
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
            if kind is PT.CONNECT and buf[i : i + 7] == _V5_CONNECT_START:
                # Too large to read, but plainly a v5 CONNECT: answered with a v5 CONNACK 0x95.
                self.protocol_level = MQTT5
            raise RemoteProtocolError(f"packet of {length} bytes is over the limit of {self.max_packet_bytes}",
                                      reason_code=PACKET_TOO_LARGE)  # v5 §3.2.2.3.6, §3.1.2.11.4
        end = i + length
        if end > n:
            self._need = end - pos
            return None
        packet = self._decoders[kind](self, buf, i, end, first & 0x0F)
        self.state = next_state
        self._need = 1
        self._pos = end
        return packet

    def _publish(self, buf: bytes, pos: int, n: int, first: int) -> p.Publish | None:
        """The fast path for a whole, well-formed PUBLISH of QoS 0 or 1
        without DUP and a remaining length of 1 or 2 bytes, on a connected
        connection (on a v5 one, with no properties or a Topic Alias alone):
        the packet the PUBLISH decoder would return.  None for anything else
        (a part missing, a limit or rule broken, other properties):
        the general path then parses it, and says what is wrong."""
        length = buf[pos + 1]
        if length < 0x80:
            i = pos + 2
        elif buf[pos + 2] < 0x80:
            length = (length & 0x7F) | (buf[pos + 2] << 7)
            i = pos + 3
        else:
            return None
        end = i + length
        if end > n or length > self.max_packet_bytes or length < 2:
            return None
        topic_end = i + 2 + ((buf[i] << 8) | buf[i + 1])
        if first > 0x31:  # QoS 1: a packet identifier, not 0, after the topic
            data = topic_end + 2
            if data > end or not (buf[topic_end] or buf[topic_end + 1]):
                return None
        else:
            data = topic_end
            if data > end:
                return None
        try:
            topic = buf[i + 2 : topic_end].decode("utf-8")
        except UnicodeDecodeError:
            return None
        if "+" in topic or "#" in topic or "\x00" in topic:
            return None
        props = None
        if self._v5:  # the property length, after the packet identifier (v5 §3.3.2.3)
            if data >= end:
                return None
            if buf[data] == 0:
                data += 1
            elif buf[data] == 3 and data + 4 <= end and buf[data + 1] == 0x23 and (buf[data + 2] or buf[data + 3]):
                # A Topic Alias and nothing else: what a device using aliases sends.
                props = _alias_only((buf[data + 2] << 8) | buf[data + 3])
                data += 4
            else:
                return None
        if not topic and props is None:
            return None  # (an empty topic name needs an alias: the general path says so)
        self._need = 1
        self._pos = end
        if first < 0x32:
            return p.Publish(topic, buf[data:end], 0, first == 0x31, False, None, props)
        return p.Publish(topic, buf[data:end], 1, first == 0x33, False, (buf[topic_end] << 8) | buf[topic_end + 1],
                         props)

    # -- sending -------------------------------------------------------------

    def send(self, packet: p.Packet | object) -> bytes:
        """Serialize one packet; LocalProtocolError if this role may not send it
        or it cannot be encoded validly (whatever it is: ``object``, so the
        compiled build refuses a non-packet the same way, not with TypeError)."""
        if type(packet) is p.Publish:
            return self._encode_publish(self, packet)
        if type(packet) is p.Connect and self.role is Role.CLIENT:
            self.protocol_level = packet.protocol_level  # the client's choice, as decoding it is the server's
        encode = self._senders.get(type(packet))
        if encode is None:
            raise LocalProtocolError(f"a {self.role.value} cannot send {type(packet).__name__}")
        return encode(self, packet)  # type: ignore[arg-type]  # a packet: its type found an encoder

"""A strict sans-IO MQTT 3.1.1 codec in the style of h11 (and of the STOMP codec).

Feed bytes with :meth:`MqttConnection.receive_data`, take packets from
:meth:`MqttConnection.events`, turn packets into bytes with
:meth:`MqttConnection.send`.  No sockets, clocks or logs.  A peer that breaks
the protocol gets :class:`RemoteProtocolError`; when the right answer is a
CONNACK with a refusal code (say, an unsupported protocol level) the error
carries it in ``return_code``, otherwise the answer is to close.

Each rule cites its normative statement in the 3.1.1 specification
(``[MQTT-x.y.z-n]``).  The protocol level lives on the connection so that
MQTT 5 (properties, reason codes) can be parsed by the same machine later.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator

from gateway.mqtt import packets as p

MAX_REMAINING_LENGTH = 268_435_455  # 4 bytes of variable length
SUPPORTED_LEVELS = {4: "MQTT"}

_U16 = struct.Struct(">H")


class Role(enum.Enum):
    SERVER = "server"  # parses client packets, serializes server packets
    CLIENT = "client"  # the reverse; for tests and benchmarks


class ProtocolError(Exception):
    def __init__(self, message: str, *, return_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.return_code = return_code


class RemoteProtocolError(ProtocolError):
    """The peer sent something malformed or out of order."""


class LocalProtocolError(ProtocolError):
    """We were asked to send something the protocol does not allow."""


def validate_topic_name(name: str) -> str | None:
    """Why ``name`` cannot be a PUBLISH topic, or None."""
    if not name:
        return "empty topic name"  # [MQTT-4.7.3-1]
    if "+" in name or "#" in name:
        return "wildcard in a topic name"  # [MQTT-3.3.2-2], [MQTT-4.7.1-1]
    if "\x00" in name:
        return "NUL in topic"  # [MQTT-4.7.3-2]
    return None


def validate_topic_filter(topic_filter: str) -> str | None:
    """Why ``topic_filter`` cannot be subscribed to, or None."""
    if not topic_filter:
        return "empty topic filter"  # [MQTT-4.7.3-1]
    if "\x00" in topic_filter:
        return "NUL in topic filter"  # [MQTT-4.7.3-2]
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return "'#' must be a whole level and the last"  # [MQTT-4.7.1-2]
        if "+" in level and level != "+":
            return "'+' must be a whole level"  # [MQTT-4.7.1-3]
    return None


class _Reader:
    """Cursor over one packet's variable header and payload."""

    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf: bytes, pos: int, end: int) -> None:
        self.buf = buf
        self.pos = pos
        self.end = end

    def u8(self) -> int:
        if self.pos >= self.end:
            raise RemoteProtocolError("packet ends too early")
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
            raise RemoteProtocolError("a length runs past the end of the packet")
        value = self.buf[self.pos : self.pos + n]
        self.pos += n
        return value

    def string(self) -> str:
        raw = self.binary()
        try:
            text = raw.decode("utf-8")  # [MQTT-1.5.3-1]: no ill-formed UTF-8, no surrogates
        except UnicodeDecodeError:
            raise RemoteProtocolError("string is not valid UTF-8") from None
        if "\x00" in text:
            raise RemoteProtocolError("string contains U+0000")  # [MQTT-1.5.3-2]
        return text

    def packet_id(self) -> int:
        value = self.u16()
        if value == 0:
            raise RemoteProtocolError("packet identifier 0")  # [MQTT-2.3.1-1]
        return value

    def rest(self) -> bytes:
        value = self.buf[self.pos : self.end]
        self.pos = self.end
        return value

    def done(self) -> None:
        if self.pos != self.end:
            raise RemoteProtocolError("bytes left over at the end of the packet")


def _string(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > 65535:
        raise LocalProtocolError("string longer than 65535 bytes")
    return _U16.pack(len(raw)) + raw


def _binary(data: bytes) -> bytes:
    if len(data) > 65535:
        raise LocalProtocolError("binary field longer than 65535 bytes")
    return _U16.pack(len(data)) + data


def _remaining_length(n: int) -> bytes:
    if n < 128:
        return bytes((n,))
    if n > MAX_REMAINING_LENGTH:
        raise LocalProtocolError("packet too large for MQTT")
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


# Fixed-header flags each packet type must carry exactly ([MQTT-2.2.2-1], [MQTT-2.2.2-2]);
# PUBLISH's are its own (dup, qos, retain).
_FIXED_FLAGS = {
    p.PacketType.PUBREL: 0b0010,  # [MQTT-3.6.1-1]
    p.PacketType.SUBSCRIBE: 0b0010,  # [MQTT-3.8.1-1]
    p.PacketType.UNSUBSCRIBE: 0b0010,  # [MQTT-3.10.1-1]
}

_FROM_CLIENT = frozenset(
    {
        p.PacketType.CONNECT, p.PacketType.PUBLISH, p.PacketType.PUBACK, p.PacketType.PUBREC,
        p.PacketType.PUBREL, p.PacketType.PUBCOMP, p.PacketType.SUBSCRIBE, p.PacketType.UNSUBSCRIBE,
        p.PacketType.PINGREQ, p.PacketType.DISCONNECT,
    }
)
_FROM_SERVER = frozenset(
    {
        p.PacketType.CONNACK, p.PacketType.PUBLISH, p.PacketType.PUBACK, p.PacketType.PUBREC,
        p.PacketType.PUBREL, p.PacketType.PUBCOMP, p.PacketType.SUBACK, p.PacketType.UNSUBACK,
        p.PacketType.PINGRESP,
    }
)
_ACKS = {
    p.PacketType.PUBACK: p.PubAck, p.PacketType.PUBREC: p.PubRec, p.PacketType.PUBREL: p.PubRel,
    p.PacketType.PUBCOMP: p.PubComp, p.PacketType.UNSUBACK: p.UnsubAck,
}
_ACK_TYPES = {cls: kind for kind, cls in _ACKS.items()}


class MqttConnection:
    """One side of an MQTT byte stream."""

    def __init__(self, role: Role = Role.SERVER, *, max_packet_bytes: int = 256 * 1024 * 1024) -> None:
        self.role = role
        self.max_packet_bytes = max_packet_bytes
        self.protocol_level = 4
        self._incoming = _FROM_CLIENT if role is Role.SERVER else _FROM_SERVER
        self._connected = role is Role.CLIENT  # a server must see CONNECT first
        self._buf = b""
        self._pos = 0
        self._eof = False

    # -- receiving -----------------------------------------------------------

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf) - self._pos

    @property
    def mid_packet(self) -> bool:
        return self._pos < len(self._buf)

    def receive_data(self, data: bytes) -> None:
        if not data:
            self._eof = True
            return
        if self._pos:
            self._buf = self._buf[self._pos :] + data
            self._pos = 0
        elif self._buf:
            self._buf += data
        else:
            self._buf = data

    def events(self) -> Iterator[p.Packet]:
        while True:
            packet = self._next()
            if packet is None:
                return
            yield packet

    def _next(self) -> p.Packet | None:
        buf = self._buf
        pos = self._pos
        n = len(buf)
        if pos >= n:
            if pos:
                self._buf = b""
                self._pos = 0
            return None
        first = buf[pos]
        kind = first >> 4
        if kind not in self._incoming:
            raise RemoteProtocolError(f"a {self.role.value} does not accept packet type {kind}")
        # Remaining length: 1 to 4 bytes, 7 bits each [MQTT-2.2.3].
        length = 0
        shift = 0
        i = pos + 1
        while True:
            if i >= n:
                if i - pos - 1 >= 4:
                    raise RemoteProtocolError("remaining length longer than 4 bytes")
                return None
            byte = buf[i]
            length |= (byte & 0x7F) << shift
            i += 1
            if not byte & 0x80:
                break
            shift += 7
            if shift >= 28:
                raise RemoteProtocolError("remaining length longer than 4 bytes")
        if length > self.max_packet_bytes:
            raise RemoteProtocolError(f"packet of {length} bytes is over the limit of {self.max_packet_bytes}")
        end = i + length
        if end > n:
            return None
        self._pos = end
        flags = first & 0x0F
        if kind != p.PacketType.PUBLISH and flags != _FIXED_FLAGS.get(kind, 0):  # type: ignore[call-overload]
            raise RemoteProtocolError(f"reserved flags {flags:#06b} set on packet type {kind}")
        if self.role is Role.SERVER:
            if kind == p.PacketType.CONNECT:
                if self._connected:
                    raise RemoteProtocolError("a second CONNECT")  # [MQTT-3.1.0-2]
            elif not self._connected:
                raise RemoteProtocolError("the first packet must be CONNECT")  # [MQTT-3.1.0-1]
        r = _Reader(buf, i, end)
        if kind == p.PacketType.PUBLISH:
            return self._publish(r, flags)
        ack = _ACKS.get(kind)  # type: ignore[call-overload]
        if ack is not None:
            packet_id = r.packet_id()
            r.done()
            return ack(packet_id)  # type: ignore[no-any-return]
        if kind == p.PacketType.CONNECT:
            packet = self._connect(r)
            self._connected = True
            return packet
        if kind == p.PacketType.SUBSCRIBE:
            return self._subscribe(r)
        if kind == p.PacketType.UNSUBSCRIBE:
            packet_id = r.packet_id()
            names = []
            while r.pos < r.end:
                names.append(r.string())
            if not names:
                raise RemoteProtocolError("UNSUBSCRIBE without a topic filter")  # [MQTT-3.10.3-2]
            return p.Unsubscribe(packet_id, names)
        if kind == p.PacketType.CONNACK:
            flags_byte = r.u8()
            if flags_byte & 0xFE:
                raise RemoteProtocolError("reserved CONNACK flags set")  # [MQTT-3.2.2-1]
            code = r.u8()
            r.done()
            return p.ConnAck(bool(flags_byte & 1), code)
        if kind == p.PacketType.SUBACK:
            packet_id = r.packet_id()
            codes = list(r.rest())
            if not codes or any(c not in (0, 1, 2, p.SUBACK_FAILURE) for c in codes):
                raise RemoteProtocolError("invalid SUBACK return codes")  # [MQTT-3.9.3-2]
            return p.SubAck(packet_id, codes)
        r.done()  # PINGREQ, PINGRESP, DISCONNECT have no body
        if kind == p.PacketType.PINGREQ:
            return p.PingReq()
        if kind == p.PacketType.PINGRESP:
            return p.PingResp()
        return p.Disconnect()

    def _publish(self, r: _Reader, flags: int) -> p.Publish:
        qos = (flags >> 1) & 3
        if qos == 3:
            raise RemoteProtocolError("PUBLISH with QoS 3")  # [MQTT-3.3.1-4]
        dup = bool(flags & 8)
        if dup and qos == 0:
            raise RemoteProtocolError("DUP set on a QoS 0 PUBLISH")  # [MQTT-3.3.1-2]
        topic = r.string()
        reason = validate_topic_name(topic)
        if reason is not None:
            raise RemoteProtocolError(f"PUBLISH topic: {reason}")
        packet_id = r.packet_id() if qos else None
        return p.Publish(topic, r.rest(), qos, bool(flags & 1), dup, packet_id)

    def _connect(self, r: _Reader) -> p.Connect:
        name = r.string()
        level = r.u8()
        if name not in ("MQTT", "MQIsdp"):
            raise RemoteProtocolError(f"unknown protocol name {name[:20]!r}")  # [MQTT-3.1.2-1]
        if SUPPORTED_LEVELS.get(level) != name:
            # [MQTT-3.1.2-2]: answer 0x01 and close.
            raise RemoteProtocolError(
                f"unsupported protocol {name} level {level}", return_code=p.UNACCEPTABLE_PROTOCOL_VERSION
            )
        self.protocol_level = level
        flags = r.u8()
        if flags & 1:
            raise RemoteProtocolError("reserved CONNECT flag set")  # [MQTT-3.1.2-3]
        keep_alive = r.u16()
        client_id = r.string()
        will = None
        will_flag = bool(flags & 0x04)
        will_qos = (flags >> 3) & 3
        will_retain = bool(flags & 0x20)
        if will_flag:
            if will_qos == 3:
                raise RemoteProtocolError("will QoS 3")  # [MQTT-3.1.2-14]
            topic = r.string()
            reason = validate_topic_name(topic)
            if reason is not None:
                raise RemoteProtocolError(f"will topic: {reason}")
            will = p.Will(topic, r.binary(), will_qos, will_retain)
        elif will_qos or will_retain:
            raise RemoteProtocolError("will QoS or retain set without a will")  # [MQTT-3.1.2-13], [MQTT-3.1.2-15]
        has_username = bool(flags & 0x80)
        has_password = bool(flags & 0x40)
        if has_password and not has_username:
            raise RemoteProtocolError("password without a user name")  # [MQTT-3.1.2-22]
        username = r.string() if has_username else None
        password = r.binary() if has_password else None
        r.done()
        return p.Connect(client_id, bool(flags & 0x02), keep_alive, username, password, will, name, level)

    def _subscribe(self, r: _Reader) -> p.Subscribe:
        packet_id = r.packet_id()
        topics = []
        while r.pos < r.end:
            topic_filter = r.string()
            options = r.u8()
            if options > 2:
                raise RemoteProtocolError("invalid requested QoS byte")  # [MQTT-3.8.3-4]
            topics.append((topic_filter, options))
        if not topics:
            raise RemoteProtocolError("SUBSCRIBE without a topic filter")  # [MQTT-3.8.3-3]
        return p.Subscribe(packet_id, topics)

    # -- sending -------------------------------------------------------------

    def send(self, packet: p.Packet) -> bytes:
        cls = type(packet)
        if cls is p.Publish:
            return self._send_publish(packet)  # type: ignore[arg-type]
        kind = _ACK_TYPES.get(cls)
        if kind is not None:
            return self._frame(kind, _U16.pack(packet.packet_id))  # type: ignore[union-attr]
        if cls is p.ConnAck:
            return self._frame(p.PacketType.CONNACK, bytes((int(packet.session_present), packet.return_code)))  # type: ignore[union-attr]
        if cls is p.SubAck:
            return self._frame(p.PacketType.SUBACK, _U16.pack(packet.packet_id) + bytes(packet.return_codes))  # type: ignore[union-attr]
        if cls is p.PingResp:
            return self._frame(p.PacketType.PINGRESP, b"")
        if cls is p.PingReq:
            return self._frame(p.PacketType.PINGREQ, b"")
        if cls is p.Disconnect:
            return self._frame(p.PacketType.DISCONNECT, b"")
        if cls is p.Subscribe:
            body = _U16.pack(packet.packet_id) + b"".join(_string(t) + bytes((q,)) for t, q in packet.topics)  # type: ignore[union-attr]
            return self._frame(p.PacketType.SUBSCRIBE, body)
        if cls is p.Unsubscribe:
            body = _U16.pack(packet.packet_id) + b"".join(_string(t) for t in packet.topics)  # type: ignore[union-attr]
            return self._frame(p.PacketType.UNSUBSCRIBE, body)
        if cls is p.Connect:
            return self._send_connect(packet)  # type: ignore[arg-type]
        raise LocalProtocolError(f"cannot send {cls.__name__}")

    def _frame(self, kind: int, body: bytes) -> bytes:
        if kind not in (_FROM_SERVER if self.role is Role.SERVER else _FROM_CLIENT):
            raise LocalProtocolError(f"a {self.role.value} cannot send packet type {kind}")
        return bytes((kind << 4 | _FIXED_FLAGS.get(kind, 0),)) + _remaining_length(len(body)) + body  # type: ignore[call-overload]

    def _send_publish(self, packet: p.Publish) -> bytes:
        topic = packet.topic.encode()
        qos = packet.qos
        head = _U16.pack(len(topic)) + topic
        if qos:
            if not packet.packet_id:
                raise LocalProtocolError("a QoS 1 or 2 PUBLISH needs a packet identifier")
            head += _U16.pack(packet.packet_id)
        flags = (8 if packet.dup else 0) | qos << 1 | (1 if packet.retain else 0)
        payload = packet.payload
        return bytes((0x30 | flags,)) + _remaining_length(len(head) + len(payload)) + head + payload

    def _send_connect(self, packet: p.Connect) -> bytes:
        flags = 0x02 if packet.clean_session else 0
        payload = _string(packet.client_id)
        if packet.will is not None:
            flags |= 0x04 | packet.will.qos << 3 | (0x20 if packet.will.retain else 0)
            payload += _string(packet.will.topic) + _binary(packet.will.payload)
        if packet.username is not None:
            flags |= 0x80
            payload += _string(packet.username)
        if packet.password is not None:
            flags |= 0x40
            payload += _binary(packet.password)
        head = _string(packet.protocol_name) + bytes((packet.protocol_level, flags)) + _U16.pack(packet.keep_alive)
        return self._frame(p.PacketType.CONNECT, head + payload)

"""The replication stream between a primary and a backup, sans-IO (in the
style of the STOMP and MQTT codecs): feed bytes with
:meth:`ReplicationConnection.receive_data` (``b""`` is EOF), take frames from
:meth:`ReplicationConnection.events`, turn frames into bytes with
:meth:`ReplicationConnection.send`.  No sockets, clocks or logs.

Frame on the wire (little-endian)::

    u32 length   of what follows the checksum: the type byte and the body
    u32 crc32    zlib.crc32 of those ``length`` bytes
    u8  type     FrameType
    body         the frame's fields, struct-packed (see _ENCODERS)

The length is checked against ``max_frame_bytes`` as soon as the 8 header
bytes are in, so a hostile or corrupt length never makes us buffer its body.
The bound is a setting (:data:`MAX_FRAME_BYTES`, 64 MiB by default) because
a Batch carries a whole group-commit batch: large under load, but bounded by
what producers can append between two takes of the committer, and a primary
splits a bigger one into several Batch frames at record boundaries
(:func:`split_runs`), so the bound need only exceed the largest single record.
A checksum on top of TCP's catches what TCP's 16-bit sum lets through (and a
bug that misframes), since these bytes go straight into a journal.

Who may send what, and when, is a table (:data:`_TRANSITIONS`): a backup sends
Hello first, then Ack, Refused, Ping and Pong; a primary answers with its own
Hello (its epoch, LSN and epoch history), then Batch frames, or a snapshot
(SnapshotBegin, FileChunk..., SnapshotEnd), InSync (the backup has acked the
live edge and counts toward confirmations from now on), Refused, Ping and Pong.  Anything else is a :class:`RemoteProtocolError` naming what was wrong;
the answer is a Refused frame carrying its ``reason``, then closing.
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from persistence.records import HEADER, HEADER_BYTES

# The default bound of one incoming frame (type byte and body); see above.
MAX_FRAME_BYTES = 64 * 2**20
# What a primary puts into one FileChunk of a snapshot.
FILE_CHUNK_BYTES = 2**20

_HEAD = struct.Struct("<II")
_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_Q = struct.Struct("<Q")
_QQ = struct.Struct("<QQ")
_QQQ = struct.Struct("<QQQ")
_RUN = struct.Struct("<QQI")


class ProtocolError(Exception):
    """What was wrong, as the ``reason`` of the Refused frame to send."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class LocalProtocolError(ProtocolError):
    """We tried to send something this side may not send."""


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes that are not a frame it may send now."""


class Role(enum.Enum):
    PRIMARY = "primary"
    BACKUP = "backup"


class FrameType(enum.IntEnum):
    HELLO = 1
    BATCH = 2
    ACK = 3
    REFUSED = 4
    SNAPSHOT_BEGIN = 5
    FILE_CHUNK = 6
    SNAPSHOT_END = 7
    PING = 8
    PONG = 9
    IN_SYNC = 10


# -- frames --------------------------------------------------------------------

History = tuple[tuple[int, int], ...]  # ((epoch, first lsn of that epoch), ...)
Run = tuple[int, int, bytes]  # (segment, offset, the journal bytes there)


@dataclass(frozen=True, slots=True)
class Hello:
    """Backup -> primary: who I am and what I hold (``epoch``: the highest
    accepted); the primary's answer: the same of the primary."""

    node_id: str
    epoch: int
    last_lsn: int
    history: History = ()


@dataclass(frozen=True, slots=True)
class Batch:
    """Primary -> backup: the journal bytes of LSNs ``first_lsn..last_lsn``
    at their journal positions (a group-commit batch, or part of one)."""

    epoch: int
    first_lsn: int
    last_lsn: int
    runs: tuple[Run, ...]


@dataclass(frozen=True, slots=True)
class Ack:
    """Backup -> primary: everything up to ``lsn`` is fsynced here."""

    epoch: int
    lsn: int


@dataclass(frozen=True, slots=True)
class Refused:
    epoch: int
    reason: str


@dataclass(frozen=True, slots=True)
class SnapshotBegin:
    """Primary -> backup: wipe, then receive ``files`` ((name, size), names
    relative to the data directory); the copy holds LSNs up to ``lsn``, and
    ``history`` is the primary's epoch history up to there."""

    epoch: int
    lsn: int
    history: History
    files: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class FileChunk:
    name: str
    offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class SnapshotEnd:
    """Every file is sent; Batch frames go on from ``lsn + 1``."""

    lsn: int


@dataclass(frozen=True, slots=True)
class InSync:
    """Primary -> backup: you acked ``lsn``, which was the live edge when it
    was sent; you count toward ``sync_replicas`` from now until this link ends
    or a snapshot begins (the primary's own accounting, told so the backup's
    role says the same)."""

    epoch: int
    lsn: int


@dataclass(frozen=True, slots=True)
class Ping:
    token: int


@dataclass(frozen=True, slots=True)
class Pong:
    token: int


Frame = Hello | Batch | Ack | Refused | SnapshotBegin | FileChunk | SnapshotEnd | InSync | Ping | Pong


class State(enum.Enum):
    """What the peer may send next."""

    AWAITING_HELLO = "awaiting hello"  # primary side: the backup says who it is first
    STREAMING = "streaming"  # primary side after Hello; backup side: the live tail
    SNAPSHOT = "snapshot"  # backup side, between SnapshotBegin and SnapshotEnd
    CLOSED = "closed"  # the peer's EOF came
    ERROR = "error"  # the peer broke the protocol; events() raises again


_T = FrameType
_TRANSITIONS: dict[State, dict[FrameType, State]] = {
    # Each side's first frame is a Hello (the primary's answers the backup's:
    # its epoch, LSN and history), or a Refused before it closes.
    State.AWAITING_HELLO: {_T.HELLO: State.STREAMING, _T.REFUSED: State.AWAITING_HELLO},
    State.SNAPSHOT: {
        _T.FILE_CHUNK: State.SNAPSHOT, _T.SNAPSHOT_END: State.STREAMING, _T.PING: State.SNAPSHOT,
        _T.PONG: State.SNAPSHOT, _T.REFUSED: State.SNAPSHOT,
    },
    State.CLOSED: {},
    State.ERROR: {},
}
# In STREAMING each side accepts what its peer's role sends on the tail.
_STREAMING: dict[Role, dict[FrameType, State]] = {
    Role.PRIMARY: {t: State.STREAMING for t in (_T.ACK, _T.REFUSED, _T.PING, _T.PONG)},
    Role.BACKUP: {
        **{t: State.STREAMING for t in (_T.BATCH, _T.IN_SYNC, _T.REFUSED, _T.PING, _T.PONG)},
        _T.SNAPSHOT_BEGIN: State.SNAPSHOT,
    },
}
SENT_BY: dict[Role, frozenset[FrameType]] = {
    Role.BACKUP: frozenset({_T.HELLO, _T.ACK, _T.REFUSED, _T.PING, _T.PONG}),
    Role.PRIMARY: frozenset({_T.HELLO, _T.BATCH, _T.REFUSED, _T.SNAPSHOT_BEGIN, _T.FILE_CHUNK, _T.SNAPSHOT_END, _T.IN_SYNC,
                             _T.PING, _T.PONG}),
}


# -- field codecs --------------------------------------------------------------


def _str(text: str) -> bytes:
    data = text.encode()
    if len(data) > 0xFFFF:
        raise LocalProtocolError(f"text of {len(data)} bytes is longer than 65535")
    return _U16.pack(len(data)) + data


def _history(history: History) -> bytes:
    return _U32.pack(len(history)) + b"".join(_QQ.pack(e, f) for e, f in history)


class _Reader:
    __slots__ = ("view", "pos")

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.pos = 0

    def take(self, n: int) -> memoryview:
        if self.pos + n > len(self.view):
            raise RemoteProtocolError("frame body is shorter than its fields")
        out = self.view[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, s: struct.Struct) -> tuple[int, ...]:
        return s.unpack(self.take(s.size))

    def str(self) -> str:
        (n,) = self.unpack(_U16)
        try:
            return str(self.take(n), "utf-8")
        except UnicodeDecodeError:
            raise RemoteProtocolError("text is not UTF-8") from None

    def history(self) -> History:
        (n,) = self.unpack(_U32)
        if n * _QQ.size > len(self.view) - self.pos:
            raise RemoteProtocolError("frame body is shorter than its fields")
        return tuple((e, f) for e, f in _QQ.iter_unpack(self.take(n * _QQ.size)))

    def end(self) -> None:
        if self.pos != len(self.view):
            raise RemoteProtocolError(f"{len(self.view) - self.pos} bytes after the frame's fields")


def _encode(frame: Frame) -> tuple[FrameType, bytes]:
    if isinstance(frame, Batch):
        parts = [_QQQ.pack(frame.epoch, frame.first_lsn, frame.last_lsn), _U32.pack(len(frame.runs))]
        for seg, offset, data in frame.runs:
            parts.append(_RUN.pack(seg, offset, len(data)))
            parts.append(data)
        return _T.BATCH, b"".join(parts)
    if isinstance(frame, Ack):
        return _T.ACK, _QQ.pack(frame.epoch, frame.lsn)
    if isinstance(frame, Hello):
        return _T.HELLO, _str(frame.node_id) + _QQ.pack(frame.epoch, frame.last_lsn) + _history(frame.history)
    if isinstance(frame, Refused):
        return _T.REFUSED, _Q.pack(frame.epoch) + _str(frame.reason)
    if isinstance(frame, SnapshotBegin):
        files = b"".join(_str(name) + _Q.pack(size) for name, size in frame.files)
        return _T.SNAPSHOT_BEGIN, _QQ.pack(frame.epoch, frame.lsn) + _history(frame.history) + _U32.pack(len(frame.files)) + files
    if isinstance(frame, FileChunk):
        return _T.FILE_CHUNK, _str(frame.name) + _Q.pack(frame.offset) + frame.data
    if isinstance(frame, SnapshotEnd):
        return _T.SNAPSHOT_END, _Q.pack(frame.lsn)
    if isinstance(frame, InSync):
        return _T.IN_SYNC, _QQ.pack(frame.epoch, frame.lsn)
    if isinstance(frame, Ping):
        return _T.PING, _Q.pack(frame.token)
    if isinstance(frame, Pong):
        return _T.PONG, _Q.pack(frame.token)
    raise LocalProtocolError(f"not a replication frame: {type(frame).__name__}")


def _decode(ftype: FrameType, body: memoryview) -> Frame:
    r = _Reader(body)
    frame: Frame
    if ftype is _T.BATCH:
        epoch, first, last = r.unpack(_QQQ)
        (count,) = r.unpack(_U32)
        runs = []
        for _ in range(count):
            seg, offset, n = r.unpack(_RUN)
            runs.append((seg, offset, bytes(r.take(n))))
        if last < first - 1:
            raise RemoteProtocolError(f"batch's last lsn {last} is before its first {first}")
        frame = Batch(epoch, first, last, tuple(runs))
    elif ftype is _T.ACK:
        frame = Ack(*r.unpack(_QQ))
    elif ftype is _T.HELLO:
        node_id = r.str()
        epoch, last_lsn = r.unpack(_QQ)
        frame = Hello(node_id, epoch, last_lsn, r.history())
    elif ftype is _T.REFUSED:
        (epoch,) = r.unpack(_Q)
        frame = Refused(epoch, r.str())
    elif ftype is _T.SNAPSHOT_BEGIN:
        epoch, lsn = r.unpack(_QQ)
        history = r.history()
        (count,) = r.unpack(_U32)
        files = []
        for _ in range(count):
            name = r.str()
            files.append((name, r.unpack(_Q)[0]))
        frame = SnapshotBegin(epoch, lsn, history, tuple(files))
    elif ftype is _T.FILE_CHUNK:
        name = r.str()
        (offset,) = r.unpack(_Q)
        frame = FileChunk(name, offset, bytes(r.take(len(body) - r.pos)))
    elif ftype is _T.SNAPSHOT_END:
        frame = SnapshotEnd(*r.unpack(_Q))
    elif ftype is _T.IN_SYNC:
        frame = InSync(*r.unpack(_QQ))
    elif ftype is _T.PING:
        frame = Ping(*r.unpack(_Q))
    else:
        frame = Pong(*r.unpack(_Q))
    r.end()
    return frame


# -- the connection ------------------------------------------------------------


class ReplicationConnection:
    """One side of a replication stream: ``role`` is this side's."""

    def __init__(self, role: Role, *, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self.role = role
        self.peer = Role.BACKUP if role is Role.PRIMARY else Role.PRIMARY
        self.max_frame_bytes = max_frame_bytes
        self.state = State.AWAITING_HELLO
        self.their_eof = False
        self._buf = bytearray()
        self._error: RemoteProtocolError | None = None

    def receive_data(self, data: bytes) -> None:
        if self.their_eof:
            raise RuntimeError("receive_data after EOF")
        if data:
            self._buf += data
        else:
            self.their_eof = True

    def events(self) -> Iterator[Frame]:
        """Whole frames, parsed lazily (a reader may stop early; the rest
        stays buffered).  Raises :class:`RemoteProtocolError` on bad bytes,
        and again on every later call."""
        while True:
            if self._error is not None:
                raise self._error
            try:
                frame = self._next()
            except RemoteProtocolError as exc:
                self._error = exc
                self.state = State.ERROR
                raise
            if frame is None:
                return
            yield frame

    def _next(self) -> Frame | None:
        buf = self._buf
        if len(buf) < _HEAD.size:
            self._at_end(buf)
            return None
        length, crc = _HEAD.unpack_from(buf, 0)
        if length > self.max_frame_bytes:
            raise RemoteProtocolError(f"frame of {length} bytes is over the limit of {self.max_frame_bytes}")
        if length == 0:
            raise RemoteProtocolError("frame without a type")
        end = _HEAD.size + length
        if len(buf) < end:
            self._at_end(buf)
            return None
        view = memoryview(buf)
        try:
            if zlib.crc32(view[_HEAD.size : end]) != crc:
                raise RemoteProtocolError("frame checksum mismatch")
            code = buf[_HEAD.size]
            try:
                ftype = FrameType(code)
            except ValueError:
                raise RemoteProtocolError(f"unknown frame type {code}") from None
            allowed = _STREAMING[self.role] if self.state is State.STREAMING else _TRANSITIONS[self.state]
            following = allowed.get(ftype)
            if following is None:
                if ftype not in SENT_BY[self.peer]:
                    raise RemoteProtocolError(f"a {self.peer.value} does not send {ftype.name}")
                raise RemoteProtocolError(f"{ftype.name} is not expected while {self.state.value}")
            frame = _decode(ftype, view[_HEAD.size + 1 : end])
        finally:
            view.release()
        del buf[:end]
        self.state = following
        return frame

    def _at_end(self, buf: bytearray) -> None:
        """No whole frame in ``buf``: at the peer's EOF, closed or an error."""
        if self.their_eof:
            if buf:
                raise RemoteProtocolError(f"connection closed in the middle of a frame ({len(buf)} bytes)")
            self.state = State.CLOSED

    def send(self, frame: Frame) -> bytes:
        ftype, body = _encode(frame)
        if ftype not in SENT_BY[self.role]:
            raise LocalProtocolError(f"a {self.role.value} does not send {ftype.name}")
        length = 1 + len(body)
        if length > self.max_frame_bytes:
            raise LocalProtocolError(f"frame of {length} bytes is over the limit of {self.max_frame_bytes}")
        typed = _U8.pack(ftype) + body
        return _HEAD.pack(length, zlib.crc32(typed)) + typed


# -- splitting a batch -----------------------------------------------------------


def split_runs(first_lsn: int, runs: list[tuple[int, int, bytes]] | tuple[Run, ...], max_bytes: int
               ) -> Iterator[tuple[int, int, tuple[Run, ...]]]:
    """Cut a batch's runs at record boundaries into pieces of at most
    ``max_bytes`` of record bytes (a single bigger record is a piece of its
    own): ``(first lsn, last lsn, runs)`` each, one LSN per top-level record."""
    lsn = first_lsn
    piece: list[Run] = []
    size = 0
    start = lsn
    for seg, offset, data in runs:
        p = 0
        run_from = 0
        while p < len(data):
            n = HEADER_BYTES + HEADER.unpack_from(data, p)[4]
            if size and size + n > max_bytes:
                if p > run_from:
                    piece.append((seg, offset + run_from, bytes(data[run_from:p])))
                yield start, lsn - 1, tuple(piece)
                piece, size, start, run_from = [], 0, lsn, p
            size += n
            lsn += 1
            p += n
        if p > run_from:
            piece.append((seg, offset + run_from, bytes(data[run_from:p])))
    if piece:
        yield start, lsn - 1, tuple(piece)

"""Journal record framing and the payload codecs of every record type.

Frame (all integers little-endian), 12 bytes of header then the payload::

    offset  size  field
    0       2     magic      b"\\xd5\\x47" top-level, b"\\xd5\\x4e" nested in a TX
    2       4     crc32      zlib.crc32 over bytes [6, 12 + length): version,
                             type, length and payload (one contiguous run)
    6       1     version    FORMAT_VERSION (1)
    7       1     type       RecordType
    8       4     length     payload bytes
    12      n     payload

The magic lets a reader resynchronise after a damaged record by searching for
the next magic whose header and checksum validate (LevelDB's log uses blocks
for this; a magic is simpler and costs two bytes).  Frames nested inside a TX
use a different magic so that resynchronising can never land inside a
transaction and apply half of it.

Payloads use struct with length-prefixed UTF-8 (u16 lengths for ids, names and
keys; u32 for header text).  A message keeps its metadata and queue keys first
so that recovery decodes those and never touches headers or body.

MESSAGE_ADD / MESSAGE_MOVE payload::

    <BqqIHHH  priority, expires, timestamp, delivery_count, id len, destination len, key count
    id, destination
    u16 * key count   key lengths, then the keys
    u32 header count, u32 * 2*count lengths (name, value, ...), then the texts
    body              the rest of the payload

TX payload: u32 op count, then that many nested frames (MESSAGE_ADD, ACK,
ARCHIVE or KV_PUT); zero bytes after them are padding (a failed batch's TX
keeps its size when its adds are taken out, see journal.neutralize).
"""

from __future__ import annotations

import struct
import sys
import zlib
from array import array
from collections.abc import Sequence
from enum import IntEnum

from core.storage import Retained, StoredMessage, StoredSubscription

MAGIC = b"\xd5\x47"
NESTED_MAGIC = b"\xd5\x4e"
FORMAT_VERSION = 1
HEADER = struct.Struct("<2sIBBI")
HEADER_BYTES = HEADER.size  # 12
CRC_FROM = 6  # the checksum covers the header from here, then the payload
MAX_PAYLOAD_BYTES = 2**32 - 1

_VTL = struct.Struct("<BBI")
_CRC = struct.Struct("<I")
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")
_TWO = struct.Struct("<HH")
_MSG_FIXED = struct.Struct("<BqqIHHH")
_NO_HEADERS = _U32.pack(0)
_BIG_ENDIAN = sys.byteorder == "big"


class RecordType(IntEnum):
    MESSAGE_ADD = 1
    ACK = 2
    SUB_ADD = 3
    SUB_REMOVE = 4
    TX = 5
    KV_PUT = 6
    KV_DELETE = 7
    # Filler that replays as nothing: what a failed batch's message adds are
    # rewritten to, so they can never become durable (see Store.batch_failed).
    PAD = 8
    # Compaction's copy of a live message into the active segment; replay only
    # updates the location of a message it already knows.
    MESSAGE_MOVE = 9
    # A message kept in a topic's archive (persistence/archive.py): the same
    # payload goes to the journal (the write-ahead copy, synced with the
    # batch) and to the topic's archive segment (synced lazily).
    ARCHIVE = 10


class CorruptRecord(Exception):
    """A frame or payload that does not decode; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# What decoding a payload that passed its checksum but is not what its type
# says may raise (a writer's bug, or a format this version misreads).
# struct.error is not a ValueError.
DECODE_ERRORS = (CorruptRecord, ValueError, IndexError, struct.error)


def header(rtype: int, payload: bytes, magic: bytes = MAGIC) -> bytes:
    """The 12 header bytes that frame ``payload``."""
    vtl = _VTL.pack(FORMAT_VERSION, rtype, len(payload))
    return magic + _CRC.pack(zlib.crc32(payload, zlib.crc32(vtl))) + vtl


def frame(rtype: int, payload: bytes, magic: bytes = MAGIC) -> bytes:
    return header(rtype, payload, magic) + payload


def parse_frame(buf: bytes | bytearray | memoryview, offset: int, end: int, nested_ok: bool = False) -> tuple[int, int]:
    """Validate the frame at ``offset``; return ``(type, payload length)``.

    Raises :class:`CorruptRecord` with the reason when it does not validate.
    """
    if end - offset < HEADER_BYTES:
        raise CorruptRecord("short header")
    magic, crc, version, rtype, length = HEADER.unpack_from(buf, offset)
    if magic != MAGIC and not (nested_ok and magic == NESTED_MAGIC):
        raise CorruptRecord("bad magic")
    if version != FORMAT_VERSION:
        raise CorruptRecord(f"unknown format version {version}")
    stop = offset + HEADER_BYTES + length
    if stop > end:
        raise CorruptRecord("record runs past the end")
    if zlib.crc32(memoryview(buf)[offset + CRC_FROM : stop]) != crc:
        raise CorruptRecord("checksum mismatch")
    return rtype, length


def pad_frame(total_bytes: int) -> bytes:
    """A PAD frame of exactly ``total_bytes`` (at least a header)."""
    return frame(RecordType.PAD, bytes(total_bytes - HEADER_BYTES))


# -- string helpers ---------------------------------------------------------


def _lengths(typecode: str, parts: list[bytes]) -> bytes:
    lengths = array(typecode, map(len, parts))
    if _BIG_ENDIAN:
        lengths.byteswap()
    return lengths.tobytes()


def _read_lengths(typecode: str, buf: bytes | memoryview, offset: int, count: int) -> array[int]:
    lengths = array(typecode)
    lengths.frombytes(buf[offset : offset + count * lengths.itemsize])
    if _BIG_ENDIAN:
        lengths.byteswap()
    return lengths


def encode_two(first: str, second: str) -> bytes:
    a = first.encode()
    b = second.encode()
    return _TWO.pack(len(a), len(b)) + a + b


def decode_two(payload: bytes | memoryview) -> tuple[str, str, int]:
    """Two strings and the offset after them."""
    la, lb = _TWO.unpack_from(payload, 0)
    a = str(payload[4 : 4 + la], "utf-8")
    b = str(payload[4 + la : 4 + la + lb], "utf-8")
    return a, b, 4 + la + lb


def encode_one(text: str) -> bytes:
    a = text.encode()
    return _U16.pack(len(a)) + a


def decode_one(payload: bytes | memoryview) -> str:
    (la,) = _U16.unpack_from(payload, 0)
    return str(payload[2 : 2 + la], "utf-8")


# -- record payloads ---------------------------------------------------------


def encode_message(message: StoredMessage, keys: Sequence[str]) -> bytes:
    """A MESSAGE_ADD payload: ``message`` held by the queues in ``keys``."""
    message_id, destination, headers, body, priority, expires, timestamp, delivery_count, _ = message
    idb = message_id.encode()
    db = destination.encode()
    fixed = _MSG_FIXED.pack(priority, expires, timestamp, delivery_count, len(idb), len(db), len(keys))
    # One queue, or no application headers (every persistent SEND without
    # them): no length array to build for it (half the cost of this function).
    if len(keys) == 1:
        kb = keys[0].encode()
        key_part: tuple[bytes, ...] = (_U16.pack(len(kb)), kb)
    else:
        kbs = [k.encode() for k in keys]
        key_part = (_lengths("H", kbs), *kbs)
    if not headers:
        return b"".join((fixed, idb, db, *key_part, _NO_HEADERS, body or b""))
    texts = [s.encode() for item in headers.items() for s in item]
    return b"".join((fixed, idb, db, *key_part, _U32.pack(len(texts) // 2), _lengths("I", texts), *texts, body or b""))


def _message_head(payload: bytes | memoryview) -> tuple[int, int, int, int, str, str, list[str], int]:
    """The one parse of a message payload's metadata: ``(priority, expires,
    timestamp, delivery count, id, destination, queue keys, where the
    headers start)``."""
    priority, expires, timestamp, count, lid, ldest, nkeys = _MSG_FIXED.unpack_from(payload, 0)
    p = _MSG_FIXED.size
    message_id = str(payload[p : p + lid], "utf-8")
    p += lid
    destination = str(payload[p : p + ldest], "utf-8")
    p += ldest
    keys = []
    if nkeys:
        lengths = _read_lengths("H", payload, p, nkeys)
        p += 2 * nkeys
        for n in lengths:
            keys.append(str(payload[p : p + n], "utf-8"))
            p += n
    return priority, expires, timestamp, count, message_id, destination, keys, p


def decode_message_meta(payload: bytes | memoryview, location: int = -1) -> tuple[StoredMessage, list[str]]:
    """The message without headers and body, and its queue keys: the
    recovery path, which never touches headers or body.  Destination and
    keys are interned: recovery may hold millions of messages in memory, and
    a queue's share one string."""
    priority, expires, timestamp, count, message_id, destination, keys, _ = _message_head(payload)
    intern = sys.intern
    message = StoredMessage(message_id, intern(destination), None, None, priority, expires, timestamp, count, location)
    return message, [intern(k) for k in keys]


def decode_message_id(payload: bytes | memoryview) -> str:
    lid = _MSG_FIXED.unpack_from(payload, 0)[4]
    p = _MSG_FIXED.size
    return str(payload[p : p + lid], "utf-8")


def decode_message(payload: bytes | memoryview, location: int = -1) -> StoredMessage:
    """The whole message, headers and body included."""
    return _decode_whole(payload, location)[0]


def _decode_whole(payload: bytes | memoryview, location: int) -> tuple[StoredMessage, list[str]]:
    priority, expires, timestamp, count, message_id, destination, keys, p = _message_head(payload)
    (nheaders,) = _U32.unpack_from(payload, p)
    p += 4
    lengths = _read_lengths("I", payload, p, 2 * nheaders)
    p += 8 * nheaders
    texts = []
    for n in lengths:
        texts.append(str(payload[p : p + n], "utf-8"))
        p += n
    if p > len(payload):
        raise CorruptRecord("message headers run past the payload")
    headers = dict(zip(texts[0::2], texts[1::2]))
    body = bytes(payload[p:])
    return StoredMessage(message_id, destination, headers, body, priority, expires, timestamp, count, location), keys


# The store's own key/value namespaces: delivery counts noted at a clean
# stop, retained messages by topic, and the idempotency keys of committed
# transactions, each with its commit's sequence number (so the oldest are
# known after a restart).
REDELIVERIES = "redeliveries"
RETAINED = "retained"
COMMIT_KEYS = "commit-keys"

# A retained message is kept as a key/value note (its topic the key) whose
# value is the message codec's payload, with the MQTT QoS where queue keys go
# (a retained message belongs to no queue): "qos:1", or "qos:" for none.
_QOS_MARK = "qos:"


def encode_retained(retained: Retained) -> bytes:
    qos = retained.qos
    return encode_message(retained.message, [_QOS_MARK if qos is None else f"{_QOS_MARK}{qos}"])


def decode_retained(payload: bytes | memoryview) -> Retained:
    message, keys = _decode_whole(payload, -1)
    qos_text = keys[0][len(_QOS_MARK) :] if keys and keys[0].startswith(_QOS_MARK) else ""
    return Retained(message, int(qos_text) if qos_text.isdigit() else None)


# A durable subscription's description is kept as one string: the pattern,
# then after a NUL (which no destination name or selector can hold) the
# selector, then after another the owner's name ("" for the anonymous
# principal).  Folders written before selectors, or before owners, were
# kept read as having none.
_FIELD_MARK = "\x00"


def encode_subscription(pattern: str, selector: str | None, owner: str | None) -> str:
    if owner is None:
        return pattern if selector is None else f"{pattern}{_FIELD_MARK}{selector}"
    return f"{pattern}{_FIELD_MARK}{selector or ''}{_FIELD_MARK}{owner}"


def decode_subscription(key: str, stored: str) -> StoredSubscription:
    parts = stored.split(_FIELD_MARK, 2)
    selector = parts[1] if len(parts) > 1 and parts[1] else None
    return StoredSubscription(key, parts[0], selector, parts[2] if len(parts) > 2 else None)


def encode_tx(ops: list[tuple[int, bytes]]) -> tuple[bytes, list[int]]:
    """A TX payload of nested frames, and where each nested frame starts
    within the payload (so a nested message gets its own location)."""
    parts = [_U32.pack(len(ops))]
    starts = []
    at = 4
    for rtype, payload in ops:
        starts.append(at)
        parts.append(header(rtype, payload, NESTED_MAGIC))
        parts.append(payload)
        at += HEADER_BYTES + len(payload)
    return b"".join(parts), starts


def decode_tx(payload: bytes | bytearray | memoryview) -> list[tuple[int, int, memoryview]]:
    """``(offset within payload, type, nested payload)`` for each op.  The
    whole TX passed its checksum, so nested checksums are not re-checked."""
    view = memoryview(payload)
    (count,) = _U32.unpack_from(view, 0)
    ops = []
    p = 4
    end = len(view)
    for _ in range(count):
        if end - p < HEADER_BYTES:
            raise CorruptRecord("transaction op runs past the record")
        magic, _crc, _version, rtype, length = HEADER.unpack_from(view, p)
        if magic != NESTED_MAGIC or p + HEADER_BYTES + length > end:
            raise CorruptRecord("bad transaction op")
        ops.append((p, rtype, view[p + HEADER_BYTES : p + HEADER_BYTES + length]))
        p += HEADER_BYTES + length
    return ops


def encode_kv_put(namespace: str, key: str, value: bytes) -> bytes:
    return encode_two(namespace, key) + value


def decode_kv_put(payload: bytes | memoryview) -> tuple[str, str, bytes]:
    namespace, key, p = decode_two(payload)
    return namespace, key, bytes(payload[p:])

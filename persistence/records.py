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

TX payload: u32 op count, then that many nested frames (MESSAGE_ADD or ACK).
"""

from __future__ import annotations

import struct
import sys
import zlib
from array import array
from enum import IntEnum

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


def encode_message(
    message_id: str,
    destination: str,
    headers: dict[str, str] | None,
    body: bytes | None,
    priority: int,
    expires: int,
    timestamp: int,
    delivery_count: int,
    keys: list[str],
) -> bytes:
    idb = message_id.encode()
    db = destination.encode()
    kbs = [k.encode() for k in keys]
    texts = [s.encode() for item in headers.items() for s in item] if headers else []
    return b"".join(
        (
            _MSG_FIXED.pack(priority, expires, timestamp, delivery_count, len(idb), len(db), len(kbs)),
            idb,
            db,
            _lengths("H", kbs),
            *kbs,
            _U32.pack(len(texts) // 2),
            _lengths("I", texts),
            *texts,
            body or b"",
        )
    )


def decode_message_meta(payload: bytes | memoryview) -> tuple[str, str, int, int, int, int, list[str]]:
    """``(id, destination, priority, expires, timestamp, delivery_count, keys)``
    without decoding headers or body: the recovery path."""
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
    return message_id, destination, priority, expires, timestamp, count, keys


def decode_message_id(payload: bytes | memoryview) -> str:
    lid = _MSG_FIXED.unpack_from(payload, 0)[4]
    p = _MSG_FIXED.size
    return str(payload[p : p + lid], "utf-8")


def decode_message(payload: bytes | memoryview) -> tuple[str, str, dict[str, str], bytes, int, int, int, int, list[str]]:
    """Everything: ``(id, destination, headers, body, priority, expires,
    timestamp, delivery_count, keys)``."""
    priority, expires, timestamp, count, lid, ldest, nkeys = _MSG_FIXED.unpack_from(payload, 0)
    p = _MSG_FIXED.size
    message_id = str(payload[p : p + lid], "utf-8")
    p += lid
    destination = str(payload[p : p + ldest], "utf-8")
    p += ldest
    keys = []
    if nkeys:
        lengths_k = _read_lengths("H", payload, p, nkeys)
        p += 2 * nkeys
        for n in lengths_k:
            keys.append(str(payload[p : p + n], "utf-8"))
            p += n
    (nheaders,) = _U32.unpack_from(payload, p)
    p += 4
    lengths = _read_lengths("I", payload, p, 2 * nheaders)
    p += 8 * nheaders
    texts = []
    for n in lengths:
        texts.append(str(payload[p : p + n], "utf-8"))
        p += n
    headers = dict(zip(texts[0::2], texts[1::2]))
    if p > len(payload):
        raise CorruptRecord("message headers run past the payload")
    return message_id, destination, headers, bytes(payload[p:]), priority, expires, timestamp, count, keys


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


def decode_tx(payload: bytes | memoryview) -> list[tuple[int, int, memoryview]]:
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

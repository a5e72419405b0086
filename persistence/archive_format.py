"""The on-disk layout of topic archives (persistence/archive.py writes it,
persistence/archive_reader.py reads it).

    archive/<escaped topic>/<base offset, 20 digits>.seg   records, journal framing, type ARCHIVE
    archive/<escaped topic>/<base offset, 20 digits>.idx   sparse index of a closed segment

Record payload (little-endian)::

    <QqBHHI  offset, timestamp (epoch ms), priority, topic len, id len, headers len
    topic, message id        UTF-8
    headers                  per header: <HI name len, value len, then name, value
    body                     the rest

Index file: ``<QQ`` (offset, position of its record) pairs, ascending.
"""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path
from urllib.parse import quote

from persistence import records
from persistence.records import HEADER, HEADER_BYTES, CorruptRecord

ROW = struct.Struct("<QqBHHI")
PAIR = struct.Struct("<HI")
OFFSET = struct.Struct("<Q")
SEGMENT_SUFFIX = ".seg"
SEGMENT_NAME = re.compile(r"^(\d{20})\.seg$")
INDEX_SUFFIX = ".idx"
# A sparse index entry every this many bytes of a segment (256 per 16 MiB).
INDEX_BYTES = 64 * 1024
ENTRY = struct.Struct("<QQ")


def segment_name(base: int) -> str:
    return f"{base:020d}{SEGMENT_SUFFIX}"


def index_name(base: int) -> str:
    return f"{base:020d}{INDEX_SUFFIX}"


def directory_name(topic: str) -> str:
    """A reversible file name for a topic: percent-escaped, never hidden."""
    name = quote(topic, safe="")
    return "%2E" + name[1:] if name.startswith(".") else name


def encode_row(offset: int, topic: bytes, message_id: str, headers: dict[str, str] | None, body: bytes, priority: int, timestamp: int) -> bytes:
    idb = message_id.encode()
    if headers:
        parts: list[bytes] = []
        for name, value in headers.items():
            nb, vb = name.encode(), value.encode()
            parts += (PAIR.pack(len(nb), len(vb)), nb, vb)
        hb = b"".join(parts)
    else:
        hb = b""
    return b"".join((ROW.pack(offset, timestamp, priority, len(topic), len(idb), len(hb)), topic, idb, hb, body))


def decode_row(payload: bytes | memoryview) -> tuple[str, int, str, dict[str, str], bytes, int, int]:
    """``(topic, offset, message id, headers, body, priority, timestamp)``."""
    offset, timestamp, priority, tl, il, hl = ROW.unpack_from(payload, 0)
    p = ROW.size
    topic = str(payload[p : p + tl], "utf-8")
    p += tl
    message_id = str(payload[p : p + il], "utf-8")
    p += il
    headers = {}
    stop = p + hl
    while p < stop:
        nl, vl = PAIR.unpack_from(payload, p)
        p += PAIR.size
        headers[str(payload[p : p + nl], "utf-8")] = str(payload[p + nl : p + nl + vl], "utf-8")
        p += nl + vl
    if p != stop or stop > len(payload):
        raise CorruptRecord("archive headers run past the record")
    return topic, offset, message_id, headers, bytes(payload[stop:]), priority, timestamp


def list_bases(directory: Path) -> list[int]:
    """The base offsets of a topic directory's segments, ascending."""
    return sorted(int(m.group(1)) for m in map(SEGMENT_NAME.match, os.listdir(directory)) if m)


def encode_index(entries: list[tuple[int, int]]) -> bytes:
    return b"".join(ENTRY.pack(offset, position) for offset, position in entries)


def read_index(path: Path) -> list[tuple[int, int]]:
    """A sparse index file's ``(offset, position)`` entries; none if missing."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    return [ENTRY.unpack_from(raw, i) for i in range(0, len(raw) - len(raw) % ENTRY.size, ENTRY.size)]


def entry_holds(fd: int, offset: int, position: int) -> bool:
    """Whether the segment open as ``fd`` has a whole, valid record of
    ``offset`` at ``position``: an index is a hint, trusted only this far."""
    size = os.fstat(fd).st_size
    if not 0 <= position <= size - HEADER_BYTES:
        return False
    head = os.pread(fd, HEADER_BYTES, position)
    length = HEADER.unpack_from(head)[4]
    if length > size - position - HEADER_BYTES:  # damaged: never read more than the file holds
        return False
    frame = head + os.pread(fd, length, position + HEADER_BYTES)
    try:
        records.parse_frame(frame, 0, len(frame))
    except CorruptRecord:
        return False
    return bool(OFFSET.unpack_from(frame, HEADER_BYTES)[0] == offset)

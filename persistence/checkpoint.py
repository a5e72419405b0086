"""Index snapshots, so that opening the store replays only the journal after
the snapshot's position.

A snapshot is *prepared* on the main thread (shallow copies: the index
entries are immutable tuples) and *written* by the committer's worker thread
after every journal record up to its position is synced, so that a
checkpoint never describes a record that is not on disk.  Written to a temp
file, fsynced, renamed, then the directory fsynced (DESIGN rule 7).

File layout (little-endian)::

    b"GWCKPT01"  u64 body length  u32 crc32(body)  body

The body is columnar (struct-packed arrays, one per field, plus tables of
distinct destinations and keys) so that loading a million entries is a
handful of C-level loops rather than a million decodes.
"""

from __future__ import annotations

import os
import struct
import sys
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from persistence.journal import OFFSET_BITS, fsync_directory
from persistence.files import FILE_MODE
from persistence.records import CorruptRecord

CHECKPOINT_NAME = "checkpoint"
_MAGIC = b"GWCKPT01"
_HEAD = struct.Struct("<8sQI")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_BIG_ENDIAN = sys.byteorder == "big"


@dataclass(slots=True)
class Snapshot:
    position: int  # journal location the replay starts from
    lsn: int  # the journal's last LSN when prepared
    messages: dict[str, Any]
    subscriptions: dict[str, str]
    kv: dict[str, dict[str, bytes]]
    seg_records: dict[int, int]
    seg_live: dict[int, int]


def _array(typecode: str, values: Any) -> bytes:
    a = array(typecode, values)
    if _BIG_ENDIAN:
        a.byteswap()
    return _U64.pack(len(a)) + a.tobytes()


class _Reader:
    __slots__ = ("view", "pos")

    def __init__(self, body: bytes) -> None:
        self.view = memoryview(body)
        self.pos = 0

    def u64(self) -> int:
        value: int
        (value,) = _U64.unpack_from(self.view, self.pos)
        self.pos += 8
        return value

    def raw(self, n: int) -> memoryview:
        if self.pos + n > len(self.view):
            raise CorruptRecord("checkpoint section runs past the end")
        out = self.view[self.pos : self.pos + n]
        self.pos += n
        return out

    def array(self, typecode: str) -> array[int]:
        a = array(typecode)
        a.frombytes(self.raw(self.u64() * a.itemsize))
        if _BIG_ENDIAN:
            a.byteswap()
        return a

    def strings(self) -> list[str]:
        lengths = self.array("Q")
        text = str(self.raw(sum(lengths)), "utf-8")
        out = []
        p = 0
        for n in lengths:  # character counts
            out.append(text[p : p + n])
            p += n
        return out

    def blobs(self) -> list[bytes]:
        lengths = self.array("Q")
        out = []
        for n in lengths:
            out.append(bytes(self.raw(n)))
        return out


def _strings(values: list[str]) -> bytes:
    return _array("Q", map(len, values)) + "".join(values).encode()


def _blobs(values: list[bytes]) -> bytes:
    return _array("Q", map(len, values)) + b"".join(values)


def serialize(snapshot: Snapshot) -> bytes:
    parts = [_U64.pack(snapshot.position), _U64.pack(snapshot.lsn)]
    parts.append(_strings([s for item in snapshot.subscriptions.items() for s in item]))
    kv_rows = [(ns, key, value) for ns, space in snapshot.kv.items() for key, value in space.items()]
    parts.append(_strings([s for ns, key, _ in kv_rows for s in (ns, key)]))
    parts.append(_blobs([value for _, _, value in kv_rows]))
    parts.append(_array("Q", snapshot.seg_records.keys()) + _array("Q", snapshot.seg_records.values()))
    ids = list(snapshot.messages)
    joined = "\0".join(ids)
    if ids and joined.count("\0") == len(ids) - 1:
        encoded = joined.encode()
        parts.append(b"\x01" + _U64.pack(len(encoded)) + encoded)
    else:
        parts.append(b"\x00" + _strings(ids))
    if ids:
        locations, refs, dests, priorities, expires, timestamps, counts = zip(*snapshot.messages.values())
    else:
        locations = refs = dests = priorities = expires = timestamps = counts = ()
    dest_table = list(dict.fromkeys(dests))
    dest_index = {d: i for i, d in enumerate(dest_table)}
    parts.append(_strings(dest_table) + _array("I", map(dest_index.__getitem__, dests)))
    if all(r.__class__ is str for r in refs):
        key_table = list(dict.fromkeys(refs))
        key_index = {k: i for i, k in enumerate(key_table)}
        parts.append(b"\x01" + _strings(key_table) + _array("I", map(key_index.__getitem__, refs)))
    else:
        key_index = {}
        per_message = array("H")
        flat = array("I")
        for r in refs:
            held = (r,) if r.__class__ is str else r
            per_message.append(len(held))
            for key in held:
                i = key_index.get(key)
                if i is None:
                    i = key_index[key] = len(key_index)
                flat.append(i)
        parts.append(b"\x00" + _strings(list(key_index)) + _array("H", per_message) + _array("I", flat))
    parts.append(_array("Q", locations))
    parts.append(_array("B", priorities))
    parts.append(_array("q", expires))
    parts.append(_array("q", timestamps))
    parts.append(_array("I", counts))
    body = b"".join(parts)
    return _HEAD.pack(_MAGIC, len(body), zlib.crc32(body)) + body


def deserialize(data: bytes) -> Snapshot:
    if len(data) < _HEAD.size:
        raise CorruptRecord("checkpoint too short")
    magic, length, crc = _HEAD.unpack_from(data, 0)
    if magic != _MAGIC:
        raise CorruptRecord("not a checkpoint of this format")
    body = data[_HEAD.size :]
    if len(body) != length or zlib.crc32(body) != crc:
        raise CorruptRecord("checkpoint checksum mismatch")
    r = _Reader(body)
    position = r.u64()
    lsn = r.u64()
    flat = r.strings()
    subscriptions = dict(zip(flat[0::2], flat[1::2]))
    names = r.strings()
    values = r.blobs()
    kv: dict[str, dict[str, bytes]] = {}
    for ns, key, value in zip(names[0::2], names[1::2], values):
        kv.setdefault(ns, {})[key] = value
    segs = r.array("Q")
    seg_records = dict(zip(segs, r.array("Q")))
    if r.raw(1)[0] == 1:
        text = str(r.raw(r.u64()), "utf-8")
        ids = text.split("\0")  # mode 1 is only written for at least one id
    else:
        ids = r.strings()
    dest_table = r.strings()
    dests = list(map(dest_table.__getitem__, r.array("I")))
    if r.raw(1)[0] == 1:
        key_table = r.strings()
        refs: list[Any] = list(map(key_table.__getitem__, r.array("I")))
    else:
        key_table = r.strings()
        per_message = r.array("H")
        flat_keys = r.array("I")
        refs = []
        p = 0
        for n in per_message:
            refs.append(key_table[flat_keys[p]] if n == 1 else tuple(key_table[i] for i in flat_keys[p : p + n]))
            p += n
    locations = r.array("Q")
    columns = (locations, r.array("B"), r.array("q"), r.array("q"), r.array("I"))
    if not all(len(c) == len(ids) for c in (dests, refs, *columns)):
        raise CorruptRecord("checkpoint columns disagree")
    loc, priorities, expires, timestamps, counts = columns
    messages = dict(zip(ids, zip(loc, refs, dests, priorities, expires, timestamps, counts)))
    seg_live: dict[int, int] = {}
    for location in loc:
        seg = location >> OFFSET_BITS
        seg_live[seg] = seg_live.get(seg, 0) + 1
    return Snapshot(position, lsn, messages, subscriptions, kv, seg_records, seg_live)


def write(directory: Path, snapshot: Snapshot) -> int:
    """Temp file, fsync, rename, fsync the directory; returns bytes written."""
    data = serialize(snapshot)
    tmp = directory / (CHECKPOINT_NAME + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        view = memoryview(data)
        written = 0
        while written < len(view):
            written += os.write(fd, view[written:])
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, directory / CHECKPOINT_NAME)
    fsync_directory(directory)
    return len(data)


def load(directory: Path) -> Snapshot | None:
    """The last checkpoint, None when there is none; CorruptRecord if damaged."""
    try:
        data = (directory / CHECKPOINT_NAME).read_bytes()
    except FileNotFoundError:
        return None
    return deserialize(data)

"""Reading a range of a topic archive, a bounded number of rows at a time
(persistence/archive.py hands out the readers)."""

from __future__ import annotations

import bisect
import os
import time
import zlib
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

from persistence.archive_format import PAIR, ROW, entry_holds, index_name, read_index, segment_name
from persistence.records import HEADER, HEADER_BYTES, MAGIC

# A reader takes the segment file this much at a time.
READ_CHUNK_BYTES = 2**20


@dataclass(slots=True)
class Rows:
    """A chunk of archived messages, column by column (ids, header names and
    values as UTF-8 bytes, so a columnar encoder can take them in bulk)."""

    offsets: list[int] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    priorities: list[int] = field(default_factory=list)
    ids: list[bytes] = field(default_factory=list)
    header_ends: list[int] = field(default_factory=lambda: [0])  # cumulative header count per row
    header_names: list[bytes] = field(default_factory=list)
    header_values: list[bytes] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.offsets)


class ArchiveReader:
    """Reads a range of one topic's archive a bounded number of rows at a
    time, sequentially through its segments, with its own descriptors; safe
    in one worker thread while the main thread appends."""

    def __init__(
        self,
        topic: Any,
        bases: list[int],
        start: int,
        stop: int,
        index: list[tuple[int, int]] | None = None,
        on_damage: Callable[..., None] | None = None,
    ) -> None:
        self.topic = topic
        self._on_damage = on_damage  # (event, **fields): told of each damaged stretch
        self.start = start
        self.stop = stop
        self._bases = bases
        self._index = index  # the first segment's sparse index, when it is the active one
        self._seek = True
        self._fd: int | None = None
        self._data = b""
        self._file_pos = 0  # of _data[0] in the segment
        self._p = 0
        self.done = start >= stop
        # Damaged stretches skipped (each resynchronised past, as the
        # journal's recovery does), and the last offset read, so a stale
        # frame found while resynchronising can never go out of order.
        self.damaged = 0
        self._segment = ""
        self._resyncing = False
        self._last = -1
        # The first segment is opened now (on the caller's thread), so that
        # retention deleting it before the worker gets to it cannot fail the
        # read; it may not exist yet while its first records wait to be written.
        self._first: int | None = None
        if not self.done and bases:
            try:
                self._first = os.open(topic.path / segment_name(bases[0]), os.O_RDONLY)
            except FileNotFoundError:
                pass

    def wait_written(self, timeout_s: float) -> None:
        """Let the committer write what was appended up to ``stop`` (a few
        milliseconds at most; bounded)."""
        deadline = time.monotonic() + timeout_s
        while self.topic.written_offset < self.stop and time.monotonic() < deadline:
            time.sleep(0.002)
        self.stop = min(self.stop, self.topic.written_offset)
        self.done = self.start >= self.stop

    def read(self, max_rows: int) -> Rows:
        """Up to ``max_rows`` rows in offset order; fewer (or none) at the end
        (then ``done``).  A segment deleted meanwhile raises FileNotFoundError."""
        rows = Rows()
        while len(rows.offsets) < max_rows and not self.done:
            if self._fd is None and not self._next_segment():
                self.done = True
                break
            if not self._read_frames(rows, max_rows):
                self._refill()
        return rows

    def _next_segment(self) -> bool:
        if not self._bases:
            return False
        base = self._bases.pop(0)
        self._segment = segment_name(base)
        if self._first is not None:
            self._fd, self._first = self._first, None
        else:
            self._fd = os.open(self.topic.path / segment_name(base), os.O_RDONLY)
        self._file_pos = 0
        self._data = b""
        self._p = 0
        if self._seek:
            self._seek = False
            self._file_pos = self._seek_position(base)
        return True

    def _seek_position(self, base: int) -> int:
        """Where to start reading the first segment: the last index entry at
        or before ``start`` whose record is where the entry says, else 0."""
        entries = self._index if self._index is not None else read_index(self.topic.path / index_name(base))
        at = bisect.bisect_right(entries, (self.start, 2**64)) - 1
        if at < 0:
            return 0
        offset, position = entries[at]
        assert self._fd is not None
        return position if entry_holds(self._fd, offset, position) else 0

    def _refill(self) -> None:
        """Read on from the first incomplete frame; at the segment's end move
        to the next one."""
        assert self._fd is not None
        data, p = self._data, self._p
        need = READ_CHUNK_BYTES
        position = self._file_pos + p
        if len(data) - p >= HEADER_BYTES:
            # One frame bigger than a chunk; a damaged length is capped by
            # what the file holds (the frame then fails its checksum).
            size = os.fstat(self._fd).st_size
            need = max(need, min(HEADER_BYTES + HEADER.unpack_from(data, p)[4], size - position))
        chunk = os.pread(self._fd, need, position)
        if len(chunk) <= len(data) - p:  # nothing new: the end of this segment
            self._close_segment()
            return
        self._data, self._file_pos, self._p = chunk, position, 0

    def _close_segment(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _read_frames(self, rows: Rows, max_rows: int) -> bool:
        """Decode whole frames of the buffer into ``rows``; False when the
        buffer needs more data."""
        data = self._data
        view = memoryview(data)
        n = len(data)
        p = self._p
        start, stop = self.start, self.stop
        header, row = HEADER.unpack_from, ROW.unpack_from
        pair = PAIR.unpack_from
        crc32 = zlib.crc32
        offsets, timestamps, priorities, ids = rows.offsets, rows.timestamps, rows.priorities, rows.ids
        ends, names, values, bodies = rows.header_ends, rows.header_names, rows.header_values, rows.bodies
        count = ends[-1]
        complete = True
        while len(offsets) < max_rows:
            if self._last >= stop - 1:  # all of the range is read: what follows may be mid-write
                self.done = True
                break
            if n - p < HEADER_BYTES:
                complete = False
                break
            magic, crc, _version, _rtype, length = header(data, p)
            end = p + HEADER_BYTES + length
            if end > n and not self._claims_past_the_end(n):
                complete = False
                break
            if end > n or magic != MAGIC or crc32(view[p + 6 : end]) != crc:
                # Damage (a flipped bit, an absurd length; or, past stop, a
                # record being written right now): skip to the next frame
                # that checks out, as the journal's recovery does.
                if not self._resyncing:
                    self._resyncing = True
                    self.damaged += 1
                    if self._on_damage is not None:
                        self._on_damage("archive_record_corrupt", topic=getattr(self.topic, "name", "?"),
                                        segment=self._segment, position=self._file_pos + p)
                found = data.find(MAGIC, p + 1)
                if found < 0:
                    p = max(p + 1, n - len(MAGIC) + 1)  # a magic may straddle the next read
                    complete = False
                    break
                p = found
                continue
            self._resyncing = False
            q = p + HEADER_BYTES
            offset, timestamp, priority, tl, il, hl = row(data, q)
            if offset >= stop:
                self.done = True
                break
            p = end
            if offset < start or offset <= self._last:
                continue
            self._last = offset
            q += ROW.size + tl
            offsets.append(offset)
            timestamps.append(timestamp)
            priorities.append(priority)
            ids.append(data[q : q + il])
            q += il
            stop_h = q + hl
            while q < stop_h:
                nl, vl = pair(data, q)
                q += 6
                names.append(data[q : q + nl])
                values.append(data[q + nl : q + nl + vl])
                q += nl + vl
                count += 1
            ends.append(count)
            bodies.append(data[stop_h:end])
        self._p = p
        return complete

    def _claims_past_the_end(self, n: int) -> bool:
        """Whether the buffer already runs to the segment's end, so a frame
        longer than what is left is damage rather than a read to finish."""
        assert self._fd is not None
        return self._file_pos + n >= os.fstat(self._fd).st_size

    def close(self) -> None:
        self._close_segment()
        if self._first is not None:
            os.close(self._first)
            self._first = None
        self.done = True

"""The segmented append-only journal.

Segment files ``00000001.log``, ``00000002.log``, ... in one directory.  A
record goes to the active segment unless it would take that segment past
``segment_bytes``, in which case a new segment starts (a record bigger than a
segment just makes its segment bigger).

Threading (the committer protocol, DESIGN.md "Storage"): :meth:`append`,
:meth:`take_batch`, :meth:`batch_written`, :meth:`requeue` and :meth:`read`
run on the main thread; :meth:`write_batch` runs in one worker thread at a
time.  Positions are decided by :meth:`append`, so the worker only copies a
detached :class:`Batch` to fixed offsets (``os.pwrite``) and syncs it: it
never reads anything the main thread mutates, and its file descriptor is its
own.  Writing to fixed offsets also makes a rewrite idempotent, which is what
lets a failed batch be retried in place.

A location is ``segment << 40 | offset`` of the record's frame (of the nested
frame for a message inside a TX), so reading one back costs two ``pread``\\ s.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from persistence.files import FILE_MODE
from persistence import records
from persistence.records import HEADER, HEADER_BYTES, MAGIC, CorruptRecord, RecordType

OFFSET_BITS = 40
OFFSET_MASK = (1 << OFFSET_BITS) - 1
SEGMENT_SUFFIX = ".log"
_SEGMENT_NAME = re.compile(r"^(\d{8})\.log$")

OnCorrupt = Callable[[str, int, str], None]


def segment_name(seq: int) -> str:
    return f"{seq:08d}{SEGMENT_SUFFIX}"


def make_location(segment: int, offset: int) -> int:
    return segment << OFFSET_BITS | offset


def split_location(location: int) -> tuple[int, int]:
    return location >> OFFSET_BITS, location & OFFSET_MASK


def list_segments(directory: Path) -> list[int]:
    found = []
    for name in os.listdir(directory):
        match = _SEGMENT_NAME.match(name)
        if match:
            found.append(int(match.group(1)))
    return sorted(found)


def fsync_directory(directory: Path) -> None:
    """After creating, renaming or deleting a file: LevelDB SyncDirIfManifest."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(slots=True)
class Batch:
    """Records taken off the journal for one write: contiguous LSNs
    ``first_lsn..last_lsn`` in ``runs`` of ``(segment, offset, bytes)``.
    The main thread never changes a batch while a worker writes it."""

    first_lsn: int
    last_lsn: int
    runs: list[tuple[int, int, bytes | bytearray]]  # bytearrays here, bytes from a primary
    sync: bool = True
    checkpoint: Any = None  # a prepared checkpoint, written after the journal is synced
    error: OSError | None = None  # set by the worker when the checkpoint could not be written
    archive: Any = None  # archive segment writes of the same records (persistence/archive.py)


class Journal:
    def __init__(self, directory: Path, segment_bytes: int, *, fsync_on_roll: bool = True) -> None:
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        self.fsync_on_roll = fsync_on_roll
        # fdatasyncs of the journal so far (written by the worker thread,
        # read for stats: an int assignment is atomic under the GIL).
        self.syncs = 0
        self.sizes: dict[int, int] = {}  # closed segments' byte sizes
        self.lsn = 0  # of the last appended record
        self.appended_bytes = 0
        self.corrupt_records = 0
        self.torn_bytes = 0
        self._seg = 1
        self._end = 0
        self._runs: list[tuple[int, int, bytes | bytearray]] = []
        self._buf: bytearray | None = None
        self._first_pending = 1
        self._inflight: list[tuple[int, int, bytes | bytearray]] = []
        self._inflight_first = 1
        self._rfds: dict[int, int] = {}
        # Worker-only: the segment it writes and its descriptor.
        self._wseg = -1
        self._wfd: int | None = None

    # -- where things are --------------------------------------------------

    @property
    def active_segment(self) -> int:
        return self._seg

    @property
    def end_location(self) -> int:
        return make_location(self._seg, self._end)

    @property
    def pending_bytes(self) -> int:
        return sum(len(data) for _, _, data in self._runs)

    def path(self, segment: int) -> Path:
        return self.directory / segment_name(segment)

    def segment_sizes(self) -> dict[int, int]:
        sizes = dict(self.sizes)
        sizes[self._seg] = self._end
        return sizes

    def unwritten_segments(self) -> set[int]:
        return {seg for seg, _, _ in self._runs} | {seg for seg, _, _ in self._inflight}

    # -- recovery ------------------------------------------------------------

    def scan(
        self, start: int = 0, *, on_corrupt: OnCorrupt | None = None, truncate: bool = True
    ) -> Iterator[tuple[int, int, memoryview]]:
        """Yield ``(location, type, payload)`` of every valid record from
        location ``start`` on, in order, and leave the journal positioned to
        append after the last good one.

        A record that fails validation is reported to ``on_corrupt(path,
        offset, reason)`` and skipped, resuming at the next magic whose frame
        validates.  When nothing valid follows in the last segment, that is a
        torn tail (a write cut short by a crash, DESIGN rule 7): it is cut off
        (``truncate``) and counted in ``torn_bytes``, not reported as corrupt.
        The payload views are only valid until the next iteration.
        """
        every = list_segments(self.directory)
        for seg in every[:-1]:
            self.sizes[seg] = self.path(seg).stat().st_size
        first_seg, first_off = split_location(start)
        segments = [s for s in every if s >= first_seg]
        if not segments:
            self._seg, self._end = max(first_seg, 1), 0
            return
        last = segments[-1]
        expected = segments[0]
        for seg in segments:
            if seg != expected and on_corrupt is not None:
                self.corrupt_records += 1
                on_corrupt(str(self.path(expected)), 0, f"segments {expected}..{seg - 1} missing")
            expected = seg + 1
            offset = first_off if seg == first_seg else 0
            end = yield from self._scan_segment(seg, offset, seg == last, on_corrupt, truncate)
            if seg == last:
                self._seg, self._end = seg, end

    def _scan_segment(
        self, seg: int, offset: int, last: bool, on_corrupt: OnCorrupt | None, truncate: bool
    ) -> Generator[tuple[int, int, memoryview], None, int]:
        path = self.path(seg)
        with open(path, "rb") as f:
            data = f.read()
        view = memoryview(data)
        n = len(data)
        base = seg << OFFSET_BITS
        if offset > n and on_corrupt is not None:
            self.corrupt_records += 1
            on_corrupt(str(path), n, f"segment is shorter than the checkpoint position {offset}")
        parse = records.parse_frame
        while offset < n:
            try:
                rtype, length = parse(data, offset, n)
            except CorruptRecord as exc:
                found = _resync(data, offset + 1, n)
                if found is None:
                    if last:
                        self.torn_bytes += n - offset
                        if truncate:
                            _truncate(path, offset)
                        n = offset
                        break
                    found = n
                self.corrupt_records += 1
                if on_corrupt is not None:
                    on_corrupt(str(path), offset, exc.reason)
                offset = found
                continue
            start = offset + HEADER_BYTES
            yield base | offset, rtype, view[start : start + length]
            offset = start + length
        return min(offset, n)

    # -- appending (main thread) ---------------------------------------------

    def append(self, rtype: int, payload: bytes) -> tuple[int, int]:
        """Buffer one record; return ``(lsn, location)`` at once."""
        n = HEADER_BYTES + len(payload)
        if self._end + n > self.segment_bytes and self._end:
            self.sizes[self._seg] = self._end
            self._seg += 1
            self._end = 0
            self._buf = None
        buf = self._buf
        if buf is None:
            buf = self._buf = bytearray()
            self._runs.append((self._seg, self._end, buf))
        location = self._seg << OFFSET_BITS | self._end
        buf += records.header(rtype, payload)
        buf += payload
        self._end += n
        self.appended_bytes += n
        self.lsn += 1
        return self.lsn, location

    def take_batch(self) -> Batch | None:
        if not self._runs:
            return None
        batch = Batch(self._first_pending, self.lsn, self._runs)
        self._inflight = self._runs
        self._inflight_first = self._first_pending
        self._runs = []
        self._buf = None
        self._first_pending = self.lsn + 1
        return batch

    def batch_written(self, batch: Batch) -> None:
        self._inflight = []

    def start_at(self, lsn: int) -> None:
        """Number on from ``lsn`` (what recovery counted): LSNs outlive a
        restart, so a primary and its backups name the same record alike."""
        self.lsn = lsn
        self._first_pending = lsn + 1

    def pending_start(self) -> tuple[int, int] | None:
        """``(lsn, location)`` of the first record not yet taken or being
        written, None when everything appended is written."""
        runs = self._inflight or self._runs
        if not runs:
            return None
        seg, offset, _ = runs[0]
        first = self._first_pending if runs is self._runs else self._inflight_first
        return first, make_location(seg, offset)

    def extend(self, runs: list[tuple[int, int, bytes]] | tuple[tuple[int, int, bytes], ...], last_lsn: int) -> None:
        """Account for records another journal appended (a backup's copy of
        the primary's): written at their positions, up to ``last_lsn``."""
        for seg, offset, data in runs:
            if seg != self._seg:
                self.sizes[self._seg] = self._end
                self._seg = seg
            self._end = offset + len(data)
            self.appended_bytes += len(data)
        self.start_at(last_lsn)

    def requeue(self, batch: Batch) -> None:
        """Put a batch that was not written back in front of what is pending,
        at the same offsets, so the next batch rewrites it."""
        self._inflight = []
        if batch.runs:
            self._runs = batch.runs + self._runs
            self._first_pending = batch.first_lsn

    # -- reading (main thread) -----------------------------------------------

    def read(self, location: int) -> tuple[int, bytes]:
        """``(type, payload)`` of the record at ``location``, wherever it is:
        still pending, being written, or on disk."""
        seg, off = split_location(location)
        for runs in (self._runs, self._inflight):
            for s, start, data in runs:
                if s == seg and start <= off < start + len(data):
                    rtype, length = records.parse_frame(data, off - start, len(data), nested_ok=True)
                    p = off - start + HEADER_BYTES
                    return rtype, bytes(data[p : p + length])
        fd = self._rfds.get(seg)
        if fd is None:
            fd = self._rfds[seg] = os.open(self.path(seg), os.O_RDONLY)
        head = os.pread(fd, HEADER_BYTES, off)
        if len(head) < HEADER_BYTES:
            raise CorruptRecord(f"no record at {segment_name(seg)}:{off}")
        frame = head + os.pread(fd, HEADER.unpack(head)[4], off + HEADER_BYTES)
        try:
            rtype, _ = records.parse_frame(frame, 0, len(frame), nested_ok=True)
        except CorruptRecord as exc:
            raise CorruptRecord(f"bad record at {segment_name(seg)}:{off} ({exc.reason})") from None
        return rtype, frame[HEADER_BYTES:]

    def read_frames(self, seg: int, offset: int, max_bytes: int) -> tuple[list[tuple[int, int, bytes]], int, bool]:
        """Whole frames of a closed segment from ``offset``: ``([(location,
        type, payload)], next offset, at the end)``.  Damaged bytes are
        skipped silently: recovery already reported them, and a message
        missed here only keeps its segment alive."""
        fd = self._rfds.get(seg)
        if fd is None:
            fd = self._rfds[seg] = os.open(self.path(seg), os.O_RDONLY)
        data = os.pread(fd, max_bytes, offset)
        eof = len(data) < max_bytes
        if len(data) >= HEADER_BYTES and not eof:
            need = HEADER_BYTES + HEADER.unpack_from(data, 0)[4]
            if need > len(data):  # one frame bigger than the chunk
                data = os.pread(fd, need, offset)
                eof = len(data) < need
        n = len(data)
        frames = []
        p = 0
        while p < n:
            try:
                rtype, length = records.parse_frame(data, p, n)
            except CorruptRecord:
                if p and not eof and (n - p < HEADER_BYTES or p + HEADER_BYTES + HEADER.unpack_from(data, p)[4] > n):
                    break  # cut by the chunk: the next call starts here
                found = _resync(data, p + 1, n)
                p = n if found is None else found
                continue
            start = p + HEADER_BYTES
            frames.append(((seg << OFFSET_BITS) | (offset + p), rtype, data[start : start + length]))
            p = start + length
        return frames, offset + p, eof and p >= n

    def read_span(self, location: int, end: int, max_bytes: int,
                  on_corrupt: OnCorrupt | None = None) -> tuple[list[tuple[int, int, memoryview]], int]:
        """The whole frames from ``location`` to offset ``end`` of its segment
        (where what is written there ends), about ``max_bytes`` of them (one
        at least): ``([(location, type, payload)], the location after them)``.
        A frame that fails validation is reported and skipped, as by scan."""
        seg, start = split_location(location)
        fd = self._rfds.get(seg)
        if fd is None:
            fd = self._rfds[seg] = os.open(self.path(seg), os.O_RDONLY)
        want = min(end - start, max(max_bytes, HEADER_BYTES))
        data = os.pread(fd, want, start)
        if len(data) == want < end - start and want < (need := HEADER_BYTES + HEADER.unpack_from(data)[4]):
            data = os.pread(fd, min(need, end - start), start)  # one frame bigger than max_bytes
        n, view, frames, p = len(data), memoryview(data), [], 0
        while p < n:
            try:
                rtype, length = records.parse_frame(data, p, n)
            except CorruptRecord as exc:
                if p and start + n < end:
                    break  # cut off where the read ends: the next call starts here
                self.corrupt_records += 1
                if on_corrupt is not None:
                    on_corrupt(str(self.path(seg)), start + p, exc.reason)
                found = _resync(data, p + 1, n)
                p = n if found is None else found
                continue
            frames.append(((seg << OFFSET_BITS) | (start + p), rtype, view[p + HEADER_BYTES : p + HEADER_BYTES + length]))
            p += HEADER_BYTES + length
        return frames, make_location(seg, start + p)

    # -- writing (worker thread) ---------------------------------------------

    def write_batch(self, batch: Batch) -> None:
        """Copy the batch to its offsets; fdatasync when ``batch.sync``.

        On failure the segments are cut back to where the batch began (best
        effort), so a crash before the retry cannot resurrect half a batch.
        """
        try:
            for seg, start, data in batch.runs:
                if seg != self._wseg:
                    self._switch(seg)
                fd = self._wfd
                assert fd is not None
                view = memoryview(data)
                written = 0
                while written < len(view):
                    written += os.pwrite(fd, view[written:], start + written)
                if start == 0:
                    fsync_directory(self.directory)
            if batch.sync and self._wfd is not None:
                os.fdatasync(self._wfd)
                self.syncs += 1
        except OSError:
            for seg, start, _ in batch.runs:
                # The write's own error is the one to raise; a cut that fails
                # too is repaired by the rewrite or by recovery's checksums.
                with contextlib.suppress(OSError):
                    os.truncate(self.path(seg), start)
            raise

    def _switch(self, seg: int) -> None:
        if self._wfd is not None:
            # The old segment is synced before the next one gets data, so a
            # crash can only lose a suffix of the log, never a middle part.
            if self.fsync_on_roll:
                os.fdatasync(self._wfd)
                self.syncs += 1
            os.close(self._wfd)
            self._wfd = None
        self._wfd = os.open(self.path(seg), os.O_WRONLY | os.O_CREAT, FILE_MODE)
        self._wseg = seg

    def sync(self) -> None:
        """fdatasync what was written (worker thread, or when idle)."""
        if self._wfd is not None:
            os.fdatasync(self._wfd)
            self.syncs += 1

    # -- segments ------------------------------------------------------------

    def delete_segment(self, seg: int) -> None:
        if seg >= self._seg:
            raise ValueError(f"segment {seg} is the active one")
        fd = self._rfds.pop(seg, None)
        if fd is not None:
            os.close(fd)
        self.sizes.pop(seg, None)
        os.remove(self.path(seg))

    def close(self) -> None:
        for fd in self._rfds.values():
            os.close(fd)
        self._rfds.clear()
        if self._wfd is not None:
            os.close(self._wfd)
            self._wfd = None
            self._wseg = -1


def neutralize(batch: Batch) -> list[tuple[int, bytes]]:
    """Rewrite a failed batch in place so that no message it added can ever
    become durable: MESSAGE_ADD frames become PAD of the same size, and a TX
    keeps its acks and pads out its adds.  Everything else (acks, moves,
    subscription and key/value changes) stays to be retried, because memory
    already reflects it.  Returns ``(location, payload)`` of the removed adds.
    """
    removed = []
    for seg, start, data in batch.runs:
        # The store's own batches (a follower's hold a primary's bytes and
        # are never neutralized): rewritten where they lie.
        assert isinstance(data, bytearray)
        p = 0
        while p < len(data):
            _m, _c, _v, rtype, length = HEADER.unpack_from(data, p)
            total = HEADER_BYTES + length
            location = make_location(seg, start + p)
            if rtype == RecordType.MESSAGE_ADD:
                removed.append((location, bytes(data[p + HEADER_BYTES : p + total])))
                data[p : p + total] = records.pad_frame(total)
            elif rtype == RecordType.TX:
                kept = []
                adds = []
                for at, op, payload in records.decode_tx(data[p + HEADER_BYTES : p + total]):
                    if op == RecordType.MESSAGE_ADD:
                        adds.append((location + HEADER_BYTES + at, bytes(payload)))
                    else:
                        kept.append((op, bytes(payload)))
                if adds:
                    removed.extend(adds)
                    # One frame for one record still (recovery counts LSNs by
                    # frames): a TX of what is kept, padded inside to the old size.
                    if kept:
                        body = records.encode_tx(kept)[0]
                        replacement = records.frame(RecordType.TX, body + bytes(length - len(body)))
                    else:
                        replacement = records.pad_frame(total)
                    data[p : p + total] = replacement
            p += total
    return removed


def _resync(data: bytes, start: int, end: int) -> int | None:
    """The offset of the next frame that validates, searching by magic."""
    at = data.find(MAGIC, start, end)
    while at != -1:
        try:
            records.parse_frame(data, at, end)
            return at
        except CorruptRecord:
            at = data.find(MAGIC, at + 1, end)
    return None


def _truncate(path: Path, size: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)

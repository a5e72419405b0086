"""Topic archives: every message published to an archived topic, kept in a
per-topic log with an offset that only grows, until retention drops it.

Layout (Kafka's, on the journal's framing)::

    archive/<escaped topic>/<base offset, 20 digits>.seg

A segment holds records framed exactly like journal records
(:mod:`persistence.records`, type ``ARCHIVE``) for the offsets from its base
up to the next segment's base.  A new segment starts when a record would take
the active one past ``segment_bytes``.  Retention deletes whole segments,
oldest first, never rewriting one: by age (a closed segment's modification
time is the arrival of its newest record) and by the topic's total bytes.

Durability costs producers no fsync of their own.  The same payload is
appended to the journal (the write-ahead copy, made durable by the batch's
fdatasync, group commit) and buffered here; the committer's worker writes it
to the segment in the same batch without syncing, and syncs the segments only
before a checkpoint is written (:meth:`Archive.sync`), so every archive record
before a checkpoint is on disk in its segment, and recovery re-applies the
ones after it from the journal (:meth:`Archive.recover`), by offset, so none
is kept twice.  A segment is synced once when it is closed, like the journal's,
so a crash can only ever cut a topic's newest segment.

Memory does not grow with the number of archived messages: per topic it is
the list of segment base offsets and sizes, and the active segment's sparse
index (an ``(offset, position)`` pair every :data:`INDEX_BYTES`), which goes to
``<base>.idx`` beside the segment when it closes.  A read seeks with the index
(an entry is trusted only if the record there has that offset; otherwise it
scans from the segment's start) and then walks the segment files.

Threading follows the journal: :meth:`append`, :meth:`take_writes`,
:meth:`written` and :meth:`reader` run on the main thread; :meth:`write` and
:meth:`sync` in the committer's worker; an :class:`ArchiveReader` in any one
other thread, with its own file descriptors.

The record and file layout is in persistence/archive_format.py; reads are
persistence/archive_reader.py's.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from persistence import records
from persistence.archive_format import (
    INDEX_BYTES,
    OFFSET,
    ROW,
    decode_row,
    directory_name,
    encode_index,
    encode_row,
    entry_holds,
    index_name,
    list_bases,
    read_index,
    segment_name,
)
from persistence.archive_reader import ArchiveReader, Rows
from persistence.journal import fsync_directory
from persistence.files import FILE_MODE, make_dirs, write_bytes
from persistence.records import HEADER_BYTES, CorruptRecord, RecordType

__all__ = ["Archive", "ArchiveGone", "ArchiveReader", "Rows", "TopicInfo", "decode_row", "encode_row", "list_topics"]

DEFAULT_SEGMENT_BYTES = 16 * 2**20
# File names are limited to 255 bytes; an escaped topic name longer than this
# is not archived (logged once).
MAX_DIRECTORY_NAME = 240
# The committer keeps at most this many segment files open for writing (one
# per topic, the most recently written); others are closed and reopened.
MAX_OPEN_SEGMENTS = 256
# Refused topic names remembered (so each is logged once), at most.
MAX_REFUSED = 1000

Log = Callable[..., None]


def _sync_path(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return  # dropped by retention meanwhile
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


class ArchiveGone(Exception):
    """Part of the requested range was dropped by retention."""

    def __init__(self, topic: str, start: int, earliest: int) -> None:
        super().__init__(f"offsets {start}..{earliest - 1} of {topic} were dropped by retention; earliest is {earliest}")
        self.earliest = earliest


class _Topic:
    __slots__ = ("name", "encoded", "path", "bases", "sizes", "next_offset", "written_offset", "run", "unwritten", "index")

    def __init__(self, name: str, path: Path, base: int) -> None:
        self.name = name
        self.encoded = name.encode()
        self.path = path
        self.bases = [base]  # segment base offsets, ascending; the last is active
        self.sizes = [0]  # bytes appended to each segment
        self.next_offset = base
        self.written_offset = base  # below this, records are in the segment files
        self.run: bytearray | None = None  # the pending run being appended to
        self.unwritten = 0  # runs pending or being written
        self.index: list[tuple[int, int]] = []  # the active segment's (offset, position) every INDEX_BYTES


@dataclass(slots=True)
class Writes:
    """Archive records taken for one batch: ``(topic, base, position, data)``
    runs, and each topic's next offset when they were taken."""

    runs: list[tuple[_Topic, int, int, bytearray]]
    marks: dict[_Topic, int] = field(default_factory=dict)
    indexes: list[tuple[Path, bytes]] = field(default_factory=list)  # closed segments' sparse indexes


@dataclass(slots=True)
class TopicInfo:
    topic: str
    earliest: int
    latest: int  # exclusive: the offset the next message gets
    bytes: int


class Archive:
    def __init__(self, directory: str | os.PathLike[str], *, segment_bytes: int = DEFAULT_SEGMENT_BYTES, log: Log | None = None) -> None:
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        self.topics: dict[str, _Topic] = {}
        self.torn_bytes = 0
        self.scanned_bytes = 0  # read by open's tail scans: what a saved index spares
        self.gaps = 0
        self._log = log
        self._pending: list[tuple[_Topic, int, int, bytearray]] = []
        self._pending_indexes: list[tuple[Path, bytes]] = []
        self._inflight: list[tuple[_Topic, int, int, bytearray]] = []
        self._refused: set[str] = set()
        # Worker-only: each topic's open segment (base, fd); descriptors and
        # directories written since the last sync.
        self._wfds: dict[_Topic, tuple[int, int]] = {}
        self._dirty: set[int] = set()
        self._dirty_paths: set[Path] = set()  # written, closed unsynced (evicted)
        self._dirty_dirs: set[Path] = set()

    # -- opening ---------------------------------------------------------------

    def open(self) -> None:
        """Find every topic's segments; scan its newest for where it ends,
        cutting a torn tail."""
        make_dirs(self.directory)
        for entry in sorted(os.listdir(self.directory)):
            path = self.directory / entry
            if not path.is_dir():
                continue
            bases = list_bases(path)
            if not bases:
                continue
            topic = _Topic(unquote(entry), path, bases[0])
            topic.bases = bases
            topic.sizes = [(path / segment_name(b)).stat().st_size for b in bases]
            end, last_offset = self._scan_tail(path, bases[-1], topic.index)
            topic.sizes[-1] = end
            topic.next_offset = topic.written_offset = bases[-1] if last_offset is None else last_offset + 1
            self.topics[topic.name] = topic

    def _scan_tail(self, directory: Path, base: int, index: list[tuple[int, int]]) -> tuple[int, int | None]:
        """Where the valid records of a topic's newest segment end, and the
        last offset, cutting a torn tail; its sparse index is rebuilt into
        ``index`` on the way.  The scan starts at the last entry of the index
        a clean close left that still holds, else at the segment's start."""
        path = directory / segment_name(base)
        with open(path, "rb") as f:
            saved = read_index(directory / index_name(base))
            from_ = 0
            for k in range(len(saved) - 1, -1, -1):
                if entry_holds(f.fileno(), *saved[k]):
                    index.extend(saved[: k + 1])
                    from_ = saved[k][1]
                    break
            f.seek(from_)
            data = f.read()
        n = len(data)
        self.scanned_bytes += n
        p = 0
        last = None
        while p < n:
            try:
                _rtype, length = records.parse_frame(data, p, n)
            except CorruptRecord:
                self.torn_bytes += n - p
                self._emit("archive_torn_tail_cut", segment=str(path), offset=from_ + p, bytes=n - p)
                with open(path, "r+b") as f:
                    f.truncate(from_ + p)
                    os.fsync(f.fileno())
                break
            (last,) = OFFSET.unpack_from(data, p + HEADER_BYTES)
            if _index_due(index, from_ + p):
                index.append((last, from_ + p))
            p += HEADER_BYTES + length
        return from_ + p, last

    def recover(self, payload: bytes | memoryview) -> None:
        """A journal record after the last checkpoint: keep it again unless
        its segment already has it."""
        offset, _ts, _prio, tl, _il, _hl = ROW.unpack_from(payload, 0)
        name = str(payload[ROW.size : ROW.size + tl], "utf-8")
        topic = self.topics.get(name)
        if topic is None:
            topic = self._create(name, offset)
            if topic is None:
                return
        if offset < topic.next_offset:
            return  # already in its segment
        if offset > topic.next_offset:
            # The journal never skips an offset; a hole means lost data
            # (a damaged journal record).  Keep going from here.
            self.gaps += 1
            self._emit("archive_gap", topic=name, missing_from=topic.next_offset, missing_to=offset - 1)
            topic.next_offset = offset
        self._buffer(topic, bytes(payload))

    # -- appending (main thread) -----------------------------------------------

    def append(
        self, name: str, message_id: str, headers: dict[str, str] | None, body: bytes, priority: int, timestamp: int
    ) -> bytes | None:
        """Give the message the topic's next offset and buffer its record for
        the segment; return the payload for the journal (None when the topic
        cannot be archived)."""
        topic = self.topics.get(name)
        if topic is None:
            topic = self._create(name, 0)
            if topic is None:
                return None
        payload = encode_row(topic.next_offset, topic.encoded, message_id, headers, body, priority, timestamp)
        self._buffer(topic, payload)
        return payload

    def _buffer(self, topic: _Topic, payload: bytes) -> None:
        n = HEADER_BYTES + len(payload)
        position = topic.sizes[-1]
        if position and position + n > self.segment_bytes:
            if topic.index:
                self._pending_indexes.append((topic.path / index_name(topic.bases[-1]), encode_index(topic.index)))
                topic.index = []
            topic.bases.append(topic.next_offset)
            topic.sizes.append(0)
            topic.run = None
            position = 0
        elif _index_due(topic.index, position):
            topic.index.append((topic.next_offset, position))
        run = topic.run
        if run is None:
            run = topic.run = bytearray()
            self._pending.append((topic, topic.bases[-1], topic.sizes[-1], run))
            topic.unwritten += 1
        run += records.header(RecordType.ARCHIVE, payload)
        run += payload
        topic.sizes[-1] += n
        topic.next_offset += 1

    def _create(self, name: str, base: int) -> _Topic | None:
        entry = directory_name(name)
        if len(entry) > MAX_DIRECTORY_NAME:
            if name not in self._refused and len(self._refused) < MAX_REFUSED:
                self._refused.add(name)
                self._emit("archive_topic_refused", topic=name[:200], reason="name too long for a directory")
            return None
        topic = self.topics[name] = _Topic(name, self.directory / entry, base)
        return topic

    def take_writes(self) -> Writes | None:
        if not self._pending:
            return None
        runs, self._pending = self._pending, []
        self._inflight = runs
        marks = {}
        for topic, _base, _pos, _data in runs:
            topic.run = None
            marks[topic] = topic.next_offset
        indexes, self._pending_indexes = self._pending_indexes, []
        return Writes(runs, marks, indexes)

    def requeue(self, writes: Writes) -> None:
        """A batch that failed: its runs go back in front, to the same places."""
        for topic, _b, _p, _d in self._pending:
            topic.run = None  # new appends start a new run after the requeued ones
        self._pending = writes.runs + self._pending
        self._pending_indexes = writes.indexes + self._pending_indexes
        self._inflight = []

    def written(self, writes: Writes) -> None:
        self._inflight = []
        for topic, _b, _p, _d in writes.runs:
            topic.unwritten -= 1
        for topic, mark in writes.marks.items():
            if mark > topic.written_offset:
                topic.written_offset = mark

    # -- writing (worker thread) -----------------------------------------------

    def write(self, writes: Writes) -> None:
        """Copy runs to their places in the segment files; no fsync (the
        journal holds the durable copy until :meth:`sync`)."""
        for topic, base, position, data in writes.runs:
            current = self._wfds.get(topic)
            if current is None or current[0] != base:
                fd = self._open_segment(topic, base, current)
            else:
                fd = current[1]
            view = memoryview(data)
            done = 0
            while done < len(view):
                done += os.pwrite(fd, view[done:], position + done)
            self._dirty.add(fd)
        for path, entries in writes.indexes:
            # A hint, checked against the segment whenever used: no sync, and
            # a lost or stale one only means a scan from the segment's start.
            with contextlib.suppress(FileNotFoundError):  # dropped by retention meanwhile
                write_bytes(path, entries)

    def _open_segment(self, topic: _Topic, base: int, current: tuple[int, int] | None) -> int:
        if current is not None:
            # A closed segment is synced once, so a crash can only cut the
            # newest one (which recovery scans).
            fd = current[1]
            if fd in self._dirty:
                os.fdatasync(fd)
                self._dirty.discard(fd)
            os.close(fd)
            del self._wfds[topic]
        elif self._dirty_paths:
            for path in [p for p in self._dirty_paths if p.parent == topic.path and p.name != segment_name(base)]:
                _sync_path(path)  # an evicted older segment of this topic: the same rule
                self._dirty_paths.discard(path)
        if len(self._wfds) >= MAX_OPEN_SEGMENTS:
            self._evict()
        if not topic.path.is_dir():
            make_dirs(topic.path)
            self._dirty_dirs.add(self.directory)
        path = topic.path / segment_name(base)
        if not path.exists():
            self._dirty_dirs.add(topic.path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, FILE_MODE)
        self._wfds[topic] = (base, fd)
        return fd

    def _evict(self) -> None:
        """Close the least recently opened segment; if it holds unsynced
        writes, its path is synced at the next :meth:`sync`."""
        topic = next(iter(self._wfds))
        base, fd = self._wfds.pop(topic)
        if fd in self._dirty:
            self._dirty.discard(fd)
            self._dirty_paths.add(topic.path / segment_name(base))
        os.close(fd)

    def sync(self) -> None:
        """Make every written record durable in its segment (before a
        checkpoint lets the journal forget it)."""
        for fd in list(self._dirty):
            os.fdatasync(fd)
        self._dirty.clear()
        for path in self._dirty_paths:
            _sync_path(path)
        self._dirty_paths.clear()
        for path in sorted(self._dirty_dirs, key=lambda p: len(p.parts), reverse=True):
            if path.is_dir():
                fsync_directory(path)
        self._dirty_dirs.clear()

    def close(self) -> None:
        """After the last write: the active segments' sparse indexes are
        saved too, so the next open scans only from their last entry."""
        for _base, fd in self._wfds.values():
            os.close(fd)
        self._wfds.clear()
        self._dirty.clear()
        for topic in self.topics.values():
            if topic.index:
                with contextlib.suppress(FileNotFoundError):
                    write_bytes(topic.path / index_name(topic.bases[-1]), encode_index(topic.index))

    # -- retention (main thread) -------------------------------------------------

    def apply_retention(self, name: str, max_age_s: float, max_bytes: int, now: float | None = None) -> int:
        """Delete the topic's oldest whole segments older than ``max_age_s``
        or beyond ``max_bytes`` in total (0 = no limit).  Returns how many
        offsets were dropped."""
        topic = self.topics.get(name)
        if topic is None or (not max_age_s and not max_bytes):
            return 0
        now = time.time() if now is None else now
        before = topic.bases[0]
        total = sum(topic.sizes)
        while len(topic.bases) > 1:
            path = topic.path / segment_name(topic.bases[0])
            too_big = max_bytes and total > max_bytes
            try:
                too_old = max_age_s and now - path.stat().st_mtime > max_age_s
            except FileNotFoundError:
                too_old = True  # never written (an empty segment): nothing to keep
            if not (too_big or too_old) or topic.unwritten and self._holds(topic, topic.bases[0]):
                break
            _remove_segment(topic.path, topic.bases[0])
            total -= topic.sizes[0]
            del topic.bases[0], topic.sizes[0]
        if len(topic.bases) == 1 and topic.sizes[0] and max_age_s and not topic.unwritten:
            self._expire_active(topic, max_age_s, now)
        return topic.bases[0] - before

    def _holds(self, topic: _Topic, base: int) -> bool:
        return any(t is topic and b == base for t, b, _p, _d in self._pending + self._inflight)

    def _expire_active(self, topic: _Topic, max_age_s: float, now: float) -> None:
        """The only segment is old and idle: start an empty one at the next
        offset (created and made durable first, so the offsets survive) and
        drop the old one."""
        old = topic.path / segment_name(topic.bases[0])
        try:
            if now - old.stat().st_mtime <= max_age_s:
                return
        except FileNotFoundError:
            return
        fd = os.open(topic.path / segment_name(topic.next_offset), os.O_WRONLY | os.O_CREAT, FILE_MODE)
        os.close(fd)
        fsync_directory(topic.path)
        _remove_segment(topic.path, topic.bases[0])
        topic.bases = [topic.next_offset]
        topic.sizes = [0]
        topic.index = []

    # -- reading -----------------------------------------------------------------

    def info(self, name: str) -> TopicInfo | None:
        topic = self.topics.get(name)
        if topic is None:
            return None
        return TopicInfo(name, topic.bases[0], topic.next_offset, sum(topic.sizes))

    def reader(self, name: str, start: int, stop: int) -> ArchiveReader:
        """Main thread: a reader of offsets ``start`` up to ``stop``
        (exclusive, at most the next offset).  Raises :class:`ArchiveGone`
        when ``start`` was dropped, KeyError when the topic has no archive."""
        topic = self.topics[name]
        if start < topic.bases[0]:
            raise ArchiveGone(name, start, topic.bases[0])
        stop = min(stop, topic.next_offset)
        first = max(0, bisect.bisect_right(topic.bases, start) - 1)
        active = list(topic.index) if first == len(topic.bases) - 1 else None
        return ArchiveReader(topic, list(topic.bases[first:]), start, stop, active, on_damage=self._emit)

    def _emit(self, event: str, **fields: Any) -> None:
        if self._log is not None:
            self._log(event, **fields)


def _index_due(index: list[tuple[int, int]], position: int) -> bool:
    """Whether a record at ``position`` gets a sparse index entry (one per INDEX_BYTES)."""
    return position >= (index[-1][1] + INDEX_BYTES if index else INDEX_BYTES)


def _remove_segment(directory: Path, base: int) -> None:
    """A segment and its sparse index, whichever of them exists."""
    for name in (segment_name(base), index_name(base)):
        with contextlib.suppress(FileNotFoundError):
            os.remove(directory / name)


def list_topics(archive: Archive) -> Iterable[TopicInfo]:
    for name in sorted(archive.topics):
        info = archive.info(name)
        if info is not None:
            yield info

"""Catch-up of a backup: what a primary answers to its Hello (:func:`plan`),
the snapshot a primary sends (:class:`SnapshotSource`) and the files a backup
receives (:class:`SnapshotReceiver`, driven by persistence/replica/follower.py).

The rule, at the primary, for a backup's Hello (``epoch``, ``last_lsn``,
``history``):

- the backup accepted a newer epoch than ours: we are a stale primary, refuse;
- its journal is not a prefix of ours (persistence/replica/epochs.py,
  :func:`epochs.diverged`): snapshot (it is wiped and copied again);
- we can still stream every batch after its ``last_lsn``: the tail, as Batch
  frames from ``last_lsn + 1``;
- otherwise (it is empty, or further behind than what we keep): snapshot.

A snapshot is taken between two batches (no batch being written), on the
main thread: it notes the end of what is written (LSN ``L``), and opens the
checkpoint file, every journal segment up to that end (the checkpoint refers
to messages whose bodies are in older segments, so all of them, not only those
after its position) and every topic archive file, recording their sizes.
The open descriptors keep the bytes of that moment readable while the primary
goes on: new records go after the noted end (a segment is only ever appended
to), a newer checkpoint replaces the file by a rename, and deleted segments
stay readable through the descriptor.  Chunks are read from disk as they are
sent (bounded, :data:`replication.FILE_CHUNK_BYTES`), never held in memory.
The backup gets every batch with ``first_lsn > L`` after SnapshotEnd(``L``):
the caller starts forwarding batches to it from ``L + 1`` at the moment the
snapshot is taken, so nothing is missed and nothing is applied twice.

Archive segments are copied as they are at that moment: what a checkpoint
covers is synced in them, and what is after the checkpoint is in the copied
journal, from which the backup's recovery puts back any record the copy
lacks, by offset (so none twice).
"""

from __future__ import annotations

import enum
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from persistence.checkpoint import CHECKPOINT_NAME
from persistence.files import FILE_MODE, make_dirs
from persistence.journal import fsync_directory, list_segments, segment_name, split_location
from persistence.recovery import CLEAN_NAME, INCOMPLETE_NAME, LOCK_NAME
from persistence.replica import epochs
from persistence.replica.epochs import History
from persistence.replica.replication import FILE_CHUNK_BYTES, FileChunk, Hello, SnapshotBegin, SnapshotEnd

# File names in a snapshot: "store/<name>" in the store folder, "archive/<topic
# folder>/<name>" in the archive folder.
STORE_PREFIX = "store/"
ARCHIVE_PREFIX = "archive/"
# Files of the store folder a snapshot never copies nor a wipe removes.
_KEPT = frozenset({LOCK_NAME, epochs.HISTORY_NAME, INCOMPLETE_NAME})


class Answer(enum.Enum):
    TAIL = "tail"
    SNAPSHOT = "snapshot"
    REFUSE = "refuse"


@dataclass(frozen=True, slots=True)
class Plan:
    answer: Answer
    from_lsn: int = 0  # TAIL: the first LSN to stream
    reason: str = ""


def plan(hello: Hello, history: History, lsn: int, oldest_lsn: int) -> Plan:
    """What a primary with ``history`` at ``lsn`` answers a backup's Hello,
    when it can still stream batches from ``oldest_lsn`` on."""
    epoch = epochs.current(history)
    if hello.epoch > epoch:
        return Plan(Answer.REFUSE, reason=f"stale epoch {epoch}: the backup accepted epoch {hello.epoch}")
    if epochs.diverged(history, lsn, hello.history, hello.last_lsn):
        return Plan(Answer.SNAPSHOT, reason=f"diverged: the backup's lsn {hello.last_lsn} is not ours")
    if hello.last_lsn == lsn or hello.last_lsn + 1 >= oldest_lsn:
        return Plan(Answer.TAIL, from_lsn=hello.last_lsn + 1)
    return Plan(Answer.SNAPSHOT, reason=f"behind: lsn {hello.last_lsn + 1} is no longer kept (from {oldest_lsn})")


# -- the primary's side ----------------------------------------------------------


class SnapshotSource:
    """The files of a store at one moment (see the module docstring).  Take
    it on the main thread between batches; read :meth:`chunks` in any one
    thread; :meth:`close` when done."""

    def __init__(self, store: Any, epoch: int, history: History) -> None:
        lsn, end = store.written_end()  # raises while a batch is being written
        end_seg, end_off = split_location(end)
        self._fds: list[tuple[str, int, int]] = []
        try:
            directory = Path(store.directory)
            self._add(STORE_PREFIX + CHECKPOINT_NAME, directory / CHECKPOINT_NAME, None)
            for seg in list_segments(directory):
                if seg < end_seg:
                    self._add(STORE_PREFIX + segment_name(seg), directory / segment_name(seg), None)
                elif seg == end_seg and end_off:
                    self._add(STORE_PREFIX + segment_name(seg), directory / segment_name(seg), end_off)
            if store.archive is not None:
                root = Path(store.archive.directory)
                for path in sorted(root.glob("*/*")) if root.is_dir() else ():
                    self._add(ARCHIVE_PREFIX + path.relative_to(root).as_posix(), path, None)
        except BaseException:
            self.close()
            raise
        self.lsn = lsn
        self.begin = SnapshotBegin(epoch, lsn, history, tuple((name, size) for name, _, size in self._fds))
        self.end = SnapshotEnd(lsn)

    def _add(self, name: str, path: Path, size: int | None) -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return  # no checkpoint yet, or an archive file retention just dropped
        self._fds.append((name, fd, os.fstat(fd).st_size if size is None else size))

    def chunks(self, chunk_bytes: int = FILE_CHUNK_BYTES) -> Iterator[FileChunk]:
        """Every file's bytes, in order, read from disk as they go."""
        for name, fd, size in self._fds:
            offset = 0
            while offset < size:
                data = os.pread(fd, min(chunk_bytes, size - offset), offset)
                if not data:
                    raise OSError(f"{name} is shorter than {size} bytes")
                yield FileChunk(name, offset, data)
                offset += len(data)

    def close(self) -> None:
        for _, fd, _ in self._fds:
            os.close(fd)
        self._fds = []


# -- the backup's side -----------------------------------------------------------


class Refusal(Exception):
    """A frame a backup will not apply; ``reason`` goes into Refused."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def wipe(directory: Path, archive: Any) -> None:
    """Remove every file of a store folder (but its lock, epoch history and
    incompleteness mark) and everything in its archive folder."""
    for name in os.listdir(directory):
        if name not in _KEPT:
            path = directory / name
            if path.is_dir():
                shutil.rmtree(path)
            else:
                os.remove(path)
    if archive is not None and Path(archive.directory).is_dir():
        root = Path(archive.directory)
        for entry in os.listdir(root):
            shutil.rmtree(root / entry) if (root / entry).is_dir() else os.remove(root / entry)
        fsync_directory(root)
    fsync_directory(directory)


class SnapshotReceiver:
    """The files a SnapshotBegin announced, written as their chunks come, in
    order; :meth:`finish` checks each is whole and syncs it."""

    def __init__(self, directory: Path, archive_directory: Path | None, begin: SnapshotBegin) -> None:
        self.begin = begin
        self._files = self.places(directory, archive_directory, begin)
        self._received = dict.fromkeys(self._files, 0)
        for path, _ in self._files.values():
            make_dirs(path.parent)
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE))

    @classmethod
    def places(cls, directory: Path, archive_directory: Path | None, begin: SnapshotBegin) -> dict[str, tuple[Path, int]]:
        """Where each announced file goes, and its size (Refusal for a name
        that is not a store or archive file: nothing outside them is written)."""
        return {name: (cls._path(directory, archive_directory, name), size) for name, size in begin.files}

    @staticmethod
    def _path(directory: Path, archive_directory: Path | None, name: str) -> Path:
        if name.startswith(STORE_PREFIX):
            root, rest, depth = directory, name[len(STORE_PREFIX):], 1
        elif name.startswith(ARCHIVE_PREFIX) and archive_directory is not None:
            root, rest, depth = archive_directory, name[len(ARCHIVE_PREFIX):], 2
        else:
            raise Refusal(f"no place for a snapshot file named {name!r}")
        parts = PurePosixPath(rest).parts
        if len(parts) != depth or any(p in ("", ".", "..") or "/" in p for p in parts) or parts[-1] in _KEPT | {CLEAN_NAME}:
            raise Refusal(f"not a file a snapshot may hold: {name!r}")
        return root.joinpath(*parts)

    def write(self, chunk: FileChunk) -> None:
        known = self._files.get(chunk.name)
        if known is None:
            raise Refusal(f"a chunk of {chunk.name!r}, which the snapshot did not announce")
        path, size = known
        if chunk.offset != self._received[chunk.name] or chunk.offset + len(chunk.data) > size:
            raise Refusal(f"a chunk of {chunk.name} at {chunk.offset}+{len(chunk.data)}, expected {self._received[chunk.name]} of {size}")
        fd = os.open(path, os.O_WRONLY)
        try:
            view = memoryview(chunk.data)
            done = 0
            while done < len(view):
                done += os.pwrite(fd, view[done:], chunk.offset + done)
        finally:
            os.close(fd)
        self._received[chunk.name] += len(chunk.data)

    def finish(self, end: SnapshotEnd) -> None:
        if end.lsn != self.begin.lsn:
            raise Refusal(f"the snapshot ends at lsn {end.lsn}, it began for {self.begin.lsn}")
        short = [name for name, (_, size) in self._files.items() if self._received[name] != size]
        if short:
            raise Refusal(f"the snapshot ended with {len(short)} files short, first {short[0]}")
        folders = set()
        for path, _ in self._files.values():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            folders.add(path.parent)
        for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
            fsync_directory(folder)
            if folder.parent != folder:
                fsync_directory(folder.parent)

"""Opening a store folder: the last checkpoint installed into an index, the
journal after it replayed, and what the index then holds turned into the
records of :class:`core.storage.Recovered`.  The store's ``open`` and the
offline ``check`` both load through here."""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from core.storage import Recovered, StoredMessage
from persistence import checkpoint as checkpoints
from persistence import records
from persistence.archive import Archive
from persistence.files import FILE_MODE
from persistence.index import Index, ref_list
from persistence.journal import OFFSET_BITS, OFFSET_MASK, Journal, OnCorrupt, make_location, split_location
from persistence.records import COMMIT_KEYS, REDELIVERIES, RETAINED, CorruptRecord

OnUnknown = Callable[[int, int], None]
# A clean stop leaves this file: the next open trusts the checkpoint (and
# knows nothing was on its way to a consumer).
CLEAN_NAME = "CLEAN"
# What one read of a live journal takes (replay_written's budget is read in
# pieces of this size).
REPLAY_CHUNK = 256 * 2**10
# Held (flock) by whoever has the folder open: one broker, or one tool.
LOCK_NAME = "LOCK"
# Present while a backup copies the folder from its primary (a snapshot): the
# folder is not a store until the copy is complete and this is gone.
INCOMPLETE_NAME = "INCOMPLETE"


# What a broker (or a backup) says when the folder it would open is locked.
IN_USE = "store {} is in use by another process (another broker on this data folder?): stop it or choose another --data-dir"


class FolderInUse(OSError):
    """Another process holds the folder's lock (a running broker, or a tool):
    not a damaged store, and worth saying so."""


def lock_folder(directory: Path, busy: str) -> int:
    """Take the folder's lock; its descriptor holds it until closed.
    Raises :class:`FolderInUse` saying ``busy`` when another process has it."""
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
            raise
        raise FolderInUse(exc.errno, busy) from exc
    return fd


def load_snapshot(directory: Path, index: Index) -> checkpoints.Snapshot | None:
    """Install the folder's checkpoint into ``index`` and return it (None
    when there is none).  Raises :class:`CorruptRecord` when it is damaged,
    leaving ``index`` as it was: the journal is then replayed from its start."""
    snapshot = checkpoints.load(directory)
    if snapshot is not None:
        install(index, snapshot)
    return snapshot


def install(index: Index, snapshot: checkpoints.Snapshot) -> None:
    """``snapshot``'s state becomes ``index``'s (its dicts, not copies)."""
    index.messages = snapshot.messages
    index.subscriptions = snapshot.subscriptions
    index.kv = snapshot.kv
    index.seg_records = snapshot.seg_records
    index.seg_live = dict(snapshot.seg_live)


@dataclass(slots=True)
class Seed:
    """A promoted backup's live index (persistence/replica/follower.py's
    :meth:`Follower.promote`), which :meth:`Store.open` takes in place of
    the checkpoint on disk, so that a promotion replays nothing it already
    applied.  It describes the folder exactly as the follower left it."""

    snapshot: checkpoints.Snapshot  # what a checkpoint at the journal's end would hold (never serialised)
    # The checkpoint ON DISK (-1: none usable) and its live messages per
    # segment: what garbage collection keeps segments for, as the store's own
    # bookkeeping of the checkpoints it wrote would be.
    ckpt_position: int
    ckpt_live: dict[int, int]


def replay(
    journal: Journal,
    index: Index,
    start: int,
    on_corrupt: OnCorrupt,
    on_unknown: OnUnknown,
    *,
    scan_from: int | None = None,
    truncate: bool = True,
    scanned: Callable[[int], None] | None = None,
) -> int:
    """Apply every valid journal record from location ``start`` on to
    ``index``; returns how many.  The scan itself begins at ``scan_from``
    (default ``start``), and ``scanned`` is told each record's location.
    A record that passes its checksum but does not decode is a writer's bug,
    not a torn write: it is reported as corrupt and skipped."""
    replayed = 0
    first = start if scan_from is None else scan_from
    for location, rtype, payload in journal.scan(first, on_corrupt=on_corrupt, truncate=truncate):
        if scanned is not None:
            scanned(location)
        if location < start:
            continue
        apply_record(journal, index, location, rtype, payload, on_corrupt, on_unknown)
        replayed += 1
    return replayed


def apply_record(journal: Journal, index: Index, location: int, rtype: int, payload: memoryview, on_corrupt: OnCorrupt,
           on_unknown: OnUnknown) -> None:
    """One record into the index.  A record that passes its checksum but does
    not decode is a writer's bug: reported as corrupt and skipped."""
    try:
        index.replay(location, rtype, payload, on_unknown)
    except records.DECODE_ERRORS as exc:
        journal.corrupt_records += 1
        on_corrupt(str(journal.path(location >> OFFSET_BITS)), location & OFFSET_MASK, f"undecodable payload: {exc}")


def replay_written(journal: Journal, index: Index, archive: Archive | None, start: int, max_bytes: int | None,
                   on_corrupt: OnCorrupt, on_unknown: OnUnknown) -> tuple[int, int]:
    """Apply to a live ``index`` the records ``journal`` holds from location
    ``start`` to its end (a backup's index catching up with what it wrote:
    another journal's records, at their positions), about ``max_bytes`` of
    them (None: all); archive records go to ``archive``'s buffers, as in
    :func:`load`.  ``(how many, the location reached)``."""
    end_seg, end_offset = split_location(journal.end_location)
    budget = max_bytes
    applied = 0
    if archive is not None:
        index.on_archive = archive.recover
    try:
        while start < journal.end_location and (budget is None or budget > 0):
            seg, offset = split_location(start)
            end = end_offset if seg == end_seg else journal.sizes.get(seg, 0)
            if offset >= end:  # the primary's next segment follows on
                start = make_location(seg + 1, 0)
                continue
            chunk = REPLAY_CHUNK if budget is None else min(budget, REPLAY_CHUNK)
            frames, after = journal.read_span(start, end, chunk, on_corrupt)
            for location, rtype, payload in frames:
                apply_record(journal, index, location, rtype, payload, on_corrupt, on_unknown)
            applied += len(frames)
            if after == start:  # the segment is shorter than what was written to it
                journal.corrupt_records += 1
                on_corrupt(str(journal.path(seg)), offset, f"segment ends before offset {end}, where it was written")
                after = make_location(seg, end)
            if budget is not None:
                budget -= split_location(after)[1] - offset
            start = after
    finally:
        index.on_archive = None
        # Compaction's moves: nobody here holds the old locations.
        index.forward.clear()
        index.origin.clear()
    return applied, start


@dataclass(slots=True)
class Loaded:
    """What :func:`load` found."""

    snapshot: checkpoints.Snapshot | None
    checkpoint_error: str | None  # why the checkpoint was not used (damaged)
    replayed: int
    # Of the last record: the checkpoint's LSN plus one for every record after
    # it (one LSN per top-level frame; journal.neutralize keeps that true).
    lsn: int


def load(directory: Path, journal: Journal, index: Index, archive: Archive | None, on_corrupt: OnCorrupt,
         on_unknown: OnUnknown, *, seed: checkpoints.Snapshot | None = None) -> Loaded:
    """Open a store folder into ``index``: the checkpoint (or ``seed``, a
    promoted backup's live index, in its place), then the journal after it
    (cutting a torn tail), archive records after it back into their
    segments; the journal numbers on from the last LSN.  Shared by the store
    and a backup's follower, so both recover alike."""
    start = 0
    error = None
    snapshot = seed
    if seed is not None:
        install(index, seed)
    else:
        try:
            snapshot = load_snapshot(directory, index)
        except CorruptRecord as exc:
            error = exc.reason
    if snapshot is not None:
        start = snapshot.position
    index.tracking = False
    if archive is not None:
        archive.open()
        index.on_archive = archive.recover
    replayed = replay(journal, index, start, on_corrupt, on_unknown)
    index.forward.clear()
    index.origin.clear()
    if archive is not None:
        index.on_archive = None
        writes = archive.take_writes()  # what recovery put back, before anything new
        if writes is not None:
            archive.write(writes)
            archive.written(writes)
    index.tracking = True
    index.track_subscriptions()
    lsn = (snapshot.lsn if snapshot is not None else 0) + replayed
    journal.start_at(lsn)
    return Loaded(snapshot, error, replayed, lsn)


def numbered_commit_keys(kv: dict[str, dict[str, bytes]]) -> list[tuple[int, str]]:
    """The remembered idempotency keys with the sequence number of their
    commit, oldest first."""
    return sorted((int(value) if value.isdigit() else 0, key) for key, value in kv.get(COMMIT_KEYS, {}).items())


def recovered(index: Index, *, clean: bool, corrupt_records: int, torn_bytes: int, replayed_records: int,
              seconds: float) -> Recovered:
    """The records of what ``index`` holds once opened.  Delivery counts
    noted at the last clean stop are folded into its messages' counts."""
    noted = index.kv.get(REDELIVERIES, {})
    queues: dict[str, list[StoredMessage]] = {}
    for mid, (location, refs, dest, priority, expires, timestamp, count) in index.messages.items():
        if noted:
            count = max(count, int(noted.get(mid, b"0")))
        message = StoredMessage(mid, dest, None, None, priority, expires, timestamp, count, location)
        for key in ref_list(refs):
            queue = queues.get(key)
            if queue is None:
                queue = queues[key] = []
            queue.append(message)
    retained = []
    for value in index.kv.get(RETAINED, {}).values():
        try:
            retained.append(records.decode_retained(value))
        except records.DECODE_ERRORS:
            continue  # not one the broker can use; nothing else depends on it
    return Recovered(
        clean=clean,
        subscriptions=[records.decode_subscription(key, text) for key, text in index.subscriptions.items()],
        queues=queues,
        retained=retained,
        commit_keys=[key for _, key in numbered_commit_keys(index.kv)],
        kv={ns: dict(space) for ns, space in index.kv.items()},
        corrupt_records=corrupt_records,
        torn_bytes=torn_bytes,
        replayed_records=replayed_records,
        seconds=seconds,
    )


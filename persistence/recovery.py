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
from persistence.files import FILE_MODE
from persistence.archive import Archive
from persistence.index import Index, ref_list
from persistence.journal import OFFSET_BITS, OFFSET_MASK, Journal, OnCorrupt
from persistence.records import COMMIT_KEYS, REDELIVERIES, RETAINED, CorruptRecord

OnUnknown = Callable[[int, int], None]
# A clean stop leaves this file: the next open trusts the checkpoint (and
# knows nothing was on its way to a consumer).
CLEAN_NAME = "CLEAN"
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
        index.messages = snapshot.messages
        index.subscriptions = snapshot.subscriptions
        index.kv = snapshot.kv
        index.seg_records = snapshot.seg_records
        index.seg_live = dict(snapshot.seg_live)
    return snapshot


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
        _apply(journal, index, location, rtype, payload, on_corrupt, on_unknown)
        replayed += 1
    return replayed


def _apply(journal: Journal, index: Index, location: int, rtype: int, payload: memoryview, on_corrupt: OnCorrupt,
           on_unknown: OnUnknown) -> None:
    """One record into the index.  A record that passes its checksum but does
    not decode is a writer's bug: reported as corrupt and skipped."""
    try:
        index.replay(location, rtype, payload, on_unknown)
    except records.DECODE_ERRORS as exc:
        journal.corrupt_records += 1
        on_corrupt(str(journal.path(location >> OFFSET_BITS)), location & OFFSET_MASK, f"undecodable payload: {exc}")


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
         on_unknown: OnUnknown) -> Loaded:
    """Open a store folder into ``index``: the checkpoint, then the journal
    after it (cutting a torn tail), archive records after it back into their
    segments; the journal numbers on from the last LSN.  Shared by the store
    and a backup's follower, so both recover alike."""
    start = 0
    error = None
    snapshot = None
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


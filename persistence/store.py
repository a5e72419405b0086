"""The store: persistent messages, durable subscriptions, transactions and
small key/value state, over the journal, the index and checkpoints.

Every change appends one record and returns its LSN at once; nothing here
blocks except :meth:`Store.write_batch` (the committer's worker thread),
:meth:`Store.open`, :meth:`Store.close` and :meth:`Store.flush`.

Durability (``sync``):

- ``always``: every batch is fdatasynced before :meth:`batch_written`, so
  ``durable_lsn`` only covers synced records (group commit).
- ``interval``: fdatasync at most every ``interval_ms`` (an idle store gets a
  sync-only batch once the interval has passed); ``durable_lsn`` advances when
  the batch is written, so receipts do not wait for the disk.
- ``never``: no fdatasync of the journal (tests only).  Checkpoints still sync
  the journal first, so a checkpoint never points at data that is not there.

A failed write (:meth:`batch_failed`): the batch's message adds (MESSAGE_ADD
records and the adds inside TX records) are rewritten in memory as padding of
the same size, so they can never become durable, and the batch goes back in
front of the queue at the same offsets; the next batch rewrites it, together
with what was appended meanwhile.  Its acks, moves, subscription and key/value
records are kept and retried, because the index (and the broker) already
reflect them.  The messages whose add failed stay readable from memory while
live, are left out of checkpoints, and are gone after a restart.  The caller
gets the failed LSN range, so the broker can send ERRORs for those SENDs;
``durable_lsn`` later passes those LSNs (it is a watermark), but what they
added is never on disk.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from core.storage import Recovered, Retained, StoredMessage
from persistence import checkpoint as checkpoints
from persistence import records
from persistence import recovery
from persistence.archive import Archive
from persistence.files import FILE_MODE, make_dirs
from persistence.index import Index
from persistence.journal import OFFSET_BITS, OFFSET_MASK, Batch, Journal, fsync_directory, neutralize, segment_name
from persistence.maintenance import COMPACT_DEAD_RATIO, Maintenance
from persistence.records import COMMIT_KEYS, REDELIVERIES, RETAINED, CorruptRecord, RecordType
from persistence.recovery import CLEAN_NAME
from persistence.settings import SYNC_POLICIES, StoreSettings

# Checkpoint once this much journal has been appended since the last one
# (capped, so huge segments do not mean huge replays).
CHECKPOINT_MAX_BYTES = 64 * 2**20

Log = Callable[..., None]


class Store:
    """The core's store port (``core.storage.MessageStore``, satisfied
    structurally: its records in, its records out), plus what the broker's
    tasks drive: the committer protocol, upkeep (a :class:`Maintenance` it holds) and
    the delivery counts noted across a clean stop."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        segment_bytes: int = 32 * 2**20,
        sync: str = "always",
        interval_ms: int = 100,
        log: Log | None = None,
        archive: Archive | None = None,
    ) -> None:
        if sync not in SYNC_POLICIES:
            raise ValueError(f"sync must be one of {SYNC_POLICIES}, not {sync!r}")
        self.directory = Path(directory)
        self.sync = sync
        self.interval_s = interval_ms / 1000
        self.appended_lsn = 0
        self.durable_lsn = 0
        self._log = log
        # Topic archives ride on the journal: their records are journaled
        # (durable with the batch) and written to the archive segments in
        # the same batch, synced there only before a checkpoint.
        self.archive = archive
        self._journal = Journal(self.directory, segment_bytes, fsync_on_roll=sync != "never")
        self._index = Index()
        self._upkeep = Maintenance(self._journal, self._index, min(segment_bytes, CHECKPOINT_MAX_BYTES))
        self._inflight: Batch | None = None
        self._last_sync = time.monotonic()
        self._unsynced = False
        self._failed_upto = 0
        self._lock_fd: int | None = None
        self._open = False
        self._commit_seq = 0
        # Locations whose record failed to read: never read (or reported) again.
        self._damaged: set[int] = set()

    @classmethod
    def in_data_dir(cls, data_dir: str | os.PathLike[str], settings: StoreSettings, log: Log | None = None) -> Store:
        """The store of a broker's data folder (``store/``), with its topic
        archives beside it (``archive/``)."""
        return cls(
            Path(data_dir) / "store",
            segment_bytes=settings.segment_bytes,
            sync=settings.sync,
            interval_ms=settings.sync_interval_ms,
            log=log,
            archive=Archive(Path(data_dir) / "archive", segment_bytes=settings.archive_segment_bytes, log=log),
        )

    # -- opening and closing -------------------------------------------------

    def open(self, seed: recovery.Seed | None = None) -> Recovered:
        """Load the checkpoint, replay the journal after it, cut a torn tail.
        With ``seed`` (a promoted backup's live index: it describes this
        folder up to its position) the checkpoint on disk is not read, only
        the journal after the seed is replayed (normally nothing), and a
        checkpoint is due at once, so that a crash soon after does not
        replay what the disk's older checkpoint leaves behind it."""
        started = time.monotonic()
        make_dirs(self.directory)
        if (self.directory / recovery.INCOMPLETE_NAME).exists():
            raise OSError(f"store {self.directory} is an incomplete copy (a backup's catch-up was cut short)")
        self._lock_fd = recovery.lock_folder(self.directory, recovery.IN_USE.format(self.directory))
        clean = (self.directory / CLEAN_NAME).exists()
        index = self._index
        journal = self._journal
        loaded = recovery.load(self.directory, journal, index, self.archive, self._on_corrupt, self._on_unknown,
                               seed=None if seed is None else seed.snapshot)
        corrupt = 0
        if seed is not None:
            # What garbage collection goes by is the checkpoint on disk, not the seed.
            self._upkeep.opened(seed.ckpt_position, seed.ckpt_live, wanted=seed.ckpt_position != journal.end_location)
        elif loaded.checkpoint_error is not None:
            corrupt += 1
            self._upkeep.opened()
            self._emit("checkpoint_corrupt", path=str(self.directory / checkpoints.CHECKPOINT_NAME), reason=loaded.checkpoint_error)
        elif loaded.snapshot is not None:
            self._upkeep.opened(loaded.snapshot.position, loaded.snapshot.seg_live)
        else:
            self._upkeep.opened()
        self.appended_lsn = self.durable_lsn = loaded.lsn
        replayed = loaded.replayed
        if journal.torn_bytes:
            self._emit("torn_tail_cut", bytes=journal.torn_bytes)
        if clean:
            os.remove(self.directory / CLEAN_NAME)
            fsync_directory(self.directory)
        self._open = True
        numbered = recovery.numbered_commit_keys(index.kv)
        if numbered:  # later commits number on from the newest
            self._commit_seq = numbered[-1][0]
        return recovery.recovered(
            index, clean=clean, corrupt_records=journal.corrupt_records + corrupt, torn_bytes=journal.torn_bytes,
            replayed_records=replayed, seconds=time.monotonic() - started,
        )

    def close(self) -> None:
        """Write everything, fsync, checkpoint, mark the folder clean."""
        if not self._open:
            return
        if self._inflight is not None:
            # Whether its write finished is unknown (a cancelled committer);
            # writing it again to the same offsets is harmless.
            self._journal.requeue(self._inflight)
            if self._inflight.archive is not None and self.archive is not None:
                self.archive.requeue(self._inflight.archive)
            if self._inflight.checkpoint is not None:
                self._upkeep.not_written()
            self._inflight = None
        self._upkeep.drop_prepared()
        self.checkpoint()
        batch = self.flush()
        if batch is not None and batch.error is not None:
            raise batch.error
        fd = os.open(self.directory / CLEAN_NAME, os.O_WRONLY | os.O_CREAT, FILE_MODE)
        os.close(fd)
        fsync_directory(self.directory)
        self._release()

    def abandon(self) -> None:
        """Drop the store as a crash would: no flush, no checkpoint, the
        folder not marked clean; only the files and the lock are released, so
        the next ``open`` recovers.  For crash tests and tools."""
        with contextlib.suppress(OSError):
            self._release()

    def flush(self) -> Batch | None:
        """Take, write and acknowledge everything pending, blocking: for
        close, tools and tests, never the event loop.  Returns the last batch."""
        last = None
        while True:
            batch = self.take_batch()
            if batch is None:
                return last
            try:
                self.write_batch(batch)
            except OSError as exc:
                self.batch_failed(batch, exc)
                raise
            self.batch_written(batch)
            last = batch

    def _release(self) -> None:
        self._journal.close()
        if self.archive is not None:
            self.archive.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        self._open = False

    def _emit(self, event: str, **fields: Any) -> None:
        if self._log is not None:
            self._log(event, **fields)

    def _on_corrupt(self, path: str, offset: int, reason: str) -> None:
        self._emit("record_corrupt", segment=path, offset=offset, reason=reason)

    def _on_unknown(self, location: int, rtype: int) -> None:
        self._emit(
            "record_type_unknown",
            segment=segment_name(location >> OFFSET_BITS),
            offset=location & OFFSET_MASK,
            type=rtype,
        )

    # -- changes (main thread) -----------------------------------------------

    def add_message(self, message: StoredMessage, keys: Sequence[str]) -> tuple[int, int]:
        """Store ``message`` once for every queue in ``keys``: ``(lsn, location)``."""
        placed = self._journal.append(RecordType.MESSAGE_ADD, records.encode_message(message, keys))
        lsn, location = placed
        index = self._index
        index.add(message, location, keys)
        index.count_record(location)
        self.appended_lsn = lsn
        return placed

    def ack(self, key: str, message_id: str) -> int:
        lsn, location = self._journal.append(RecordType.ACK, records.encode_two(key, message_id))
        self._index.ack(key, message_id)
        self._index.count_record(location)
        self.appended_lsn = lsn
        return lsn

    def archive_message(self, topic: str, message: StoredMessage) -> int:
        """Keep a message in ``topic``'s archive at its next offset."""
        assert self.archive is not None
        payload = self.archive.append(topic, message.id, message.headers, message.body or b"", message.priority, message.timestamp)
        if payload is None:
            return self.appended_lsn
        return self._change(RecordType.ARCHIVE, payload, _nothing)

    def transaction(
        self,
        adds: Sequence[tuple[StoredMessage, Sequence[str]]],
        acks: Sequence[tuple[str, str]],
        *,
        archived: Sequence[tuple[str, StoredMessage]] = (),
        commit_key: str | None = None,
    ) -> tuple[int, list[int]]:
        """All adds, acks (``(key, message id)``), archive records (``(topic,
        message)``) and the COMMIT's idempotency key as one record: after a
        crash, all or nothing.  ``(lsn, the location of each add)``."""
        if not adds and not acks and not archived and commit_key is None:
            return self.appended_lsn, []
        ops: list[tuple[int, bytes]] = [(RecordType.MESSAGE_ADD, records.encode_message(m, keys)) for m, keys in adds]
        ops.extend((RecordType.ACK, records.encode_two(key, mid)) for key, mid in acks)
        if archived:
            assert self.archive is not None
            for topic, m in archived:
                row = self.archive.append(topic, m.id, m.headers, m.body or b"", m.priority, m.timestamp)
                if row is not None:
                    ops.append((RecordType.ARCHIVE, row))
        numbered = b""
        if commit_key is not None:
            self._commit_seq += 1
            numbered = b"%d" % self._commit_seq
            ops.append((RecordType.KV_PUT, records.encode_kv_put(COMMIT_KEYS, commit_key, numbered)))
        payload, starts = records.encode_tx(ops)
        lsn, location = self._journal.append(RecordType.TX, payload)
        index = self._index
        base = location + records.HEADER_BYTES
        locations = []
        for (m, keys), at in zip(adds, starts):
            locations.append(base + at)
            index.add(m, base + at, keys)
        for key, mid in acks:
            index.ack(key, mid)
        if commit_key is not None:
            index.put(COMMIT_KEYS, commit_key, numbered)
        seg = location >> OFFSET_BITS
        index.seg_records[seg] = index.seg_records.get(seg, 0) + len(ops)
        self.appended_lsn = lsn
        return lsn, locations

    def forget_commit_key(self, key: str) -> int:
        """An idempotency key fell out of the remembered window."""
        return self.delete(COMMIT_KEYS, key)

    def add_subscription(self, key: str, pattern: str, selector: str | None = None, owner: str | None = None) -> int:
        """Keep a durable subscription: its topic pattern, selector and owner."""
        text = records.encode_subscription(pattern, selector, owner)
        return self._change(RecordType.SUB_ADD, records.encode_two(key, text), self._index.add_subscription, key, text)

    def remove_subscription(self, key: str) -> int:
        """Also drops ``key``'s reference from every message it held."""
        return self._change(RecordType.SUB_REMOVE, records.encode_one(key), self._index.remove_subscription, key)

    def retain(self, topic: str, message: StoredMessage | None, qos: int | None = None) -> int:
        """Keep ``message`` as the retained message of ``topic`` (None clears)."""
        if message is None:
            return self.delete(RETAINED, topic)
        return self.put(RETAINED, topic, records.encode_retained(Retained(message, qos)))

    def note(self, namespace: str, key: str, value: bytes | None) -> int:
        """Keep a small piece of protocol state (None forgets it)."""
        if value is None:
            return self.delete(namespace, key)
        return self.put(namespace, key, value)

    def remember_redeliveries(self, delivered: Iterable[tuple[str, int]]) -> int:
        """At a clean stop: note ``(message id, deliveries)`` of the messages
        delivered in this run, so they come back marked redelivered (the
        store keeps no count per delivery; that would cost a record per
        message).  Returns how many were noted."""
        noted = 0
        for message_id, count in delivered:
            self.put(REDELIVERIES, message_id, b"%d" % count)
            noted += 1
        return noted

    def forget_redeliveries(self) -> None:
        """Once restored, the notes of the last stop are spent."""
        for message_id in list(self._index.kv.get(REDELIVERIES, {})):
            self.delete(REDELIVERIES, message_id)

    def put(self, namespace: str, key: str, value: bytes) -> int:
        return self._change(RecordType.KV_PUT, records.encode_kv_put(namespace, key, value), self._index.put, namespace, key, value)

    def delete(self, namespace: str, key: str) -> int:
        return self._change(RecordType.KV_DELETE, records.encode_two(namespace, key), self._index.delete, namespace, key)

    def _change(self, rtype: int, payload: bytes, apply: Callable[..., None], *args: Any) -> int:
        lsn, location = self._journal.append(rtype, payload)
        apply(*args)
        self._index.count_record(location)
        self.appended_lsn = lsn
        return lsn

    def read_message(self, location: int) -> StoredMessage:
        """The whole message (headers and body), wherever its record is."""
        index = self._index
        if index.forward:
            location = index.forward.get(location, location)
        payload = index.orphans.get(location) if index.orphans else None
        if payload is None:
            rtype, payload = self._journal.read(location)
            if rtype != RecordType.MESSAGE_ADD and rtype != RecordType.MESSAGE_MOVE:
                raise CorruptRecord(f"location {location:#x} holds a record of type {rtype}, not a message")
        return records.decode_message(payload, location)

    def load(self, location: int, destination: str) -> StoredMessage | None:
        """:meth:`read_message`, or None when the record is unreadable: then
        reported (naming ``destination``) and counted once, like a record
        recovery skips.  Found only now because a clean start trusts its
        checkpoint and leaves bodies on disk; every queue holding the record
        asks again, and is told None without another report."""
        if location in self._damaged:
            return None
        try:
            return self.read_message(location)
        except records.DECODE_ERRORS as exc:
            self._damaged.add(location)
            self.report_damaged(location, getattr(exc, "reason", None) or str(exc), destination=destination)
            return None

    def report_damaged(self, location: int, reason: str, **fields: Any) -> None:
        """A record :meth:`read_message` could not read: counted and logged
        like one that recovery skips (the caller drops its message)."""
        index = self._index
        if index.forward:
            location = index.forward.get(location, location)
        self._journal.corrupt_records += 1
        seg, off = location >> OFFSET_BITS, location & OFFSET_MASK
        self._emit("record_corrupt", segment=str(self._journal.path(seg)), offset=off, reason=reason, **fields)

    def written_end(self) -> tuple[int, int]:
        """``(lsn, location)`` of the end of what is written (what a copy of
        the folder may take: persistence/replica/catchup.py).  Only between batches:
        the worker of one may be renaming a checkpoint that is ahead of it."""
        if self._inflight is not None:
            raise RuntimeError("written_end while a batch is being written")
        pending = self._journal.pending_start()
        if pending is None:
            return self._journal.lsn, self._journal.end_location
        return pending[0] - 1, pending[1]

    # -- upkeep (the maintenance task's; persistence/maintenance.py) -----------

    def checkpoint_due(self) -> bool:
        return self._upkeep.checkpoint_due()

    def checkpoint(self) -> None:
        """Prepare a checkpoint, written by the next batch."""
        self._upkeep.checkpoint()

    def collect_garbage(self) -> list[str]:
        """Delete the segments nothing live needs; their names."""
        return self._upkeep.collect_garbage()

    def compact_step(self, max_records: int = 1000, *, min_dead_ratio: float = COMPACT_DEAD_RATIO) -> bool:
        """One bounded step of compaction (:meth:`Maintenance.compact_step`)."""
        before = self._journal.lsn
        more = self._upkeep.compact_step(max_records, min_dead_ratio=min_dead_ratio)
        if self._journal.lsn != before:  # its moves are appended records
            self.appended_lsn = self._journal.lsn
        return more

    def stats(self) -> dict[str, Any]:
        """What the store holds and how dead each segment is (for logs and metrics)."""
        return self._upkeep.stats(self.appended_lsn, self.durable_lsn)

    # -- committer protocol --------------------------------------------------

    def take_batch(self) -> Batch | None:
        """Main thread: detach what is pending (None when nothing to do)."""
        if self._inflight is not None:
            raise RuntimeError("take_batch while a batch is being written")
        batch = self._journal.take_batch()
        now = time.monotonic()
        if batch is None:
            idle_sync = self.sync == "interval" and self._unsynced and now - self._last_sync >= self.interval_s
            if not self._upkeep.prepared and not idle_sync:
                return None
            batch = Batch(self._journal.lsn + 1, self._journal.lsn, [])
        if self.archive is not None:
            batch.archive = self.archive.take_writes()
        prepared = self._upkeep.take()
        if prepared is not None:
            batch.checkpoint = prepared
            batch.sync = True  # the checkpoint may only describe synced records
        elif self.sync == "never":
            batch.sync = False
        elif self.sync == "interval":
            batch.sync = now - self._last_sync >= self.interval_s
        if batch.sync:
            self._last_sync = now
        self._inflight = batch
        return batch

    def write_batch(self, batch: Batch) -> None:
        """Worker thread: write (and sync) the batch, then its checkpoint.
        Touches only the batch and the journal's writer descriptor."""
        self._journal.write_batch(batch)
        if batch.archive is not None:
            self.archive.write(batch.archive)  # type: ignore[union-attr]
        if batch.checkpoint is not None:
            try:
                if self.archive is not None:
                    # Archive records the checkpoint lets the journal forget
                    # must be durable in their segments first.
                    self.archive.sync()
                checkpoints.write(self.directory, batch.checkpoint)
            except OSError as exc:
                # The journal part is written; only the checkpoint is lost,
                # and it is prepared again later.
                batch.error = exc

    def batch_written(self, batch: Batch) -> None:
        """Main thread: the batch is on disk; its LSNs are durable."""
        self._journal.batch_written(batch)
        if batch.archive is not None:
            self.archive.written(batch.archive)  # type: ignore[union-attr]
        self._inflight = None
        if batch.last_lsn > self.durable_lsn:
            self.durable_lsn = batch.last_lsn
        if batch.sync:
            self._unsynced = False
        elif batch.runs:
            self._unsynced = True
        snapshot = batch.checkpoint
        if snapshot is not None:
            if batch.error is not None:
                self._emit("checkpoint_failed", reason=batch.error.strerror or str(batch.error))
                self._upkeep.not_written()
            else:
                self._upkeep.written(snapshot)
                self._emit("checkpoint_written", messages=len(snapshot.messages), position=snapshot.position)

    def batch_failed(self, batch: Batch, error: OSError) -> tuple[int, int]:
        """Main thread: the batch was not (fully) written.  Returns the LSN
        range ``(first, last)`` newly failed (empty when first > last): the
        SENDs in it must be told they failed.  See the module docstring."""
        for location, payload in neutralize(batch):
            self._index.orphan(location, payload)
        self._journal.requeue(batch)
        if batch.archive is not None:
            self.archive.requeue(batch.archive)  # type: ignore[union-attr]
        self._inflight = None
        self._upkeep.drop_prepared()  # it may describe messages that are now orphans
        if batch.checkpoint is not None:
            self._upkeep.not_written()
        first = max(batch.first_lsn, self._failed_upto + 1)
        last = batch.last_lsn
        self._failed_upto = max(self._failed_upto, last)
        return first, last


def _nothing() -> None:
    """An archive record changes no index state (the archive keeps its own)."""

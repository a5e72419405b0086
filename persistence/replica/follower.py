"""A backup's store: it keeps a copy of the primary's journal, record for
record at the same positions, so that its folder is a valid store at every
moment (a plain :meth:`Store.open` recovers every record it has acked) and
becomes the new primary's store by a restart's recovery.

A Batch frame goes through three steps, the committer protocol's
(persistence/store.py), so the blocking part runs in a worker thread while
the bookkeeping stays on the main thread:

- :meth:`Follower.receive` (main thread) checks one or several consecutive
  Batch frames of one epoch (a backup's group commit: what arrived while the
  last write ran goes to disk with one fdatasync and one Ack): the epoch (an
  older one than the highest accepted is refused; a newer one is accepted and
  saved to the epoch history, fsynced, before anything of it is written or
  acked), the continuity (``first_lsn`` is our last LSN + 1, else "gap"), the
  positions (the first record starts where our journal ends, or a new segment
  starts), and every record's frame and checksum, one LSN per record.
  Nothing is written for a refused batch.
- :meth:`Follower.write` (worker thread) saves a new epoch, copies the bytes
  to their (segment, offset) positions, fdatasyncs, then writes a prepared
  checkpoint, as the store's worker does (topic-archive records go back into
  their segments when the index is rebuilt, as on a restart).
- :meth:`Follower.written` (main thread) accounts for the bytes and returns
  the Ack to send.

The index follows the journal a little behind it, between steps and never
while a write is in flight: :meth:`Follower.catch_up` reads back what was
written and acked since the index last caught up and applies it as
recovery's replay does (topic-archive records back into their segments), a
bounded amount per call (the Backup runs it in a worker thread after each
Ack, and while the link is idle).  The journal stays the truth: the folder
is a valid store whatever the index holds.  A checkpoint is the caught-up
index, and so is what :meth:`Follower.promote` hands over (:attr:`seed`):
the new primary's :meth:`Store.open` takes it in place of the checkpoint on
disk and replays only what follows it, normally nothing, so that promotion
does not grow with what the backup took since its last checkpoint.

It never appends records of its own and never compacts (compaction's copies
come from the primary as ordinary records); it checkpoints and deletes its own
dead segments with the store's upkeep (a :class:`Maintenance` it holds), every
checkpoint's worth of journal bytes (:meth:`upkeep`, which the Backup runs
between writes): a checkpoint prepared by :meth:`checkpoint` is written by the
next batch's worker step, or by :meth:`flush`.

Catch-up by snapshot (persistence/replica/catchup.py): :meth:`begin_snapshot` marks
the folder incomplete and wipes it, :meth:`file_chunk` writes the primary's
files, :meth:`end_snapshot` syncs them, opens the copy like a restart and
clears the mark; Batch frames go on from the snapshot's LSN + 1.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from persistence import checkpoint as checkpoints
from persistence import records
from persistence import recovery
from persistence.archive import Archive
from persistence.files import FILE_MODE, make_dirs
from persistence.index import Index
from persistence.journal import Batch, Journal, fsync_directory, make_location
from persistence.maintenance import Maintenance
from persistence.replica import epochs
from persistence.replica.catchup import Refusal, SnapshotReceiver, wipe
from persistence.replica.epochs import History
from persistence.replica.replication import Ack, Hello
from persistence.replica.replication import Batch as BatchFrame
from persistence.replica.replication import FileChunk, SnapshotBegin, SnapshotEnd
from persistence.settings import StoreSettings
from persistence.store import CHECKPOINT_MAX_BYTES

Log = Any


@dataclass(slots=True)
class Step:
    """One accepted batch on its way to disk (the follower's committer batch)."""

    frame: BatchFrame  # the received frames as one (their runs in order)
    batch: Batch  # the journal's view: the runs at their positions, a checkpoint to write after
    history: History | None  # a new epoch's history, saved before the journal write

    @property
    def checkpoint(self) -> Any:
        return self.batch.checkpoint


class Follower:
    """The store folder of a backup (``directory``; topic archives in
    ``archive``, as :meth:`Store.in_data_dir` lays them out)."""

    def __init__(self, directory: str | os.PathLike[str], *, segment_bytes: int = 32 * 2**20,
                 archive: Archive | None = None, log: Log | None = None) -> None:
        self.directory = Path(directory)
        self.archive = archive
        self.segment_bytes = segment_bytes
        self.history: History = ()
        self.last_lsn = 0
        self.needs_snapshot = False  # diverged from the primary: batches wait for a snapshot
        self.incomplete_found = False  # open found a cut-short snapshot and wiped it
        self._log = log
        self._lock_fd: int | None = None
        self._receiver: SnapshotReceiver | None = None
        # Once promoted: the caught-up index, for Store.open (None: the store
        # recovers from the disk's checkpoint, as after a crash).
        self.seed: recovery.Seed | None = None
        self._reset()

    @classmethod
    def in_data_dir(cls, data_dir: str | os.PathLike[str], settings: StoreSettings, log: Log | None = None) -> Follower:
        return cls(Path(data_dir) / "store", segment_bytes=settings.segment_bytes, log=log,
                   archive=Archive(Path(data_dir) / "archive", segment_bytes=settings.archive_segment_bytes, log=log))

    def _reset(self) -> None:
        """Fresh in-memory state: an empty journal, index and upkeep."""
        self._journal = Journal(self.directory, self.segment_bytes)
        self._index = Index()
        self._upkeep = Maintenance(self._journal, self._index, min(self.segment_bytes, CHECKPOINT_MAX_BYTES))
        self._inflight: Step | None = None
        self._applied = 0  # the journal location the index has applied up to
        self.appended_lsn = self.durable_lsn = 0

    # -- opening and closing ---------------------------------------------------

    def open(self) -> None:
        """Recover the folder as a store would (empty is fine); a snapshot
        that was cut short is wiped, leaving an empty store to catch up."""
        make_dirs(self.directory)
        self._lock_fd = recovery.lock_folder(self.directory, recovery.IN_USE.format(self.directory))
        self.history = epochs.load(self.directory)
        if (self.directory / recovery.INCOMPLETE_NAME).exists():
            self.incomplete_found = True
            wipe(self.directory, self.archive)
            os.remove(self.directory / recovery.INCOMPLETE_NAME)
            fsync_directory(self.directory)
        self._load()

    def _load(self) -> None:
        loaded = recovery.load(self.directory, self._journal, self._index, self.archive, self._on_corrupt, self._on_unknown)
        if loaded.snapshot is not None and loaded.checkpoint_error is None:
            self._upkeep.opened(loaded.snapshot.position, loaded.snapshot.seg_live)
        else:
            self._upkeep.opened()
        self._applied = self._journal.end_location
        self.last_lsn = self.appended_lsn = self.durable_lsn = loaded.lsn

    def close(self) -> None:
        """Write a prepared checkpoint, release the folder.  Never marks it
        clean: a promoted backup's clients were the old primary's, and what
        was on its way to them is unknown here."""
        if self._lock_fd is None:
            return
        self.flush()
        self._release()

    def promote(self, epoch: int | None = None) -> Path:
        """Catch the index up and close, so the folder can be opened as the
        new primary's Store, then save ``epoch`` (the new primary's, first
        numbering the LSN after ours) in its history; returns the folder.
        The index goes to :attr:`seed` for that Store's open (none while a
        snapshot is awaited or copied, or when reading the journal back
        failed: the store then recovers from disk, as after a crash)."""
        seed = None
        if self._lock_fd is not None and not self.copying:
            try:
                self.catch_up()
            except OSError as exc:
                if self._log is not None:
                    self._log("promotion_index_unusable", reason=exc.strerror or str(exc))
            else:
                index = self._index
                snapshot = checkpoints.Snapshot(self._journal.end_location, self._journal.lsn, index.messages,
                                                index.subscriptions, index.kv, index.seg_records, index.seg_live)
                seed = snapshot
        self.close()
        if seed is not None:  # after close: its flush may write a prepared checkpoint
            self.seed = recovery.Seed(seed, *self._upkeep.installed)
            self._index = Index()  # the store's from now on
        if epoch is not None:
            self.history = epochs.extended(self.history, epoch, self.last_lsn + 1)
            epochs.save(self.directory, self.history)
        return self.directory

    def abandon(self) -> None:
        """Drop everything as a crash would (tests and tools)."""
        self._release()

    def flush(self) -> None:
        """Write a prepared checkpoint, if any (blocking)."""
        if self._inflight is not None:
            raise RuntimeError("flush while a batch is being written")
        if not self._upkeep.prepared:
            return
        step = Step(BatchFrame(self.epoch, self.last_lsn + 1, self.last_lsn, ()), Batch(self.last_lsn + 1, self.last_lsn, []),
                    None)
        self._take(step)
        try:
            self.write(step)
        except BaseException:
            self.failed(step)  # not left "being written": the next flush prepares it again
            raise
        self.written(step)

    def _release(self) -> None:
        self._journal.close()
        if self.archive is not None:
            self.archive.close()
        if self._receiver is not None:
            self._receiver = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _on_corrupt(self, path: str, offset: int, reason: str) -> None:
        if self._log is not None:
            self._log("record_corrupt", segment=path, offset=offset, reason=reason)

    def _on_unknown(self, location: int, rtype: int) -> None:
        if self._log is not None:
            self._log("record_type_unknown", location=location, type=rtype)

    # -- what it holds -----------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The highest epoch accepted (the fencing token)."""
        return epochs.current(self.history)

    @property
    def copying(self) -> bool:
        """Its folder waits for, or is being replaced by, a snapshot: what it
        holds is not a prefix of the primary's journal to be judged by LSN."""
        return self._receiver is not None or self.needs_snapshot

    def hello(self, node_id: str) -> Hello:
        return Hello(node_id, self.epoch, self.last_lsn, self.history)

    def accept_primary(self, hello: Hello) -> bool:
        """The primary's answer to our Hello.  An older epoch is refused; a
        primary whose journal ours is a prefix of is followed (its history
        adopted and saved); otherwise False: we hold records it never had,
        and batches are refused until its snapshot replaces our folder."""
        if hello.epoch < self.epoch:
            raise Refusal(f"stale epoch {hello.epoch}: epoch {self.epoch} is accepted here")
        if epochs.diverged(hello.history, hello.last_lsn, self.history, self.last_lsn):
            self.needs_snapshot = True
            return False
        if hello.history != self.history:
            # Blocking fsync on the caller's thread: once per connection.
            epochs.save(self.directory, hello.history)
            self.history = hello.history
        return True

    # -- applying batches --------------------------------------------------------

    def receive(self, *frames: BatchFrame) -> Step:
        """Main thread: check ``frames`` (consecutive, of one epoch; raises
        :class:`Refusal`) and detach the step a worker writes."""
        if self._inflight is not None:
            raise RuntimeError("receive while a batch is being written")
        if self._receiver is not None or self.needs_snapshot:
            raise Refusal("a snapshot is needed before batches")
        if not frames:
            raise ValueError("no frames")
        epoch = frames[0].epoch
        if epoch < self.epoch:
            raise Refusal(f"stale epoch {epoch}: epoch {self.epoch} is accepted here")
        seg, end = self._journal.active_segment, self._journal.end_location
        expected = self.last_lsn + 1
        for frame in frames:
            if frame.epoch != epoch:
                raise ValueError("frames of several epochs in one step")
            if frame.first_lsn != expected:
                raise Refusal(f"gap: expected lsn {expected}, got {frame.first_lsn}")
            if not frame.runs or frame.last_lsn < frame.first_lsn:
                raise Refusal("bad batch: no records")
            seg, end = self._check_runs(frame, seg, end)
            expected = frame.last_lsn + 1
        history = None
        if epoch > self.epoch:
            history = epochs.extended(self.history, epoch, frames[0].first_lsn)
        runs = frames[0].runs if len(frames) == 1 else tuple(run for frame in frames for run in frame.runs)
        whole = BatchFrame(epoch, frames[0].first_lsn, frames[-1].last_lsn, runs)
        step = Step(whole, Batch(whole.first_lsn, whole.last_lsn, list(runs)), history)
        self._take(step)
        return step

    def _take(self, step: Step) -> None:
        step.batch.checkpoint = self._upkeep.take()
        self._inflight = step

    def _check_runs(self, frame: BatchFrame, seg: int, end: int) -> tuple[int, int]:
        """Check ``frame``'s runs against a journal ending at ``end`` (in
        segment ``seg``); where it ends."""
        count = 0
        for run_seg, offset, data in frame.runs:
            at = make_location(run_seg, offset)
            if at != end and not (offset == 0 and run_seg == seg + 1):
                raise Refusal(f"gap: a record at segment {run_seg} offset {offset}, our journal ends at {end:#x}")
            p = 0
            while p < len(data):
                try:
                    _rtype, length = records.parse_frame(data, p, len(data))
                except records.CorruptRecord as exc:
                    raise Refusal(f"bad batch: segment {run_seg} offset {offset + p}: {exc.reason}") from None
                p += records.HEADER_BYTES + length
                count += 1
            seg, end = run_seg, make_location(run_seg, offset + len(data))
        if count != frame.last_lsn - frame.first_lsn + 1:
            raise Refusal(f"bad batch: {count} records for lsn {frame.first_lsn}..{frame.last_lsn}")
        return seg, end

    def write(self, step: Step) -> None:
        """Worker thread: a new epoch's history, then the journal bytes at
        their positions and fdatasync, then a checkpoint."""
        if step.history is not None:
            epochs.save(self.directory, step.history)
        if step.batch.runs:
            self._journal.write_batch(step.batch)
        if step.batch.checkpoint is not None:
            if self.archive is not None:
                self.archive.sync()
            checkpoints.write(self.directory, step.batch.checkpoint)

    def written(self, step: Step) -> Ack:
        """Main thread: the step is on disk; the Ack to send."""
        self._inflight = None
        if step.history is not None:
            self.history = step.history
        snapshot = step.batch.checkpoint
        if snapshot is not None:
            self._upkeep.written(snapshot)
        frame = step.frame
        if frame.runs:
            self._journal.extend(frame.runs, frame.last_lsn)
            self.last_lsn = self.appended_lsn = self.durable_lsn = frame.last_lsn
        return Ack(self.epoch, self.last_lsn)

    # -- the index -----------------------------------------------------------------

    @property
    def index_behind(self) -> bool:
        """Records were written that the index has not applied yet."""
        return self._receiver is None and self._lock_fd is not None and self._applied < self._journal.end_location

    def catch_up(self, max_bytes: int | None = None) -> int:
        """Between steps (blocking; any one thread): apply to the index what
        was written since it last caught up, about ``max_bytes`` of journal
        (None: all of it), as recovery's replay does; topic-archive records
        go back into their segments.  How many records it applied."""
        if self._inflight is not None:
            raise RuntimeError("catch_up while a batch is being written")
        applied = 0
        if self.index_behind:
            applied, self._applied = recovery.replay_written(self._journal, self._index, self.archive, self._applied,
                                                             max_bytes, self._on_corrupt, self._on_unknown)
        if self.archive is not None:  # also what an earlier call failed to write
            writes = self.archive.take_writes()
            if writes is not None:
                try:
                    self.archive.write(writes)
                except OSError:
                    self.archive.requeue(writes)  # tried again by the next call; no checkpoint before
                    raise
                self.archive.written(writes)
        return applied

    # -- upkeep (persistence/maintenance.py) ------------------------------------

    def checkpoint_due(self) -> bool:
        return self._upkeep.checkpoint_due()

    def checkpoint(self) -> None:
        """Prepare a checkpoint of the caught-up index (see :meth:`Maintenance.checkpoint`)."""
        self.catch_up()
        self._upkeep.checkpoint()

    def stats(self) -> dict[str, Any]:
        self.catch_up()
        return self._upkeep.stats(self.appended_lsn, self.durable_lsn)

    # collect_garbage needs no catch-up: an index behind the journal only
    # counts more messages live (the acks it has not applied), never fewer,
    # and the checkpoint it goes by was taken from a caught-up one.
    def collect_garbage(self) -> list[str]:
        """Delete the segments nothing live needs; their names."""
        return self._upkeep.collect_garbage()

    def upkeep(self) -> list[str]:
        """Between steps (blocking; the Backup runs it in a worker thread, as
        it does a write): when a checkpoint is due, catch the index up, write
        the checkpoint at once and delete the segments it leaves dead; the
        names deleted.  Without it a backup's journal would grow for ever
        (and a crash's recovery would replay all of it).  Readers on the
        main thread meanwhile see ``last_lsn`` and ``history`` unchanged."""
        if not self.checkpoint_due():
            return []
        self.checkpoint()
        self.flush()
        return self.collect_garbage()

    def failed(self, step: Step) -> None:
        """Main thread: the worker's write raised; nothing of the step is
        acked, and the primary sends it again (the same bytes to the same
        places) after a new Hello."""
        self._inflight = None
        if step.batch.checkpoint is not None:
            self._upkeep.not_written()

    def apply(self, *frames: BatchFrame) -> Ack:
        """receive, write and written in one (blocking: tests and tools)."""
        step = self.receive(*frames)
        try:
            self.write(step)
        except OSError:
            self.failed(step)
            raise
        return self.written(step)

    def compact_step(self, max_records: int = 1000, *, min_dead_ratio: float = 0.0) -> bool:
        """Never: a backup's journal is the primary's, byte for byte."""
        return False

    # -- catch-up by snapshot ----------------------------------------------------

    def begin_snapshot(self, frame: SnapshotBegin) -> None:
        """Mark the folder incomplete, wipe it, get ready for the files."""
        if self._inflight is not None:
            raise RuntimeError("begin_snapshot while a batch is being written")
        if frame.epoch < self.epoch:
            raise Refusal(f"stale epoch {frame.epoch}: epoch {self.epoch} is accepted here")
        archive_dir = self.archive.directory if self.archive is not None else None
        SnapshotReceiver.places(self.directory, archive_dir, frame)  # refuses bad names before wiping
        marker = self.directory / recovery.INCOMPLETE_NAME
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT, FILE_MODE))
        fsync_directory(self.directory)
        self._journal.close()
        if self.archive is not None:
            self.archive.close()
            self.archive = Archive(self.archive.directory, segment_bytes=self.archive.segment_bytes, log=self._log)
        wipe(self.directory, self.archive)
        self._reset()
        self.last_lsn = 0
        self._receiver = SnapshotReceiver(self.directory, archive_dir, frame)

    def file_chunk(self, frame: FileChunk) -> None:
        """Write one chunk (blocking; any one thread at a time)."""
        if self._receiver is None:
            raise Refusal("a file chunk outside a snapshot")
        self._receiver.write(frame)

    def end_snapshot(self, frame: SnapshotEnd) -> Ack:
        """Sync the copy, open it like a restart, clear the mark: the Ack of
        the snapshot's LSN."""
        receiver = self._receiver
        if receiver is None:
            raise Refusal("a snapshot end outside a snapshot")
        receiver.finish(frame)  # every file whole and synced, or Refusal
        history = receiver.begin.history
        if epochs.current(history) < self.epoch:
            history = epochs.extended(history, self.epoch, receiver.begin.lsn + 1)
        epochs.save(self.directory, history)
        self.history = history
        self._receiver = None
        started = time.monotonic()
        self._load()
        if self.last_lsn != frame.lsn:
            raise Refusal(f"the snapshot holds lsn {self.last_lsn}, not {frame.lsn}")
        os.remove(self.directory / recovery.INCOMPLETE_NAME)
        fsync_directory(self.directory)
        self.needs_snapshot = False
        if self._log is not None:
            self._log("snapshot_installed", lsn=frame.lsn, seconds=round(time.monotonic() - started, 3))
        return Ack(self.epoch, self.last_lsn)

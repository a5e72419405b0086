"""The upkeep of one journal and its index, run by the broker's maintenance
task between batches (and by a backup's, between writes): checkpoints (a
snapshot of the index, prepared on the main thread, handed to the next batch,
installed once that batch has synced the journal it describes), deleting
segments nothing live needs, and compacting mostly-dead segments a bounded
step at a time by re-appending their live messages.

:class:`Maintenance` owns that bookkeeping: the checkpoint's life from
prepared to installed, and which segment compaction is at.  The store
(persistence/store.py) and a backup's follower (persistence/replica/follower.py)
each hold one and call it; they own the batches a checkpoint travels in."""

from __future__ import annotations

from typing import Any

from persistence import checkpoint as checkpoints
from persistence import records
from persistence.index import Index
from persistence.journal import OFFSET_BITS, Journal, segment_name
from persistence.records import RecordType

# A segment is worth compacting once more than half of its records are dead.
COMPACT_DEAD_RATIO = 0.5
# Compaction pauses while this much is still waiting to be written, so moves
# never outrun the committer (and memory) by more than this.
COMPACT_BACKLOG_BYTES = 8 * 2**20
COMPACT_CHUNK_BYTES = 2**20


class Maintenance:
    """Checkpoint, garbage collection and compaction of one journal and its
    index.  A checkpoint goes prepared (:meth:`checkpoint`) -> taken by a
    batch (:meth:`take`) -> installed (:meth:`written`) or wanted again
    (:meth:`not_written`); garbage collection goes by the installed one."""

    def __init__(self, journal: Journal, index: Index, checkpoint_bytes: int) -> None:
        self._journal = journal
        self._index = index
        # A checkpoint is due once this much journal was appended since the last.
        self._checkpoint_bytes = checkpoint_bytes
        self._prepared: checkpoints.Snapshot | None = None  # not yet taken by a batch
        self._taken: checkpoints.Snapshot | None = None  # in the batch being written
        self._position = -1  # of the installed checkpoint (-1: none)
        self._live: dict[int, int] = {}  # its live messages per segment
        self._bytes_at = 0  # journal.appended_bytes when the last one was prepared
        self._wanted = False
        self._compacting: tuple[int, int] | None = None  # (segment, next offset)
        self._compacted: set[int] = set()

    # -- the checkpoint's life -------------------------------------------------

    @property
    def installed(self) -> tuple[int, dict[int, int]]:
        """The installed checkpoint's position (-1: none) and its live
        messages per segment: what garbage collection keeps segments for."""
        return self._position, self._live

    def opened(self, position: int = -1, live: dict[int, int] | None = None, *, wanted: bool = False) -> None:
        """The journal was just recovered, from the checkpoint at ``position``
        (-1: none usable); ``wanted``: prepare one at the next chance."""
        self._position, self._live = position, {} if live is None else live
        self._wanted = wanted
        self._bytes_at = self._journal.appended_bytes

    def checkpoint_due(self) -> bool:
        if self._prepared is not None or self._taken is not None:
            return False
        if self._journal.end_location == self._position:
            return False
        return self._wanted or self._journal.appended_bytes - self._bytes_at >= self._checkpoint_bytes

    def checkpoint(self) -> None:
        """Prepare a snapshot of the index (shallow copies, main thread); the
        next batch writes it once the journal up to here is synced."""
        index = self._index
        messages = index.messages.copy()
        for location, payload in index.orphans.items():
            mid = records.decode_message_id(payload)
            entry = messages.get(mid)
            if entry is not None and entry[0] == location:
                del messages[mid]
        self._prepared = checkpoints.Snapshot(
            position=self._journal.end_location,
            lsn=self._journal.lsn,
            messages=messages,
            subscriptions=dict(index.subscriptions),
            kv={ns: dict(space) for ns, space in index.kv.items()},
            seg_records=dict(index.seg_records),
            seg_live={seg: n for seg, n in index.seg_live.items() if n},
        )
        self._bytes_at = self._journal.appended_bytes
        self._wanted = False

    @property
    def prepared(self) -> bool:
        return self._prepared is not None

    def take(self) -> checkpoints.Snapshot | None:
        """The prepared snapshot, for the batch about to be written (None: none)."""
        snapshot, self._prepared = self._prepared, None
        if snapshot is not None:
            self._taken = snapshot
        return snapshot

    def written(self, snapshot: checkpoints.Snapshot) -> None:
        """The taken snapshot is on disk: garbage collection goes by it now."""
        self._taken = None
        self._position = snapshot.position
        self._live = snapshot.seg_live

    def not_written(self) -> None:
        """The taken snapshot's write failed or was abandoned: prepare one again."""
        self._taken = None
        self._wanted = True

    def drop_prepared(self) -> None:
        """The prepared snapshot may describe what is no longer true (a failed
        batch's messages): never write it."""
        self._prepared = None

    # -- what the journal holds ------------------------------------------------

    def stats(self, appended_lsn: int, durable_lsn: int) -> dict[str, Any]:
        """What the store holds and how dead each segment is (for logs and metrics)."""
        index = self._index
        sizes = self._journal.segment_sizes()
        dead = {}
        for seg in sorted(sizes):
            total = index.seg_records.get(seg, 0)
            dead[segment_name(seg)] = round(1 - index.seg_live.get(seg, 0) / total, 3) if total else 1.0
        return {
            "segments": len(sizes),
            "bytes": sum(sizes.values()),
            "live_messages": len(index.messages),
            "subscriptions": len(index.subscriptions),
            "kv_keys": sum(len(space) for space in index.kv.values()),
            "unwritten_messages": len(index.orphans),
            "pending_bytes": self._journal.pending_bytes,
            "appended_lsn": appended_lsn,
            "durable_lsn": durable_lsn,
            "corrupt_records": self._journal.corrupt_records,
            "fsyncs": self._journal.syncs,
            "dead_ratio": dead,
        }

    def collect_garbage(self) -> list[str]:
        """Delete closed segments with no live message, that the installed
        checkpoint neither replays from nor points into."""
        journal = self._journal
        ckpt_seg = self._position >> OFFSET_BITS if self._position >= 0 else 0
        unwritten = journal.unwritten_segments()
        deleted = []
        for seg in sorted(journal.sizes):
            if seg >= journal.active_segment or seg in unwritten or self._index.seg_live.get(seg, 0):
                continue
            if seg >= ckpt_seg or self._live.get(seg, 0):
                self._wanted = True  # dead, but the checkpoint still needs it
                continue
            journal.delete_segment(seg)
            self._index.forget_segment(seg)
            self._compacted.discard(seg)
            deleted.append(segment_name(seg))
        # No directory fsync here (it would block the event loop): a deleted
        # segment that comes back after a crash holds only dead records from
        # before the checkpoint, and is deleted again.
        return deleted

    def compact_step(self, max_records: int = 1000, *, min_dead_ratio: float = COMPACT_DEAD_RATIO) -> bool:
        """Copy up to ``max_records`` records' live messages out of the most
        dead segment into the active one; the emptied segment is deleted by
        :meth:`collect_garbage` after the next checkpoint.  True while there
        may be more to do now."""
        journal = self._journal
        if journal.pending_bytes >= COMPACT_BACKLOG_BYTES:
            return False
        if self._compacting is None:
            seg = self._compaction_candidate(min_dead_ratio)
            if seg is None:
                return False
            self._compacting = (seg, 0)
        seg, offset = self._compacting
        frames, next_offset, at_end = journal.read_frames(seg, offset, COMPACT_CHUNK_BYTES)
        done = 0
        for location, rtype, payload in frames:
            if done >= max_records:
                next_offset = location & ((1 << OFFSET_BITS) - 1)
                at_end = False
                break
            if rtype == RecordType.MESSAGE_ADD or rtype == RecordType.MESSAGE_MOVE:
                self._move(location, payload)
            elif rtype == RecordType.TX:
                base = location + records.HEADER_BYTES
                for at, op, nested in records.decode_tx(payload):
                    if op == RecordType.MESSAGE_ADD:
                        self._move(base + at, bytes(nested))
            done += 1
        if at_end or not frames and next_offset == offset:
            self._compacting = None
            self._compacted.add(seg)
            self._wanted = True
        else:
            self._compacting = (seg, next_offset)
        return True

    def _move(self, location: int, payload: bytes) -> None:
        mid = records.decode_message_id(payload)
        entry = self._index.messages.get(mid)
        if entry is None or entry[0] != location:
            return  # dead, or already moved
        _lsn, new = self._journal.append(RecordType.MESSAGE_MOVE, payload)
        self._index.move(mid, new)
        self._index.count_record(new)

    def _compaction_candidate(self, min_dead_ratio: float) -> int | None:
        journal = self._journal
        unwritten = journal.unwritten_segments()
        best, best_ratio = None, min_dead_ratio
        for seg in journal.sizes:
            if seg >= journal.active_segment or seg in unwritten or seg in self._compacted:
                continue
            total = self._index.seg_records.get(seg, 0)
            live = self._index.seg_live.get(seg, 0)
            if not total or not live:
                continue  # empty, or all dead: collect_garbage's job
            ratio = 1 - live / total
            if ratio > best_ratio:
                best, best_ratio = seg, ratio
        return best

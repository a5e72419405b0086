"""The store's upkeep, run by the broker's maintenance task between batches:
checkpoints (a snapshot of the index, written once the journal it describes
is synced), deleting segments nothing live needs, and compacting mostly-dead
segments a bounded step at a time by re-appending their live messages.

A mixin of :class:`persistence.store.Store`, whose journal, index and
checkpoint bookkeeping it works on; on its own it holds no state."""

from __future__ import annotations

from typing import Any

from persistence import checkpoint as checkpoints
from persistence import records
from persistence.journal import OFFSET_BITS, segment_name
from persistence.records import RecordType

# A segment is worth compacting once more than half of its records are dead.
COMPACT_DEAD_RATIO = 0.5
# Compaction pauses while this much is still waiting to be written, so moves
# never outrun the committer (and memory) by more than this.
COMPACT_BACKLOG_BYTES = 8 * 2**20
COMPACT_CHUNK_BYTES = 2**20


class Maintenance:
    """Checkpoint, garbage collection and compaction of a :class:`Store`."""

    # Provided by Store.
    _journal: Any
    _index: Any
    _prepared: Any
    _inflight: Any
    _ckpt_position: int
    _ckpt_bytes_at: int
    _ckpt_live: dict[int, int]
    _checkpoint_bytes: int
    _want_checkpoint: bool
    _compacting: list[int] | None
    _compacted: set[int]
    appended_lsn: int
    durable_lsn: int

    def checkpoint_due(self) -> bool:
        if self._prepared is not None or (self._inflight is not None and self._inflight.checkpoint is not None):
            return False
        if self._journal.end_location == self._ckpt_position:
            return False
        return self._want_checkpoint or self._journal.appended_bytes - self._ckpt_bytes_at >= self._checkpoint_bytes

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
        self._ckpt_bytes_at = self._journal.appended_bytes
        self._want_checkpoint = False

    def stats(self) -> dict[str, Any]:
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
            "appended_lsn": self.appended_lsn,
            "durable_lsn": self.durable_lsn,
            "corrupt_records": self._journal.corrupt_records,
            "fsyncs": self._journal.syncs,
            "dead_ratio": dead,
        }

    def collect_garbage(self) -> list[str]:
        """Delete closed segments with no live message, that the installed
        checkpoint neither replays from nor points into."""
        journal = self._journal
        ckpt_seg = self._ckpt_position >> OFFSET_BITS if self._ckpt_position >= 0 else 0
        unwritten = journal.unwritten_segments()
        deleted = []
        for seg in sorted(journal.sizes):
            if seg >= journal.active_segment or seg in unwritten or self._index.seg_live.get(seg, 0):
                continue
            if seg >= ckpt_seg or self._ckpt_live.get(seg, 0):
                self._want_checkpoint = True  # dead, but the checkpoint still needs it
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
            self._compacting = [seg, 0]
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
            self._want_checkpoint = True
        else:
            self._compacting = [seg, next_offset]
        return True

    def _move(self, location: int, payload: bytes) -> None:
        mid = records.decode_message_id(payload)
        entry = self._index.messages.get(mid)
        if entry is None or entry[0] != location:
            return  # dead, or already moved
        lsn, new = self._journal.append(RecordType.MESSAGE_MOVE, payload)
        self._index.move(mid, new)
        self._index.count_record(new)
        self.appended_lsn = lsn

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

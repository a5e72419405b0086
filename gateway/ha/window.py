"""The replication window across a failover (pure: no I/O, no Trio).

A primary keeps its recent batches in memory (gateway/ha/replicator.py), so
that a backup a little behind resumes by tail instead of copying a snapshot.
A new primary would start with that window empty, and every backup not
exactly at its last LSN (the other backup, the old primary coming back)
would be copied whole, while ``sync_replicas`` receipts wait.  So a backup
keeps the batch frames it applied last (:class:`Recent`), bounded as the
primary's window is (the same limits: the memory a backup already had to
plan for, should it lead), and once promoted seeds its window with them
(:func:`seeding`).

The frames of the old epochs are sent again under the new primary's epoch.
A Batch frame's epoch is its sender's fencing token, not the author of its
records: a backup refuses any frame older than the epoch it accepted, and it
accepted the new one at the Hello, with the new primary's epoch history
(which says which epoch wrote which LSNs, the old ones included).  Which
records are whose stays the history's job; the epoch check before the tail
(persistence/replica/catchup.py's ``plan``) is unchanged, so a peer holding records
the new primary never had is still copied by snapshot.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

from persistence.replica import replication as r

# The primary's window of recent batches.  32 MiB holds a few seconds of a
# busy broker's journal (the store's own group-commit batches are far smaller),
# which covers a backup restart or a short network blip; a backup further
# behind than that is cheaper to copy from disk than to keep in memory.
WINDOW_BYTES = 32 * 2**20
WINDOW_BATCHES = 8192  # per-frame overhead bound, for many tiny batches


def size_of(frame: r.Batch) -> int:
    return sum(len(data) for _, _, data in frame.runs)


class Recent:
    """The batch frames a backup applied last (fsynced here), oldest first,
    contiguous, within ``max_bytes`` and ``max_batches``; the newest always
    stays, however large."""

    def __init__(self, max_bytes: int = WINDOW_BYTES, max_batches: int = WINDOW_BATCHES) -> None:
        self.max_bytes = max_bytes
        self.max_batches = max_batches
        self.held = 0  # bytes of records
        self._frames: collections.deque[r.Batch] = collections.deque()

    def __len__(self) -> int:
        return len(self._frames)

    def add(self, frame: r.Batch) -> None:
        """``frame`` is written and synced in the backup's journal."""
        if self._frames and frame.first_lsn != self._frames[-1].last_lsn + 1:
            self.clear()  # only an unbroken run of batches can serve a tail
        self._frames.append(frame)
        self.held += size_of(frame)
        while len(self._frames) > 1 and (self.held > self.max_bytes or len(self._frames) > self.max_batches):
            self.held -= size_of(self._frames.popleft())

    def clear(self) -> None:
        """The journal was replaced (a snapshot): what is kept is no longer its history."""
        self._frames.clear()
        self.held = 0

    def frames(self) -> tuple[r.Batch, ...]:
        return tuple(self._frames)


def seeding(frames: Sequence[r.Batch], last_lsn: int, epoch: int, *, max_bytes: int = WINDOW_BYTES,
            max_batches: int = WINDOW_BATCHES) -> tuple[list[r.Batch], str]:
    """The frames a new primary of ``epoch``, whose store recovered up to
    ``last_lsn``, starts its window with: ``frames`` (a promoted backup's
    :class:`Recent`) stamped with ``epoch``, the newest within the bounds;
    and why none, if none.  Only an unbroken run ending exactly at
    ``last_lsn`` serves: a batch written but never reported applied (its
    worker cancelled by the promotion) leaves the store past the frames, and
    a tail served from a window with a hole would stop at the hole."""
    if not frames:
        return [], "no batches kept"
    if frames[-1].last_lsn != last_lsn:
        return [], f"the kept batches end at lsn {frames[-1].last_lsn}, the store at {last_lsn}"
    if any(b.first_lsn != a.last_lsn + 1 for a, b in zip(frames, frames[1:])):
        return [], "the kept batches have a hole"
    kept: list[r.Batch] = []
    held = 0
    for frame in reversed(frames):
        size = size_of(frame)
        if kept and (held + size > max_bytes or len(kept) >= max_batches):
            break
        kept.append(r.Batch(epoch, frame.first_lsn, frame.last_lsn, frame.runs))
        held += size
    kept.reverse()
    return kept, ""

"""What an HA node tells its admin port about the cluster
(gateway/admin/cluster.py renders it): no I/O of its own, no Trio.

:class:`Marks` is the primary's bounded memory of its recent batches (last
LSN, bytes written through it, when) from which a backup's lag is read off
its acked LSN: pure.  :class:`NodeStatus` is the :class:`cluster.Source` of a
node: its view from the runtime's live objects (on the event loop), and the
group's records through the coordinator (blocking; the admin server calls it
in a worker thread)."""

from __future__ import annotations

import bisect
import collections
from typing import Any

from gateway.admin import cluster
from gateway.ha.coordinator import CoordinationError
from gateway.ha.node import State

STATES = tuple(s.value for s in State)
FOLLOWING = (State.BACKUP_SYNCING, State.BACKUP_IN_SYNC)  # the lock holder it knows of is current
ROLES = {State.PRIMARY: "primary", State.SUSPENDED: "primary", State.FENCED: "fenced", State.STEPPED_DOWN: "fenced",
         State.BACKUP_SYNCING: "syncing"}  # others: "backup"
# Batches remembered for lag figures: as many as the replication window may
# hold, so a backup still served from the window has exact figures (one
# behind the window is copying a snapshot and gets lower bounds).
MARKS = 8192


class Marks:
    """The primary's last ``limit`` batches as (last LSN, bytes written
    through it, when written), for :meth:`behind`.  Everything up to
    ``base_lsn`` was written before the oldest mark, no later than ``base_at``
    (at first: the LSN the primary started from, and when)."""

    def __init__(self, lsn: int, now: float, limit: int = MARKS) -> None:
        self.limit = limit
        self.marks: collections.deque[tuple[int, int, float]] = collections.deque()
        self.base_lsn, self.base_bytes, self.base_at = lsn, 0, now
        self.last_lsn = lsn
        self.bytes = 0  # record bytes written since the start

    def add(self, last_lsn: int, nbytes: int, now: float) -> None:
        self.bytes += nbytes
        self.last_lsn = last_lsn
        self.marks.append((last_lsn, self.bytes, now))
        if len(self.marks) > self.limit:
            self.base_lsn, self.base_bytes, self.base_at = self.marks.popleft()

    def behind(self, acked: int, now: float) -> tuple[int, int, float, bool]:
        """(LSNs, bytes, seconds, exact) written here after ``acked``: the
        seconds since the oldest of those batches was written (0 when
        caught up).  Not exact when ``acked`` is older than what is
        remembered: then lower bounds.  A backup that holds part of a batch
        counts all of it."""
        if acked >= self.last_lsn:
            return 0, 0, 0.0, True
        lsns = self.last_lsn - acked
        if acked < self.base_lsn:
            return lsns, self.bytes - self.base_bytes, max(0.0, now - self.base_at), False
        i = bisect.bisect_right(self.marks, acked, key=lambda mark: mark[0])  # the first batch with LSNs past acked
        before = self.marks[i - 1][1] if i else self.base_bytes
        return lsns, self.bytes - before, max(0.0, now - self.marks[i][2]), True


class NodeStatus:
    """A node's :class:`cluster.Source`: ``node`` is the runtime's HaNode,
    ``replicator`` its :class:`Replicator` once it serves as the primary."""

    def __init__(self, node: Any, replicator: Any = None) -> None:
        self.node = node
        self.replicator = replicator

    def view(self) -> cluster.View:
        node, state = self.node, self.node.state
        lock = node.lock
        common = dict(node_id=node.ha.node_id, role=ROLES.get(state, "backup"), state=state.value, states=STATES,
                      failovers=node.failovers, sync_replicas=node.ha.sync_replicas, waiting_for=node.waiting_for())
        if self.replicator is not None:
            primary = self.replicator
            return cluster.View(**common, epoch=primary.epoch, lsn=primary.last_lsn,
                                primary=node.ha.node_id if state in (State.PRIMARY, State.SUSPENDED) else None,
                                backups=tuple(primary.lags()))
        follower = node.follower
        return cluster.View(**common, epoch=follower.epoch, lsn=follower.last_lsn,
                            primary=lock.node_id if lock is not None and state in FOLLOWING else None)

    def members(self) -> cluster.Members:
        coordinator = self.node.coordinator
        if not coordinator.connected():  # answer at once: an operator asks most while ZooKeeper is away
            return cluster.Members(error="not connected to ZooKeeper")
        try:
            records = coordinator.nodes()
        except CoordinationError as exc:
            return cluster.Members(error=str(exc))
        return cluster.Members(tuple(cluster.Member(r.node_id, r.role.value, r.epoch, r.lsn, r.advertise)
                                     for r in records.values()))

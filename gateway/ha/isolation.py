"""When a primary that is cut off from its backups, but not from ZooKeeper,
steps down, and how long it then stands aside (pure: no I/O, no clock).

Cut off from every backup, a primary confirms nothing (``sync_replicas``
backups must ack a batch before its receipt goes out), so every write fails
for as long as the cut lasts, while the backups and ZooKeeper, a majority,
could elect one of them.  So once it has had fewer than ``sync_replicas``
backups linked for ``after_s``, and ZooKeeper still lists enough other nodes
that may lead for an election without it (:func:`electable_without`), it
steps down: it closes its clients, releases the lock and ends its run
(gateway/ha/node.py's ISOLATED).

Why that is safe.  Stepping down is what a crash of the primary does to the
group, and the election is safe after any crash: a confirmed batch is on
``sync_replicas`` backups, and the quorum of final records it waits for
(gateway/ha/election.py) includes one of them, with or without this node.
The batches only this node wrote were never confirmed, so no receipt went
out for them; it drops them when it follows the new primary (catch-up by
snapshot).

Why it waits ``after_s`` (the ZooKeeper session timeout).  A backup that was
killed, not cut, leaves its record in ZooKeeper until its session expires,
within a session timeout of its link dropping; waiting that long, the
primary counts only live nodes and does not step down for backups that are
dead (no other node could lead then: writes wait for a backup to come
back, as before).  A late look that still sees a dead node's record makes it
step down in vain, which costs its clients a reconnect and nothing else.

Why it then stands aside (:data:`Role.STANDING_ASIDE`).  Its journal is the
longest, so it would win the very election it left and be cut off again.
The fresh node of its process joins not eligible, and not counted in any
quorum, until it has caught up with a new primary or ``stand_aside_s`` has
passed: by then the backups have elected one of them, or could not (gone
too), and it may lead again.
"""

from __future__ import annotations

from collections.abc import Iterable

from gateway.ha.election import NodeRecord, eligible


class Isolation:
    """Since when a primary has had too few backups linked to confirm a batch."""

    def __init__(self, sync_replicas: int, after_s: float) -> None:
        self.sync_replicas = sync_replicas
        self.after_s = after_s
        self.since: float | None = None  # when the count first fell short, while it stays short

    def linked(self, backups: int, now: float) -> bool:
        """``backups`` are linked at ``now``: True once fewer than
        ``sync_replicas`` have been for ``after_s`` without a break.  Never
        with ``sync_replicas`` 0: such a primary confirms alone."""
        if self.sync_replicas == 0 or backups >= self.sync_replicas:
            self.since = None
            return False
        if self.since is None:
            self.since = now
        return now - self.since >= self.after_s


def electable_without(records: Iterable[NodeRecord], node_id: str, needed: int) -> bool:
    """Could the group elect a primary without ``node_id``: at least
    ``needed`` (election.quorum) live records of other nodes that may lead."""
    return sum(1 for r in records if r.node_id != node_id and eligible(r)) >= needed


def stand_aside_s(session_timeout_s: float) -> float:
    """How long the fresh node of a primary that stepped down for isolation
    stands aside: two session timeouts, ample for the backups to see the lock
    released (a watch, at once), settle and elect one of them."""
    return 2 * session_timeout_s


def standing_aside(until: float | None, now: float) -> bool:
    """Does a node that stepped down for isolation still stand aside at ``now``?
    (``until`` is None once it caught up with a new primary: an ordinary backup.)"""
    return until is not None and now < until

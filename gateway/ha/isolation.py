"""When a primary that is cut off from its backups, but not from ZooKeeper,
steps down, and how long it then stands aside (pure: no I/O, no clock).

Cut off from every backup, a primary confirms nothing (``sync_replicas``
backups must ack a batch before its receipt goes out), so every write fails
for as long as the cut lasts, while the backups and ZooKeeper, a majority,
could elect one of them.  The backups know they are cut off: a backup that
follows the primary of epoch E but has no link to it says so in its record
(``unlinked = E``, gateway/ha/runtime.py).  So once, for ``after_s`` without
a break, the primary has had fewer than ``sync_replicas`` backups linked
while ZooKeeper listed enough other nodes that may lead and say they are
unlinked from it for an election without it (:func:`cut_off_by`), it steps
down: it closes its clients, releases the lock and ends its run
(gateway/ha/node.py's ISOLATED).

Why that is safe.  Stepping down is what a crash of the primary does to the
group, and the election is safe after any crash: a confirmed batch is on
``sync_replicas`` backups, and the quorum of final records it waits for
(gateway/ha/election.py) includes one of them, with or without this node.
The batches only this node wrote were never confirmed, so no receipt went
out for them; it drops them when it follows the new primary (catch-up by
snapshot).

Why the backups' word, and not their records alone.  A backup that was
killed or frozen leaves its record in ZooKeeper until its session expires, a
session timeout and up to a server tick later; counted as a node that could
lead, it would make the primary step down for backups that are dead, and no
other node could lead then.  A dead backup says nothing: only live ones
that lost their link mark themselves unlinked.  The wait (:func:`wait_s`, a
session timeout) rides out a link that blinks and comes back, and a frozen
backup that wakes and joins again before it links.

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


def wait_s(session_timeout_s: float) -> float:
    """How long a primary must have been cut off before it steps down."""
    return session_timeout_s


class Isolation:
    """Since when a primary has been cut off: too few backups linked to
    confirm a batch, and enough other nodes in ZooKeeper to elect one."""

    def __init__(self, sync_replicas: int, after_s: float) -> None:
        self.sync_replicas = sync_replicas
        self.after_s = after_s
        self.since: float | None = None  # when both first held, while they hold

    def short(self, backups: int) -> bool:
        """Too few of ``backups`` linked to confirm a batch?  Never with
        ``sync_replicas`` 0: such a primary confirms alone."""
        return self.sync_replicas > 0 and backups < self.sync_replicas

    def observe(self, cut_off: bool, now: float) -> bool:
        """At ``now`` it is ``cut_off`` (short of backups while others could
        lead) or not: True once it has been for ``after_s`` without a break."""
        if not cut_off:
            self.since = None
            return False
        if self.since is None:
            self.since = now
        return now - self.since >= self.after_s


def cut_off_by(records: Iterable[NodeRecord], node_id: str, epoch: int, needed: int) -> bool:
    """Do at least ``needed`` (election.quorum) live nodes other than
    ``node_id`` that may lead say they follow the primary of ``epoch`` with
    no link to it: an election without it could succeed."""
    return sum(1 for r in records if r.node_id != node_id and eligible(r) and r.unlinked == epoch) >= needed


def stand_aside_s(session_timeout_s: float) -> float:
    """How long the fresh node of a primary that stepped down for isolation
    stands aside: two session timeouts, ample for the backups to see the lock
    released (a watch, at once), settle and elect one of them."""
    return 2 * session_timeout_s


def standing_aside(until: float | None, now: float) -> bool:
    """Does a node that stepped down for isolation still stand aside at ``now``?
    (``until`` is None once it caught up with a new primary: an ordinary backup.)"""
    return until is not None and now < until

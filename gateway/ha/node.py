"""One HA node's role, as a table (pure: no I/O, no clock).

The runtime (gateway/ha/runtime.py) turns what it hears into events, calls
:func:`step`, and carries out the actions it gets back, in order.  Events
come from the coordinator (whether another node holds the lock, or nobody;
the session fenced, lost, back), from the replication stream (caught up, a
gap, refused as stale, following ended), from the election (lock taken or
not), from the store (promoted) and from the runtime's timers (a suspended
primary whose session may soon expire: fence_due; a fenced node that heard
nothing for a session timeout: quiet).

A primary whose ZooKeeper connection drops (kazoo: SUSPENDED) may still
hold its session: kazoo reconnects to another server of the ensemble within
milliseconds when one restarts, and a loaded machine answers pings late.  So
it does not fence at once: it is SUSPENDED, its clients stay connected but
no receipt goes out (the receipt gate is frozen), and a timer is armed for
the moment after which its session could no longer be relied on (the
runtime computes it; gateway/ha/coordinator.py says why it is safe).  Back
with the same session (RECONNECT) it is PRIMARY again and releases what it
held; the timer first (FENCE_DUE) and it stops accepting and closes its
clients (FENCED), as does any sign that it is deposed.  Once its session is
lost, or it sees another holder of the lock, or a backup refuses it as
stale, it ends this node's run and the process starts a fresh node, which
joins as a backup (a new session, the data folder reopened as a follower;
catch-up sorts out records the new primary never had).  No supervisor is
needed for a deposed primary to rejoin.  A primary whose store fails to
write or fsync a batch (STORE_FAILED) steps down: it closes its clients,
releases the lock and ends its run, and the process starts no fresh node
until its data folder takes a write again (the runtime's).  So does a primary
cut off from its backups while ZooKeeper still sees enough of them to elect
one (ISOLATED, gateway/ha/isolation.py), whose fresh node then stands aside
for a while.  A (pair) not in the table changes
nothing (so a FENCE_DUE that comes late, after RECONNECT, is harmless).
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class State(enum.StrEnum):
    STARTING = "starting"  # joined (or rejoining), role not known yet
    BACKUP_SYNCING = "backup_syncing"  # following a primary, not caught up (snapshot or tail)
    BACKUP_IN_SYNC = "backup_in_sync"  # following at the live edge
    CANDIDATE = "candidate"  # nobody leads: publishing its LSN, trying to lead
    PRIMARY = "primary"  # serving clients
    SUSPENDED = "suspended"  # primary, its ZooKeeper connection lost, its session maybe alive: receipts held
    FENCED = "fenced"  # was primary, no longer sure: accepts nothing
    STEPPED_DOWN = "stepped_down"  # was primary, its store cannot write or its backups are cut off: lock released


class Event(enum.StrEnum):
    PRIMARY_SEEN = "primary_seen"  # another node holds the lock
    PRIMARY_GONE = "primary_gone"  # nobody holds it
    LEAD_TAKEN = "lead_taken"
    LEAD_NOT_TAKEN = "lead_not_taken"
    CAUGHT_UP = "caught_up"
    GAP = "gap"
    REFUSED_STALE = "refused_stale"  # a peer holds a newer epoch than the one offered
    FOLLOW_ENDED = "follow_ended"  # the backup gave up on the primary
    PROMOTED = "promoted"  # the follower's folder is ready to open as the primary's store
    FENCE = "fence"  # ZooKeeper connection suspended (the session may live on)
    FENCE_DUE = "fence_due"  # suspended so long that the session may soon expire (the runtime's timer)
    LOST = "lost"  # ZooKeeper session expired
    RECONNECT = "reconnect"
    QUIET = "quiet"  # fenced, its broker stopped, and no news for a session timeout
    STORE_FAILED = "store_failed"  # the store could not write or fsync a batch (not a full disk)
    ISOLATED = "isolated"  # too few backups linked for a while, and enough others in ZooKeeper to lead (isolation.py)


class Action(enum.StrEnum):
    FOLLOW = "follow"  # run a Backup against the lock holder's address (no-op if already)
    STOP_FOLLOWING = "stop_following"
    PUBLISH_LSN = "publish_lsn"  # update this node's /nodes record with its last LSN
    TRY_LEAD = "try_lead"
    PROMOTE = "promote"  # close the follower, record the new epoch in the folder
    START_PRIMARY = "start_primary"  # open the store, recover, replication listener, clients, ready
    HOLD_RECEIPTS = "hold_receipts"  # freeze the receipt gate where it is: clients wait, nothing goes out
    ARM_FENCE_TIMER = "arm_fence_timer"  # FENCE_DUE at the last moment the session is surely alive (less a margin)
    RELEASE_RECEIPTS = "release_receipts"  # disarm the timer, unfreeze the gate, wake the held writers
    STOP_ACCEPTING = "stop_accepting"  # close the client listeners and every client at once
    RESTART_AS_BACKUP = "restart_as_backup"  # end this node's run: the process starts a fresh one, a backup
    REJOIN = "rejoin"  # a new session: create this node's record again
    # Release the lock, end this run; the next one waits for the data folder
    # to write again (a store failure) or stands aside for a while (isolated).
    STEP_DOWN = "step_down"


class Transition(NamedTuple):
    state: State
    actions: tuple[Action, ...]


S, E, A = State, Event, Action
BACKUPS = (S.BACKUP_SYNCING, S.BACKUP_IN_SYNC)
NOT_PRIMARY = (S.STARTING, *BACKUPS, S.CANDIDATE)

TABLE: dict[tuple[State, Event], Transition] = {
    (S.STARTING, E.PRIMARY_SEEN): Transition(S.BACKUP_SYNCING, (A.FOLLOW,)),
    (S.STARTING, E.PRIMARY_GONE): Transition(S.CANDIDATE, (A.PUBLISH_LSN, A.TRY_LEAD)),
    (S.STARTING, E.RECONNECT): Transition(S.STARTING, (A.REJOIN,)),
    (S.BACKUP_SYNCING, E.CAUGHT_UP): Transition(S.BACKUP_IN_SYNC, ()),
    (S.CANDIDATE, E.PRIMARY_GONE): Transition(S.CANDIDATE, (A.PUBLISH_LSN, A.TRY_LEAD)),
    (S.CANDIDATE, E.PRIMARY_SEEN): Transition(S.BACKUP_SYNCING, (A.FOLLOW,)),
    (S.CANDIDATE, E.LEAD_TAKEN): Transition(S.CANDIDATE, (A.PROMOTE,)),
    (S.CANDIDATE, E.PROMOTED): Transition(S.PRIMARY, (A.START_PRIMARY,)),
    (S.PRIMARY, E.FENCE): Transition(S.SUSPENDED, (A.HOLD_RECEIPTS, A.ARM_FENCE_TIMER)),
    # CONNECTED after SUSPENDED without LOST: the same session, so /primary is
    # still ours (the next look at the lock checks it all the same).
    (S.SUSPENDED, E.RECONNECT): Transition(S.PRIMARY, (A.RELEASE_RECEIPTS,)),
    (S.SUSPENDED, E.FENCE_DUE): Transition(S.FENCED, (A.STOP_ACCEPTING,)),
    # Fenced stays fenced: back or not, what clients it had are gone and a
    # newer primary may exist; a fresh node (a new session) sorts it out.
    (S.FENCED, E.LOST): Transition(S.FENCED, (A.RESTART_AS_BACKUP,)),
    (S.FENCED, E.RECONNECT): Transition(S.FENCED, (A.RESTART_AS_BACKUP,)),
    (S.FENCED, E.PRIMARY_SEEN): Transition(S.FENCED, (A.RESTART_AS_BACKUP,)),
    (S.FENCED, E.PRIMARY_GONE): Transition(S.FENCED, (A.RESTART_AS_BACKUP,)),
    (S.FENCED, E.QUIET): Transition(S.FENCED, (A.RESTART_AS_BACKUP,)),  # ZooKeeper away: waiting is bounded
}
for _state in (S.PRIMARY, S.SUSPENDED):
    # A disk that cannot write: a backup with a healthy one should lead.
    TABLE[(_state, E.STORE_FAILED)] = Transition(S.STEPPED_DOWN, (A.STOP_ACCEPTING, A.STEP_DOWN))
    for _event in (E.LOST, E.PRIMARY_SEEN, E.PRIMARY_GONE, E.REFUSED_STALE):  # deposed, or may be
        TABLE[(_state, _event)] = Transition(S.FENCED, (A.STOP_ACCEPTING, A.RESTART_AS_BACKUP))
for _state in BACKUPS:
    TABLE[(_state, E.PRIMARY_SEEN)] = Transition(_state, (A.FOLLOW,))
    TABLE[(_state, E.PRIMARY_GONE)] = Transition(S.CANDIDATE, (A.STOP_FOLLOWING, A.PUBLISH_LSN, A.TRY_LEAD))
    TABLE[(_state, E.GAP)] = Transition(S.BACKUP_SYNCING, ())  # the Backup reconnects; its Hello sorts it out
    TABLE[(_state, E.REFUSED_STALE)] = Transition(S.BACKUP_SYNCING, (A.STOP_FOLLOWING,))  # wait for a new lock
    TABLE[(_state, E.FOLLOW_ENDED)] = Transition(S.BACKUP_SYNCING, ())  # followed again at the next PRIMARY_SEEN
for _state in NOT_PRIMARY:
    # A lost session took this node's record with it: rejoin once back.
    TABLE[(_state, E.LOST)] = Transition(S.STARTING, (A.STOP_FOLLOWING,) if _state != S.STARTING else ())
# Cut off from its backups, not from ZooKeeper: backups that ZooKeeper sees
# should lead.  (Suspended, it fences on its own timer anyway.)
TABLE[(S.PRIMARY, E.ISOLATED)] = Transition(S.STEPPED_DOWN, (A.STOP_ACCEPTING, A.STEP_DOWN))
del _state, _event


def step(state: State, event: Event) -> Transition:
    """The next state and what to do; a pair not in the table changes nothing."""
    return TABLE.get((state, event), Transition(state, ()))

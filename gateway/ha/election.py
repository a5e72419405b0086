"""The pure decisions of HA: node records, who is the candidate, which epochs count.

Stdlib only, no I/O, no clock.  ZooKeeper holds the records as JSON; whatever
is read back is validated here, and anything malformed is refused with a
`RecordError` (the coordinator then ignores that record rather than crash,
since any client of the ensemble can write there).

Election (the rule replicated LevelDB followed): among the live, eligible
nodes the one holding the most of the journal leads, judged by (epoch, lsn)
so that a record from a newer primary's history outranks a longer one from
an older primary's.  Ties go to the lowest node id, so every node computes
the same candidate from the same records, whatever order it read them in.

Settling: a record is only as good as the moment it was written.  While the
primary of epoch E lives, a backup's record lags what it holds, so when that
primary goes every node first stops applying its batches and then publishes
its record "final for vacancy E" (``vacancy = E``, its LSN final).  The
election is decided (:func:`decide`) only once every eligible live record is
final for the current vacancy (/epoch's value): then no record is stale, and
the candidate holds the most that any live node holds of what was confirmed.
A node that never says so blocks the election only until its session ends,
as its record is ephemeral; a record that is not eligible cannot win nor
change the order of the others, so it need not settle.

Validation: a record read from ZooKeeper that does not parse is logged once
per znode and reason (:class:`Refusals`, in the coordinator), and then: a
member's record is left out (the quorum counts valid final records only, so
leaving one out never elects a node without a confirmed batch), and a node
finding its own so writes it again; a /primary that does not parse is not
followed (nobody is taken to lead either: the lock is held), and the session
that owns the znode, whatever its text says, writes it again; an /epoch that
does not parse counts as its data version (:func:`current_epoch` says why
that is safe).

Quorum: settling covers the nodes that are alive, not one that is down.  A
confirmed batch is on the primary and on ``sync_replicas`` backups, so of the
other ``replicas - 1`` nodes at most ``replicas - 1 - sync_replicas`` lack
it, and any ``replicas - sync_replicas`` final records include one that holds
it (:func:`quorum`).  With fewer, nobody leads: a group of three whose first
node to come back after a full stop is the least advanced (or an empty
disk) waits for a second one rather than lead and make the others throw away
confirmed batches, as replicated LevelDB waited for a quorum of ``replicas``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Iterable
from typing import Any

MAX_RECORD_BYTES = 1024  # a record is a few short fields; anything longer is not ours
MAX_ADVERTISE_CHARS = 261  # a 253-character DNS name, ':' and a port
MAX_COUNTER = 2**63 - 1  # epochs and LSNs fit a signed 64-bit integer, as in the journal
MAX_EPOCH_DIGITS = 19
# A znode name (no '/'), and a Kubernetes pod name fits: StatefulSet pods are
# named <set>-<ordinal>, lower-case, at most 63 characters.
NODE_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class RecordError(ValueError):
    """A record, epoch or field that is not valid; the message says which and why."""


class Role(enum.StrEnum):
    PRIMARY = "primary"
    BACKUP = "backup"
    # Still copying a snapshot: its (epoch, lsn) says nothing about what it
    # holds contiguously yet, so it may not lead.
    SYNCING = "syncing"
    # A primary that stepped down because it was cut off from its backups
    # (gateway/ha/isolation.py), for a while after: the most advanced node,
    # it would win again and be cut off again, while the backups that
    # ZooKeeper still sees wait for it.  It may not lead, nor count.
    STANDING_ASIDE = "standing_aside"


def check_node_id(node_id: object) -> str:
    if not isinstance(node_id, str) or NODE_ID_PATTERN.fullmatch(node_id) is None:
        raise RecordError(f"node_id must match {NODE_ID_PATTERN.pattern}: {node_id!r:.80}")
    return node_id


def check_advertise(advertise: object) -> str:
    """``host:port`` (an IPv6 host in brackets), as a backup would dial it."""
    if not isinstance(advertise, str) or not 3 <= len(advertise) <= MAX_ADVERTISE_CHARS:
        raise RecordError(f"advertise must be host:port: {advertise!r:.80}")
    host, sep, port = advertise.rpartition(":")
    if (not sep or not host or not advertise.isascii() or not host.isprintable() or any(c in host for c in " /")
            or not port.isdigit() or not 1 <= int(port) <= 65535):
        raise RecordError(f"advertise must be host:port: {advertise!r:.80}")
    return advertise


def check_counter(name: str, value: object) -> int:
    # bool is an int to Python, never to us.
    if type(value) is not int or not 0 <= value <= MAX_COUNTER:
        raise RecordError(f"{name} must be an integer in [0, 2**63): {value!r:.80}")
    return value


def decode_object(data: bytes, what: str) -> dict[str, Any]:
    if len(data) > MAX_RECORD_BYTES:
        raise RecordError(f"{what} is {len(data)} bytes, over {MAX_RECORD_BYTES}")
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RecordError(f"{what} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise RecordError(f"{what} is not a JSON object")
    return value


class Refusals:
    """The reason each znode's record was last refused for, so that a corrupt
    record, read again at every look, is logged once (and again only when the
    reason changes).  Bounded: past ``limit`` paths it starts over, at worst
    logging a line again."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.reasons: dict[str, str] = {}

    def first(self, path: str, reason: str) -> bool:
        """Record that ``path`` was refused for ``reason``: True if that is news."""
        if self.reasons.get(path) == reason:
            return False
        if path not in self.reasons and len(self.reasons) >= self.limit:
            self.reasons.clear()
        self.reasons[path] = reason
        return True

    def clear(self, path: str) -> None:
        """``path`` parsed again: a later refusal is news."""
        self.reasons.pop(path, None)


def encode_object(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields, separators=(",", ":"), sort_keys=True).encode()


@dataclasses.dataclass(frozen=True, slots=True)
class NodeRecord:
    """What one live node says about itself in ``/nodes/<node_id>``."""

    node_id: str
    advertise: str  # host:port of its replication listener
    epoch: int  # epoch of the last batch it holds
    lsn: int  # last durable LSN it holds
    role: Role
    # The epoch of the primary this node saw go, once it applies no more of
    # that epoch's batches: its lsn is final for that vacancy.  None: not yet.
    vacancy: int | None = None
    # A backup that follows the primary of this epoch but has no link to it
    # (a live node says so; a dead one cannot): gateway/ha/isolation.py.
    unlinked: int | None = None

    def __post_init__(self) -> None:
        check_node_id(self.node_id)
        check_advertise(self.advertise)
        check_counter("epoch", self.epoch)
        check_counter("lsn", self.lsn)
        if not isinstance(self.role, Role):
            raise RecordError(f"role must be one of {[r.value for r in Role]}: {self.role!r:.80}")
        if self.vacancy is not None:
            check_counter("vacancy", self.vacancy)
        if self.unlinked is not None:
            check_counter("unlinked", self.unlinked)

    def to_json(self) -> bytes:
        fields: dict[str, Any] = {"node_id": self.node_id, "advertise": self.advertise, "epoch": self.epoch, "lsn": self.lsn,
                  "role": self.role.value}
        if self.vacancy is not None:
            fields["vacancy"] = self.vacancy
        if self.unlinked is not None:
            fields["unlinked"] = self.unlinked
        return encode_object(fields)

    @classmethod
    def from_json(cls, data: bytes) -> NodeRecord:
        """The record in ``data``; unknown keys are ignored (a newer node may say more)."""
        fields = decode_object(data, "node record")
        try:
            role = Role(fields.get("role"))
        except ValueError:
            raise RecordError(f"role must be one of {[r.value for r in Role]}: {fields.get('role')!r:.80}") from None
        return cls(node_id=fields.get("node_id"), advertise=fields.get("advertise"),
                   epoch=fields.get("epoch"), lsn=fields.get("lsn"), role=role, vacancy=fields.get("vacancy"),
                   unlinked=fields.get("unlinked"))

    def position(self) -> tuple[int, int]:
        """How much of the journal it holds, in election order."""
        return (self.epoch, self.lsn)


@dataclasses.dataclass(frozen=True, slots=True)
class PrimaryRecord:
    """What ``/primary`` (the lock) says: who leads, in which epoch, where to dial it."""

    node_id: str
    epoch: int
    advertise: str

    def __post_init__(self) -> None:
        check_node_id(self.node_id)
        check_counter("epoch", self.epoch)
        check_advertise(self.advertise)

    def to_json(self) -> bytes:
        return encode_object({"node_id": self.node_id, "epoch": self.epoch, "advertise": self.advertise})

    @classmethod
    def from_json(cls, data: bytes) -> PrimaryRecord:
        fields = decode_object(data, "primary record")
        return cls(node_id=fields.get("node_id"), epoch=fields.get("epoch"),
                   advertise=fields.get("advertise"))


def eligible(record: NodeRecord) -> bool:
    """May this node lead?  Not while it is still copying a snapshot, nor
    while it stands aside."""
    return record.role not in (Role.SYNCING, Role.STANDING_ASIDE)


def candidate(records: Iterable[NodeRecord]) -> str | None:
    """The node that should lead: highest (epoch, lsn) among the eligible, ties
    to the lowest node id; None when no node is eligible.

    Deterministic in the set of records, not their order, so every node that
    read the same /nodes agrees without talking to the others.
    """
    best: NodeRecord | None = None
    for record in records:
        if not eligible(record):
            continue
        if best is None or (-record.epoch, -record.lsn, record.node_id) < (-best.epoch, -best.lsn, best.node_id):
            best = record
    return None if best is None else best.node_id


def final(record: NodeRecord, vacancy: int) -> bool:
    """Is this record's position final for the vacancy left by the primary of epoch ``vacancy``?"""
    return record.vacancy == vacancy


def settled(records: Iterable[NodeRecord], vacancy: int) -> bool:
    """Has every eligible record published its final position for this vacancy?"""
    return all(final(r, vacancy) for r in records if eligible(r))


def quorum(replicas: int, sync_replicas: int) -> int:
    """How many final, eligible records an election needs in a group of
    ``replicas`` nodes whose batches are confirmed by ``sync_replicas`` backups.

    With ``sync_replicas`` 0 nothing is promised beyond the primary's disk;
    the group then elects as if it were 1, rather than wait for a dead primary.
    """
    return max(1, replicas - max(1, sync_replicas))


def shortfall(records: Iterable[NodeRecord], needed: int) -> tuple[int, int] | None:
    """(eligible records seen, ``needed``) while fewer than ``needed`` nodes
    that may lead are in the group (a lone node of a group waits for
    ``replicas - sync_replicas`` of them, :func:`quorum`), else None."""
    seen = sum(1 for r in records if eligible(r))
    return (seen, needed) if seen < needed else None


def decide(records: Iterable[NodeRecord], vacancy: int, needed: int = 1) -> str | None:
    """Who should lead now that the primary of epoch ``vacancy`` (the value in
    /epoch) is gone: the candidate once the records have settled and at least
    ``needed`` of them (:func:`quorum`) are eligible and final, else None
    (nobody may lead yet: a record may still be stale, or a node holding a
    confirmed batch may be down)."""
    records = list(records)
    if not settled(records, vacancy) or sum(1 for r in records if eligible(r)) < needed:
        return None
    return candidate(records)


# -- epochs ---------------------------------------------------------------------
#
# /epoch holds the fencing token as a decimal number.  It only ever grows, by
# one per takeover, through a compare-and-set on the znode's version; every
# replicated batch carries the epoch of the primary that wrote it.


def parse_epoch(data: bytes) -> int:
    """The epoch in ``/epoch``'s data: a plain decimal number."""
    if not data or len(data) > MAX_EPOCH_DIGITS or not data.isdigit():
        raise RecordError(f"epoch must be a decimal number of at most {MAX_EPOCH_DIGITS} digits: {data[:40]!r}")
    return check_counter("epoch", int(data))


def current_epoch(data: bytes, version: int) -> tuple[int, str | None]:
    """The current epoch from /epoch's data and its znode's data version, and
    why the data was not taken (None when it was).

    Every takeover writes n + 1 over n by compare-and-set on the version, so
    the group's own writes keep the value equal to the version, and the
    version never goes back.  A write that is not a takeover (garbage, a
    wrong type, a number out of range, or a lower number) still bumps the
    version.  So the epoch is the larger of the value and the version, and
    the version alone when the value does not parse: never lower than any
    epoch ever issued on this znode, so the next takeover's epoch is newer
    than every deposed primary's and a backup still refuses them (no
    confirmed batch is rolled back by a reused epoch).  Every node reading
    the same znode computes the same vacancy, so the election settles.  Not
    0 (the znode as absent): a rolled-back epoch would let a deposed primary's
    batches count again, and the backups would refuse the new primary.
    """
    version = check_counter("version", version)
    try:
        return max(parse_epoch(data), version), None
    except RecordError as exc:
        return version, str(exc)


def format_epoch(epoch: int) -> bytes:
    return str(check_counter("epoch", epoch)).encode()


def takeover_epoch(current: int) -> int:
    """The epoch a new primary takes: one past the current one."""
    if check_counter("epoch", current) == MAX_COUNTER:
        raise RecordError("epoch exhausted")
    return current + 1


class Verdict(enum.Enum):
    ACCEPT = "accept"  # the epoch already accepted: go on
    ADVANCE = "advance"  # a newer primary: remember (durably) the new epoch first, then go on
    REFUSE = "refuse"  # an older primary: refuse, it has been superseded


def judge_epoch(highest_accepted: int, offered: int) -> Verdict:
    """What a node does with a batch or hello stamped ``offered`` when the
    highest epoch it has accepted is ``highest_accepted``.

    A node never goes back: once it has heard from epoch n, nothing from an
    older epoch is taken, so a superseded primary can get no confirmation.
    """
    check_counter("epoch", highest_accepted)
    check_counter("epoch", offered)
    if offered < highest_accepted:
        return Verdict.REFUSE
    return Verdict.ACCEPT if offered == highest_accepted else Verdict.ADVANCE

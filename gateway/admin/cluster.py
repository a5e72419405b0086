"""The cluster as one node sees it, as plain values, and what the admin port
makes of it: the ``/api/v1/cluster`` document and the ``gateway_ha_*``
metric families.  Pure (stdlib only), so a single-node broker answers the
same shapes without loading anything of HA: role ``single``.

An HA node's side (gateway/ha/status.py) fills a :class:`View` from its live
objects on the event loop, and reads the group's ``/nodes`` records from
ZooKeeper (:meth:`Source.members`, blocking) in a worker thread: the API's
answer is a :class:`ClusterBody`, whose one blocking read the admin server
makes off the loop, as it does for an archive stream.

Lag is what the primary knows of each backup connected to it (the only node
that knows both ends): ``lag_lsns`` (LSNs written here and not acked there),
``lag_bytes`` (their journal record bytes) and ``lag_seconds`` (how long ago
the oldest of them was written here; 0 when caught up).  ``lag_exact`` is
false when the backup is behind what the primary still remembers of its
batches (a backup copying a snapshot): the figures are then lower bounds.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any, Protocol

SINGLE = "single"
# Metric samples, as (labels, value): metrics.py writes them with HELP and TYPE.
Family = tuple[str, str, str, list[tuple[str, float]]]


@dataclasses.dataclass(frozen=True, slots=True)
class Lag:
    """One backup connected to this primary, as the primary sees it."""

    node_id: str
    acked_lsn: int  # everything up to it is fsynced there
    acked_epoch: int  # the epoch of the batch holding acked_lsn
    in_sync: bool  # counts toward sync_replicas
    lag_lsns: int
    lag_bytes: int
    lag_seconds: float
    lag_exact: bool = True  # False: lower bounds (behind what the primary remembers)


@dataclasses.dataclass(frozen=True, slots=True)
class Member:
    """A node's record in ZooKeeper's ``/nodes`` (as it last published it)."""

    node_id: str
    role: str  # primary | backup | syncing
    epoch: int
    lsn: int
    advertise: str


@dataclasses.dataclass(frozen=True, slots=True)
class Members:
    """The group's records, or why they could not be read."""

    records: tuple[Member, ...] = ()
    error: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class View:
    """This node, live."""

    node_id: str
    role: str  # single | primary | backup | syncing | fenced
    state: str  # the role table's state (gateway/ha/node.py); "single" without [ha]
    epoch: int
    lsn: int
    states: tuple[str, ...] = (SINGLE,)  # every state there is: one role sample each
    failovers: int = 0  # promotions of this node to primary since it started
    primary: str | None = None  # who holds the lock, as far as this node knows
    sync_replicas: int = 0
    backups: tuple[Lag, ...] = ()  # on a primary: every connected backup
    waiting_for: tuple[int, int] | None = None  # a candidate short of nodes: (seen, needed)

    @property
    def in_sync(self) -> int:
        return sum(1 for b in self.backups if b.in_sync)


class Source(Protocol):
    def view(self) -> View:
        """This node now (on the event loop: it reads live objects)."""

    def members(self) -> Members:
        """The group's records (blocking: a worker thread calls it)."""


class Single:
    """The cluster of a broker without ``[ha]``: itself."""

    def __init__(self, lsn: Callable[[], int]) -> None:
        self.lsn = lsn

    def view(self) -> View:
        return View(node_id="", role=SINGLE, state=SINGLE, epoch=0, lsn=self.lsn())

    def members(self) -> Members:
        return Members()


def lag_fields(lag: Lag) -> dict[str, Any]:
    return {"acked_lsn": lag.acked_lsn, "acked_epoch": lag.acked_epoch, "in_sync": lag.in_sync,
            "lag_lsns": lag.lag_lsns, "lag_bytes": lag.lag_bytes, "lag_seconds": round(lag.lag_seconds, 3),
            "lag_exact": lag.lag_exact}


def document(view: View, members: Members) -> dict[str, Any]:
    """``GET /api/v1/cluster``: this node, then every node of the group (the
    ``/nodes`` records; this node's own entry with its live values, and each
    backup the primary serves with its replication figures, also one whose
    record is missing)."""
    me: dict[str, Any] = {"node_id": view.node_id, "role": view.role, "state": view.state, "epoch": view.epoch,
                          "lsn": view.lsn}
    out: dict[str, Any] = {**me, "failovers": view.failovers}
    if view.role == SINGLE:
        return {**out, "nodes": [{**me, "self": True}]}
    lags = {lag.node_id: lag for lag in view.backups}
    nodes: list[dict[str, Any]] = []
    seen = set()
    for record in sorted(members.records, key=lambda m: m.node_id):
        seen.add(record.node_id)
        if record.node_id == view.node_id:
            nodes.append({**me, "advertise": record.advertise, "self": True})
            continue
        entry: dict[str, Any] = {"node_id": record.node_id, "role": record.role, "epoch": record.epoch,
                                 "lsn": record.lsn, "advertise": record.advertise}
        lag = lags.get(record.node_id)
        if lag is not None and lag.acked_lsn >= record.lsn:  # fresher than its record (published every ~0.5 s)
            entry.update(epoch=lag.acked_epoch, lsn=lag.acked_lsn)
        if lag is not None:
            entry["replication"] = lag_fields(lag)
        nodes.append(entry)
    if view.node_id not in seen:  # ZooKeeper unreadable, or this node's record not (yet) there
        nodes.append({**me, "self": True})
    for lag in view.backups:
        if lag.node_id not in seen:  # connected, its session gone or not readable
            nodes.append({"node_id": lag.node_id, "role": None, "epoch": lag.acked_epoch, "lsn": lag.acked_lsn,
                          "advertise": None, "replication": lag_fields(lag)})
    out.update(primary=view.primary, nodes=nodes)
    if view.role == "primary":
        out.update(sync_replicas=view.sync_replicas, in_sync=view.in_sync)
    if view.waiting_for is not None:
        seen, needed = view.waiting_for
        out["waiting_for"] = {"nodes_seen": seen, "nodes_needed": needed}
    out["zookeeper"] = "ok" if members.error is None else members.error
    return out


def label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def families(view: View) -> list[Family]:
    """The ``gateway_ha_*`` metric families of this node.  Without [ha]
    only the role, ``single``, so a dashboard needs no special case."""
    roles = [(f'{{role="{label(state)}"}}', 1 if state == view.state else 0) for state in view.states]
    out: list[Family] = [("gateway_ha_role", "gauge",
                          "This node's HA state: 1 for the one it is in, 0 for the others (single: no [ha]).", roles)]
    if view.role == SINGLE:
        return out
    out += [
        ("gateway_ha_epoch", "gauge", "The epoch this node leads in (primary) or last accepted (backup).",
         [("", view.epoch)]),
        ("gateway_ha_lsn", "gauge", "The last LSN this node wrote (primary) or applied and fsynced (backup).",
         [("", view.lsn)]),
        ("gateway_ha_failovers_total", "counter", "Promotions of this node to primary since it started.",
         [("", view.failovers)]),
    ]
    if view.role != "primary":
        return out
    by_backup = [(f'{{backup="{label(lag.node_id)}"}}', lag) for lag in sorted(view.backups, key=lambda b: b.node_id)]
    out += [
        ("gateway_ha_backups_in_sync", "gauge", "Connected backups that count toward sync_replicas.",
         [("", view.in_sync)]),
        ("gateway_ha_sync_replicas", "gauge", "In-sync backups that must confirm a batch before its receipts.",
         [("", view.sync_replicas)]),
        ("gateway_ha_backup_acked_lsn", "gauge", "The last LSN a connected backup confirmed fsynced.",
         [(labels, lag.acked_lsn) for labels, lag in by_backup]),
        ("gateway_ha_backup_in_sync", "gauge", "1 while a connected backup counts toward sync_replicas.",
         [(labels, int(lag.in_sync)) for labels, lag in by_backup]),
        ("gateway_ha_replication_lag_bytes", "gauge",
         "Journal record bytes written here that a connected backup has not confirmed.",
         [(labels, lag.lag_bytes) for labels, lag in by_backup]),
        ("gateway_ha_replication_lag_seconds", "gauge",
         "Age of the oldest batch a connected backup has not confirmed (0: caught up).",
         [(labels, round(lag.lag_seconds, 3)) for labels, lag in by_backup]),
    ]
    return out


class ClusterBody:
    """The ``/api/v1/cluster`` answer as a streamed body: the view is taken
    on the event loop when the request is handled, the group's records are
    read (blocking) by the admin server's worker thread in :meth:`next_chunk`."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.view = source.view()
        self.done = False

    def next_chunk(self) -> bytes | None:
        if self.done:
            return None
        self.done = True
        return json.dumps(document(self.view, self.source.members()), separators=(",", ":")).encode()

    def close(self) -> None:
        pass


"""An HA primary's role in the broker: :class:`PrimaryRole`, what
gateway/app.py's ``Replication`` asks of it.  A :class:`Replicator` (the
replication stream's primary end, gateway/ha/replicator.py) over the store
the broker opened, with the receipt gate the server asks and the hold a
suspended primary puts on it (gateway/ha/runtime.py decides when), and the
watch on how many backups it has linked (:meth:`PrimaryRole.watch_isolation`:
gateway/ha/isolation.py says when a primary cut off from them steps down)."""

from __future__ import annotations

import ipaddress
import ssl
from collections.abc import Callable
from functools import partial
from typing import Any

import trio

from gateway.config import HaSettings
from gateway.ha.coordinator import CoordinationError
from gateway.ha.election import NodeRecord
from gateway.ha import isolation
from gateway.ha.replicator import Replicator
from gateway.ha.status import NodeStatus
from gateway.ha.window import Recent
from gateway.transports.server import Server
from persistence.journal import Batch
from persistence.replica.epochs import History
from persistence.store import Store

ISOLATION_CHECK_S = 0.5  # how often a primary counts its linked backups


def split_host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def replication_bind(ha: HaSettings) -> tuple[str, int]:
    """Where the replication listener binds: ``replication_listen``, but
    loopback only when no cluster secret is set (a laptop trial: anyone who
    reaches an open link could read the journal) unless ``open_links``."""
    host, port = split_host_port(ha.replication_listen)
    if ha.cluster_secret or ha.open_links or is_loopback(host):
        return host, port
    return ("::1" if ":" in host else "127.0.0.1"), port


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def warn_open_links(ha: HaSettings, log: Any) -> None:
    """Said once, at the process's start: a group without a cluster secret."""
    if ha.cluster_secret:
        return
    how = "set [ha] cluster_secret_file (or GATEWAY_CLUSTER_SECRET) to the same secret on every node"
    host, port = replication_bind(ha)
    if ha.open_links:
        log.warning("replication_link_open", listen=f"{host}:{port}",
                    detail=f"no cluster secret and open_links = true: anyone who reaches this port can read the "
                           f"journal and pose as a member; {how}")
    else:
        log.warning("replication_link_loopback_only", listen=f"{host}:{port}", configured=ha.replication_listen,
                    detail=f"no cluster secret: the replication listener binds loopback only, so other machines' "
                           f"nodes cannot follow this one; {how} (or open_links = true to accept anyone)")


class PrimaryRole:
    """The broker's :class:`app.Replication`: a :class:`Replicator` over the
    store the broker opened, its receipt hooks set to the broker's server."""

    def __init__(self, ha: HaSettings, history: History, log: Any, on_refused: Any, cluster: NodeStatus,
                 recent: Recent | None = None, ssl_context: ssl.SSLContext | None = None,
                 on_store_failed: Callable[[str], None] | None = None) -> None:
        self.ha, self.history, self.log, self.on_refused = ha, history, log, on_refused
        self.on_store_failed = on_store_failed  # the runtime's: it steps down
        self.ssl_context = ssl_context  # [ha] link_tls: the listener's TLS
        self.recent = Recent() if recent is None else recent  # the batches it applied last as a backup: its window's start
        self.replicator: Replicator | None = None
        self.cluster = cluster  # what its admin port shows of the group
        self.held: int | None = None  # the receipt gate, frozen while the ZooKeeper connection is suspended
        self.server: Server | None = None

    def attach(self, store: Store) -> None:
        self.replicator = Replicator(store, self.history, node_id=self.ha.node_id, sync_replicas=self.ha.sync_replicas,
                                  sync_timeout_s=self.ha.sync_timeout_s, on_refused=self.on_refused, log=self.log.info,
                                  secret=self.ha.cluster_secret, ping_interval_s=self.ha.link_heartbeat_s,
                                  idle_timeout_s=self.ha.link_timeout_s)
        self.replicator.seed(self.recent.frames())
        self.recent.clear()  # the window holds them now
        self.cluster.replicator = self.replicator

    def publish(self, batch: Batch) -> None:
        assert self.replicator is not None
        self.replicator.publish(batch)

    def receipt_lsn(self) -> int:
        assert self.replicator is not None
        lsn = self.replicator.receipt_lsn()
        return lsn if self.held is None else min(self.held, lsn)

    def hold(self) -> None:
        """Freeze the receipt gate where it is (its own guard with
        ``sync_replicas = 0``, where no backup's confirmation gates it)."""
        if self.replicator is not None and self.held is None:
            self.held = self.replicator.receipt_lsn()

    def store_failed(self, reason: str) -> None:
        """A batch failed to write or fsync (not for a full disk): hold every
        receipt from now on (a batch after it that seems to write proves
        nothing) and have the node step down."""
        self.hold()
        if self.on_store_failed is not None:
            self.on_store_failed(reason)

    def withdraw(self, reason: str) -> None:
        """Its run ends (deposed, fenced, stepping down): every receipt still
        held, on a batch written here but not confirmed, is withdrawn with an
        ERROR (a PUBACK withheld) naming it, as when its confirmation times
        out, rather than left behind the gate while the connection is cut."""
        if self.replicator is None or self.server is None:
            return
        first, last = self.receipt_lsn() + 1, self.replicator.store.appended_lsn
        if first <= last:
            self.server.durable_failed(first, last, reason, stored=True)

    def release(self) -> None:
        """Unfreeze the gate and wake the writers it held."""
        self.held = None
        if self.server is not None:
            self.server.durable_advanced()

    def serving(self, server: Server) -> None:
        assert self.replicator is not None
        self.server = server
        self.replicator.on_confirmed = server.durable_advanced
        # Written here, not confirmed: the client is told so, not "not stored".
        self.replicator.on_failed = partial(server.durable_failed, stored=True)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        assert self.replicator is not None
        host, port = replication_bind(self.ha)
        await self.replicator.run(host, port, ssl_context=self.ssl_context, task_status=task_status)

    async def watch_isolation(self, read_nodes: Callable[[], dict[str, NodeRecord]], epoch: int, quorum: int,
                              on_isolated: Callable[[str], None]) -> None:
        """Count the linked backups every :data:`ISOLATION_CHECK_S`; while
        too few are, read ``read_nodes`` (the coordinator's, blocking) too,
        and once ``quorum`` other nodes that may lead have said all along,
        for :func:`isolation.wait_s`, that they are unlinked from this
        primary (of ``epoch``), tell ``on_isolated`` why, once.  Said once,
        too, when they do not: it stays the primary, its receipts waiting."""
        after_s = isolation.wait_s(self.ha.zookeeper_session_timeout_s)
        watch, told = isolation.Isolation(self.ha.sync_replicas, after_s), False
        while True:
            await trio.sleep(ISOLATION_CHECK_S)
            linked = len(self.replicator.peers) if self.replicator is not None else 0
            if not watch.short(linked):
                watch.observe(False, trio.current_time())
                told = False
                continue
            try:
                records = await trio.to_thread.run_sync(read_nodes, abandon_on_cancel=True)
            except CoordinationError:
                # ZooKeeper did not answer: the suspension path is the one for
                # that; the wait starts over once it answers.
                watch.observe(False, trio.current_time())
                continue
            cut_off = isolation.cut_off_by(records.values(), self.ha.node_id, epoch, quorum)
            if watch.observe(cut_off, trio.current_time()):
                on_isolated(f"{linked} of sync_replicas = {self.ha.sync_replicas} backups linked, and {quorum} "
                            f"other node(s) that may lead said they had no link to it, for {after_s:g} s")
                return
            if not cut_off and not told:
                self.log.warning("ha_backups_unlinked", linked=linked, sync_replicas=self.ha.sync_replicas,
                                 detail="too few backups linked to confirm a batch, and too few live nodes in "
                                        "ZooKeeper say they are cut off from it to elect one without it: it stays "
                                        "the primary, receipts waiting for a backup to link")
                told = True

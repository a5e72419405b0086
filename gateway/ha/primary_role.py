"""An HA primary's part in the broker: :class:`PrimaryPart` is what
gateway/app.py's ``PrimaryRole`` asks for, a :class:`Primary` (the
replication stream's primary side, gateway/ha/replicator.py) over the store
the broker opened, with the receipt gate the server asks and the hold a
suspended primary puts on it (gateway/ha/runtime.py decides when)."""

from __future__ import annotations

from functools import partial
from typing import Any

import trio

from gateway.config import HaSettings
from gateway.ha.replicator import Primary
from gateway.ha.status import NodeStatus
from gateway.ha.window import Recent
from gateway.transports.server import Server
from persistence.epochs import History
from persistence.journal import Batch
from persistence.store import Store


def split_host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


class PrimaryPart:
    """The broker's :class:`app.PrimaryRole`: a :class:`Primary` over the
    store the broker opened, its receipt hooks set to the broker's server."""

    def __init__(self, ha: HaSettings, history: History, log: Any, on_refused: Any, cluster: NodeStatus,
                 recent: Recent | None = None) -> None:
        self.ha, self.history, self.log, self.on_refused = ha, history, log, on_refused
        self.recent = Recent() if recent is None else recent  # the batches it applied last as a backup: its window's start
        self.replicator: Primary | None = None
        self.cluster = cluster  # what its admin port shows of the group
        self.held: int | None = None  # the receipt gate, frozen while the ZooKeeper connection is suspended
        self.server: Server | None = None

    def attach(self, store: Store) -> None:
        self.replicator = Primary(store, self.history, node_id=self.ha.node_id, sync_replicas=self.ha.sync_replicas,
                                  sync_timeout_s=self.ha.sync_timeout_s, on_refused=self.on_refused, log=self.log.info)
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
        host, port = split_host_port(self.ha.replication_listen)
        await self.replicator.run(host, port, task_status=task_status)

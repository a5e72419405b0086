"""Coordinators as the HA tests drive them: each node a `Coordinator` whose
callbacks are written, in order, into one shared event log, and an election
loop that does what the broker does when /primary is absent: each node
publishes its record as final for the vacancy, then tries to lead."""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import structlog

from gateway.ha.coordinator import CoordinationError, Coordinator, StateCallbacks
from gateway.ha.election import NodeRecord, Role
from tests.support.zookeeper_helpers import ZooKeeperServer

ROOT = "/gateway"
SESSION_TIMEOUT_S = 3.0
WAIT_S = 20.0  # any wait for ZooKeeper news; far beyond the session timeout


class EventLog:
    """Facts from every node and the test, in the order they happened: (who, what, detail)."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str, object]] = []
        self.changed = threading.Condition()

    def add(self, who: str, what: str, detail: object = None) -> None:
        with self.changed:
            self.items.append((who, what, detail))
            self.changed.notify_all()

    def index(self, who: str, what: str, *detail: object) -> int:
        """Position of the first (who, what[, detail]); StopIteration if there is none."""
        with self.changed:
            return next(i for i, (w, k, d) in enumerate(self.items) if (w, k) == (who, what) and detail in ((), (d,)))

    def wait(self, who: str, what: str, timeout: float = WAIT_S) -> int:
        with self.changed:
            if not self.changed.wait_for(lambda: any((w, k) == (who, what) for w, k, _ in self.items), timeout):
                raise AssertionError(f"no {what!r} from {who} within {timeout} s; events: {self.items}")
        return self.index(who, what)

    def of(self, what: str) -> list[tuple[str, object]]:
        with self.changed:
            return [(w, d) for w, k, d in self.items if k == what]


class Node:
    """One HA node's coordination, without the broker: its record and its coordinator."""

    def __init__(self, zookeeper: ZooKeeperServer, node_id: str, log: EventLog, *, lsn: int, epoch: int = 0,
                 role: Role = Role.BACKUP, session_timeout_s: float = SESSION_TIMEOUT_S, auth: str = "") -> None:
        self.node_id = node_id
        self.log = log
        self.record = NodeRecord(node_id, f"{node_id}.test:7000", epoch, lsn, role)
        self.needs_join = False
        self.changes = 0
        callbacks = StateCallbacks(on_fence=lambda: log.add(node_id, "fence"), on_lost=self.lost,
                                   on_reconnect=lambda: log.add(node_id, "reconnect"))
        self.coordinator = Coordinator(f"{zookeeper.hosts}{ROOT}", node_id, session_timeout_s=session_timeout_s,
                                       callbacks=callbacks, log=structlog.get_logger("test"), auth=auth)
        self.closed = False

    def lost(self) -> None:
        self.needs_join = True  # a new session has no record of ours: join again once connected
        self.log.add(self.node_id, "lost")

    def start(self) -> Node:
        self.coordinator.connect()
        self.coordinator.join(self.record)
        return self

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.log.add(self.node_id, "closed")
            self.coordinator.close()

    def try_lead(self) -> int | None:
        if self.needs_join and self.coordinator.client.connected:
            self.record = dataclasses.replace(self.record, role=Role.BACKUP)
            try:
                self.coordinator.join(self.record)
            except CoordinationError:
                return None  # the new session is not there yet: next round
            self.needs_join = False
        try:
            self.settle()
        except CoordinationError:
            return None  # ZooKeeper away for the moment: next round
        epoch = self.coordinator.try_lead(self.record)
        if epoch is not None:
            self.record = dataclasses.replace(self.record, epoch=epoch, role=Role.PRIMARY)
        return epoch

    def settle(self) -> None:
        """While nobody leads, publish this node's record as final for the
        vacancy (its LSN is whatever the test gave it; nothing else moves it)."""
        if self.coordinator.primary() is not None:
            return
        vacancy = self.coordinator.epoch()
        if self.record.vacancy != vacancy:
            self.record = dataclasses.replace(self.record, vacancy=vacancy)
            self.coordinator.update(self.record)
            self.log.add(self.node_id, "settled", vacancy)

    def count_change(self) -> None:
        self.changes += 1


def elect(nodes: list[Node], log: EventLog, *, timeout: float = WAIT_S) -> Node:
    """Every live node tries to lead, all at once, round after round, until one
    does; as the broker does while /primary is absent.  Every attempt is
    logged ("tried" with its answer); "lead" when the lock is taken."""
    live = [n for n in nodes if not n.closed]
    deadline = time.monotonic() + timeout
    with ThreadPoolExecutor(max_workers=len(live)) as pool:
        while True:
            answers = list(pool.map(Node.try_lead, live))
            for node, epoch in zip(live, answers):
                log.add(node.node_id, "tried", epoch)
            leaders = [(n, e) for n, e in zip(live, answers) if e is not None]
            assert len(leaders) <= 1, f"two leaders in one round: {leaders}"
            if leaders:
                (leader, epoch), = leaders
                log.add(leader.node_id, "lead", epoch)
                return leader
            if time.monotonic() >= deadline:
                raise AssertionError(f"nobody led within {timeout} s; events: {log.items}")
            time.sleep(0.05)


def holders(nodes: list[Node]) -> list[str]:
    """The live nodes whose session owns /primary right now (one that cannot
    ask ZooKeeper at the moment owns nothing it could act on)."""
    def holds(node: Node) -> bool:
        try:
            return node.coordinator.holds_lock()
        except CoordinationError:
            return False

    return [n.node_id for n in nodes if not n.closed and holds(n)]

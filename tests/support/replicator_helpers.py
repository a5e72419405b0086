"""What the replication stream's tests share: a primary node in one Trio
process (a Store, the broker's own committer task, a Replicator serving on
127.0.0.1), backups (a Follower and a Backup) started and killed at will, a
stand-in for the server's receipt hooks, and bounded real waits."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from gateway import tasks
from gateway.admin import metrics
from gateway.ha.backup import Backup
from gateway.ha.replicator import Replicator
from persistence.replica import epochs
from persistence.replica.follower import Follower
from persistence.store import Store
from tests.support.replication_helpers import follower, primary

H1 = ((1, 1),)
WAIT_S = 20.0


class Events:
    """A log: every (event, fields), as the replicator's ``log`` callable
    and as the committer's structlog-like logger."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: str, **fields: Any) -> None:
        self.seen.append((event, fields))

    def error(self, event: str, **fields: Any) -> None:
        self(event, **fields)

    def named(self, event: str) -> list[dict[str, Any]]:
        return [fields for name, fields in self.seen if name == event]


class Receipts:
    """The server's side of the receipt gate: what the replicator wakes
    (durable_advanced; counted apart from the committer's wakes) and fails
    (durable_failed)."""

    def __init__(self) -> None:
        self.advanced = 0
        self.confirmations = 0
        self.failed: list[tuple[int, int, str]] = []

    def confirmed(self) -> None:
        self.confirmations += 1

    def durable_advanced(self) -> None:
        self.advanced += 1

    def durable_failed(self, first_lsn: int, last_lsn: int, reason: str) -> None:
        self.failed.append((first_lsn, last_lsn, reason))


async def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Poll ``condition`` (real time, bounded)."""
    with trio.move_on_after(timeout_s):
        while not condition():
            await trio.sleep(0.01)
        return
    raise AssertionError(f"not within {timeout_s} s: {what}")


class PrimaryNode:
    """A primary: its Store in ``data_dir``, the committer (gateway/tasks.py's
    commit, with the replicator) and the Replicator listening on a free port."""

    def __init__(self, data_dir: Path, history: epochs.History = H1, **options: Any) -> None:
        self.store: Store = primary(data_dir)
        epochs.save(data_dir / "store", history)
        self.receipts = Receipts()
        self.log = Events()
        self.lot = trio.lowlevel.ParkingLot()
        self.replicator = Replicator(self.store, history, node_id="p", on_confirmed=self.receipts.confirmed,
                                  on_failed=self.receipts.durable_failed, log=self.log, **options)
        self.port = 0

    async def start(self, nursery: trio.Nursery) -> None:
        nursery.start_soon(tasks.commit, self.store, self.receipts, self.lot, self.log, metrics.Histogram(),
                           trio.CapacityLimiter(1), None, self.replicator)
        self.port = await nursery.start(self.replicator.run, "127.0.0.1", 0)

    async def commit(self) -> int:
        """Run the commit path until all that is appended is written."""
        self.lot.unpark_all()
        await wait_for(lambda: self.store.durable_lsn == self.store.appended_lsn, "the committer wrote")
        return self.store.durable_lsn

    async def confirmed(self, lsn: int | None = None) -> None:
        target = self.store.durable_lsn if lsn is None else lsn
        await wait_for(lambda: self.replicator.confirmed_lsn() >= target, f"confirmation of lsn {target}")


class BackupNode:
    """A backup's Follower and Backup, run in a cancel scope of its own."""

    def __init__(self, data_dir: Path, node_id: str, port: int, make: Callable[[Path], Follower] = follower,
                 **options: Any) -> None:
        self.follower = make(data_dir)
        self.refusals: list[str] = []
        self.log = Events()
        self.backup = Backup(self.follower, node_id, "127.0.0.1", port, on_refused=self.refusals.append,
                             log=self.log, **options)
        self.scope = trio.CancelScope()
        self.ended: str | None = None
        self.done = trio.Event()

    def start(self, nursery: trio.Nursery) -> BackupNode:
        nursery.start_soon(self._run)
        return self

    async def _run(self) -> None:
        with self.scope:
            self.ended = await self.backup.run()
        self.done.set()

    async def kill(self) -> None:
        """As a crash: cancelled, the folder dropped without a flush."""
        self.scope.cancel()
        await self.done.wait()
        self.follower.abandon()

    async def stop(self) -> None:
        self.scope.cancel()
        await self.done.wait()
        self.follower.close()

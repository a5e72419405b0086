"""A backup says when it is at the live edge, and a lost backup disk is
recovered without losing a receipt.

In one Trio process (a Replicator and Backups over real sockets): a backup is
told it is in sync exactly when the primary counts it toward sync_replicas,
after a tail and after a snapshot, and stops being so when its link ends.

End to end (a real ZooKeeper, `gateway serve` nodes): a backup whose data
folder is deleted restarts empty, copies the primary's store (a snapshot,
then the tail) while a STOMP producer keeps getting receipts on one
connection, reaches backup_in_sync in its /metrics and /readyz; then the
primary is SIGKILLed and that backup, the only one left, takes over and
delivers every receipted message."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import trio

from tests.support.ha_nodes import WAIT_S, Node, wait_ready, wait_role
from tests.support.helpers import RawClient
from tests.support.processes import HOST
from tests.support.replicator_helpers import BackupNode, PrimaryNode, wait_for
from tests.support.replication_helpers import everything
from tests.support.store_helpers import message
from tests.support.zookeeper_helpers import ZooKeeperServer

# -- in one process -------------------------------------------------------------


class Reports:
    """What a Backup reports, in order."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def caught_up(self) -> None:
        self.seen.append("caught_up")

    def behind(self) -> None:
        self.seen.append("behind")


def reporting(tmp_path: Path, name: str, port: int, reports: Reports) -> BackupNode:
    return BackupNode(tmp_path / name, name, port, on_caught_up=reports.caught_up, on_behind=reports.behind)


async def test_a_backup_reports_caught_up_as_the_primary_counts_it(tmp_path: Path) -> None:
    node = PrimaryNode(tmp_path / "p", window_bytes=4096)
    async with trio.open_nursery() as nursery:
        await node.start(nursery)
        everything(node.store, n=10, tag="a")
        await node.commit()
        first = Reports()
        b = reporting(tmp_path, "b", node.port, first).start(nursery)
        await wait_for(lambda: first.seen == ["caught_up"], "the backup caught up by tail")
        # Told only once the primary counts it, and with everything acked.
        assert node.replicator.in_sync() == ["b"] and b.backup.in_sync
        assert b.follower.last_lsn == node.store.durable_lsn and node.replicator.confirmed_lsn() == b.follower.last_lsn
        everything(node.store, n=5, tag="b")
        await node.commit()
        await node.confirmed()
        assert first.seen == ["caught_up"]  # still in sync: nothing more to say
        await b.kill()
        assert first.seen == ["caught_up", "behind"] and not b.backup.in_sync
        await wait_for(lambda: node.replicator.in_sync() == [], "the primary no longer counts it")
        # While it is away the primary writes far more than its window: it comes back by snapshot.
        for i in range(60):
            node.store.add_message(message(f"away{i}", body=b"w" * 200), ["/queue/away"])
            await node.commit()
        second = Reports()
        b = reporting(tmp_path, "b", node.port, second).start(nursery)
        await wait_for(lambda: second.seen == ["caught_up"], "the backup caught up by snapshot")
        assert b.backup.snapshots == 1 and node.replicator.in_sync() == ["b"]
        names = [name for name, _ in b.log.seen]
        assert names.index("snapshot_receiving") < names.index("replication_in_sync")
        await b.stop()
        assert second.seen == ["caught_up", "behind"]
        nursery.cancel_scope.cancel()
    node.store.close()


# -- end to end -------------------------------------------------------------------

FILLER_BYTES = 256 * 1024
# More than the primary's window of recent batches (32 MiB): an empty backup
# can no longer be streamed the journal from its start and gets a snapshot.
FILLER_COUNT = 140
WINDOW = 8


class Producer(threading.Thread):
    """Receipted persistent SENDs on one connection, one after another, until
    stopped; ``receipted`` holds the id of every one whose RECEIPT came (an
    ERROR or a closed connection ends it, kept in ``failure``)."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.client = RawClient((HOST, port), timeout=WAIT_S)
        self.client.connect()
        self.receipted: list[str] = []
        self.stop = threading.Event()
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                rid = f"live-{len(self.receipted)}"
                self.client.send_frame("SEND", {"destination": "/queue/live", "persistent": "true", "receipt": rid},
                                       rid.encode())
                self.client.receipt(rid, timeout=2 * WAIT_S)  # an ERROR instead fails here
                self.receipted.append(rid)
                self.stop.wait(0.01)
        except BaseException as exc:  # reported by the test
            self.failure = exc

    def count_after(self, n: int) -> None:
        """Wait until ``n`` more receipts came than now."""
        target = len(self.receipted) + n
        deadline = threading.Event()
        timer = threading.Timer(2 * WAIT_S, deadline.set)
        timer.start()
        try:
            while len(self.receipted) < target and self.failure is None and not deadline.is_set():
                deadline.wait(0.05)
        finally:
            timer.cancel()
        assert self.failure is None, f"the producer failed: {self.failure!r}"
        assert len(self.receipted) >= target, f"only {len(self.receipted)} receipts of {target}"


def fill(port: int) -> list[str]:
    """FILLER_COUNT receipted big SENDs (WINDOW at a time); their ids."""
    client = RawClient((HOST, port), timeout=WAIT_S)
    client.connect()
    body = b"f" * FILLER_BYTES
    ids = [f"filler-{i}" for i in range(FILLER_COUNT)]
    for start in range(0, FILLER_COUNT, WINDOW):
        window = ids[start:start + WINDOW]
        for rid in window:
            client.send_frame("SEND", {"destination": "/queue/filler", "persistent": "true", "receipt": rid,
                                       "x-id": rid}, body)
        for rid in window:
            client.receipt(rid, timeout=WAIT_S)
    client.close()
    return ids


def drain(port: int, expected: dict[str, set[str]]) -> dict[str, list[str]]:
    """Every message of each queue (by its id), until each has as many as expected, then a quiet spell."""
    consumer = RawClient((HOST, port), timeout=WAIT_S)
    consumer.connect()
    got: dict[str, list[str]] = {queue: [] for queue in expected}
    for queue in expected:
        consumer.send_frame("SUBSCRIBE", {"destination": queue, "id": queue, "ack": "auto"})
    while any(len(got[q]) < len(expected[q]) for q in expected):
        frame = consumer.expect("MESSAGE", timeout=WAIT_S)
        queue = frame.headers["subscription"]
        got[queue].append(frame.headers.get("x-id") or frame.body.decode())
    for frame in consumer.quiet_for(1.0):  # none twice, none more
        got[frame.headers["subscription"]].append(frame.headers.get("x-id") or frame.body.decode())
    consumer.close()
    return got


def test_a_backup_that_lost_its_disk_catches_up_and_then_takes_over_with_every_receipt(
        tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    # A long sync timeout: with two nodes, receipts wait while the only backup is away (latency, not ERROR).
    nodes = [Node(tmp_path, name, zookeeper, sync_timeout_s=4 * WAIT_S, replicas=2).start() for name in ("gw-0", "gw-1")]
    producer: Producer | None = None
    try:
        primary = wait_ready(nodes)
        (backup,) = [n for n in nodes if n is not primary]
        wait_role(backup, "backup_in_sync")
        fillers = fill(primary.stomp_port)
        producer = Producer(primary.stomp_port)
        producer.start()
        producer.count_after(20)

        backup.kill()
        shutil.rmtree(backup.data_dir)  # the lost disk
        backup.start()
        wait_role(backup, "backup_in_sync")
        assert "not ready: backup_in_sync" in (backup.get("/readyz") or (0, ""))[1]
        log = backup.log_path.read_text(errors="replace")
        assert "snapshot_installed" in log, backup.log_tail()  # a copy of the store, not the journal from its start
        producer.count_after(20)  # and the tail after it
        producer.stop.set()
        producer.join(2 * WAIT_S)
        assert not producer.is_alive() and producer.failure is None, repr(producer.failure)
        assert not producer.client.eof, "the producer's connection was closed"
        receipted = list(producer.receipted)

        primary.kill()
        assert wait_ready([backup]) is backup
        got = drain(backup.stomp_port, {"/queue/live": set(receipted), "/queue/filler": set(fillers)})
        assert sorted(got["/queue/filler"]) == sorted(fillers)
        assert sorted(got["/queue/live"]) == sorted(receipted)  # every one sent was receipted (one at a time)
    finally:
        if producer is not None:
            producer.stop.set()
            producer.client.close()
        for node in nodes:
            node.kill()

"""After a failover a backup a little behind the new primary resumes by tail,
not by a snapshot: the new primary's replication window starts with the
batches it applied last as a backup (gateway/ha/window.py), sent under its
new epoch.  First over the stream in one Trio process (a primary, two
Backups, one promoted by hand), then with `gateway serve` processes and a
real ZooKeeper: under receipted load one backup is stopped (SIGSTOP) so that
it falls several megabytes behind, the primary is SIGKILLed, the other backup
wins, and the stopped one, resumed, is served by tail; the killed node,
restarted, catches up too, and every receipted message is delivered."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import trio

from gateway.ha.window import Recent
from persistence.replica import epochs
from tests.support.ha_nodes import WAIT_S, Node, wait_ready, wait_role
from tests.support.helpers import RawClient
from tests.support.processes import HOST
from tests.support.replicator_helpers import BackupNode, PrimaryNode, wait_for
from tests.support.replication_helpers import everything, folder_state
from tests.support.zookeeper_helpers import ZooKeeperServer


async def test_over_the_stream_a_promoted_backup_serves_a_backup_behind_it_by_tail(tmp_path: Path) -> None:
    a = PrimaryNode(tmp_path / "a")
    kept = Recent()
    async with trio.open_nursery() as nursery:
        async with trio.open_nursery() as a_tasks:
            await a.start(a_tasks)
            b = BackupNode(tmp_path / "b", "b", a.port, recent=kept).start(nursery)
            c = BackupNode(tmp_path / "c", "c", a.port).start(nursery)
            everything(a.store, n=8, tag="x")
            await a.commit()
            await wait_for(lambda: a.replicator.in_sync() == ["b", "c"], "both backups in sync")
            await c.kill()  # C misses what follows
            for tag in "yz":
                everything(a.store, n=8, tag=tag)
                await a.commit()
            await wait_for(lambda: b.follower.last_lsn == a.store.durable_lsn, "B has everything")
            a_tasks.cancel_scope.cancel()  # A dies
        a.store.abandon()
        await b.stop()
        # B is promoted: epoch 2 from its next LSN, its window seeded with what it kept.
        last = b.follower.last_lsn
        history = epochs.extended(epochs.load(tmp_path / "b" / "store"), 2, last + 1)
        new = PrimaryNode(tmp_path / "b", history)
        new.replicator.seed(kept.frames())
        await new.start(nursery)
        c = BackupNode(tmp_path / "c", "c", new.port).start(nursery)
        behind = c.follower.last_lsn
        await wait_for(lambda: new.replicator.in_sync() == ["c"], "C caught up")
        assert behind < last
        assert [(x["answer"], x["lsn"]) for x in new.log.named("backup_connected")] == [("tail", behind)]
        assert c.log.named("snapshot_receiving") == [] and c.refusals == []
        assert epochs.epoch_of(c.follower.history, last) == 1  # the old records stay epoch 1's
        everything(new.store, n=4, tag="new")  # and the new primary's own batches follow
        await new.commit()
        await new.confirmed()
        await c.stop()
        nursery.cancel_scope.cancel()
    new.store.close()
    assert folder_state(tmp_path / "c") == folder_state(tmp_path / "b")


BODY_BYTES = 4096
# Receipted while the stopped backup is away: well past what the primary sends
# to a backup that does not ack (4 MiB), well within the window (32 MiB).
AWAY = 2400
CHUNK = 100


def body(i: int) -> bytes:
    return f"m{i} ".encode().ljust(BODY_BYTES, b".")


def receipts(client: RawClient, wanted: set[str], timeout: float = 30) -> set[str]:
    """RECEIPTs read until every one of ``wanted`` came (any order), or the link ended."""
    got: set[str] = set()
    while not wanted <= got:
        try:
            frame = client.next_frame(timeout)
        except (AssertionError, OSError):
            break  # closed, reset, or silent: what came is what was receipted
        assert frame.command == "RECEIPT", f"expected RECEIPT, got {frame!r}"
        got.add(frame.headers["receipt-id"])
    return got


def send(client: RawClient, first: int, count: int) -> set[str]:
    for i in range(first, first + count):
        client.send_frame("SEND", {"destination": "/queue/orders", "persistent": "true", "receipt": str(i)}, body(i))
    return {str(i) for i in range(first, first + count)}


def connections(node: Node, backup: str) -> list[tuple[str, int]]:
    """(answer, the backup's LSN) of each `backup_connected` of ``backup`` in ``node``'s log."""
    out = []
    for line in node.log_path.read_text(errors="replace").splitlines():
        if "backup_connected" in line and f"backup={backup} " in line + " ":
            out.append((re.search(r"answer=(\w+)", line).group(1), int(re.search(r" lsn=(\d+)", line).group(1))))  # type: ignore[union-attr]
    return out


def seeded_up_to(node: Node) -> int:
    found = re.search(r"replication_window_seeded.* last_lsn=(\d+)", node.log_path.read_text(errors="replace"))
    assert found, "no seeded window\n" + node.log_tail()
    return int(found.group(1))


def test_after_a_sigkill_of_the_primary_the_backup_behind_resumes_by_tail(tmp_path: Path,
                                                                         zookeeper: ZooKeeperServer) -> None:
    # A session timeout longer than the stop, so the stopped backup stays in the group.
    nodes = [Node(tmp_path, name, zookeeper, session_timeout_s=10).start() for name in ("gw-0", "gw-1", "gw-2")]
    stopped: Node | None = None
    try:
        old = wait_ready(nodes)
        winner, lagging = [n for n in nodes if n is not old]
        for backup in (winner, lagging):
            wait_role(backup, "backup_in_sync")
        producer = RawClient((HOST, old.stomp_port), timeout=30)
        producer.connect()
        receipted = receipts(producer, send(producer, 0, CHUNK))
        assert len(receipted) == CHUNK
        assert lagging.proc is not None
        lagging.proc.send_signal(signal.SIGSTOP)
        stopped = lagging
        for first in range(CHUNK, CHUNK + AWAY, CHUNK):  # confirmed by the winner alone
            got = receipts(producer, send(producer, first, CHUNK))
            assert len(got) == CHUNK, old.log_tail()
            receipted |= got
        # Under load: a chunk on its way, some of it receipted, when the primary is killed.
        sent = CHUNK + AWAY + CHUNK
        wanted = send(producer, CHUNK + AWAY, CHUNK)
        receipted |= receipts(producer, {min(wanted, key=int)})
        old.kill()
        lagging.proc.send_signal(signal.SIGCONT)
        stopped = None
        receipted |= receipts(producer, wanted, timeout=2)
        producer.abort()
        assert wait_ready([winner, lagging]) is winner  # it holds the most
        wait_role(lagging, "backup_in_sync")
        # The backup left behind was answered from the seeded window, by tail.
        mark = len(lagging.log_path.read_text(errors="replace"))
        answers = connections(winner, lagging.node_id)
        assert answers and answers[0][0] == "tail" and answers[0][1] < seeded_up_to(winner), answers
        assert "snapshot_receiving" not in lagging.log_path.read_text(errors="replace")[mark:]
        # The killed node, restarted, catches up (by tail, or by snapshot if it
        # held an unconfirmed tail of its own) and confirms the new primary's batches.
        old.start()
        wait_role(old, "backup_in_sync")
        assert [a for a, _ in connections(winner, old.node_id)][-1] in ("tail", "snapshot")
        consumer = RawClient((HOST, winner.stomp_port), timeout=30)
        consumer.connect()
        consumer.send_frame("SUBSCRIBE", {"destination": "/queue/orders", "id": "s", "ack": "auto"})
        delivered: list[bytes] = []
        missing = {body(int(i)) for i in receipted}
        while missing:
            delivered.append(consumer.expect("MESSAGE", timeout=WAIT_S).body)
            missing.discard(delivered[-1])
        delivered += [f.body for f in consumer.quiet_for(2.0)]
        assert len(delivered) == len(set(delivered)) and set(delivered) <= {body(i) for i in range(sent)}
        consumer.send_frame("SEND", {"destination": "/queue/later", "persistent": "true", "receipt": "after"}, b"x")
        consumer.receipt("after", timeout=30)
        consumer.close()
    finally:
        if stopped is not None and stopped.proc is not None:
            stopped.proc.send_signal(signal.SIGCONT)
        for node in nodes:
            node.kill()

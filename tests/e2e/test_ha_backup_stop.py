"""A backup told to stop following (its primary is gone: the runtime stops
it before the election) at the moment it has taken a batch off the wire but
not yet begun writing it.  Seen in benchmarks/failover.py: the batch stayed
"being written" in the Follower forever, so the next primary's snapshot
(begin_snapshot) and the process's own close (flush) raised RuntimeError and
the node died.  Nothing of such a batch is written or acked; the Follower
closes cleanly, and a new Backup over it follows the primary again."""

from __future__ import annotations

from pathlib import Path

import trio

from gateway.ha.backup import Backup
from tests.support.replicator_helpers import PrimaryNode, wait_for
from tests.support.replication_helpers import everything, folder_state, follower


async def test_a_backup_stopped_before_it_writes_a_batch_leaves_its_follower_usable(tmp_path: Path) -> None:
    node = PrimaryNode(tmp_path / "p")
    f = follower(tmp_path / "b")
    threads = trio.CapacityLimiter(1)
    async with trio.open_nursery() as nursery:
        await node.start(nursery)
        everything(node.store, n=4, tag="a")
        first = await node.commit()
        scope = trio.CancelScope()
        done = trio.Event()

        async def follow() -> None:
            with scope:
                await Backup(f, "b", "127.0.0.1", node.port, threads=threads).run()
            done.set()

        nursery.start_soon(follow)
        await wait_for(lambda: f.last_lsn == first, "the backup has the first batch")
        await threads.acquire()  # the backup's next write waits for a worker thread...
        everything(node.store, n=4, tag="b")
        second = await node.commit()
        await wait_for(lambda: threads.statistics().tasks_waiting == 1, "the second batch taken, its write waiting")
        scope.cancel()  # ...when it is told to stop
        await done.wait()
        threads.release()
        assert f.last_lsn == first  # nothing of the second batch is held, so nothing of it was acked
        again = trio.CancelScope()

        async def follow_again() -> None:
            with again:
                await Backup(f, "b", "127.0.0.1", node.port, threads=threads).run()

        nursery.start_soon(follow_again)
        await wait_for(lambda: f.last_lsn == second, "a new Backup over the same follower caught up")
        await node.confirmed(second)
        again.cancel()
        nursery.cancel_scope.cancel()
    f.close()  # raised "flush while a batch is being written" before
    node.store.close()
    assert folder_state(tmp_path / "b") == folder_state(tmp_path / "p")

"""The replication stream over real sockets on 127.0.0.1, in one Trio
process: a primary Store written through the broker's own committer with a
Replicator (gateway/ha/replicator.py) and Backups (gateway/ha/backup.py) into
Followers in other folders.  Receipts are gated on confirmations; each
backup's folder opens as a plain Store holding the primary's state; a killed
backup resumes by tail, a wiped one by snapshot while the primary writes, a
too slow one is cut to a snapshot with the primary's memory bounded, and a
primary of an older epoch is refused and never confirmed."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import trio

from persistence.archive import Archive
from persistence.replica import epochs
from persistence.replica import replication as r
from persistence.replica.follower import Follower
from persistence.replica.replication import split_runs
from tests.support.replicator_helpers import BackupNode, PrimaryNode, wait_for
from tests.support.replication_helpers import SEGMENT, everything, folder_state, follower, frame_of
from tests.support.store_helpers import message


def same_state(tmp_path: Path, *backups: str) -> None:
    expected = folder_state(tmp_path / "p")
    for name in backups:
        assert folder_state(tmp_path / name) == expected, name


async def test_receipts_wait_for_the_required_backups_and_their_folders_hold_the_primary_state(tmp_path: Path) -> None:
    node = PrimaryNode(tmp_path / "p", sync_replicas=2)
    async with trio.open_nursery() as nursery:
        await node.start(nursery)
        everything(node.store, n=10, tag="a")
        lsn = await node.commit()
        gate = node.replicator.receipt_lsn
        assert lsn > 0 and node.replicator.confirmed_lsn() == 0 and gate() == 0  # no backup: nothing released
        one = BackupNode(tmp_path / "b1", "b1", node.port).start(nursery)
        await wait_for(lambda: one.follower.last_lsn == lsn, "b1 has the tail")
        everything(node.store, n=10, tag="b")
        lsn = await node.commit()
        await wait_for(lambda: node.replicator.in_sync() == ["b1"] and node.replicator.peers["b1"].acked == lsn,
                       "b1 in sync")
        # One in-sync backup has acked everything; two are required.
        assert node.replicator.confirmed_lsn() == 0 and gate() == 0 and node.receipts.confirmations == 0
        two = BackupNode(tmp_path / "b2", "b2", node.port).start(nursery)
        await wait_for(lambda: node.replicator.confirmed_lsn() == lsn, "b2 acked the newest batch too")
        everything(node.store, n=10, tag="c")
        lsn = await node.commit()
        await node.confirmed(lsn)
        assert gate() == lsn == node.store.durable_lsn and node.receipts.confirmations > 0
        assert node.replicator.in_sync() == ["b1", "b2"] and node.receipts.failed == []
        await one.stop()
        await two.stop()
        nursery.cancel_scope.cancel()
    node.store.close()
    same_state(tmp_path, "b1", "b2")


async def test_a_killed_backup_restarts_and_resumes_by_tail(tmp_path: Path) -> None:
    node = PrimaryNode(tmp_path / "p")
    async with trio.open_nursery() as nursery:
        await node.start(nursery)
        b = BackupNode(tmp_path / "b", "b", node.port).start(nursery)
        for tag in "ab":
            everything(node.store, n=8, tag=tag)
            await node.commit()
        await node.confirmed()
        await b.kill()
        everything(node.store, n=8, tag="while-down")  # the primary goes on
        await node.commit()
        assert node.replicator.confirmed_lsn() < node.store.durable_lsn
        b = BackupNode(tmp_path / "b", "b", node.port).start(nursery)
        await wait_for(lambda: b.follower.last_lsn == node.store.durable_lsn, "the restarted backup caught up")
        everything(node.store, n=8, tag="c")
        await node.commit()
        await node.confirmed()
        answers = [c["answer"] for c in node.log.named("backup_connected")]
        assert answers == ["tail", "tail"] and b.backup.snapshots == 0  # never copied: the window had it
        await b.stop()
        nursery.cancel_scope.cancel()
    node.store.close()
    same_state(tmp_path, "b")


async def test_a_wiped_backup_catches_up_by_snapshot_while_the_primary_keeps_writing(tmp_path: Path) -> None:
    node = PrimaryNode(tmp_path / "p", window_bytes=4096)
    async with trio.open_nursery() as nursery:
        await node.start(nursery)
        b = BackupNode(tmp_path / "b", "b", node.port).start(nursery)
        everything(node.store, n=20, tag="a")
        await node.commit()
        await node.confirmed()
        await b.kill()
        shutil.rmtree(tmp_path / "b")  # the lost disk
        node.store.checkpoint()
        everything(node.store, n=20, tag="b")
        await node.commit()
        b = BackupNode(tmp_path / "b", "b", node.port).start(nursery)
        written = 0
        with trio.move_on_after(30):
            while not node.log.named("snapshot_sent") or written < 40:  # writes before, during and after the copy
                node.store.add_message(message(f"live{written}", body=b"l" * 100), ["/queue/live"])
                written += 1
                await node.commit()
                await trio.sleep(0.005)
        await node.confirmed()
        [sent] = node.log.named("snapshot_sent")
        assert b.backup.snapshots == 1 and sent["lsn"] < node.store.durable_lsn  # more came after the copy, by tail
        assert node.replicator.in_sync() == ["b"]
        await b.stop()
        nursery.cancel_scope.cancel()
    node.store.close()
    same_state(tmp_path, "b")


async def test_a_backup_refuses_a_primary_of_an_older_epoch_which_never_gets_a_confirmation(tmp_path: Path) -> None:
    (tmp_path / "b" / "store").mkdir(parents=True)
    epochs.save(tmp_path / "b" / "store", ((2, 1),))  # it follows the primary of epoch 2 already
    node = PrimaryNode(tmp_path / "p", sync_timeout_s=0.5)  # a stale primary of epoch 1
    async with trio.open_nursery() as nursery:
        await node.start(nursery)
        everything(node.store, n=5)
        lsn = await node.commit()
        b = BackupNode(tmp_path / "b", "b", node.port).start(nursery)
        await b.done.wait()
        assert b.ended is not None and "stale epoch 1: epoch 2 is accepted here" in b.ended
        assert b.refusals == ["stale epoch 1: epoch 2 is accepted here"]
        assert b.follower.last_lsn == 0 and b.follower.epoch == 2  # nothing of epoch 1 written
        everything(node.store, n=5, tag="more")
        await node.commit()
        await wait_for(lambda: node.receipts.failed and node.receipts.failed[-1][1] == node.store.durable_lsn,
                       "the waiting receipts failed")
        assert node.replicator.confirmed_lsn() == 0 and node.replicator.receipt_lsn() == 0
        first, _, reason = node.receipts.failed[0]
        assert first == 1 and node.receipts.failed[0][1] >= lsn
        assert reason == "not confirmed by 1 in-sync backup within 0.5 s (0 in sync)"
        b.follower.close()
        nursery.cancel_scope.cancel()
    node.store.close()


class SlowFollower(Follower):
    """A backup whose disk is slow: every batch write takes 30 ms more."""

    def write(self, step):  # type: ignore[no-untyped-def]
        time.sleep(0.03)
        super().write(step)


def slow_follower(data_dir: Path) -> Follower:
    f = SlowFollower(data_dir / "store", segment_bytes=SEGMENT, archive=Archive(data_dir / "archive", segment_bytes=1024))
    f.open()
    return f


async def test_a_backup_too_slow_is_cut_to_a_snapshot_and_the_primary_memory_stays_bounded(tmp_path: Path) -> None:
    node = PrimaryNode(tmp_path / "p", window_bytes=8192, unacked_bytes=1024)
    async with trio.open_nursery() as nursery:
        await node.start(nursery)
        b = BackupNode(tmp_path / "b", "b", node.port, make=slow_follower).start(nursery)
        for i in range(150):  # ~150 batches of ~300 bytes: far more than the window, faster than the backup
            for j in range(3):
                node.store.add_message(message(f"m{i}.{j}", body=b"s" * 40), ["/queue/slow"])
            await node.commit()
        assert node.log.named("backup_cut_to_snapshot")
        assert node.replicator.window_peak <= 8192 and node.replicator.window_held <= 8192
        await node.confirmed()  # once the writes stop, it catches up and is in sync again
        assert b.backup.snapshots >= 1 and node.replicator.in_sync() == ["b"]
        await b.stop()
        nursery.cancel_scope.cancel()
    node.store.close()
    same_state(tmp_path, "b")


async def test_a_backup_that_kept_part_of_a_batch_gets_the_rest_of_it(tmp_path: Path) -> None:
    node = PrimaryNode(tmp_path / "p")
    async with trio.open_nursery() as nursery:
        await node.start(nursery)
        everything(node.store, n=10)
        batch = node.store.take_batch()  # by hand (the committer is idle): we need its frame
        assert batch is not None
        node.store.write_batch(batch)
        node.store.batch_written(batch)
        node.replicator.publish(batch)
        # A backup that crashed while writing it: a prefix of its records is on disk.
        f = follower(tmp_path / "b")
        pieces = list(split_runs(batch.first_lsn, frame_of(batch, 1).runs, 1))
        for first, last, runs in pieces[: len(pieces) // 2]:
            f.apply(r.Batch(1, first, last, runs))
        held = f.last_lsn
        f.close()
        assert batch.first_lsn < held < batch.last_lsn
        b = BackupNode(tmp_path / "b", "b", node.port).start(nursery)
        await node.confirmed()
        assert [c["answer"] for c in node.log.named("backup_connected")] == ["tail"] and b.refusals == []
        await b.stop()
        nursery.cancel_scope.cancel()
    node.store.close()
    same_state(tmp_path, "b")

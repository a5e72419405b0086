"""The primary's bookkeeping without sockets, on Trio's autojump clock: the
sync timeout fails what waits on confirmations (through the server's
durable_failed path), batch by batch; the window of recent batches stays
within its bound; with sync_replicas = 0 the local disk alone releases."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from gateway.ha.replicator import Replicator
from persistence.store import Store
from tests.support.replicator_helpers import H1, Receipts
from tests.support.replication_helpers import primary
from tests.support.store_helpers import message


def write(store: Store, replicator: Replicator, count: int = 1, size: int = 50) -> int:
    """Append ``count`` messages and commit them as one batch, as the committer does."""
    for _ in range(count):
        store.add_message(message(f"m{store.appended_lsn}", body=b"x" * size), ["/queue/a"])
    batch = store.take_batch()
    assert batch is not None
    store.write_batch(batch)
    store.batch_written(batch)
    replicator.publish(batch)
    return batch.last_lsn


async def test_receipts_waiting_longer_than_sync_timeout_fail_with_the_reason(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    store = primary(tmp_path)
    receipts = Receipts()
    p = Replicator(store, H1, node_id="p", sync_replicas=2, sync_timeout_s=10, on_failed=receipts.durable_failed)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(p.watch_sync)
        first = write(store, p, 3)
        await trio.sleep(5)
        second = write(store, p, 2)
        await trio.sleep(4.9)
        assert receipts.failed == [] and p.receipt_lsn() == 0  # waiting, bounded
        await trio.sleep(0.2)
        reason = "not confirmed by 2 in-sync backups within 10 s (0 in sync)"
        assert receipts.failed == [(1, first, reason)]  # the first batch only: the second has 5 s left
        await trio.sleep(5)
        assert receipts.failed == [(1, first, reason), (first + 1, second, reason)]
        await trio.sleep(60)
        assert len(receipts.failed) == 2  # each LSN fails once
        nursery.cancel_scope.cancel()
    store.close()


async def test_without_required_backups_the_local_disk_alone_releases(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    store = primary(tmp_path)
    receipts = Receipts()
    p = Replicator(store, H1, node_id="p", sync_replicas=0, sync_timeout_s=1, on_failed=receipts.durable_failed)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(p.watch_sync)
        lsn = write(store, p, 4)
        assert p.confirmed_lsn() == p.receipt_lsn() == lsn == store.durable_lsn
        await trio.sleep(10)
        assert receipts.failed == []
        nursery.cancel_scope.cancel()
    store.close()


async def test_the_window_of_recent_batches_is_bounded_but_keeps_the_newest(tmp_path: Path) -> None:
    store = primary(tmp_path)
    p = Replicator(store, H1, node_id="p", window_bytes=2000, window_batches=5)
    for _ in range(50):
        write(store, p, 2)
        assert p.window_held <= 2000
    assert p.window_peak <= 2000
    write(store, p, 40, size=200)  # one batch larger than the whole window: it alone stays
    assert 2000 < p.window_held < 12000 and p.window_peak == p.window_held
    for _ in range(10):
        write(store, p, 1)
    assert p.window_held <= 2000
    store.close()


async def test_a_suspended_primarys_receipt_gate_holds_where_it_was_until_released(tmp_path: Path) -> None:
    """PrimaryRole.hold freezes the gate (with sync_replicas = 0 nothing else
    would: the local disk alone releases); release unfreezes it and wakes the
    server's held writers."""
    import structlog

    from gateway.config import HaSettings
    from gateway.ha.primary_role import PrimaryRole

    store = primary(tmp_path)
    receipts = Receipts()
    ha = HaSettings(node_id="p", sync_replicas=0)
    part = PrimaryRole(ha, H1, structlog.get_logger("test"), on_refused=None, cluster=type("Status", (), {})())
    part.attach(store)
    part.serving(receipts)  # type: ignore[arg-type]  # the server's durable_advanced / durable_failed
    assert part.replicator is not None
    before = write(store, part.replicator, 2)
    assert part.receipt_lsn() == before
    part.hold()
    after = write(store, part.replicator, 3)
    assert store.durable_lsn == after > before and part.receipt_lsn() == before  # written, not released
    part.hold()  # a second hold keeps the first mark
    assert part.receipt_lsn() == before
    woken = receipts.advanced
    part.release()
    assert part.receipt_lsn() == after and receipts.advanced == woken + 1
    store.close()

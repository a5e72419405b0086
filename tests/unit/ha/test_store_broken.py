"""The committer (gateway/tasks.py's commit) tells an HA primary to step
down when a batch fails to write for anything but a full disk: a read-only
filesystem or an I/O error means the disk cannot be trusted, while a full
disk is the disk alarm's to hold producers for and the write is retried."""

from __future__ import annotations

import errno
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from gateway import tasks
from gateway.admin import metrics
from tests.support.replicator_helpers import Events, Receipts


class FailingStore:
    """One batch to take, whose write fails with ``code``."""

    def __init__(self, code: int) -> None:
        self.code = code
        self.batches = [SimpleNamespace(first_lsn=1, last_lsn=1, runs=[])]

    def take_batch(self) -> Any:
        return self.batches.pop() if self.batches else None

    def write_batch(self, batch: Any) -> None:
        raise OSError(self.code, errno.errorcode[self.code])

    def batch_failed(self, batch: Any, error: OSError) -> tuple[int, int]:
        return batch.first_lsn, batch.last_lsn


async def broken_after_one_failed_write(code: int) -> tuple[list[str], Receipts]:
    told: list[str] = []
    receipts = Receipts()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(tasks.commit, FailingStore(code), receipts, trio.lowlevel.ParkingLot(), Events(),
                           metrics.Histogram(), trio.CapacityLimiter(1), None, None, told.append)
        with trio.fail_after(5):
            while not receipts.failed:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    return told, receipts


@pytest.mark.parametrize("code", [errno.EROFS, errno.EIO])
async def test_a_disk_that_cannot_write_is_told_to_the_primary(code: int) -> None:
    told, receipts = await broken_after_one_failed_write(code)
    assert told == [errno.errorcode[code]]
    assert receipts.failed == [(1, 1, errno.errorcode[code])]  # its SENDs are told, as before


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
async def test_a_full_disk_is_not_a_reason_to_step_down(code: int) -> None:
    told, receipts = await broken_after_one_failed_write(code)
    assert told == []
    assert receipts.failed == [(1, 1, errno.errorcode[code])]

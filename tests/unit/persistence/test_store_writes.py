"""The store through its own door: the write path in batches, reads of records
not yet written, failed writes that are never durable, and the sync policies."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from persistence.offline import check
from tests.support.store_helpers import message, opened, reopen, subscriptions


def test_read_message_finds_a_record_still_pending_or_being_written(tmp_path: Path) -> None:
    s, _ = opened(tmp_path)
    m = message("pending", body=b"p")
    _, m_location = s.add_message(m, ["/queue/a"])
    assert s.read_message(m_location).body == b"p"
    batch = s.take_batch()
    tx = message("in-tx", body=b"t")
    _, [tx_location] = s.transaction([(tx, ["/queue/a"])], [])
    assert s.read_message(m_location).body == b"p"  # in the batch being written
    assert s.read_message(tx_location).body == b"t"  # pending, inside a TX
    s.write_batch(batch)
    s.batch_written(batch)
    s.flush()
    assert s.read_message(tx_location).headers == {"h": "in-tx"}
    s.close()


def enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("failing", ["pwrite", "fdatasync"])
def test_a_failed_write_is_never_durable_and_later_writes_are(tmp_path: Path, monkeypatch, failing: str) -> None:
    s, _ = opened(tmp_path, sync="always")
    s.add_message(message("before"), ["/queue/a"])
    s.add_message(message("acked-later"), ["/queue/a"])
    s.flush()
    durable = s.durable_lsn
    lost = message("lost", body=b"L" * 20)
    _, lost_location = s.add_message(lost, ["/queue/a"])
    s.ack("/queue/a", "acked-later")
    s.transaction([(message("lost-tx"), ["/queue/b"])], [("/queue/a", "before")])
    s.add_subscription("d", "/topic/t")
    batch = s.take_batch()
    with monkeypatch.context() as m:
        m.setattr(os, failing, enospc)
        with pytest.raises(OSError) as exc:
            s.write_batch(batch)
    assert exc.value.errno == errno.ENOSPC
    first, last = s.batch_failed(batch, exc.value)
    assert (first, last) == (durable + 1, s.appended_lsn)
    assert s.durable_lsn == durable
    assert s.read_message(lost_location).body == b"L" * 20  # still readable while live
    s.checkpoint()  # must leave out what never reached disk
    # A second failure reports only what is new.
    s.add_message(message("also-lost"), ["/queue/a"])
    batch = s.take_batch()
    with monkeypatch.context() as m:
        m.setattr(os, "pwrite", enospc)
        with pytest.raises(OSError) as exc:
            s.write_batch(batch)
    assert s.batch_failed(batch, exc.value) == (last + 1, s.appended_lsn)
    # Space is back.
    s.add_message(message("after"), ["/queue/a"])
    s.checkpoint()
    s.flush()
    assert s.durable_lsn == s.appended_lsn
    s, r = reopen(tmp_path, s)
    got = {k: [m.id for m in q] for k, q in r.queues.items()}
    # The adds of the failed batches are gone; its acks and subscription were retried.
    assert got == {"/queue/a": ["after"]}
    assert subscriptions(r) == {"d": "/topic/t"} and r.corrupt_records == 0
    s.close()
    report = check(tmp_path)
    assert report["corrupt_records"] == 0 and report["messages"] == 1


def test_sync_policies_decide_when_fdatasync_runs(tmp_path: Path, monkeypatch) -> None:
    calls = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (calls.append(fd), real(fd)))
    for policy, expected in (("always", 3), ("never", 0)):
        calls.clear()
        s, _ = opened(tmp_path / policy, sync=policy, segment_bytes=2**20)
        for i in range(3):
            s.add_message(message(f"m{i}"), ["/queue/a"])
            s.flush()
            assert s.durable_lsn == s.appended_lsn
        assert len(calls) == expected, policy
        s.abandon()
    calls.clear()
    s, _ = opened(tmp_path / "interval", sync="interval", interval_ms=60_000, segment_bytes=2**20)
    s._last_sync -= 120  # the interval has passed once
    for i in range(3):
        s.add_message(message(f"m{i}"), ["/queue/a"])
        s.flush()
        assert s.durable_lsn == s.appended_lsn  # durable at write, not at sync
    assert len(calls) == 1
    assert s.take_batch() is None  # interval not passed again: nothing to do
    s._last_sync -= 120
    idle = s.take_batch()  # an idle sync-only batch for what is unsynced
    assert idle is not None and idle.runs == [] and idle.sync
    s.write_batch(idle)
    s.batch_written(idle)
    assert len(calls) == 2 and s.take_batch() is None
    s.close()

"""The replication window across a failover (gateway/ha/window.py), without
sockets: a backup keeps the batches it applied last, bounded like the
primary's window; promoted, it seeds its window with them under its new
epoch; a peer a little behind whose history agrees is answered by tail and
ends with the promoted node's state, while the old primary holding an
unconfirmed tail is still copied by snapshot."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.ha.replicator import Replicator
from gateway.ha.window import Recent, seeding
from persistence.replica import epochs
from persistence.replica import replication as r
from persistence.replica.catchup import Answer, Plan, Refusal, plan
from persistence.store import Store
from tests.support.replicator_helpers import H1, Events
from tests.support.replication_helpers import SEGMENT, commit, everything, folder_state, follower, primary, ship


def batch(first: int, last: int, size: int = 100, epoch: int = 1) -> r.Batch:
    return r.Batch(epoch, first, last, ((1, first * 1000, b"x" * size),))


def test_a_backup_keeps_its_last_batches_within_the_bounds_newest_always() -> None:
    kept = Recent(max_bytes=1000, max_batches=4)
    for lsn in range(1, 21):
        kept.add(batch(lsn, lsn, 300))
        assert kept.held <= 1000 and len(kept) <= 4
    assert [f.first_lsn for f in kept.frames()] == [18, 19, 20]  # 900 bytes: a fourth would pass 1000
    kept.add(batch(21, 30, 5000))  # larger than the bound: it alone stays
    assert [f.first_lsn for f in kept.frames()] == [21] and kept.held == 5000
    for lsn in range(31, 40):
        kept.add(batch(lsn, lsn, 10))
    assert len(kept) == 4  # the count bound, for many small batches
    kept.add(batch(50, 50))  # not the next lsn (a snapshot went between): only an unbroken run serves
    assert [f.first_lsn for f in kept.frames()] == [50]
    kept.clear()
    assert kept.frames() == () and kept.held == 0


def test_seeding_restamps_an_unbroken_run_that_ends_at_the_store() -> None:
    frames = [batch(1, 3), batch(4, 4), batch(5, 9)]
    seeded, why = seeding(frames, 9, 2)
    assert why == "" and [(f.epoch, f.first_lsn, f.last_lsn) for f in seeded] == [(2, 1, 3), (2, 4, 4), (2, 5, 9)]
    assert [f.runs for f in seeded] == [f.runs for f in frames]  # the same records, not copied
    # The newest within the primary's bounds (if its own are smaller).
    assert [f.first_lsn for f in seeding(frames, 9, 2, max_bytes=250)[0]] == [4, 5]
    assert [f.first_lsn for f in seeding(frames, 9, 2, max_batches=1)[0]] == [5]
    # A batch written but never reported applied (a promotion cancelled it):
    # the store is past the frames, and a window with a hole would stall a tail.
    assert seeding(frames, 10, 2) == ([], "the kept batches end at lsn 9, the store at 10")
    assert seeding([batch(1, 3), batch(5, 9)], 9, 2) == ([], "the kept batches have a hole")
    assert seeding([], 0, 2) == ([], "no batches kept")


async def test_a_promoted_backup_serves_a_lagging_peer_by_tail_and_the_old_primary_by_snapshot(tmp_path: Path) -> None:
    # A is the primary of epoch 1; B keeps everything, C stops half way.
    a = primary(tmp_path / "a")
    epochs.save(tmp_path / "a" / "store", H1)
    b, c, d = follower(tmp_path / "b"), follower(tmp_path / "c"), follower(tmp_path / "d")
    frames = []
    for tag in "wxyz":
        everything(a, n=6, tag=tag)
        frames += commit(a)
    kept = Recent()
    for frame in frames:
        ship([frame], b)
        kept.add(frame)
    half = len(frames) // 2
    ship(frames[:half], c)
    ship(frames[:half], d)
    # A writes more that no backup acked (an unconfirmed tail), and dies.
    everything(a, n=3, tag="lost")
    commit(a)
    a_lsn = a.durable_lsn
    a.abandon()
    # B is promoted: epoch 2 from its next LSN, its window seeded with what it kept.
    store_dir = b.promote()
    nb = Store(store_dir, segment_bytes=SEGMENT, sync="never", archive=b.archive)
    nb.open()
    last = nb.durable_lsn
    history = epochs.extended(epochs.load(store_dir), 2, last + 1)
    epochs.save(store_dir, history)
    log = Events()
    p = Replicator(nb, history, node_id="b", log=log)
    p.seed(kept.frames())
    assert log.named("replication_window_seeded") == [
        {"first_lsn": 1, "last_lsn": last, "batches": len(frames), "bytes": p.window_held}]
    seeded, _ = seeding(kept.frames(), last, 2)
    oldest = seeded[0].first_lsn
    # C is behind, and its history agrees: the tail, from its next LSN.
    assert c.last_lsn < last and plan(c.hello("c"), history, last, oldest) == Plan(Answer.TAIL, from_lsn=c.last_lsn + 1)
    # A's records past `last` are epoch 1's, never B's: copied by snapshot, as before.
    fa = follower(tmp_path / "a")
    assert (fa.epoch, fa.last_lsn) == (1, a_lsn) and a_lsn > last
    assert plan(fa.hello("a"), history, last, oldest).reason.startswith("diverged")
    fa.close()
    # C accepts B at the Hello (epoch 2 and B's history), then the old
    # epoch's records under epoch 2: the frame's epoch is its sender's token.
    assert c.accept_primary(r.Hello("b", 2, last, history)) is True
    acks = [c.apply(f) for f in seeded if f.first_lsn > c.last_lsn]
    assert acks[-1] == r.Ack(2, last) and c.history == history and epochs.epoch_of(c.history, last) == 1
    # Sent as they were (epoch 1), C would refuse them once it accepted epoch 2.
    assert d.accept_primary(r.Hello("b", 2, last, history)) is True
    with pytest.raises(Refusal, match="stale epoch 1"):
        d.apply(frames[half])
    d.close()
    # B's own batches follow; C ends with B's state.
    everything(nb, n=4, tag="new")
    ship(commit(nb, epoch=2), c)
    assert c.last_lsn == nb.durable_lsn > last
    c.close()
    nb.close()
    assert folder_state(tmp_path / "c") == folder_state(tmp_path / "b")
